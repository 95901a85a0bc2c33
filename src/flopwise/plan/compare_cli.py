"""`flopwise compare`: the job on every catalog device (or the listed ones), a table, and
time-vs-cost Pareto data as PNG, JSON and CSV; with `--local`, the small-team hybrid plan
(own cards vs a rented cloud node).

Imports stay inside the command (the planner, rich, matplotlib load only when it runs).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Optional

import typer

from flopwise.plan.search_cli import band_cell

CSV_FIELDS = ("hardware", "name", "devices", "chosen", "pareto", "priced", "precision", "layout", "days",
              "device_hours", "kwh", "on_demand_usd", "spot_usd", "tokens_per_second_per_device", "mfu",
              "expected_error", "efficiency_confidence", "note")


def register(app: typer.Typer) -> None:
    """Add `compare` to the top-level app."""
    app.command(name="compare")(compare_command)


def compare_command(
    model: str = typer.Option("llama2-7b", "--model", help="Catalog key or a config.json path."),
    tokens: Optional[str] = typer.Option(None, "--tokens", help="Tokens (CNN: samples) to train on: 300B, 1.4T, 2e12. [default: 2T; 1B for a --finetune]"),
    gpus: Optional[int] = typer.Option(None, "--gpus", help="Use this many devices of each kind."),
    budget_usd: Optional[float] = typer.Option(None, "--budget-usd", help="Fastest option whose on-demand cost fits."),
    deadline_days: Optional[float] = typer.Option(None, "--deadline-days", help="Fewest devices that finish in time."),
    hardware: Optional[str] = typer.Option(None, "--hardware", help="Comma-separated catalog keys. [default: all]"),
    out: Optional[Path] = typer.Option(None, "--out", help="Write pareto.png, compare.json, compare.csv (--local: hybrid.json, hybrid.csv) into this folder. [default: write no files]"),
    max_devices: int = typer.Option(4096, "--max-devices", help="Largest device count tried."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", help="Training sequence length. [default: the model's]"),
    batch_tokens: Optional[str] = typer.Option(None, "--batch-tokens", help="Tokens per optimizer step. [default: 4Mi]"),
    precision: Optional[str] = typer.Option(None, "--precision", help="[default: bf16, else fp16, else fp32 per device]"),
    optimizer: Optional[str] = typer.Option(None, "--optimizer", help="adamw|sgd|adam8bit. [default: adamw]"),
    price_per_hour: Optional[float] = typer.Option(None, "--price-per-hour", help="USD per device-hour for every device."),
    global_batch: Optional[int] = typer.Option(None, "--global-batch", help="Sequences (CNN: samples) per step. [default: 4Mi tokens; CNN 256]"),
    host_memory_gib: float = typer.Option(1024.0, "--host-memory-gib", help="RAM per node for offloaded states (assumption; 8-GPU cloud nodes carry ~1-2 TiB)."),
    local: bool = typer.Option(False, "--local", help="Hybrid plan: --hardware/--gpus are your own cards, vs --cloud."),
    cloud: str = typer.Option("v100-32gb:8:298", "--cloud", help="--local: rented node as DEVICE:COUNT[:HOST_GIB]. [default: 8 x V100 32GB with 320 GB = 298 GiB RAM, Tencent Cloud's GN10X.18XLARGE320, the cloud node of the small-team recipe in the blog post \"AI大模型算力争夺战：核心技术解析与实战指南\"]"),
    local_host_memory_gib: float = typer.Option(128.0, "--local-host-memory-gib", help="--local: RAM of your machine for offloaded states (assumption)."),
    electricity_usd_per_kwh: float = typer.Option(0.15, "--electricity-usd-per-kwh", help="--local: your electricity price (assumption)."),
    local_hardware_usd: Optional[float] = typer.Option(None, "--local-hardware-usd", help="--local: price of one of your cards, amortised."),
    amortize_years: float = typer.Option(3.0, "--amortize-years", help="--local: service life the card price is spread over."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
    stack: str = typer.Option("flopwise", "--stack", help="Training software stack planned (see `flopwise plan --help`)."),
    finetune: Optional[str] = typer.Option(None, "--finetune", help="full|lora|qlora: a full fine-tune, or LoRA adapters on a frozen base (qlora: base in NF4). [default: none: training from scratch]"),
    lora_rank: Optional[int] = typer.Option(None, "--lora-rank", help="--finetune lora|qlora: adapter rank r. "
                                            "[default: 16; 32 with --stack nemo, NeMo's LoRA default]"),
    lora_targets: str | None = typer.Option(None, "--lora-targets", help="--finetune lora|qlora: all-linear|qkvo|module names (q_proj,v_proj). [default: all-linear, or the stack's]"),
    ep: int = typer.Option(1, "--ep", help="MoE: expert-parallel size held on every layout (see `flopwise plan --help`)."),
    sequence_parallel: bool = typer.Option(True, "--sequence-parallel/--no-sequence-parallel", help="Plan tensor-parallel layouts with sequence parallelism (the default, as Megatron-Core and torchtitan recipes run them) or without it."),
) -> None:
    """Compare devices for one job: fewest devices that fit, best layout, time, energy, cost; Pareto front.

    Devices without a published price are compared on time and energy only. With --local,
    plan your own cards (e.g. --hardware rtx4090 --gpus 4) against a cloud node.
    """
    from flopwise.plan.flag_bounds import check_flag_values

    check_flag_values(locals())  # every numeric flag in its physical / practical range, before any search
    from flopwise.errors import UserError

    keys = [h.strip() for h in hardware.split(",") if h.strip()] if hardware else None
    tuning = {"finetune": finetune, "lora_rank": lora_rank, "lora_targets": lora_targets}
    if tokens is None:
        from flopwise.plan.finetune import default_tokens

        tokens = default_tokens("full" if finetune is None else (finetune if finetune != "full" else "full-finetune"),
                                "2T")
    if local:
        if ep > 1:
            raise UserError("--ep is not taken with --local (the hybrid plan of dense fine-tunes); compare without --local")
        if not keys or len(keys) != 1 or gpus is None:
            raise UserError("--local needs one --hardware (your cards) and --gpus (how many), e.g. --hardware rtx4090 --gpus 4")
        return _hybrid(model, tokens, keys[0], gpus, cloud, local_host_memory_gib, electricity_usd_per_kwh,
                       local_hardware_usd, amortize_years, seq_len, batch_tokens, price_per_hour, out, as_json,
                       tuning)
    from flopwise.plan.compare import compare_devices

    if max_devices < 1:
        raise UserError(f"--max-devices must be >= 1, got {max_devices}")
    result = compare_devices(model, tokens, keys, gpus=gpus, budget_usd=budget_usd, deadline_days=deadline_days,
                             max_devices=max_devices, seq_len=seq_len, batch_tokens=batch_tokens, precision=precision,
                             optimizer=optimizer, price_per_hour=price_per_hour, global_batch=global_batch,
                             host_memory_gib=host_memory_gib, finetune_options=tuning, stack=stack, ep=ep,
                             sequence_parallel=sequence_parallel)
    written = write_outputs(result, out) if out is not None else []
    if as_json:
        data = result.to_dict()
        data["files"] = [str(p) for p in written]
        print(json.dumps(data, indent=2, allow_nan=False, default=str))
        return
    print_comparison(result, written)


def csv_rows(result) -> list[dict]:
    """One row per (device, count) option evaluated, plus one per device with nothing to offer."""
    front = {(o.hardware, o.devices) for o in result.pareto}
    rows = []
    for verdict in result.verdicts:
        if not verdict.options:
            rows.append({"hardware": verdict.hardware, "name": verdict.name, "note": verdict.note})
        for option in verdict.options:
            row = option.to_dict()
            row.pop("plan")
            row["chosen"] = verdict.chosen is not None and option.devices == verdict.chosen.devices
            row["pareto"] = (option.hardware, option.devices) in front
            row["note"] = "" if option.priced else "no published price: time and energy only"
            rows.append(row)
    return rows


def write_outputs(result, folder: Path) -> list[Path]:
    """pareto.png, compare.json and compare.csv in `folder`."""
    from flopwise.plan.pareto_plot import plot_pareto

    folder.mkdir(parents=True, exist_ok=True)
    rows = csv_rows(result)
    csv_path = folder / "compare.csv"
    with csv_path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    json_path = folder / "compare.json"
    json_path.write_text(json.dumps(result.to_dict(), indent=2, allow_nan=False, default=str) + "\n")
    unpriced = sorted({r["hardware"] for r in rows if r.get("days") is not None and not r.get("priced")})
    png = plot_pareto([r for r in rows if r.get("days") is not None], folder / "pareto.png",
                      f"{result.model}, {result.tokens:.3g} tokens: time vs on-demand cost", unpriced)
    return [png, json_path, csv_path]


def _finetune_words(options) -> str:
    """' (qlora fine-tune, rank 16, all-linear)' when the options planned a LoRA/QLoRA run, else ''."""
    work = next((o.plan.spec.workload for o in options if o is not None), None)
    if work is None or work.finetune == "full":
        return ""
    return f" ({work.finetune} fine-tune, rank {work.lora_rank}, {work.lora_targets})"


def _money(value) -> str:
    return "n/a" if value is None else f"${value:,.0f}"


def print_comparison(result, written: list[Path]) -> None:
    """The chosen option per device as a table, then advice, published rules of thumb and notes."""
    from rich.console import Console

    from flopwise.table_layout import print_first_that_fits

    console = Console()
    if result.mode == "gpus":
        what = f"{result.target:g} devices each"
    elif result.mode == "budget":
        what = f"fastest within ${result.target:,.0f} on demand"
    elif result.mode == "deadline":
        what = f"fewest devices finishing within {result.target:g} days"
    else:
        what = "fewest devices that fit"
    console.print(f"[bold]{result.model}[/bold]{_finetune_words([v.chosen for v in result.verdicts])}, "
                  f"{result.tokens:.3g} tokens: {what}")
    columns = ("device", "n", "best layout", "days", "device-h", "MWh", "on-demand", "spot", "tok/s/dev", "MFU", "±")
    front = {(o.hardware, o.devices) for o in result.pareto}
    rows = []
    for verdict in sorted(result.verdicts, key=lambda v: (v.chosen is None, v.chosen.days if v.chosen else 0)):
        o = verdict.chosen
        if o is None:
            rows.append(dict(zip(columns, (verdict.hardware, "-", f"[dim]{verdict.note}[/dim]", *["-"] * 8)),
                             key=verdict.hardware))
            continue
        mark = " *" if (o.hardware, o.devices) in front else ""
        rows.append(dict(zip(columns, (
            o.hardware + mark + ("" if o.priced else " (no price)"), str(o.devices), o.layout, f"{o.days:,.1f}",
            f"{o.device_hours:,.0f}", "n/a" if o.kwh is None else f"{o.kwh / 1000:,.2f}", _money(o.on_demand_usd),
            _money(o.spot_usd), f"{o.plan.time.tokens_per_second_per_device:,.0f}", f"{o.plan.time.mfu:.1%}",
            band_cell(o.plan),
        )), key=o.hardware + mark))
    # a narrow terminal gets the layouts, then the time and cost per device, instead of squeezed cells
    print_first_that_fits(
        console,
        _compare_table(columns, rows),
        [_compare_table(columns[:4], rows, "layouts"), _compare_table(("key", *columns[4:]), rows, "energy, cost, speed")],
    )
    console.print("[dim]* on the time-vs-cost Pareto front; spot is the catalog's spot price before preemptions "
                  "(see `flopwise plan --spot`); devices marked (no price) are compared on time and energy only.[/dim]")
    for line in result.advice:
        console.print(f"[bold]numbers:[/bold] {line}")
    for line in result.rules_of_thumb:
        console.print(line)
    for line in result.notes:
        console.print(f"[yellow]note:[/yellow] {line}")
    if written:
        console.print("wrote " + ", ".join(str(p) for p in written))
    else:
        console.print("[dim]no files written; add --out DIR for pareto.png, compare.json and compare.csv[/dim]")


def _compare_table(columns, rows: list[dict[str, str]], title: str | None = None):
    from rich import box
    from rich.table import Table

    table = Table() if title is None else Table(title=title, title_justify="left", box=box.SIMPLE_HEAD,
                                                   pad_edge=False, collapse_padding=True)
    for column in columns:
        wraps = column == "best layout"  # the device key is never cut; a long layout text may wrap
        table.add_column("device" if column == "key" else column,
                         justify="left" if column in ("key", "device", "best layout") else "right", no_wrap=not wraps)
    for row in rows:
        table.add_row(*(row[c] for c in columns))
    return table


def _hybrid(model, tokens, local_key, gpus, cloud, host_gib, electricity, hardware_usd, years, seq_len, batch_tokens,
            price_per_hour, out, as_json, tuning=None) -> None:
    from flopwise.errors import UserError
    from flopwise.plan.hybrid import Site, parse_site, plan_hybrid

    if gpus < 1:
        raise UserError(f"--gpus must be >= 1, got {gpus}")
    if host_gib <= 0:
        raise UserError(f"--local-host-memory-gib must be > 0, got {host_gib}")
    result = plan_hybrid(model, tokens, Site(local_key, gpus, host_gib), parse_site(cloud, "--cloud"),
                         electricity, hardware_usd, years, seq_len, batch_tokens, price_per_hour,
                         finetune_options=tuning)
    if out is not None:
        _write_hybrid(result, out)
    if as_json:
        print(json.dumps(result.to_dict(), indent=2, allow_nan=False, default=str))
        return
    print_hybrid(result, out)


def _write_hybrid(result, folder: Path) -> None:
    """hybrid.json and hybrid.csv (the model-size sweep on both sites) in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "hybrid.json").write_text(json.dumps(result.to_dict(), indent=2, allow_nan=False, default=str) + "\n")
    with (folder / "hybrid.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["model", "params", "local_layout", "local_days", "local_usd", "cloud_layout", "cloud_days",
                         "cloud_usd", "cloud_faster", "cloud_cheaper"])
        for r in result.sweep:
            writer.writerow([r.model, r.params, r.local.layout if r.local else "does not fit",
                             r.local.days if r.local else "", r.local_usd if r.local_usd is not None else "",
                             r.cloud.layout if r.cloud else "does not fit", r.cloud.days if r.cloud else "",
                             r.cloud_usd if r.cloud_usd is not None else "", r.cloud_faster, r.cloud_cheaper])


