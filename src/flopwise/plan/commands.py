"""CLI commands of flopwise.plan (registered by flopwise.cli): `flopwise plan`, `compare`, `models`.

Imports stay inside the command so `flopwise --help` does not load the planner, and rich
is imported only when a table is printed.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Callable, Optional

import typer

from flopwise.plan import compare_cli
from flopwise.plan.models_cli import register_models
from flopwise.plan.options import OPTIONS


ConfigLoader = Callable[[Optional[Path], list[str]], object]
_load_training_config: ConfigLoader | None = None


def register(app: typer.Typer, load_training_config: ConfigLoader | None = None) -> None:
    """Add `plan`, `compare` and `models` to the top-level app.

    `load_training_config(path, overrides)` reads a `flopwise train` config for
    `plan --config`; the CLI passes the trainer's loader in, so the planner imports no
    trainer module (plan never imports train).
    """
    global _load_training_config
    _load_training_config = load_training_config
    app.command(name="plan")(plan_command)
    compare_cli.register(app)
    register_models(app)


def plan_command(**options) -> None:
    """Predict FLOPs, memory, time, energy and cost of a training run (no GPU needed).

    With no options: Llama 2 7B on 8 x H100 SXM, bf16, AdamW, 4096-token sequences,
    4M-token batches, 2T tokens; the ZeRO stage is chosen and the reason printed.
    """
    from flopwise.plan.flag_bounds import check_flag_values

    check_flag_values(options)  # every numeric flag in its physical / practical range, before any search
    # the planner loads when the command runs, not at `flopwise --help`
    from flopwise.plan.options import runspec_kwargs, search_devices_and_base
    from flopwise.plan.planner import build_runspec, plan

    o = dict(options)
    config, overrides = o.pop("config", None), o.pop("overrides", None)
    if config is not None or overrides:
        # every flag the config path does not read is refused, not silently ignored
        conflicting = [option.flag.partition("/")[0] for option in OPTIONS
                       if option.name not in CONFIG_FLAGS and option.name != "spot" and o[option.name] != option.default]
        return plan_training_config(config, overrides or [], o["hardware"], o["as_json"], spot=o["spot"],
                                    conflicting=conflicting, profile=o["profile"])
    devices = 0
    if o["search"]:  # the search picks the layout
        devices, o = search_devices_and_base(o)
    kwargs, measured, warnings = runspec_kwargs(o), None, ()
    if o["profile"] is not None:  # defaults (ZeRO stage, TP x PP split) are chosen on the measured rates
        measured, hardware, warnings = _read_profile(o["profile"], o["hardware"])
        kwargs.update(hardware=hardware, profile=measured)
    spec = build_runspec(**kwargs)
    if warnings:
        import dataclasses

        extra = {**spec.cluster.extra, "warnings": (*spec.cluster.extra.get("warnings", ()), *warnings)}
        spec = dataclasses.replace(spec, cluster=dataclasses.replace(spec.cluster, extra=extra))
    if o["search"] or o["spot"]:
        # the search loads only for --search / --spot
        from flopwise.plan.search_cli import run_search_and_spot

        if o["search"]:
            from flopwise.plan.search import with_expert_parallel

            spec = with_expert_parallel(spec, o["search_ep"])

        return run_search_and_spot(spec, devices, o["search"], o["objective"], o["top"], o["spot"],
                                   o["preemptions_per_day"], o["checkpoint_seconds"], o["restart_seconds"] or 0.0,
                                   o["spot_price_per_hour"], o["as_json"], o["host_memory_gib"],
                                   show_plan=print_plan, profile=measured,
                                   sequence_parallel=o["sequence_parallel"] is not False)
    result = plan(spec, profile=measured)
    saving = _checkpoint_cost(result, o)
    if o["as_json"]:
        print_plan_json(result, checkpoint=saving)
        return
    print_plan(result)
    _print_checkpoint_cost(saving)


def _checkpoint_cost(result, o: dict):
    """`--storage-gbps`: what a checkpoint of this plan costs and how often to write one (None without it)."""
    from flopwise.plan.checkpoint_cost import for_plan

    return for_plan(result, o)


def _print_checkpoint_cost(saving) -> None:
    if saving is not None:
        from flopwise.plan.checkpoint_cost import describe

        for line in describe(saving):
            print(line)


def _typer_signature() -> inspect.Signature:
    """plan_command's signature for typer, from the one option table (plan/options.py)."""
    parameters = [
        inspect.Parameter("overrides", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Optional[list[str]],
                          default=typer.Argument(None, metavar="[KEY=VALUE]...",
                                                 help="With --config: dotted overrides, as `flopwise train` takes them.")),
        inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[Path],
                          default=typer.Option(None, "--config", help="A `flopwise train` YAML config: plan exactly "
                                               "the run it describes (model, layout, precision, batch, steps).")),
    ]
    for option in OPTIONS:
        annotation = Optional[option.type] if option.default is None else option.type
        parameters.append(inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                                            default=typer.Option(option.default, option.flag, *option.aliases,
                                                                 help=option.help.replace("[default:", r"\[default:"))))
    return inspect.Signature(parameters, return_annotation=None)


