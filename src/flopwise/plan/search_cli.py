"""Output of `flopwise plan --search` and `flopwise plan --spot` (the options live on `plan`).

Kept apart from `commands.py` so the single-plan command stays short; rich is imported
only when a table is printed.
"""

from __future__ import annotations

import json
from typing import Callable

from flopwise.errors import UserError
from flopwise.plan.planner import GIB, Plan, RunSpec, plan
from flopwise.plan.preemption import SpotEstimate, estimate_spot
from flopwise.plan.search import (
    REASONS, SearchResult, above_published, nothing_fits_message, published_mfu_ceiling, search_layouts,
)


def run_search_and_spot(
    spec: RunSpec,
    devices: int,
    search: bool,
    objective: str,
    top: int,
    spot: bool,
    preemptions_per_day: float | None,
    checkpoint_seconds: float | None,
    restart_seconds: float,
    spot_price_per_hour: float | None,
    as_json: bool,
    host_memory_gib: float | None = None,
    show_plan: Callable[[Plan], None] = print,
    profile=None,
    sequence_parallel: bool = True,
) -> None:
    """Search layouts (or take the given one), then optionally plan spot vs on-demand; print or emit JSON.

    `host_memory_gib` is RAM per node, shared by the node's devices, for offloaded states;
    `show_plan` prints the one plan when there is no search (the caller's table, so this
    module need not import the command that calls it); `profile`, a measured device profile
    (`--profile`), times every layout instead of the family curve; `sequence_parallel=False`
    (`--no-sequence-parallel`) searches layouts without it."""
    result = None
    if search:
        host = None
        if host_memory_gib is not None:
            if host_memory_gib <= 0:
                raise UserError(f"--host-memory-gib must be > 0, got {host_memory_gib}")
            per_node = spec.cluster.devices_per_node or spec.cluster.hardware.devices_per_node or 8
            host = host_memory_gib / min(devices, per_node)
        result = search_layouts(spec, devices, objective=objective, top=top, host_memory_per_device_gib=host,
                                profile=profile, sequence_parallel=sequence_parallel)
        if result.best is None:
            raise UserError(nothing_fits_message(result, host_memory_per_device_gib=host))
        chosen = result.best
    else:
        chosen = plan(spec, profile=profile)
    spot_estimate = None
    if spot:
        spot_estimate = spot_for(chosen, preemptions_per_day, checkpoint_seconds, restart_seconds, spot_price_per_hour)
    if as_json:
        out = result.to_dict() if result is not None else {"plan": chosen.to_dict()}
        if spot_estimate is not None:
            out["spot"] = spot_estimate.to_dict()
        print(json.dumps(out, indent=2, allow_nan=False, default=str))
        return
    if result is not None:
        print_search(result)
    else:
        show_plan(chosen)
    if spot_estimate is not None:
        print_spot(spot_estimate, chosen)


def spot_for(chosen: Plan, preemptions_per_day: float | None, checkpoint_seconds: float | None,
             restart_seconds: float, spot_price_per_hour: float | None) -> SpotEstimate:
    """Spot vs on-demand for one plan, with catalog prices unless overridden."""
    if preemptions_per_day is None or checkpoint_seconds is None:
        raise UserError("--spot needs --preemptions-per-day and --checkpoint-seconds (and optionally --restart-seconds)")
    hw = chosen.spec.cluster.hardware
    on_demand = chosen.cost.on_demand_usd_per_device_hour
    spot_price = spot_price_per_hour if spot_price_per_hour is not None else chosen.cost.spot_usd_per_device_hour
    if spot_price is None:
        raise UserError(f"--spot: no spot price for {hw.key} in the catalog; pass --spot-price-per-hour")
    if spot_price < 0:
        raise UserError(f"--spot-price-per-hour must be >= 0, got {spot_price}")
    if on_demand is None:
        raise UserError(f"--spot: no on-demand price for {hw.key} in the catalog; pass --price-per-hour")
    return estimate_spot(chosen.time.total_seconds, chosen.spec.layout.devices, preemptions_per_day,
                         checkpoint_seconds, restart_seconds, on_demand, spot_price)


def _duration(seconds: float) -> str:
    if seconds >= 86_400:
        return f"{seconds / 86_400:,.2f} d"
    if seconds >= 3600:
        return f"{seconds / 3600:,.2f} h"
    if seconds >= 60:
        return f"{seconds / 60:,.1f} min"
    return f"{seconds:,.2f} s"


