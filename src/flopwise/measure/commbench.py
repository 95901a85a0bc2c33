"""`flopwise bench`: time the collectives a training job depends on.

The seed article's first troubleshooting step is "check torch.distributed.all_reduce
time"; this measures it (and all_gather / reduce_scatter / broadcast, which FSDP and
ZeRO use) with real torch.distributed calls, the same way nccl-tests does, so the
figures compare with published nccl-tests numbers and with the hardware catalog.

Conventions (NVIDIA nccl-tests, doc/PERFORMANCE.md):
  * size S is the whole array: the all_reduce / broadcast buffer, the all_gather output,
    the reduce_scatter input (each rank holds S/n of the latter two);
  * time is the mean over `iters` timed calls after `warmup` untimed ones, averaged over ranks;
  * algbw = S / t;  busbw = algbw x 2(n-1)/n (all_reduce), x (n-1)/n (all_gather,
    reduce_scatter), x 1 (broadcast). busbw is comparable with the link's peak bandwidth
    whatever the number of ranks.

It starts torchrun itself (`--standalone`, one node), or, when it already runs inside a
torchrun launch (RANK / WORLD_SIZE set), measures in place so a multi-node job can run
`torchrun --nnodes ... -m flopwise bench`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from flopwise.errors import UserError

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
DEFAULT_SIZES = "64K,256K,1M,2M,4M,8M,16M,64M"
SIZE_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30}
ELEMENT_BYTES = 4  # float32, nccl-tests' default type
SATURATION_FRACTION = 0.8
RANK_SPREAD_WARN = 0.25
RULE_OF_THUMB_BUCKET_MB = (2.0, 8.0)  # "AI大模型算力争夺战": "调整AllReduce分组大小（建议2MB-8MB）"
DDP_DEFAULT_BUCKET_MB = 25.0  # torch.nn.parallel.DistributedDataParallel bucket_cap_mb default


# --------------------------------------------------------------------------- arguments


def parse_size(text: str) -> int:
    """'64K' -> 65536 bytes; binary multiples, as nccl-tests' -b/-e flags."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?)(?:i?B)?\s*", text.upper())
    if not match:
        raise UserError(f"--sizes: {text!r} is not a size; use numbers with K, M or G, e.g. 1K,1M,64M")
    value = int(float(match.group(1)) * SIZE_UNITS[match.group(2)])
    if value <= 0:
        raise UserError(f"--sizes: {text!r} must be more than 0 bytes")
    return value


def parse_sizes(text: str) -> list[int]:
    """A comma list of sizes, sorted and without repeats."""
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise UserError("--sizes is empty; give e.g. 1K,1M,64M")
    return sorted({parse_size(p) for p in parts})


def parse_ops(text: str) -> list[str]:
    """'all' or a comma list of collective names."""
    if text.strip() == "all":
        return list(OPS)
    ops = [p.strip() for p in text.split(",") if p.strip()]
    bad = [op for op in ops if op not in OPS]
    if bad or not ops:
        raise UserError(f"--op: {', '.join(bad) or text!r} is not a collective; allowed: {', '.join(OPS)}, all")
    return ops


def format_size(n: float) -> str:
    """65536 -> '64K'."""
    for unit, factor in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= factor:
            value = n / factor
            return f"{value:g}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return f"{int(n)}B"


# --------------------------------------------------------------------------- arithmetic (nccl-tests)


def bus_bandwidth_factor(op: str, world_size: int) -> float:
    """busbw / algbw for a collective over n ranks (nccl-tests doc/PERFORMANCE.md, "Summary")."""
    n = world_size
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    if op == "broadcast":
        return 1.0
    raise ValueError(f"unknown collective {op!r}")