plan_command.__signature__ = _typer_signature()
plan_command.__annotations__ = {p.name: p.annotation for p in plan_command.__signature__.parameters.values()}


def print_plan_json(result, checkpoint=None) -> None:
    """Print a Plan as the JSON of docs/planner.md ("JSON contract"); `checkpoint` adds the `--storage-gbps` section."""
    import json

    data = result.to_dict()
    if checkpoint is not None:
        data["checkpoint"] = checkpoint.to_dict()
    print(json.dumps(data, indent=2, allow_nan=False, default=str))


CONFIG_FLAGS = frozenset({"hardware", "profile", "as_json"})
"""The `plan` options that `plan --config` reads; the config (with KEY=VALUE overrides) sets the rest."""


def plan_training_config(config: Path | None, overrides: list[str], hardware: str | None, as_json: bool,
                         spot: bool = False, conflicting: list[str] = (), profile: str | None = None) -> None:
    """`plan --config`: the plan of the run `flopwise train CONFIG [KEY=VALUE ...]` would start.

    The RunSpec comes from `plan.from_config.planned_config`, the function the trainer
    writes its `plan.json` with. The config names no hardware: `--hardware` picks it.
    """
    from flopwise.catalog.hardware import get_hardware  # planner modules load when the command runs, not at --help
    from flopwise.config.resolve import resolve_run
    from flopwise.errors import UserError
    from flopwise.plan.default_strategy import settle_strategy
    from flopwise.plan.from_config import planned_config
    from flopwise.plan.planner import EXAMPLE, plan

    if config is None:
        raise UserError(f"{overrides[0]}: KEY=VALUE overrides need --config (the training config they change)")
    if conflicting or spot:
        names = ", ".join(list(conflicting) + (["--spot"] if spot else []))
        raise UserError(f"--config sets the model, layout and workload; drop {names} "
                        "(change the config with KEY=VALUE overrides instead)")
    if _load_training_config is None:
        raise UserError("--config: no training-config reader is registered (run through the `flopwise` command)")
    cfg = _load_training_config(config, list(overrides))
    measured, warnings = None, ()
    if profile is not None:  # the device's measured rates, as `flopwise train` uses them
        measured, device, warnings = _read_profile(profile, hardware)
    else:
        device = get_hardware(hardware or EXAMPLE["hardware"])
    # parallel.strategy unset: the strategy the trainer picks on this device, by the same rule
    precision_line = _pretrained_precision_default(cfg, device)  # before the strategy reads it, as the trainer
    choice = settle_strategy(cfg, device, "cpu" if device.vendor == "cpu" else "cuda")
    planned = planned_config(cfg, resolve_run(cfg))
    result = plan(planned.on(device), profile=measured)
    if choice.chosen:
        print(choice.line(), file=sys.stderr if as_json else sys.stdout)
    if precision_line:
        print(f"default: {precision_line}", file=sys.stderr if as_json else sys.stdout)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if as_json:
        print_plan_json(result)
        return
    print_plan(result)
    for note in planned.notes:
        print(note)


def _pretrained_precision_default(cfg, device) -> str | None:
    """The trainer's precision rule for a pretrained model (config/finetune_defaults.py), applied for the
    `--hardware` device rather than this machine, so the plan is of the run on that device."""
    from flopwise.config.finetune_defaults import pretrained_precision_default

    bf16 = device.vendor != "cpu" and bool(device.peak_tflops.get("bf16"))
    line = pretrained_precision_default(cfg, bf16, device.key)
    return f"{line} (as the trainer sets it there)" if line else None


def _read_profile(path: str, hardware: str | None):
    """(profile, hardware, warnings) for `--profile`: a CPU profile with no --hardware becomes the
    device; a profile measured on another device than --hardware is used anyway, with a warning."""
    from flopwise.catalog.hardware import get_hardware
    from flopwise.plan.planner import EXAMPLE
    from flopwise.plan.profile import hardware_from_profile, load_profile

    measured = load_profile(path)
    if measured.device_kind == "cpu" and hardware is None:
        return measured, hardware_from_profile(measured), ()
    hw = get_hardware(hardware or EXAMPLE["hardware"])
    words = {w for w in measured.device.lower().replace("-", " ").split() if any(c.isdigit() for c in w)}
    if any(part in words for part in hw.key.split("-")):
        return measured, hw, ()
    return measured, hw, (f"--profile was measured on {measured.device}, not {hw.key}; its GEMM rates are used anyway",)


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:,.2f} GiB"


