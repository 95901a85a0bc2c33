"""CLI commands of flopwise.diagnose: `doctor`, `bench`, `calibrate` and `diagnose`.

Each command parses its options, calls one function of this package and renders the result as a rich table, or as JSON with `--json`.
torch and matplotlib are imported inside the commands that need them.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from flopwise.measure.commbench import DEFAULT_SIZES

STATUS_STYLE = {"ok": "green", "warn": "yellow", "fail": "red bold"}
SEVERITY_STYLE = {"info": "cyan", "warn": "yellow", "critical": "red bold"}
SHORT_LABELS = {
    "data_seconds": "data",
    "compute_seconds": "fwd+bwd",
    "sync_wait_seconds": "sync wait",
    "optimizer_seconds": "optim",
    "other_seconds": "other",
    "step_seconds": "step",
}


def register(app: typer.Typer) -> None:
    """Add this package's commands to the top-level app."""
    app.command("doctor")(doctor)
    app.command("bench")(bench)
    app.command("calibrate")(calibrate)
    app.command("diagnose")(diagnose)


def _console():
    from rich.console import Console

    return Console()


def doctor(
    as_json: Annotated[bool, typer.Option("--json", help="Print the checks as JSON.")] = False,
) -> None:
    """Check this machine for training: Python, torch build, GPUs and driver, NCCL, backends, packages, env."""
    from flopwise.diagnose.doctor import has_failures, run_checks

    checks = run_checks()
    if as_json:
        summary = {s: sum(c.status == s for c in checks) for s in ("ok", "warn", "fail")}
        print(json.dumps({"checks": [c.to_dict() for c in checks], "summary": summary}, indent=2))
    else:
        from rich.table import Table

        table = Table(title="flopwise doctor", show_lines=False)
        for col in ("check", "status", "found", "fix"):
            table.add_column(col, overflow="fold")
        for c in checks:
            style = STATUS_STYLE[c.status]
            table.add_row(c.name, f"[{style}]{c.status}[/]", c.value, c.fix)
        _console().print(table)
    if has_failures(checks):
        raise typer.Exit(1)


def bench(
    op: Annotated[str, typer.Option("--op", help="all_reduce, all_gather, reduce_scatter, broadcast, a comma list, or all.")] = "all_reduce",
    sizes: Annotated[str, typer.Option("--sizes", help="Message sizes (whole array, nccl-tests convention), e.g. 1K,1M,64M.")] = DEFAULT_SIZES,
    nproc: Annotated[Optional[int], typer.Option("--nproc", help="Processes to start (default: number of GPUs, or 2 on CPU).")] = None,
    iters: Annotated[int, typer.Option("--iters", help="Timed calls per size.")] = 20,
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed calls per size before timing.")] = 5,
    backend: Annotated[str, typer.Option("--backend", help="auto (nccl with GPUs, else gloo), gloo or nccl.")] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    out: Annotated[Optional[Path], typer.Option("--out", help="Also write the JSON result to this file.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", hidden=True, help="Print nothing (used by the launcher).")] = False,
) -> None:
    """Time collectives (latency, algbw, busbw per size and rank) and show where bandwidth saturates."""
    from flopwise.measure.commbench import parse_ops, parse_sizes, run_bench

    ops, size_list = parse_ops(op), parse_sizes(sizes)
    if nproc is None:
        import torch

        nproc = max(2, torch.cuda.device_count()) if torch.cuda.is_available() else 2
    result = run_bench(ops, size_list, nproc, iters, warmup, backend)
    if result is None:  # a rank other than 0 inside a launch
        return
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2))
    if quiet:
        return
    if as_json:
        print(json.dumps(result, indent=2))
        return
    _render_bench(result, out)