def print_hybrid(result, folder: Path | None) -> None:
    """The model-size sweep on both sites and the crossovers."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 180))
    here = f"{result.local.devices} x {result.local.hardware}"
    there = f"{result.cloud.devices} x {result.cloud.hardware}"
    cost_basis = f"electricity ${result.electricity_usd_per_kwh:g}/kWh"
    if result.local_hardware_usd:
        cost_basis += f" + ${result.local_hardware_usd:,.0f}/card over {result.amortize_years:g} years"
    console.print(f"[bold]local {here}[/bold] ({cost_basis}; host RAM {result.local.host_memory_gib:g} GiB) vs "
                  f"[bold]cloud {there}[/bold] (on demand), {result.tokens:.3g} tokens"
                  f"{_finetune_words([r.local for r in result.sweep] + [r.cloud for r in result.sweep])}")
    table = Table()
    for column in ("model", "params", "local layout", "local days", "local $", "cloud layout", "cloud days", "cloud $"):
        table.add_column(column, justify="left" if "layout" in column or column == "model" else "right")
    for r in result.sweep:
        style = "bold" if r.model == result.job.model else None
        table.add_row(
            r.model, f"{r.params / 1e9:,.2f}B", r.local.layout if r.local else "[red]does not fit[/red]",
            f"{r.local.days:,.2f}" if r.local else "-", _money(r.local_usd),
            r.cloud.layout if r.cloud else "[red]does not fit[/red]", f"{r.cloud.days:,.2f}" if r.cloud else "-",
            _money(r.cloud_usd), style=style,
        )
    console.print(table)
    for line in result.findings:
        console.print(f"[bold]numbers:[/bold] {line}")
    if result.buy_break_even_tokens is not None:
        console.print(f"[bold]numbers:[/bold] buying the {here} (${result.local_hardware_usd * result.local.devices:,.0f}) "
                      f"costs less than renting {there} for {result.job.model} after "
                      f"{result.buy_break_even_tokens:.3g} tokens")
    if result.cloud.host_memory_gib is None:
        console.print(f"[dim]cloud host memory not checked; give it as --cloud {result.cloud.hardware}:"
                      f"{result.cloud.devices}:GIB[/dim]")
    if folder is not None:
        console.print(f"wrote {folder / 'hybrid.json'}, {folder / 'hybrid.csv'}")
    else:
        console.print("[dim]no files written; add --out DIR for hybrid.json and hybrid.csv[/dim]")