def _count(n: float) -> str:
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:,.2f}{unit}"
    return f"{n:,.0f}"


def _duration(seconds: float) -> str:
    if seconds >= 86_400:
        return f"{seconds / 86_400:,.1f} days"
    if seconds >= 3600:
        return f"{seconds / 3600:,.1f} h"
    return f"{seconds:,.2f} s"


def _interruption_rows(est) -> list[tuple[str, str]]:
    """The expected job with hardware interruptions (plan/interruptions.py); none when they are off
    or the job is too short to expect one (under 0.1)."""
    if est.per_day <= 0 or est.work_seconds <= 0 or est.expected_interruptions < 0.1:
        return []  # none expected within the job: nothing to add
    rate = "Llama 3's rate" if est.default_rate else "your rate"
    usd = "" if est.expected_on_demand_usd is None else f", ${est.expected_on_demand_usd:,.0f} on demand"
    return [
        (f"interruptions ({rate}, {est.per_day:.3g}/day)",
         f"{est.expected_interruptions:,.0f} expected: restarts {_duration(est.restart_overhead_seconds)}, "
         f"lost work {_duration(est.lost_work_seconds)}, checkpoints {_duration(est.checkpoint_overhead_seconds)}"),
        ("whole job with interruptions", f"{_duration(est.expected_seconds)} (+{est.overhead:.1%}; "
                                         f"{est.expected_device_hours:,.0f} device-hours{usd})"),
    ]


def _layout_words(lay) -> str:
    """The parallel layout as the header names it: sequence parallelism and an interleaved
    schedule's chunks are part of the layout a recipe states ("tp 4+SP", "pp 4 interleaved x5")."""
    sp = "+SP" if lay.tp > 1 and lay.sequence_parallel else ""
    pp = f"pp {lay.pp}"
    if lay.pp > 1 and lay.pipeline_schedule == "interleaved":
        pp += f" interleaved x{lay.virtual_stages}"
    elif lay.pp > 1 and lay.pipeline_schedule != "1f1b":
        pp += f" {lay.pipeline_schedule}"
    return ", ".join([f"dp {lay.dp}", f"tp {lay.tp}{sp}", pp] + ([f"cp {lay.cp}"] if lay.cp > 1 else [])
                     + ([f"ep {lay.ep}" + (f" etp {lay.expert_tp}" if lay.expert_tp != lay.tp else "")
                         + (" (DeepEP)" if lay.moe_dispatcher == "deepep" else "")]
                        if lay.ep > 1 else []))


def _offloaded_activations_words(lay) -> str:
    """', activations of N blocks per stage offloaded' when the layout offloads them, else ''."""
    if not lay.offload_activations:
        return ""
    from flopwise.plan.activation_offload import describe

    return f", activations of {describe(lay.offload_activations)} blocks per stage offloaded"