def print_search(result: SearchResult) -> None:
    """The ranked layouts as a table, then what was evaluated and why the rest were rejected."""
    from rich.console import Console

    from flopwise.table_layout import print_first_that_fits

    console = Console()
    spec = result.base
    tight = sum(p.memory.verdict == "tight" for p in result.ranked)
    fit = len(result.ranked) - tight
    hw = spec.cluster.hardware
    console.print(f"[bold]{spec.model.name or spec.model.key}[/bold] on {result.devices} x {hw.name or hw.key}: "
                  f"{spec.workload.precision}, {spec.workload.optimizer}, seq {spec.workload.seq_len}, "
                  f"global batch {result.global_batch} sequences"
                  f"{f', context parallel {spec.layout.cp}' if spec.layout.cp > 1 else ''}"
                  f"{f', expert parallel {spec.layout.ep}' if spec.layout.ep > 1 else ''}; "
                  + (f"best {fit} by {result.objective}" + (f", then {tight} tight (may not fit)" if tight else "")
                     if fit else f"none fits outright; best {tight} tight (may not fit) by {result.objective}"))
    rows = [_search_row(i, p) for i, p in enumerate(result.ranked, 1)]
    layout_columns = SEARCH_COLUMNS[:11]
    time_columns = ("#", *SEARCH_COLUMNS[11:17])
    cost_columns = ("#", *SEARCH_COLUMNS[17:])
    # one wide table when the terminal holds it; else the layouts, their time, then their cost, by rank (#)
    print_first_that_fits(
        console,
        _search_table(SEARCH_COLUMNS, rows),
        [_search_table(layout_columns, rows, "layouts (CPU: GiB offloaded per device)"),
         _search_table(time_columns, rows, "time of the same layouts (#)"),
         _search_table(cost_columns, rows, "job length, cost and energy of the same layouts (#)")],
    )
    ceiling = published_mfu_ceiling(result.ranked[0]) if result.ranked else None
    if ceiling and any(above_published(p) for p in result.ranked):
        console.print(f"[yellow]! MFU above the best published run on this device class ({ceiling[0]:.1%}, "
                      f"{ceiling[1]}): treat as optimistic[/yellow]")
    for i, p in enumerate(result.ranked, 1):
        m = p.memory
        if m.verdict == "tight":  # kept, after those that fit: within the memory forecast's own error
            console.print(f"[yellow]#{i} tight: {m.allocated_bytes / GIB:.1f} GiB allocated ({m.total_bytes / GIB:.1f} "
                          f"with the allocator's reserve) of {m.capacity_bytes / GIB:.1f} GiB usable, within the memory forecast's ± {m.band:.0%}: may fit, may run out of "
                          "memory[/yellow]")
        elif m.fits_with:  # the stack's own memory options the fit relies on (plan/stacks)
            console.print(f"#{i} fits with {', '.join(m.fits_with)} ({p.spec.stack})")
    console.print(f"layouts evaluated: {result.evaluated:,} (memory), {result.timed:,} timed; "
                  f"{result.fitting:,} fit or are tight")
    for key, count in result.rejected.items():
        unit = "(tp, pp) splits" if key in ("tp_heads", "tp_node", "pp_layers", "dp_batch") else "layouts"
        console.print(f"rejected: {count:,} {unit}: {REASONS[key]}")
    for note in result.notes:
        console.print(f"[dim]{note}[/dim]")
    without_sp = any(p.spec.layout.tp > 1 and not p.spec.layout.sequence_parallel for p in result.ranked)
    sp_note = "sequence parallelism off (--no-sequence-parallel)" if without_sp else "sequence parallelism is on with every tp > 1"
    from flopwise.plan.activation_offload import host_bytes_per_second

    link = host_bytes_per_second(result.ranked[0].spec.cluster.hardware) / 1e9 if result.ranked else None
    copies = f"copies over the device's host link ({link:.0f} GB/s)" if link else "host-link copies"
    console.print(f"[dim]GiB: planned peak with the allocator's reserve; CPU GiB: states offloaded per device (host memory checked only with --host-memory-gib); {sp_note}; variants scoring the same that differ only in "
                  f"ZeRO stage or offload are shown once (the simplest); offload is timed as {copies} and "
                  "a CPU Adam step at 1e9 parameters/s (assumptions), and ties prefer no offload. ± is the expected error validated on published runs of the regime, ? where it "
                  "extrapolates (docs/validation.md). intl: interleaved; optim: optimizer. `--json` lists each layout's full "
                  "plan.[/dim]")


SEARCH_COLUMNS = ("#", "dp", "tp", "pp", "mbs x acc", "ZeRO", "recompute", "offload", "schedule", "GiB", "CPU GiB",
                  "step", "bubble", "comm", "comm %", "tok/s/dev", "MFU", "±", "job", "on-demand $", "MWh")


def band_cell(p) -> str:
    """The plan's expected error (plan/band.py), '?' marking a regime never validated."""
    if p.band is None or p.band.expected_error != p.band.expected_error:
        return "?"
    return f"{100 * p.band.expected_error:.0f}%" + ("?" if p.band.extrapolates else "")