def _render_bench(result: dict, out: Optional[Path]) -> None:
    from rich.table import Table

    from flopwise.measure.commbench import format_size

    console = _console()
    table = Table(
        title=f"{result['backend']} collectives, {result['world_size']} ranks, float32, "
        f"{result['iters']} iters after {result['warmup']} warm-up"
    )
    for col in ("op", "size", "time (us)", "algbw GB/s", "busbw GB/s", "per-rank time (us)"):
        table.add_column(col, justify="left" if col in ("op", "per-rank time (us)") else "right")
    for r in result["results"]:
        table.add_row(
            r["op"],
            format_size(r["size_bytes"]),
            f"{r['latency_seconds'] * 1e6:,.1f}",
            f"{r['algbw_gb_per_s']:.3f}",
            f"{r['busbw_gb_per_s']:.3f}",
            " ".join(f"{t * 1e6:,.0f}" for t in r["per_rank_seconds"]),
        )
    console.print(table)
    console.print("busbw follows nccl-tests (doc/PERFORMANCE.md): algbw x 2(n-1)/n all_reduce, (n-1)/n all_gather/reduce_scatter.")
    if result.get("saturation"):
        console.print(f"[bold]bucket size:[/] {result['saturation']['advice']}")
    for line in result.get("nccl_debug_transport") or []:
        console.print(f"NCCL: {line}")
    for note in result.get("notes", []):
        console.print(f"note: {note}")
    if out is not None:
        console.print(f"wrote {out}")


def calibrate(
    out: Annotated[Optional[Path], typer.Option("--out", help=r"Write the profile here. \[default: $XDG_CACHE_HOME/flopwise/profiles/<device>.json, ~/.cache when unset]")] = None,
    dtypes: Annotated[Optional[str], typer.Option("--dtypes", help=r"Comma list of fp32, tf32, bf16, fp16. \[default: fp32,bf16 on CPU; fp32,tf32,bf16,fp16 on CUDA]")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="A small grid and short timings (a few seconds).")] = False,
    threads: Annotated[Optional[int], typer.Option("--threads", help=r"torch threads per process. \[default: 1 when several processes run (OMP_NUM_THREADS if set), torch's in one]")] = None,
    nproc: Annotated[Optional[int], typer.Option("--nproc", help=r"Processes measuring at once, as training ranks run (also times collectives). \[default: on a CPU 2, `flopwise train`'s default launch, so the default training run reads this profile; 1 on a GPU]")] = None,
    report_to: Annotated[Optional[Path], typer.Option("--report", hidden=True, help="Write where the profile went (used by the launcher).")] = None,
) -> None:
    """Measure this device's GEMM speed per shape and dtype, memory bandwidth, collectives and (CPU) a step's other operators; write a profile for `plan --profile` and the trainer."""
    from flopwise.measure.calibrate import run_calibration

    result = run_calibration(out, dtypes, quick, threads, nproc)
    if result is not None and report_to is not None:
        report_to.write_text(json.dumps({"path": str(result.path),
                                         "previous": str(result.previous) if result.previous else None}))
    if result is None or report_to is not None:  # a rank inside the launch `--nproc` starts
        # gloo's threads can abort the interpreter's teardown ("terminate called without an
        # active exception", SIGABRT) after a clean destroy; the profile is written by now
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    from flopwise.plan.profile import busy_warning

    profile, path = result.profile, result.path
    console = _console()
    threads_text = f", {profile.threads} thread(s) per process" if profile.threads else ""
    console.print(f"device: {profile.device}, {profile.processes} process(es){threads_text}, torch {profile.torch_version}")
    from rich.table import Table

    table = Table(title="GEMM, achieved TFLOP/s (F.linear, median call)")
    for col in ("dtype", "shapes", "best", "at (M, N, K)", "smallest shape"):
        table.add_column(col, justify="left" if col == "dtype" else "right")
    for dtype in profile.dtypes():
        points = [p for p in profile.gemm if p.dtype == dtype]
        best = max(points, key=lambda p: p.flops_per_s)
        small = min(points, key=lambda p: p.m * p.n * p.k)
        table.add_row(dtype, str(len(points)), f"{best.flops_per_s / 1e12:.4f}", f"({best.m}, {best.n}, {best.k})",
                      f"{small.flops_per_s / 1e12:.4f} at ({small.m}, {small.n}, {small.k})")
    console.print(table)
    console.print(f"memory bandwidth (copy): {profile.memory_bandwidth_bytes_per_s / 1e9:,.1f} GB/s")
    if profile.kernel_overhead_seconds:
        console.print(f"one tiny operator: {profile.kernel_overhead_seconds * 1e6:,.1f} us")
    if profile.op_seconds_per_element:
        ops = ", ".join(f"{name} {seconds * 1e9:,.2f}" for name, seconds in profile.op_seconds_per_element.items())
        console.print(f"element-wise, forward + backward, ns per element (cross_entropy: per logit): {ops}")
    if profile.attention:
        best = max(profile.attention, key=lambda p: p.flops_per_s)
        console.print(f"fused attention, forward + backward: up to {best.flops_per_s / 1e9:,.1f} GFLOP/s "
                      f"({best.dtype}, sequence {best.seq}, head size {best.head_dim})")
    if profile.optimizer_seconds_per_param:
        steps = ", ".join(f"{name} {seconds * 1e9:,.2f} ns" for name, seconds in profile.optimizer_seconds_per_param.items())
        console.print(f"optimizer step with clipping, per parameter: {steps}")
    if profile.collective_bus_bytes_per_s:
        console.print(f"all_reduce bus bandwidth (best): {profile.collective_bus_bytes_per_s / 1e9:,.2f} GB/s")
    if profile.fsdp_unit_seconds:
        units = ", ".join(f"{seconds * 1e3:,.1f} ms at {size / 2**20:,.2f} MiB" for size, seconds in profile.fsdp_unit_seconds)
        console.print(f"one FSDP unit, forward + backward beyond its compute: {units}")
    for note in profile.notes:
        console.print(f"note: {note}")
    if profile.load_before is not None:
        console.print(f"machine load (1 min) while measuring: {profile.load_before:.2f} before, "
                      f"{profile.load_after:.2f} after, on {profile.cpu_count} core(s)")
    warning = busy_warning(profile)
    if warning:
        console.print(f"[yellow]{warning}[/]")
    if result.previous is not None:
        console.print(f"replaced the profile at {path}; the previous one is kept as {result.previous}")
    console.print(f"wrote {path}")