def print_plan(result) -> None:
    """Print a Plan as rich tables: parameters, FLOPs, memory, time, energy and cost."""
    from rich.console import Console
    from rich.table import Table

    from flopwise.plan.planner import gradient_dtype

    spec, lay, work = result.spec, result.spec.layout, result.spec.workload
    hw = spec.cluster.hardware
    console = Console()
    console.print(
        f"[bold]{spec.model.name or spec.model.key}[/bold] on {lay.devices} x {hw.name or hw.key} "
        f"({_layout_words(lay)}); {work.precision}, {work.optimizer}, ZeRO-{lay.zero_stage}, "
        f"recompute {lay.recompute}, offload {lay.offload}"
        f"{_offloaded_activations_words(lay)}{', torch.compile' if lay.compiled else ''}; micro-batch {lay.micro_batch_size} x accum "
        f"{lay.grad_accum} = {lay.global_batch_size} per step"
        + ("" if spec.model.arch == "cnn" else f", seq {work.seq_len}")
    )

    def table(title: str, rows: list[tuple[str, str]]) -> None:
        """One two-column rich table."""
        t = Table(title=title, title_justify="left", show_header=False)
        t.add_column(style="cyan")
        t.add_column(justify="right")
        for row in rows:
            t.add_row(*row)
        console.print(t)

    p, f, m, c, tm = result.params, result.flops, result.memory, result.comm, result.time
    rows = [("total", _count(p.total)), ("active per token", _count(p.active)),
            ("embedding", _count(p.embedding)), ("output head", _count(p.output_head)),
            ("non-embedding", _count(p.non_embedding))]
    table("Parameters", rows)
    from flopwise.catalog.models import windowed_layers
    from flopwise.plan.finetune import split_of, summary_rows
    from flopwise.plan.planner import gradient_dtype

    tuned = split_of(spec)
    if tuned is not None:
        table("Fine-tune", summary_rows(tuned, result.memory, gradient_dtype(spec, result.memory.fits_with)))
    unit = f.unit
    table("FLOPs", [
        (f"N for 6N (active non-embedding + head)", _count(f.matmul_params)),
        (f"model FLOPs / {unit} ({'4N + 6·adapters' if tuned else '6N'} + attention)", f"{f.model_per_unit:.4g}"),
        ("  of which attention (12·L·s·d)" + (" and SSD scans (21·d·N per Mamba layer)"
                                              if spec.model.hybrid_pattern else "")
         + (f", {windowed_layers(spec.model)} layers windowed to {spec.model.sliding_window} keys"
            if windowed_layers(spec.model) else ""), f"{f.attention_per_unit:.4g}"),
        (f"hardware FLOPs / {unit} (with recompute)", f"{f.hardware_per_unit:.4g}"),
        (f"{unit}s", _count(f.units)),
        ("model FLOPs, whole job", f"{f.model_total:.4g}"),
        ("PF-days", f"{f.pf_days:,.1f}"),
    ])
    verdict = "[green]fits[/green]" if m.fits else "[red]does NOT fit[/red]"
    if m.verdict == "tight":
        with_ = f" with {', '.join(m.fits_with)}" if m.fits_with else ""
        verdict = (f"[yellow]tight{with_}: {m.allocated_bytes / m.capacity_bytes - 1:.0%} over the usable memory, within "
                   f"the forecast's ± {m.band:.0%} (may fit)[/yellow]")
    if m.fits and m.fits_with:
        verdict = f"[green]fits with {', '.join(m.fits_with)}[/green]"
    where = f"stage {m.worst_stage} of {lay.pp}, " if lay.pp > 1 else ""
    conventions = f"{spec.stack} stack" if spec.stack != "flopwise" else f"{lay.framework} conventions"
    table(f"Memory per device ({where}{conventions}; {verdict})", [
        ("weights" + (" (frozen base + adapters)" if tuned else ""), _gib(m.weights)), ("gradients", _gib(m.gradients)),
        ("optimizer states", _gib(m.optimizer_states)), ("fp32 master weights", _gib(m.master_weights)),
        (f"activations ({m.inflight_layers:g} layer-micro-batches)", _gib(m.activations)),
        ("final norm + head inputs, logits" + (" (kept for backward)" if tuned else ""), _gib(m.logits)),
        ("communication buffers" + (" + dequantised weight" if tuned and tuned.method == "qlora" else "")
         + (" + loss's transient logits" if tuned else ""), _gib(m.comm_buffers)),
        *([("fp8 weight copies" if spec.workload.precision == "fp8" else "autocast weight copies",
            _gib(m.fp8_buffers))] if m.fp8_buffers else []),
        ("allocated", _gib(m.allocated_bytes)),
        (f"allocator reserve ({spec.cluster.allocator_reserve:.0%} of per-step allocations)", _gib(m.allocator_reserve)),
        ("[bold]total (reserved)[/bold]", f"[bold]{_gib(m.total_bytes)}[/bold]"),
        (f"usable (of {_gib(m.device_bytes)}, reserve {spec.cluster.memory_reserve_gib:g} GiB)", _gib(m.capacity_bytes)),
        ("offloaded to CPU", _gib(m.cpu_offload_bytes)),
    ])
    table("Time", [
        ("peak (dense)", f"{tm.peak_flops / 1e12:,.1f} TFLOP/s"),
        ("efficiency (HFU)", f"{tm.efficiency:.1%} ({tm.efficiency_confidence} confidence)"),
        ("compute / step", _duration(tm.compute_seconds)),
        ("  GEMMs / attention / memory-bound / optimizer",
         " / ".join(_duration(x) for x in (tm.gemm_seconds, tm.attention_seconds, tm.memory_bound_seconds,
                                           tm.optimizer_seconds))),
        ("pipeline bubble" + (f" (layers per stage {tm.stage_layers})" if spec.layout.pp > 1 else ""),
         f"{tm.bubble_fraction:.1%}"),
        (f"exposed comm / step (DP {c.dp_link}, {gradient_dtype(spec, m.fits_with)} gradients; TP {c.tp_link})",
         f"{_duration(tm.exposed_comm_seconds)} ({tm.exposed_comm_share:.0%} of the step; "
         f"TP {_duration(tm.tp_exposed_seconds)}, DP {_duration(tm.dp_exposed_seconds)}, "
         f"PP {_duration(tm.pp_exposed_seconds)}"
         + (f", CP {_duration(tm.cp_exposed_seconds)}" if spec.layout.cp > 1 else "")
         + (f", EP {'DeepEP' if spec.layout.moe_dispatcher == 'deepep' else 'all-to-all'} "
            f"{_duration(tm.ep_exposed_seconds)}" if spec.layout.ep > 1 else "") + ")"),
        *([("host copies / step (offload, not hidden)", _duration(tm.offload_seconds))] if tm.offload_seconds else []),
        ("step", _duration(tm.step_seconds)),
        (f"{unit}s / s", f"{tm.tokens_per_second:,.0f} ({tm.tokens_per_second_per_device:,.0f} per device)"),
        *([("expected error (validated)", result.band.describe())] if result.band is not None else []),
        ("MFU" + (" (of the fp8 peak, as Composer counts)" if tm.mfu_16bit_peak is not None else ""), f"{tm.mfu:.1%}"),
        *([("MFU of the 16-bit peak (as torchtitan counts)", f"{tm.mfu_16bit_peak:.1%}")]
          if tm.mfu_16bit_peak is not None else []),
        ("steps", f"{tm.steps:,.0f}"),
        ("whole job", _duration(tm.total_seconds)),
        ("device-hours", f"{tm.device_hours:,.0f}"),
        *_interruption_rows(result.interruptions),
    ])
    if lay.pp > 1:
        from flopwise.plan.stage_memory import every_stage_memory

        table("Memory per pipeline stage", [
            (f"stage {st.stage} ({st.layers} layers{', embedding' if st.stage == 0 else ''}"
             f"{', head' if st.stage == lay.pp - 1 else ''})", _gib(st.total_bytes)) for st in every_stage_memory(spec)
        ])
    e, cost = result.energy, result.cost
    table("Energy and cost", [
        ("energy (TDP x hours x PUE)", "unknown" if e.kwh is None else f"{e.kwh / 1000:,.1f} MWh at {e.watts_per_device:g} W, PUE {e.pue:g}"),
        ("CO2 (0.385 t/MWh)", "unknown" if e.tco2e is None else f"{e.tco2e:,.1f} t"),
        ("on-demand", "n/a" if cost.on_demand_usd is None else f"${cost.on_demand_usd:,.0f} (${cost.on_demand_usd_per_device_hour:g}/h)"),
        ("spot", "n/a" if cost.spot_usd is None else f"${cost.spot_usd:,.0f} (${cost.spot_usd_per_device_hour:g}/h)"),
        ("price source", cost.price_source or cost.note),
    ])
    from flopwise.plan.facility import estimate_facility

    fac = estimate_facility(spec)
    if fac.node_watts is not None:
        cooling = "[red]above[/red]" if fac.exceeds_air_cooling else "within"
        table("Facility (at TDP)", [
            (f"per node ({fac.devices_per_node} devices + host, {fac.host_overhead_fraction:.0%} overhead)",
             f"{fac.node_watts / 1000:,.1f} kW"),
            (f"per rack ({fac.nodes_per_rack} nodes)", f"{fac.rack_kw:,.1f} kW, {cooling} air cooling"),
            (f"cluster ({fac.nodes} nodes, {fac.racks} racks)", f"{fac.cluster_watts / 1000:,.1f} kW"),
            ("air-cooling limit", fac.air_cooling_source),
        ])
    if cost.price_source and "does not pay" in cost.note:
        console.print(f"[yellow]note:[/yellow] {cost.note.split('; ', 1)[1]}")
    console.print(f"[dim]efficiency source: {tm.efficiency_source}[/dim]")
    console.print("[dim]assumptions: 6N + 12·L·s·d FLOPs/token (no causal halving); time from an operator "
                  "model (shape-aware GEMM curves, memory-bound ops, hierarchical collectives at nccl-tests "
                  "bus bandwidths, DP overlapped with the last backward); activations per Korthikanti et al. "
                  "2022; energy at TDP. See docs/planner.md.[/dim]")
    for line in spec.cluster.extra.get("defaults", ()):
        console.print(f"[bold]default:[/bold] {line}")
    for line in result.warnings:
        console.print(f"[yellow]warning:[/yellow] {line}")
    for line in result.advice:
        console.print(f"[bold]advice:[/bold] {line}")