def _search_row(i: int, p) -> dict[str, str]:
    lay, tm = p.spec.layout, p.time
    sched = "-" if lay.pp == 1 else lay.pipeline_schedule + (f" v{lay.virtual_stages}" if lay.pipeline_schedule == "interleaved" else "")
    cells = (
        str(i), str(lay.dp), str(lay.tp) + ("+SP" if lay.sequence_parallel else ""), str(lay.pp),
        f"{lay.micro_batch_size} x {lay.grad_accum}", str(lay.zero_stage), lay.recompute, lay.offload, sched,
        f"{p.memory.total_bytes / 2**30:,.1f}", f"{p.memory.cpu_offload_bytes / 2**30:,.0f}", _duration(tm.step_seconds),
        f"{tm.bubble_fraction:.1%}", _duration(tm.exposed_comm_seconds), f"{tm.exposed_comm_share:.0%}",
        f"{tm.tokens_per_second_per_device:,.0f}", f"{tm.mfu:.1%}" + (" !" if above_published(p) else ""),
        band_cell(p), _duration(tm.total_seconds),
        "n/a" if p.cost.on_demand_usd is None else f"{p.cost.on_demand_usd:,.0f}",
        "n/a" if p.energy.kwh is None else f"{p.energy.kwh / 1000:,.2f}",
    )
    return dict(zip(SEARCH_COLUMNS, cells))


COMPACT_HEADERS = {"mbs x acc": "mbs×acc", "CPU GiB": "CPU"}
COMPACT_CELLS = (("interleaved", "intl"), ("optimizer", "optim"))
"""Long cell values shortened in the folded (80-column) tables; the footnote spells them out."""


def _compact(cell: str) -> str:
    for long, short in COMPACT_CELLS:
        cell = cell.replace(long, short)
    return cell


def _search_table(columns, rows: list[dict[str, str]], title: str | None = None):
    """All rows over `columns`; with a title it is one part of a folded (narrow) layout, drawn compactly."""
    from rich import box
    from rich.table import Table

    if title is None:
        table = Table(show_lines=False)
    else:
        table = Table(show_lines=False, title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                      collapse_padding=True)
    for column in columns:
        table.add_column(COMPACT_HEADERS.get(column, column) if title else column, justify="right", no_wrap=True)
    for row in rows:
        table.add_row(*((_compact(row[c]) if title else row[c]) for c in columns))
    return table


def print_spot(estimate: SpotEstimate, chosen: Plan) -> None:
    """Checkpoint interval, expected overheads, time and cost on spot vs on demand, and the verdict."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    e = estimate
    table = Table(title=f"Spot vs on-demand ({e.devices} x {chosen.spec.cluster.hardware.key}, "
                        f"{e.preemptions_per_day:g} preemptions/day)", title_justify="left", show_header=False)
    table.add_column(style="cyan")
    table.add_column(justify="right")
    rows = [
        ("mean time between preemptions", _duration(e.mtbf_seconds) if e.mtbf_seconds != float("inf") else "none"),
        ("checkpoint interval, Young 1974 sqrt(2CM)", _duration(e.young_interval_seconds)),
        ("checkpoint interval, Daly 2006 (used)", _duration(e.daly_interval_seconds)),
        ("expected preemptions", f"{e.expected_preemptions:,.1f}"),
        ("time writing checkpoints", _duration(e.checkpoint_overhead_seconds)),
        ("time restarting", _duration(e.restart_overhead_seconds)),
        ("work lost and redone", _duration(e.lost_work_seconds)),
        ("job on demand", _duration(e.on_demand_wall_seconds)),
        ("job on spot (expected)", _duration(e.spot_wall_seconds)),
        ("on-demand cost", f"${e.on_demand_usd:,.0f} (${e.on_demand_usd_per_device_hour:g}/device-h)"),
        ("spot cost (expected)", f"${e.spot_usd:,.0f} (${e.spot_usd_per_device_hour:g}/device-h)"),
        ("break-even preemption rate", _break_even_text(e)),
    ]
    for row in rows:
        table.add_row(*row)
    console.print(table)
    if chosen.cost.price_source and chosen.cost.price_source != "--price-per-hour":
        console.print(f"[dim]catalog prices: {chosen.cost.price_source}[/dim]")
    console.print(f"[bold]recommend {e.recommendation}[/bold]: {e.reason}")


def _break_even_text(e: SpotEstimate) -> str:
    if e.spot_usd_per_device_hour >= e.on_demand_usd_per_device_hour:
        return "none: spot costs more per hour than on demand"
    if e.break_even_preemptions_per_day is None:
        return "spot never breaks even"
    return f"{e.break_even_preemptions_per_day:,.2f} per day"

