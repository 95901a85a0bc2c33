"""`flopwise models`: list and show the models catalog, with parameters counted by the planner.

It lives in `plan` because the counts are the planner's (`plan.params`); the catalog
only loads the numbers.
"""

from __future__ import annotations

import json
from dataclasses import asdict

import typer

from flopwise.catalog.models import ModelSpec, get_model, load_models
from flopwise.plan.mamba import layer_mix, mixer_params
from flopwise.plan.params import ParamCount, attention_params, count_params, mlp_params


def register_models(app: typer.Typer) -> None:
    """Add the `models` command."""

    @app.command("models")
    def models(
        name_or_config: str = typer.Argument(
            None,
            metavar="NAME_OR_CONFIG",
            help="A catalog key (e.g. llama3-8b) or a path to a HuggingFace config.json or its folder.",
        ),
        as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    ) -> None:
        """List the model catalog, or show one model's numbers and parameter breakdown."""
        if name_or_config is None:
            specs = list(load_models().values())
            if as_json:
                print(json.dumps([model_record(spec) for spec in specs], indent=2))
            else:
                _print_catalog(specs)
            return
        spec = get_model(name_or_config)
        if as_json:
            print(json.dumps(model_record(spec), indent=2))
        else:
            _print_model(spec)


def model_record(spec: ModelSpec) -> dict:
    """A model's spec and parameter breakdown as plain JSON-ready data."""
    counts = count_params(spec)
    params = asdict(counts)
    if spec.arch != "cnn":
        params["per_layer"] = counts.per_layer
        params["active_per_layer"] = counts.active_per_layer
    return {"model": asdict(spec), "params": params}


def format_count(n: float) -> str:
    """Human parameter count: 174.60B, 335.1M, 25.6M."""
    if n >= 1e9:
        return f"{n / 1e9:.2f}B"
    if n >= 1e6:
        return f"{n / 1e6:.1f}M"
    if n >= 1e3:
        return f"{n / 1e3:.1f}K"
    return str(int(n))


def _heads(spec: ModelSpec) -> str:
    kv = spec.n_kv_heads or spec.n_heads
    return f"{spec.n_heads}" if kv == spec.n_heads else f"{spec.n_heads}/{kv}"


def _print_catalog(specs: list[ModelSpec]) -> None:
    from rich.table import Table

    table = Table(title="flopwise models (parameters counted from the architecture)")
    for column in ("key", "arch", "layers", "hidden", "heads/kv", "ffn", "vocab", "seq", "total", "active"):
        table.add_column(column, justify="left" if column in ("key", "arch") else "right", no_wrap=True)
    for spec in specs:
        counts = count_params(spec)
        if spec.arch == "cnn":
            dims = ["-"] * 6
        else:
            dims = [
                str(spec.n_layers),
                str(spec.hidden),
                _heads(spec),
                str(spec.ffn_hidden) + (f" x{spec.n_experts}" if spec.n_experts > 1 else ""),
                str(spec.vocab_size),
                str(spec.seq_len),
            ]
        table.add_row(spec.key, spec.arch, *dims, format_count(counts.total), format_count(counts.active))
    _console().print(table)


def _console():
    """A rich console; when output is piped there is no terminal to fit, so don't truncate."""
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    return console


def _print_model(spec: ModelSpec) -> None:
    from rich.table import Table

    counts = count_params(spec)
    console = _console()
    arch = Table(title=f"{spec.name} ({spec.key})", show_header=False)
    arch.add_column("field")
    arch.add_column("value", justify="right")
    for field_name, value in asdict(spec).items():
        if field_name in ("key", "name", "source", "reported_params") or value in (None, 0, 0.0, "", False):
            continue
        if spec.arch == "cnn" and field_name not in ("arch", "params", "flops_per_sample"):
            continue
        if field_name == "shared_expert_gate" and not spec.shared_expert_ffn_hidden:
            continue  # says something only of a shared expert
        if field_name == "flops_per_sample":
            value = f"{value / 1e9:.3f} GFLOPs forward (2 per multiply-add)"
        arch.add_row(field_name, str(value))
    console.print(arch)
    console.print(_breakdown_table(spec, counts))
    console.print(f"source: {spec.source}", soft_wrap=True)


def _breakdown_table(spec: ModelSpec, counts: ParamCount):
    from rich.table import Table

    table = Table(title="parameters")
    table.add_column("part")
    table.add_column("count", justify="right")
    table.add_column("exact", justify="right")
    rows = [("total", counts.total), ("active per token", counts.active)]
    mix = layer_mix(spec)
    if mix is not None:  # a hybrid's layers by kind (the ParamCount's per-layer fields are their average)
        rows += [
            ("embedding", counts.embedding),
            ("output head", counts.output_head),
            (f"Mamba-2 mixer per Mamba layer (x{mix.mamba})", mixer_params(spec)),
            (f"attention per attention layer (x{mix.attention})", attention_params(spec)),
            (f"mlp per MLP layer (x{mix.mlp})", mlp_params(spec.hidden, spec.ffn_hidden, spec.mlp, spec.mlp_bias)),
            (f"norm per layer (x{counts.n_layers})", counts.norms_per_layer),
            ("final norm", counts.final_norm),
            ("non-embedding", counts.non_embedding),
        ]
    elif spec.arch != "cnn":
        rows += [
            ("embedding", counts.embedding),
            ("output head", counts.output_head),
            (f"attention per layer (x{counts.n_layers})", counts.attention_per_layer),
            (f"mlp per layer (x{counts.moe_layers})", counts.mlp_per_layer),
            ("mlp active per layer", counts.mlp_active_per_layer),
            *([(f"dense mlp per dense layer (x{counts.dense_layers})", counts.dense_mlp_per_layer)]
              if counts.dense_layers else []),
            ("norms per layer", counts.norms_per_layer),
            ("final norm", counts.final_norm),
            ("other (pooler, embedding norm)", counts.other),
            ("non-embedding", counts.non_embedding),
        ]
    if spec.reported_params:
        rows.append(("reported by the source", int(spec.reported_params)))
    for label, value in rows:
        table.add_row(label, format_count(value), f"{value:,}")
    return table