def element_count(op: str, size_bytes: int, world_size: int) -> int:
    """Elements of the whole array, rounded so each rank's share is whole (as nccl-tests rounds)."""
    count = max(1, size_bytes // ELEMENT_BYTES)
    if op in ("all_gather", "reduce_scatter"):
        count = max(world_size, count // world_size * world_size)
    return count


def summarize(op: str, size_bytes: int, world_size: int, per_rank_seconds: list[float]) -> dict:
    """One result row: latency (mean over ranks, as nccl-tests), algbw, busbw and the per-rank view."""
    mean = sum(per_rank_seconds) / len(per_rank_seconds)
    algbw = size_bytes / mean / 1e9 if mean > 0 else 0.0
    spread = (max(per_rank_seconds) - min(per_rank_seconds)) / mean if mean > 0 else 0.0
    return {
        "op": op,
        "size_bytes": size_bytes,
        "latency_seconds": mean,
        "max_rank_latency_seconds": max(per_rank_seconds),
        "algbw_gb_per_s": algbw,
        "busbw_gb_per_s": algbw * bus_bandwidth_factor(op, world_size),
        "per_rank_seconds": list(per_rank_seconds),
        "rank_spread": spread,
    }


def saturation(rows: list[dict], op: str = "all_reduce", fraction: float = SATURATION_FRACTION) -> dict | None:
    """Smallest message that reaches `fraction` of the best measured bus bandwidth for `op`.

    Gradient buckets below that size spend their time on per-call latency rather than on
    the link; this is where the common "AllReduce bucket 2-8 MB" rule of thumb comes from.
    """
    rows = sorted((r for r in rows if r["op"] == op), key=lambda r: r["size_bytes"])
    if len(rows) < 2:
        return None
    peak = max(r["busbw_gb_per_s"] for r in rows)
    first = next(r for r in rows if r["busbw_gb_per_s"] >= fraction * peak)
    saturated_in_range = first["size_bytes"] < rows[-1]["size_bytes"]
    size_mb = first["size_bytes"] / 2**20
    return {
        "op": op,
        "peak_busbw_gb_per_s": peak,
        "fraction": fraction,
        "saturation_size_bytes": first["size_bytes"],
        "saturated_within_sizes": saturated_in_range,
        "suggested_bucket_mb": max(1.0, round(size_mb, 1)) if saturated_in_range else None,
        "advice": bucket_advice(size_mb, peak, saturated_in_range, op),
    }


def bucket_advice(size_mb: float, peak: float, saturated_in_range: bool, op: str) -> str:
    """Plain-language reading of the saturation point against the 2-8 MB rule of thumb and DDP's 25 MB."""
    if not saturated_in_range:
        return (
            f"{op} bus bandwidth was still rising at the largest size ({format_size(size_mb * 2**20)}); "
            "measure larger sizes (e.g. --sizes 16M,64M,256M) before choosing a bucket size"
        )
    low, high = RULE_OF_THUMB_BUCKET_MB
    where = "inside" if low <= size_mb <= high else ("below" if size_mb < low else "above")
    return (
        f"{op} reaches {SATURATION_FRACTION:.0%} of its best bus bandwidth ({peak:.2f} GB/s) at "
        f"{format_size(size_mb * 2**20)}, {where} the 2-8 MB range a common rule of thumb gives for AllReduce buckets (blog post “AI大模型算力争夺战：核心技术解析与实战指南”): gradient buckets "
        f"of at least {max(1.0, size_mb):.0f} MB keep the link busy (parallel.ddp_bucket_mb; "
        f"PyTorch DDP defaults to {DDP_DEFAULT_BUCKET_MB:.0f} MB); larger buckets only delay the "
        "overlap of communication with the backward pass"
    )


def rank_notes(rows: list[dict]) -> list[str]:
    """Call out uneven per-rank times.

    Every rank of a collective waits for the last to arrive, so the rank with the
    *shortest* time is the one the others waited for (a busy host, a slow device, a
    worse link); its own wait is short because it came last.
    """
    notes = []
    for r in rows:
        if r["rank_spread"] > RANK_SPREAD_WARN and r["latency_seconds"] > 1e-4:
            times = r["per_rank_seconds"]
            late = min(range(len(times)), key=times.__getitem__)
            notes.append(
                f"{r['op']} {format_size(r['size_bytes'])}: ranks differ by {r['rank_spread']:.0%}; "
                f"rank {late} arrived last (others waited for it): check its host load, clocks and links"
            )
    return notes


# --------------------------------------------------------------------------- measuring (inside a launch)


def inside_launch() -> bool:
    """True inside a torchrun (or equivalent) launch that set the rendezvous variables."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def choose_backend(requested: str) -> str:
    """'auto' -> nccl with CUDA GPUs, else gloo."""
    import torch
    import torch.distributed as dist

    if requested not in ("auto", "gloo", "nccl"):
        raise UserError(f"--backend {requested!r} is not allowed; use auto, gloo or nccl")
    if requested == "auto":
        return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"
    if requested == "nccl" and not (torch.cuda.is_available() and dist.is_nccl_available()):
        raise UserError("--backend nccl needs CUDA GPUs and a torch build with NCCL; use --backend gloo on CPU")
    return requested


def _collective(op: str, count: int, world_size: int, device):
    """Buffers and a zero-argument call for one collective on `count` float32 elements."""
    import torch
    import torch.distributed as dist

    if op == "all_reduce":
        buf = torch.ones(count, device=device)
        return lambda: dist.all_reduce(buf)
    if op == "broadcast":
        buf = torch.ones(count, device=device)
        return lambda: dist.broadcast(buf, src=0)
    shard = count // world_size
    if op == "all_gather":
        inp, out = torch.ones(shard, device=device), torch.empty(count, device=device)
        return lambda: dist.all_gather_into_tensor(out, inp)
    inp, out = torch.ones(count, device=device), torch.empty(shard, device=device)
    return lambda: dist.reduce_scatter_tensor(out, inp)


def measure(ops: list[str], sizes: list[int], iters: int, warmup: int) -> list[dict]:
    """Time each collective in an initialised process group; every rank returns the same rows."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    rows = []
    for op in ops:
        for size in sizes:
            count = element_count(op, size, world)
            call = _collective(op, count, world, device)
            for _ in range(warmup):
                call()
            sync()
            dist.barrier()
            start = time.perf_counter()
            for _ in range(iters):
                call()
            sync()
            elapsed = (time.perf_counter() - start) / iters
            mine = torch.tensor([elapsed], dtype=torch.float64, device=device)
            every = torch.empty(world, dtype=torch.float64, device=device)
            dist.all_gather_into_tensor(every, mine)
            rows.append(summarize(op, count * ELEMENT_BYTES, world, every.cpu().tolist()))
            del call
    return rows


def run_in_launch(ops: list[str], sizes: list[int], iters: int, warmup: int, backend: str) -> dict | None:
    """Measure inside the current launch; rank 0 gets the result, other ranks None."""
    import torch
    import torch.distributed as dist

    chosen = choose_backend(backend)
    if chosen == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    owns_group = not dist.is_initialized()
    if owns_group:
        dist.init_process_group(chosen)
    try:
        rows = measure(ops, sizes, iters, warmup)
        world = dist.get_world_size()
        rank = dist.get_rank()
    finally:
        if owns_group:
            dist.destroy_process_group()
    if rank != 0:
        return None
    return assemble(rows, chosen, world, iters, warmup, torch.__version__)


def assemble(rows: list[dict], backend: str, world: int, iters: int, warmup: int, torch_version: str) -> dict:
    """The JSON document `flopwise bench` prints and writes."""
    debug = os.environ.get("NCCL_DEBUG")
    notes = rank_notes(rows)
    if backend == "gloo":
        notes.append("gloo on CPU measures host memory and loopback/TCP, not GPU links; use it to check the launch, not to size GPU buckets")
    elif not debug:
        notes.append("NCCL_DEBUG is unset: rerun with NCCL_DEBUG=INFO to see which transport (NVLink/P2P, SHM, IB, socket) NCCL chose")
    sat_op = next((op for op in ("all_reduce", "reduce_scatter", "all_gather", "broadcast") if any(r["op"] == op for r in rows)), None)
    return {
        "backend": backend,
        "world_size": world,
        "dtype": "float32",
        "iters": iters,
        "warmup": warmup,
        "torch_version": torch_version,
        "nccl_debug": debug if backend == "nccl" else None,
        "conventions": "nccl-tests doc/PERFORMANCE.md: algbw = size/time, busbw = algbw x 2(n-1)/n "
        "(all_reduce), (n-1)/n (all_gather, reduce_scatter), 1 (broadcast); GB = 1e9 bytes",
        "results": rows,
        "saturation": saturation(rows, sat_op) if sat_op else None,
        "notes": notes,
    }


# --------------------------------------------------------------------------- launching


def nccl_transport_lines(log_text: str, limit: int = 12) -> list[str]:
    """The NCCL_DEBUG=INFO lines that say which transport NCCL used, de-duplicated."""
    keep = re.compile(r"NCCL version|NET/|via P2P|via SHM|P2P/IPC|P2P/CUMEM|NVLS|Using network|Channel 00", re.I)
    seen: list[str] = []
    for line in log_text.splitlines():
        if "NCCL INFO" not in line or not keep.search(line):
            continue
        text = line.split("NCCL INFO", 1)[1].strip()
        if text not in seen:
            seen.append(text)
        if len(seen) >= limit:
            break
    return seen


def launch(
    ops: list[str],
    sizes: list[int],
    nproc: int,
    iters: int,
    warmup: int,
    backend: str,
    timeout_s: float = 900.0,
) -> dict:
    """Start `nproc` local processes with torchrun and return rank 0's result document.

    NCCL_DEBUG=INFO is set for NCCL runs unless the caller chose a level, and the
    transport lines it prints are kept in the result (seed: "set NCCL_DEBUG=INFO").
    """
    if nproc < 2:
        raise UserError(f"--nproc {nproc}: a collective needs at least 2 processes")
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    if backend == "nccl":
        env.setdefault("NCCL_DEBUG", "INFO")
    with tempfile.TemporaryDirectory(prefix="flopwise-bench-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "flopwise", "bench",
            "--op", ",".join(ops), "--sizes", ",".join(str(s) for s in sizes),
            "--iters", str(iters), "--warmup", str(warmup), "--backend", backend,
            "--out", str(out), "--quiet",
        ]  # fmt: skip
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as err:
            raise UserError(f"flopwise bench: the {nproc}-process run did not finish in {timeout_s:.0f} s; try fewer or smaller --sizes") from err
        log = proc.stdout + proc.stderr
        if proc.returncode != 0 or not out.exists():
            tail = " | ".join(line for line in log.strip().splitlines()[-3:])
            raise UserError(f"flopwise bench: torchrun exited with {proc.returncode}: {tail[-400:]}")
        result = json.loads(out.read_text())
    if result["backend"] == "nccl":
        result["nccl_debug_transport"] = nccl_transport_lines(log)
    return result


MAX_MESSAGE_BYTES = 4 * 2**30
MAX_CALLS = 10**6


def check_bench_bounds(sizes: list[int], nproc: int | None, iters: int, warmup: int) -> None:
    """Practical ceilings, so a typo cannot start thousands of processes or allocate terabytes."""
    import os

    if iters > MAX_CALLS or warmup > MAX_CALLS:
        raise UserError(f"--iters / --warmup: at most {MAX_CALLS:,} calls per size (got {iters:,} / {warmup:,})")
    if max(sizes) > MAX_MESSAGE_BYTES:
        raise UserError(f"--sizes: {format_size(max(sizes))} is above the {format_size(MAX_MESSAGE_BYTES)} per message allowed")
    most = max(2, 8 * (os.cpu_count() or 1))
    if nproc is not None and nproc > most:
        raise UserError(f"--nproc {nproc}: more than {most} local processes (8 per CPU core) would only thrash this machine")


def run_bench(ops: list[str], sizes: list[int], nproc: int, iters: int, warmup: int, backend: str) -> dict | None:
    """Measure in place inside a launch, otherwise start one; None on ranks other than 0."""
    if iters < 1 or warmup < 0:
        raise UserError("--iters must be >= 1 and --warmup >= 0")
    check_bench_bounds(sizes, nproc, iters, warmup)
    if inside_launch():
        return run_in_launch(ops, sizes, iters, warmup, backend)
    return launch(ops, sizes, nproc, iters, warmup, choose_backend(backend))