def diagnose(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by `flopwise train`.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the diagnosis as JSON.")] = False,
) -> None:
    """Find stragglers, data stalls, slow steps, loss trouble and plan misses in a run directory."""
    from flopwise.diagnose.analyze import COMPONENTS, diagnose_run_dir

    result = diagnose_run_dir(run_dir)
    if as_json:
        print(json.dumps(result.to_dict(), indent=2))
        return
    from flopwise.table_layout import print_first_that_fits

    console = _console()
    keys = [k for k in (*COMPONENTS, "other_seconds", "step_seconds") if all(k in b.median for b in result.breakdown)]
    # 80 columns cannot hold median/p90 pairs for 6 components: fold into a median and a p90 table
    print_first_that_fits(
        console,
        _breakdown_table(f"{run_dir}: step time per rank, ms (median/p90)", result.breakdown, keys,
                         lambda b, k: f"{b.median[k] * 1e3:.1f}/{b.p90[k] * 1e3:.1f}"),
        [_breakdown_table(f"{run_dir}: step time per rank, ms (median)", result.breakdown, keys,
                          lambda b, k: f"{b.median[k] * 1e3:.1f}", compact=True),
         _breakdown_table("the same, 90th percentile (p90), ms", result.breakdown, keys,
                          lambda b, k: f"{b.p90[k] * 1e3:.1f}", compact=True)],
    )
    if not result.findings:
        console.print("[green]No problems found[/]: no straggler, data stall, outlier step, loss spike or plan mismatch.")
    for f in result.findings:
        style = SEVERITY_STYLE[f.severity]
        console.print(f"[{style}]{f.severity}[/] {f.kind}: {f.message}")
        console.print(f"    next: {f.next_step}")
    for note in result.notes:
        console.print(f"note: {note}")
    if result.skipped_lines:
        console.print(f"note: {result.skipped_lines} unreadable metric line(s) skipped")


def _breakdown_table(title: str, breakdown, keys: list[str], cell, compact: bool = False):
    """One row per rank: each step-time component as `cell(rank_breakdown, key)`, then tokens/s."""
    from rich import box
    from rich.table import Table

    table = Table(title=title, box=box.SIMPLE_HEAD if compact else box.HEAVY_HEAD, pad_edge=not compact)
    table.add_column("rank", justify="right", no_wrap=True)
    for k in keys:
        table.add_column(SHORT_LABELS[k], justify="right", no_wrap=True)
    table.add_column("tokens/s", justify="right", no_wrap=True)
    for b in breakdown:
        table.add_row(str(b.rank), *(cell(b, k) for k in keys),
                      f"{b.tokens_per_second:,.0f}" if b.tokens_per_second else "n/a")
    return table
