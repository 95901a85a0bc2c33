"""CLI commands of flopwise.plan (registered by flopwise.cli): `flopwise plan`.

Imports stay inside the command so `flopwise --help` does not load the planner, and rich
is imported only when a table is printed.
"""

from __future__ import annotations

from typing import Optional

import typer

from flopwise.plan import compare_cli


def register(app: typer.Typer) -> None:
    """Add `plan` and `compare` to the top-level app."""
    app.command(name="plan")(plan_command)
    compare_cli.register(app)


def plan_command(
    model: Optional[str] = typer.Option(None, "--model", help="Catalog key (see `flopwise models`) or a config.json path. [default: llama2-7b]"),
    hardware: Optional[str] = typer.Option(None, "--hardware", help="Catalog key (see `flopwise hardware`). [default: h100-sxm]"),
    gpus: Optional[int] = typer.Option(None, "--gpus", help="Devices in all. [default: 8, or dp*tp*pp]"),
    dp: Optional[int] = typer.Option(None, "--dp", help="Data-parallel size. [default: gpus/(tp*pp)]"),
    tp: Optional[int] = typer.Option(None, "--tp", help="Tensor-parallel size. [default: 1]"),
    pp: Optional[int] = typer.Option(None, "--pp", help="Pipeline-parallel stages. [default: 1]"),
    micro_batch: Optional[int] = typer.Option(None, "--micro-batch", help="Sequences per device per micro-step. [default: 1]"),
    global_batch: Optional[int] = typer.Option(None, "--global-batch", help="Sequences per optimizer step."),
    batch_tokens: Optional[str] = typer.Option(None, "--batch-tokens", help="Tokens per optimizer step, e.g. 4M. [default: 4Mi]"),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", help="Training sequence length. [default: the model's]"),
    tokens: Optional[str] = typer.Option(None, "--tokens", help="Tokens (CNN: samples) to train on: 300B, 1.4T, 2e12. [default: 2T]"),
    precision: Optional[str] = typer.Option(None, "--precision", help="bf16|fp16|fp32|tf32|fp8. [default: bf16]"),
    optimizer: Optional[str] = typer.Option(None, "--optimizer", help="adamw|sgd|adam8bit. [default: adamw]"),
    zero: Optional[int] = typer.Option(None, "--zero", help="ZeRO stage 0-3 over data parallel (FSDP = 3). [default: 3 for pure DP, 1 with TP/PP, 0 without DP]"),
    recompute: str = typer.Option("none", "--recompute", help="none|selective|full activation recompute."),
    offload: str = typer.Option("none", "--offload", help="none|optimizer|params (params needs --zero 3)."),
    schedule: str = typer.Option("1f1b", "--schedule", help="Pipeline schedule: 1f1b|gpipe|interleaved."),
    virtual_stages: Optional[int] = typer.Option(None, "--virtual-stages", help="Interleaved: model chunks per device. [default: 2]"),
    sequence_parallel: bool = typer.Option(False, "--sequence-parallel", help="Megatron sequence parallelism with TP."),
    no_flash_attention: bool = typer.Option(False, "--no-flash-attention", help="Keep the s x s attention scores (no flash attention)."),
    dropout: bool = typer.Option(False, "--dropout", help="Count dropout masks in activation memory."),
    efficiency: Optional[float] = typer.Option(None, "--efficiency", help="Achieved fraction of peak (overrides calibration)."),
    price_per_hour: Optional[float] = typer.Option(None, "--price-per-hour", help="USD per device-hour (overrides the catalog)."),
    pue: float = typer.Option(1.1, "--pue", help="Data-centre power usage effectiveness."),
    calibrate: Optional[str] = typer.Option(None, "--calibrate", help="Run dir whose predicted_vs_measured.json MFU becomes the efficiency."),
    memory_reserve_gib: float = typer.Option(2.0, "--memory-reserve-gib", help="Device memory kept back (context, fragmentation)."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
    search: bool = typer.Option(False, "--search", help="Search every layout for --gpus devices and rank those that fit."),
    objective: str = typer.Option("time", "--objective", help="--search ranks by time|cost|energy."),
    top: int = typer.Option(5, "--top", help="--search shows this many layouts."),
    spot: bool = typer.Option(False, "--spot", help="Plan spot instances: checkpoint interval, expected time and cost."),
    preemptions_per_day: Optional[float] = typer.Option(None, "--preemptions-per-day", help="--spot: job interruptions per day."),
    checkpoint_seconds: Optional[float] = typer.Option(None, "--checkpoint-seconds", help="--spot: seconds to write one checkpoint."),
    restart_seconds: float = typer.Option(0.0, "--restart-seconds", help="--spot: seconds from preemption to training again."),
    spot_price_per_hour: Optional[float] = typer.Option(None, "--spot-price-per-hour", help="--spot: USD per device-hour (overrides the catalog)."),
    host_memory_gib: Optional[float] = typer.Option(None, "--host-memory-gib", help="--search: host RAM per node for offloaded states. [default: unchecked]"),
    profile: Optional[str] = typer.Option(None, "--profile", help="Device profile from `flopwise calibrate`: GEMM efficiency from measured rates (a CPU profile with no --hardware plans that CPU)."),
) -> None:
    """Predict FLOPs, memory, time, energy and cost of a training run (no GPU needed).

    With no options: Llama 2 7B on 8 x H100 SXM, bf16, AdamW, ZeRO-3, 4096-token
    sequences, 4M-token batches, 2T tokens.
    """
    from flopwise.plan.planner import build_runspec, plan

    devices = gpus or ((dp * (tp or 1) * (pp or 1)) if dp else 8)
    if search:  # the search picks the layout; one device keeps the global batch exactly as asked
        gpus, dp, tp, pp, zero, micro_batch = 1, None, None, None, None, None
    spec = build_runspec(
        model=model, hardware=hardware, gpus=gpus, dp=dp, tp=tp, pp=pp, micro_batch=micro_batch,
        global_batch=global_batch, batch_tokens=batch_tokens, seq_len=seq_len, tokens=tokens,
        precision=precision, optimizer=optimizer, zero=zero, recompute=recompute, offload=offload,
        schedule=schedule, virtual_stages=virtual_stages, sequence_parallel=sequence_parallel,
        flash_attention=not no_flash_attention, dropout=dropout, efficiency=efficiency,
        price_per_hour=price_per_hour, pue=pue, calibrate=calibrate, memory_reserve_gib=memory_reserve_gib,
    )
    if search or spot:
        from flopwise.plan.search_cli import run_search_and_spot

        return run_search_and_spot(spec, devices, search, objective, top, spot, preemptions_per_day,
                                   checkpoint_seconds, restart_seconds, spot_price_per_hour, as_json, host_memory_gib)
    measured = None
    if profile is not None:
        spec, measured = _with_profile(spec, profile, hardware is None)
    result = plan(spec, profile=measured)
    if as_json:
        import json

        print(json.dumps(result.to_dict(), indent=2, allow_nan=False, default=str))
        return
    print_plan(result)


def _with_profile(spec, path: str, hardware_defaulted: bool):
    """(spec, profile): a CPU profile with no --hardware becomes the device; a profile measured on
    another device than --hardware is used anyway, with a warning."""
    import dataclasses

    from flopwise.plan.planner import validate
    from flopwise.plan.profile import hardware_from_profile, load_profile

    measured = load_profile(path)
    cluster = spec.cluster
    if measured.device_kind == "cpu" and hardware_defaulted:
        cluster = dataclasses.replace(cluster, hardware=hardware_from_profile(measured))
    else:
        hw = cluster.hardware
        words = {w for w in measured.device.lower().replace("-", " ").split() if any(c.isdigit() for c in w)}
        if not any(part in words for part in hw.key.split("-")):
            warnings = tuple(cluster.extra.get("warnings", ())) + (
                f"--profile was measured on {measured.device}, not {hw.key}; its GEMM rates are used anyway",)
            cluster = dataclasses.replace(cluster, extra={**cluster.extra, "warnings": warnings})
    spec = dataclasses.replace(spec, cluster=cluster)
    validate(spec)
    return spec, measured


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


def print_plan(result) -> None:
    """Print a Plan as rich tables: parameters, FLOPs, memory, time, energy and cost."""
    from rich.console import Console
    from rich.table import Table

    spec, lay, work = result.spec, result.spec.layout, result.spec.workload
    hw = spec.cluster.hardware
    console = Console()
    console.print(
        f"[bold]{spec.model.name or spec.model.key}[/bold] on {lay.devices} x {hw.name or hw.key} "
        f"(dp {lay.dp}, tp {lay.tp}, pp {lay.pp}); {work.precision}, {work.optimizer}, ZeRO-{lay.zero_stage}, "
        f"recompute {lay.recompute}, offload {lay.offload}; micro-batch {lay.micro_batch_size} x accum "
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
    unit = f.unit
    table("FLOPs", [
        (f"N for 6N (active non-embedding + head)", _count(f.matmul_params)),
        (f"model FLOPs / {unit} (6N + attention)", f"{f.model_per_unit:.4g}"),
        (f"  of which attention (12·L·s·d)", f"{f.attention_per_unit:.4g}"),
        (f"hardware FLOPs / {unit} (with recompute)", f"{f.hardware_per_unit:.4g}"),
        (f"{unit}s", _count(f.units)),
        ("model FLOPs, whole job", f"{f.model_total:.4g}"),
        ("PF-days", f"{f.pf_days:,.1f}"),
    ])
    verdict = "[green]fits[/green]" if m.fits else "[red]does NOT fit[/red]"
    table(f"Memory per device ({verdict})", [
        ("weights", _gib(m.weights)), ("gradients", _gib(m.gradients)),
        ("optimizer states", _gib(m.optimizer_states)), ("fp32 master weights", _gib(m.master_weights)),
        (f"activations ({m.inflight_layers:g} layer-micro-batches)", _gib(m.activations)),
        ("final norm + head inputs, logits", _gib(m.logits)), ("communication buffers", _gib(m.comm_buffers)),
        ("[bold]total[/bold]", f"[bold]{_gib(m.total_bytes)}[/bold]"),
        (f"usable (of {_gib(m.device_bytes)}, reserve {spec.cluster.memory_reserve_gib:g} GiB)", _gib(m.capacity_bytes)),
        ("offloaded to CPU", _gib(m.cpu_offload_bytes)),
    ])
    table("Time", [
        ("peak (dense)", f"{tm.peak_flops / 1e12:,.1f} TFLOP/s"),
        ("efficiency (HFU)", f"{tm.efficiency:.1%} ({tm.efficiency_confidence} confidence)"),
        ("compute / step", _duration(tm.compute_seconds)),
        ("pipeline bubble", f"{tm.bubble_fraction:.1%}"),
        (f"exposed comm / step (DP {c.dp_link}, TP {c.tp_link})", _duration(tm.exposed_comm_seconds)),
        ("step", _duration(tm.step_seconds)),
        (f"{unit}s / s", f"{tm.tokens_per_second:,.0f} ({tm.tokens_per_second_per_device:,.0f} per device)"),
        ("MFU", f"{tm.mfu:.1%}"),
        ("steps", f"{tm.steps:,.0f}"),
        ("whole job", _duration(tm.total_seconds)),
        ("device-hours", f"{tm.device_hours:,.0f}"),
    ])
    e, cost = result.energy, result.cost
    table("Energy and cost", [
        ("energy (TDP x hours x PUE)", "unknown" if e.kwh is None else f"{e.kwh / 1000:,.1f} MWh at {e.watts_per_device:g} W, PUE {e.pue:g}"),
        ("CO2 (0.385 t/MWh)", "unknown" if e.tco2e is None else f"{e.tco2e:,.1f} t"),
        ("on-demand", "n/a" if cost.on_demand_usd is None else f"${cost.on_demand_usd:,.0f} (${cost.on_demand_usd_per_device_hour:g}/h)"),
        ("spot", "n/a" if cost.spot_usd is None else f"${cost.spot_usd:,.0f} (${cost.spot_usd_per_device_hour:g}/h)"),
        ("price source", cost.price_source or cost.note),
    ])
    if cost.price_source and "does not pay" in cost.note:
        console.print(f"[yellow]note:[/yellow] {cost.note.split('; ', 1)[1]}")
    console.print(f"[dim]efficiency source: {tm.efficiency_source}[/dim]")
    console.print("[dim]assumptions: 6N + 12·L·s·d FLOPs/token (no causal halving); activations per "
                  "Korthikanti et al. 2022; ring collectives at 80% of link bandwidth; DP comm overlapped "
                  "with up to 80% of backward; energy at TDP. See docs/planner.md.[/dim]")
    for line in result.warnings:
        console.print(f"[yellow]warning:[/yellow] {line}")
    for line in result.advice:
        console.print(f"[bold]advice:[/bold] {line}")
