"""`flopwise calibrate`: measure this device's GEMM speeds, memory bandwidth and collectives.

The result is a `flopwise.plan.profile.DeviceProfile`, written as JSON, which the
planner's time model reads in place of datasheet curves (`flopwise plan --profile`) and
which the trainer's prediction uses for the device it runs on.

How it measures:

- GEMMs: `torch.nn.functional.linear(x[M,K], w[N,K])` (what a model's layers call), over a
  grid of shapes ordered by work, per dtype. On a GPU each shape alone: one warm-up call,
  then calls until both a minimum count and a time budget are reached, timed with CUDA
  events; the call at the FAST_QUANTILE gives the rate (2·M·N·K / seconds). On a CPU the
  shapes are timed in turn, each call after a cache flush (`time_in_turn`), at the median
  round. A CPU call's time is the smaller of its wall time and the process's CPU time
  divided by its threads, so that time the scheduler gives to other processes on a shared
  machine is not counted as the device's. A dtype whose single call exceeds
  `max_call_seconds` is left out (fp16 matmuls on many CPUs run at a few GFLOP/s), and the
  profile says so.
- Memory bandwidth: a large tensor copy, read + write bytes over the time of one copy.
- Kernel overhead: the time of an add of two one-element tensors (dispatch and launch,
  which every small element-wise operator of a step pays).
- On a CPU, the operators of a step besides its GEMMs, forward + backward under autograd
  as the trainer runs them (eager, unfused, fp32): RMSNorm, SiLU-gated product, tanh GELU,
  residual add and the trainer's rotary embedding per element of their input (and the
  forward's share of each), cross-entropy per logit; fused causal attention
  (`scaled_dot_product_attention`) over a few sequence lengths and head sizes per dtype;
  and the trainer's optimizer step (foreach AdamW with gradient clipping) per parameter.
  Each is timed in turn with the others like the CPU GEMMs.
- Collectives: `flopwise.measure.commbench.measure`, bus bandwidth as nccl-tests defines
  it, inside a launch of several processes; a CPU calibration in one process (not
  `--quick`) starts two gloo processes of its own for them, as the trainer's default
  launch talks through gloo. On a CPU, with them: what one FSDP2 unit adds to a forward +
  backward by its size, and the optimizer step over FSDP2's sharded parameters
  (`measure_fsdp_units`).

Under a launch every process measures at the same time (they share a CPU's memory and
cores as training ranks do), the figures are averaged over processes and rank 0 writes.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from flopwise.errors import UserError
from flopwise.plan.profile import (
    SCHEMA_VERSION,
    AttentionPoint,
    CollectivePoint,
    DeviceProfile,
    GemmPoint,
    default_profile_path,
    load_profile,
)

TORCH_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
CPU_DEFAULT_DTYPES = ("fp32", "bf16")
CUDA_DEFAULT_DTYPES = ("fp32", "tf32", "bf16", "fp16")
COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter")
FAST_QUANTILE = 0.2
OPERATOR_QUANTILE = 0.5
"""CPU timings take the median round: the trainer reports the median of its steps, and on a
shared machine a low quantile picks the moments it runs fastest; operators that allocate
their outputs afresh, as a step does, also pay for new pages in some calls."""


@dataclass(frozen=True)
class Budget:
    """How long calibration may spend: the grid, time per shape, and buffer sizes."""

    tokens: tuple[int, ...]  # M values (tokens per micro-batch)
    widths: tuple[int, ...]  # h values; shapes are (M, h, h), (M, 4h, h), (M, h, 4h)
    seconds_per_shape: float
    min_calls: int
    max_call_seconds: float
    copy_bytes: int
    collective_sizes: tuple[int, ...]
    collective_iters: int
    max_gemm_flops: float = float("inf")  # shapes with more work are left out (CPU time budget)
    op_tokens: int = 0  # tokens of the element-wise operator timings (0: not measured)
    attention_shapes: tuple[tuple[int, int], ...] = ()  # (sequence, head size) of the attention timings
    optimizer_params: int = 0  # parameters of the optimizer-step timing (0: not measured)
    fsdp_widths: tuple[int, ...] = (128, 384, 768)  # Linear(h, h) FSDP units: 66 KB, 0.59 MB, 2.4 MB fp32
    fsdp_rounds: int = 12


def budget_for(kind: str, quick: bool) -> Budget:
    """The measurement grid and time budget for a CPU or a CUDA device (quick: a few seconds)."""
    mib = 2**20
    if kind == "cuda":
        if quick:
            return Budget((1024, 8192), (1024, 4096), 0.02, 5, 1.0, 256 * mib, (mib, 16 * mib), 5)
        return Budget((512, 2048, 8192, 16384), (512, 1024, 2048, 4096, 8192), 0.05, 10, 1.0, 1024 * mib,
                      (mib, 4 * mib, 16 * mib, 64 * mib, 256 * mib), 20)
    kib = 2**10
    if quick:
        return Budget((256, 1024), (128, 512), 0.02, 5, 0.2, 32 * mib, (64 * kib, mib, 8 * mib), 3, 1e9,
                      op_tokens=256, attention_shapes=((128, 32), (128, 64)), optimizer_params=2**18,
                      fsdp_widths=(128, 384), fsdp_rounds=4)
    return Budget((128, 512, 2048), (128, 256, 512, 1024), 0.05, 5, 1.0, 64 * mib,
                  (64 * kib, mib, 4 * mib, 16 * mib), 5, 4e9, op_tokens=1024,
                  attention_shapes=((128, 32), (128, 64), (512, 32), (512, 64)), optimizer_params=2**22)


def gemm_shapes(budget: Budget) -> list[tuple[int, int, int]]:
    """(M, N, K) shapes of a transformer's GEMMs: square, 4x wide (MLP up) and 4x deep (MLP down)."""
    shapes = {(m, n, k) for m in budget.tokens for h in budget.widths for n, k in ((h, h), (4 * h, h), (h, 4 * h))
              if 2.0 * m * n * k <= budget.max_gemm_flops}
    return sorted(shapes, key=lambda s: (s[0] * s[1] * s[2], s))


def parse_dtypes(text: str | None, kind: str) -> tuple[str, ...]:
    """'fp32,bf16' -> ('fp32', 'bf16'); None -> the device's defaults; tf32 needs CUDA."""
    if not text:
        return CUDA_DEFAULT_DTYPES if kind == "cuda" else CPU_DEFAULT_DTYPES
    names = tuple(dict.fromkeys(part.strip().lower() for part in text.split(",") if part.strip()))
    for name in names:
        if name not in TORCH_DTYPES:
            raise UserError(f"--dtypes: {name!r} is not one of {', '.join(TORCH_DTYPES)}")
        if name == "tf32" and kind != "cuda":
            raise UserError("--dtypes: tf32 is a CUDA tensor-core mode; on CPU use fp32")
    if not names:
        raise UserError("--dtypes is empty; give e.g. fp32,bf16")
    return names


# ---------------------------------------------------------------------------- timing


def time_call(fn, device: torch.device, seconds: float, min_calls: int, max_call_seconds: float,
              quantile: float = FAST_QUANTILE) -> float | None:
    """Seconds of `fn()` (the call at `quantile` of the timed ones) after one warm-up call;
    None when one call exceeds `max_call_seconds`."""
    cuda = device.type == "cuda"
    start = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize(device)
    if time.perf_counter() - start > max_call_seconds:
        return None
    samples: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(samples) < min_calls or time.perf_counter() < deadline:
        if cuda:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(begin.elapsed_time(end) / 1e3)
        else:
            samples.append(cpu_call_seconds(fn))
        if len(samples) >= 1000:
            break
    samples.sort()
    return samples[int(quantile * (len(samples) - 1))]


def cpu_call_seconds(fn) -> float:
    """Seconds of one `fn()` on a CPU: the smaller of its wall time and the process's CPU time
    over its threads, so time the scheduler gives other processes is not counted."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return min(wall, cpu / torch.get_num_threads()) if cpu > 0 else wall


CACHE_FLUSH_BYTES = 64 * 2**20
"""Written (untimed) before each timed CPU call: more than the last-level caches of the CPUs
flopwise runs on, so each call starts with cold caches, as Triton's `do_bench` flushes the
L2 cache before each timed GPU call."""


def time_in_turn(calls: dict, seconds: float, min_rounds: int, max_call_seconds: float,
                 quantile: float = OPERATOR_QUANTILE) -> dict:
    """CPU seconds of each of `calls` ({key: fn}), timed in turn round after round, each call
    after a cache flush (the call at `quantile` of its rounds: by default the median, the
    statistic the trainer reports of its steps); keys whose warm-up call exceeds
    `max_call_seconds` are left out.

    A training step runs each operator once between many others, so its inputs and weights
    are no longer in the caches the way they are when one call repeats: repeating one call
    measures warm caches (on this project's 2-core test machine, GEMMs 10-20 % and
    element-wise operators up to 2x faster than inside a training step). A call's time is
    `cpu_call_seconds`."""
    flush = torch.empty(CACHE_FLUSH_BYTES // 4)
    kept = {}
    for key, fn in calls.items():
        start = time.perf_counter()
        fn()
        if time.perf_counter() - start <= max_call_seconds:
            kept[key] = fn
    samples: dict = {key: [] for key in kept}
    deadline = time.perf_counter() + seconds
    rounds = 0
    while kept and (rounds < min_rounds or time.perf_counter() < deadline) and rounds < 1000:
        for key, fn in kept.items():
            flush.fill_(float(rounds))
            samples[key].append(cpu_call_seconds(fn))
        rounds += 1
    return {key: sorted(times)[int(quantile * (len(times) - 1))] for key, times in samples.items()}


def measure_gemms(dtypes: tuple[str, ...], device: torch.device, budget: Budget) -> tuple[list[GemmPoint], list[str]]:
    """Achieved FLOP/s of `F.linear` over the grid for each dtype, and notes on what was cut short.

    On a CPU the grid's shapes are timed in turn (`time_in_turn`); on a GPU each shape alone."""
    if device.type == "cpu":
        return _measure_gemms_in_turn(dtypes, device, budget)
    points: list[GemmPoint] = []
    notes: list[str] = []
    for name in dtypes:
        dtype = TORCH_DTYPES[name]
        previous = torch.backends.cuda.matmul.allow_tf32 if device.type == "cuda" else None
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
        try:
            for m, n, k in gemm_shapes(budget):
                x = torch.randn(m, k, device=device).to(dtype)
                w = torch.randn(n, k, device=device).to(dtype)
                seconds = time_call(lambda: F.linear(x, w), device, budget.seconds_per_shape, budget.min_calls,
                                    budget.max_call_seconds)
                if seconds is None:
                    notes.append(f"{name}: stopped at ({m}, {n}, {k}): one call took over "
                                 f"{budget.max_call_seconds:g} s; larger shapes not measured")
                    break
                points.append(GemmPoint(name, m, n, k, 2.0 * m * n * k / seconds))
        finally:
            if previous is not None:
                torch.backends.cuda.matmul.allow_tf32 = previous
    return points, notes


def _measure_gemms_in_turn(dtypes: tuple[str, ...], device: torch.device,
                           budget: Budget) -> tuple[list[GemmPoint], list[str]]:
    points: list[GemmPoint] = []
    notes: list[str] = []
    shapes = gemm_shapes(budget)
    for name in dtypes:
        dtype = TORCH_DTYPES[name]
        calls = {}
        for m, n, k in shapes:
            x = torch.randn(m, k, device=device).to(dtype)
            w = torch.randn(n, k, device=device).to(dtype)
            calls[(m, n, k)] = lambda x=x, w=w: F.linear(x, w)
        timed = time_in_turn(calls, budget.seconds_per_shape * len(calls), budget.min_calls, budget.max_call_seconds)
        for (m, n, k), seconds in timed.items():
            points.append(GemmPoint(name, m, n, k, 2.0 * m * n * k / seconds))
        if len(timed) < len(calls):
            notes.append(f"{name}: {len(calls) - len(timed)} of {len(calls)} shapes left out: one call took over "
                         f"{budget.max_call_seconds:g} s")
    return points, notes


def measure_memory_bandwidth(device: torch.device, budget: Budget) -> float:
    """Bytes/s of a large copy (each byte read once and written once)."""
    count = budget.copy_bytes // 4
    src = torch.ones(count, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    seconds = time_call(lambda: dst.copy_(src), device, budget.seconds_per_shape * 4, 5, 10.0)
    return 2.0 * budget.copy_bytes / seconds


def measure_kernel_overhead(device: torch.device) -> float:
    """Seconds of one tiny operator (an add of one-element tensors), start to end."""
    one = torch.ones(1, device=device)
    return time_call(lambda: torch.add(one, one), device, 0.05, 50, 1.0)


OP_WIDTH = 256  # hidden size of the element-wise timings (the activation's width: 2 x that)
OP_VOCAB = 4096  # vocabulary of the cross-entropy timing
ATTENTION_HEADS = 8
ATTENTION_TOKENS = {128: 1024, 512: 1024}  # batch x sequence of each attention timing


def _forward_backward(fn, inputs: list[torch.Tensor]):
    """A call that runs `fn(*inputs)` and its backward from a fixed output gradient, fresh
    input gradients each time (as a training step does)."""
    with torch.no_grad():
        grad = torch.randn_like(fn(*inputs))

    def call() -> None:
        for t in inputs:
            t.grad = None
        fn(*inputs).backward(grad)

    call()  # the process's first backward starts autograd's engine: not the operator's time
    return call


def measure_operators(device: torch.device, budget: Budget) -> tuple[dict[str, float], dict[str, float]]:
    """Seconds per element, forward + backward, of a transformer step's element-wise operators
    in fp32 (per logit for cross-entropy), and the forward's share of each (the forward alone,
    recording the graph as a training forward does, over forward + backward: what a
    recomputed forward costs); empty when the budget has none (CUDA)."""
    if not budget.op_tokens:
        return {}, {}
    from flopwise.rotary import apply_rotary, rotary_tables

    T, h = budget.op_tokens, OP_WIDTH

    def leaf(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device, requires_grad=True)

    norm = torch.nn.RMSNorm(h, device=device)
    head_dim, heads = 32, 8
    seq = min(T, 128)
    cos, sin = rotary_tables(head_dim, seq, 10000.0)
    cos, sin = cos.to(device), sin.to(device)
    targets = torch.randint(0, OP_VOCAB, (T,), device=device)
    cases = {
        "norm": (norm, [leaf(T, h)]),
        "swiglu": (lambda a, b: F.silu(a) * b, [leaf(T, 2 * h), leaf(T, 2 * h)]),
        "gelu": (lambda a: F.gelu(a, approximate="tanh"), [leaf(T, 2 * h)]),
        "add": (torch.add, [leaf(T, h), leaf(T, h)]),
        "rope": (lambda q: apply_rotary(q, cos, sin), [leaf(T // seq, heads, seq, head_dim)]),
        "cross_entropy": (lambda z: F.cross_entropy(z, targets), [leaf(T, OP_VOCAB)]),
    }
    calls = {(name, "both"): _forward_backward(fn, inputs) for name, (fn, inputs) in cases.items()}
    calls.update({(name, "forward"): (lambda fn=fn, inputs=inputs: fn(*inputs)) for name, (fn, inputs) in cases.items()})
    timed = time_in_turn(calls, budget.seconds_per_shape * len(calls), budget.min_calls, budget.max_call_seconds)
    both = {name: seconds / cases[name][1][0].numel() for (name, part), seconds in timed.items() if part == "both"}
    share = {name: min(1.0, timed[(name, "forward")] / timed[(name, "both")])
             for name in cases if (name, "both") in timed and (name, "forward") in timed}
    return both, share


def measure_attention(dtypes: tuple[str, ...], device: torch.device, budget: Budget) -> list[AttentionPoint]:
    """FLOP/s of fused causal attention, forward + backward, per dtype and (sequence, head size);
    FLOPs as `plan/ops.py` counts them: 3.5 × the causal forward's 2·2·s²·d per head. Inputs
    are laid out as a model's attention layer passes them: (batch, sequence, heads, head size)
    projections transposed to heads-first views. Timed in turn (`time_in_turn`)."""
    points = []
    for name in dtypes:
        dtype = TORCH_DTYPES[name]
        calls, work = {}, {}
        for seq, head_dim in budget.attention_shapes:
            batch = max(1, ATTENTION_TOKENS.get(seq, 1024) // seq)
            qkv = [torch.randn(batch, seq, ATTENTION_HEADS, head_dim, device=device).to(dtype).requires_grad_()
                   for _ in range(3)]
            calls[(seq, head_dim)] = _forward_backward(
                lambda q, k, v: F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                               v.transpose(1, 2), is_causal=True), qkv)
            work[(seq, head_dim)] = 3.5 * 4.0 * batch * ATTENTION_HEADS * seq * seq * head_dim * 0.5
        timed = time_in_turn(calls, budget.seconds_per_shape * len(calls), budget.min_calls, budget.max_call_seconds)
        points += [AttentionPoint(name, seq, head_dim, work[(seq, head_dim)] / seconds)
                   for (seq, head_dim), seconds in timed.items()]
    return points


OPTIMIZER_WIDTH = 256  # hidden size of the optimizer timing's layers


def measure_optimizer(device: torch.device, budget: Budget) -> dict[str, float]:
    """Seconds per parameter of the trainer's optimizer step (foreach AdamW after clipping the
    gradient norm) over the tensors of decoder layers (four h×h attention matrices, three
    h×2.7h MLP matrices, two norms) making up about `budget.optimizer_params`: as many tensors
    per parameter as a model has (CPU foreach kernels loop over tensors), and more state than
    the caches hold; empty when not budgeted."""
    if not budget.optimizer_params:
        return {}
    h = OPTIMIZER_WIDTH
    layer = [h * h] * 4 + [h * (8 * h // 3)] * 3 + [h] * 2
    sizes = layer * max(1, round(budget.optimizer_params / sum(layer)))
    params = [torch.nn.Parameter(torch.randn(n, device=device)) for n in sizes]
    for param in params:
        param.grad = torch.randn_like(param)
    optimizer = torch.optim.AdamW(params, lr=1e-4, foreach=True)

    def step() -> None:
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        optimizer.step()

    timed = time_in_turn({"adamw": step}, budget.seconds_per_shape * 2, budget.min_calls,
                         budget.max_call_seconds * 4)
    return {name: seconds / sum(sizes) for name, seconds in timed.items()}


def measure_collectives(budget: Budget) -> list[CollectivePoint]:
    """Bus bandwidth of FSDP's and DDP's collectives in the current process group (commbench)."""
    import torch.distributed as dist

    from flopwise.measure.commbench import measure

    rows = measure(list(COLLECTIVE_OPS), list(budget.collective_sizes), budget.collective_iters, 2)
    world = dist.get_world_size()
    return [CollectivePoint(r["op"], world, int(r["size_bytes"]), r["busbw_gb_per_s"] * 1e9) for r in rows]


FSDP_UNITS = 4  # layers per stack in the FSDP unit timing


def measure_fsdp_units(budget: Budget, widths: tuple[int, ...],
                       rounds: int) -> tuple[tuple[tuple[float, float], ...], float]:
    """((unit weight bytes, seconds), ...) that one FSDP2 unit adds to a forward + backward in the
    current (CPU) process group, per unit size: a stack of FSDP_UNITS `Linear(h, h)` layers,
    each its own `fully_shard`, against the same stack unwrapped, on `budget.op_tokens`
    tokens. The difference is the unit's two all-gathers and reduce-scatter, the copies into
    and out of FSDP's flat buffers, its hooks, and the waits for the other ranks that each
    collective implies while compute runs between them, as in a training step. Each round
    times every stack, unwrapped then wrapped, after a barrier; a unit's cost is the median
    over rounds of the pair's difference (pairs share the machine's state of the moment).
    Second: the optimizer step over the wrapped stacks' parameters, per parameter a rank
    owns (`_sharded_optimizer_seconds`)."""
    import copy

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    tokens = max(1, budget.op_tokens)
    stacks = []
    for h in widths:
        plain = torch.nn.Sequential(*[torch.nn.Linear(h, h) for _ in range(FSDP_UNITS)])
        sharded = copy.deepcopy(plain)
        for layer in sharded:
            fully_shard(layer, mesh=mesh)
        fully_shard(sharded, mesh=mesh)
        stacks.append((4.0 * (h * h + h), plain, sharded, torch.randn(tokens, h)))
    extra: dict[int, list[float]] = {i: [] for i in range(len(stacks))}
    for r in range(rounds + 1):  # round 0 warms up
        for i, (_, plain, sharded, x) in enumerate(stacks):
            pair = []
            for model in (plain, sharded):
                dist.barrier()
                start = time.perf_counter()
                model(x).sum().backward()
                pair.append(time.perf_counter() - start)
            if r:
                extra[i].append((pair[1] - pair[0]) / FSDP_UNITS)
    optimizer = _sharded_optimizer_seconds([stack[2] for stack in stacks], rounds)
    mine = torch.tensor([statistics.median(extra[i]) for i in range(len(stacks))] + [optimizer], dtype=torch.float64)
    dist.all_reduce(mine)  # the mean over ranks
    mine /= dist.get_world_size()
    units = tuple((stack[0], float(value)) for stack, value in zip(stacks, mine[:-1]) if value > 0)
    return units, float(mine[-1])


def _sharded_optimizer_seconds(models: list, rounds: int) -> float:
    """Seconds per parameter this rank owns of the trainer's optimizer step (clipping, then
    foreach AdamW) over FSDP2-sharded parameters: DTensors, whose every operator passes
    through DTensor's dispatch, and a clipping norm all-reduced over the ranks."""
    import torch.distributed as dist

    params = [p for model in models for p in model.parameters() if p.grad is not None]
    optimizer = torch.optim.AdamW(params, lr=1e-4, foreach=True)
    owned = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in params)
    samples = []
    for r in range(rounds + 1):
        dist.barrier()
        start = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        optimizer.step()
        if r:
            samples.append(time.perf_counter() - start)
    return statistics.median(samples) / max(1, owned)


GLOO_PROCESSES = 2  # the trainer's default launch: 2 processes on this machine


def measure_gloo_collectives(budget: Budget, world: int = GLOO_PROCESSES
                             ) -> tuple[list[CollectivePoint], tuple[tuple[float, float], ...], float]:
    """Collectives, the FSDP unit costs and sharded optimizer step (`measure_fsdp_units`) between `world` local
    processes on gloo, started here (a one-process CPU calibration has no peer to measure with)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = _free_port()
    procs = [ctx.Process(target=_gloo_worker, args=(rank, world, port, budget, queue)) for rank in range(world)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=300)
    codes = [proc.exitcode for proc in procs]
    if any(code != 0 for code in codes) or queue.empty():
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        raise UserError(f"flopwise calibrate: the {world} gloo processes timing collectives exited with {codes}")
    rows, units, optimizer = queue.get()
    return [CollectivePoint(*row) for row in rows], tuple(tuple(point) for point in units), optimizer


def _gloo_worker(rank: int, world: int, port: int, budget: Budget, queue) -> None:
    """One of the processes of `measure_gloo_collectives` (module level: spawn pickles it)."""
    import warnings

    import torch.distributed as dist

    # torch's notice that the nccl-tests-style collectives commbench times are renamed upstream
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.distributed")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        points = measure_collectives(budget)
        units, optimizer = measure_fsdp_units(budget, budget.fsdp_widths, budget.fsdp_rounds)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        queue.put(([(p.op, p.world_size, p.size_bytes, p.bus_bytes_per_s) for p in points], units, optimizer))
    # gloo's threads can abort the interpreter's teardown ("terminate called without an active
    # exception", exit -6) after a clean destroy; the result is already in the queue's pipe
    os._exit(0)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---------------------------------------------------------------------------- the profile


def device_name(device: torch.device) -> str:
    """'NVIDIA H100 80GB HBM3' for a GPU; 'cpu (<model name>)' for a CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu ({model or platform.processor() or platform.machine()})"


def _process_group():
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1 else None


def sharing_processes(device: torch.device) -> int:
    """Processes measuring or training on this machine's CPU at once (1 on a GPU: each has its own)."""
    if device.type == "cuda":
        return 1
    dist = _process_group()
    local = os.environ.get("LOCAL_WORLD_SIZE")
    if local and local.isdigit():
        return int(local)
    return dist.get_world_size() if dist is not None else 1


def measure_profile(dtypes: tuple[str, ...], device: torch.device, quick: bool,
                    collectives: bool = True) -> DeviceProfile:
    """Measure a profile on `device`; in a process group every rank measures at once and gets the mean.
    The machine's 1-minute load before and after is recorded with it (`DeviceProfile.busy_load_per_core`)."""
    load_before = machine_load()
    budget = budget_for(device.type, quick)
    points, notes = measure_gemms(dtypes, device, budget)
    bandwidth = measure_memory_bandwidth(device, budget)
    overhead = measure_kernel_overhead(device)
    operators, forward_share = measure_operators(device, budget)
    attention = measure_attention(dtypes, device, budget) if device.type == "cpu" else []
    optimizer = measure_optimizer(device, budget)
    dist = _process_group()
    collective_points: list[CollectivePoint] = []
    units: tuple[tuple[float, float], ...] = ()
    sharded_step = 0.0
    if dist is not None:
        points, bandwidth, operators, attention, optimizer, forward_share = _mean_over_ranks(
            dist, points, bandwidth, operators, attention, optimizer, forward_share)
        if collectives:
            collective_points = measure_collectives(budget)
            if device.type == "cpu":
                units, sharded_step = measure_fsdp_units(budget, budget.fsdp_widths, budget.fsdp_rounds)
    elif collectives and device.type == "cpu" and not quick:
        collective_points, units, sharded_step = measure_gloo_collectives(budget)
    if units and sharded_step > 0:
        optimizer = {**optimizer, "adamw_fsdp": sharded_step}
    return DeviceProfile(
        device=device_name(device),
        device_kind=device.type,
        gemm=tuple(points),
        memory_bandwidth_bytes_per_s=bandwidth,
        collectives=tuple(collective_points),
        kernel_overhead_seconds=overhead,
        op_seconds_per_element=operators,
        op_forward_share=forward_share,
        attention=tuple(attention),
        optimizer_seconds_per_param=optimizer,
        fsdp_unit_seconds=units,
        threads=torch.get_num_threads() if device.type == "cpu" else None,
        processes=sharing_processes(device),
        torch_version=torch.__version__,
        host=socket.gethostname(),
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        load_before=load_before,
        load_after=machine_load(),
        cpu_count=os.cpu_count(),
        notes=tuple(notes) + (("quick calibration: a small grid, short timings",) if quick else ()),
    )


def machine_load() -> float | None:
    """The 1-minute load average (None where the system has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def profile_path_for(device: torch.device) -> Path:
    """This machine's cache file for `device` as this process measures it: device, threads and processes
    sharing it, host and torch build (`plan.profile.profile_key`)."""
    threads = torch.get_num_threads() if device.type == "cpu" else None
    return default_profile_path(device_name(device), threads, sharing_processes(device), socket.gethostname(),
                                torch.__version__)


def _mean_over_ranks(dist, points: list[GemmPoint], bandwidth: float, operators: dict[str, float],
                     attention: list[AttentionPoint], optimizer: dict[str, float], forward_share: dict[str, float]):
    """Average each measurement over the ranks that made it: GEMM and attention rates per
    shape, the bandwidth, operator and optimizer seconds per element, forward shares."""
    mine = ([(p.dtype, p.m, p.n, p.k, p.flops_per_s) for p in points], bandwidth, operators,
            [(p.dtype, p.seq, p.head_dim, p.flops_per_s) for p in attention], optimizer, forward_share)
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)

    def mean_rows(index: int) -> dict[tuple, float]:
        rows: dict[tuple, list[float]] = {}
        for rank in every:
            for *key, rate in rank[index]:
                rows.setdefault(tuple(key), []).append(rate)
        return {key: statistics.fmean(values) for key, values in rows.items()}

    def mean_table(index: int) -> dict[str, float]:
        rows: dict[str, list[float]] = {}
        for rank in every:
            for key, value in rank[index].items():
                rows.setdefault(key, []).append(value)
        return {key: statistics.fmean(values) for key, values in rows.items()}

    gemm = [GemmPoint(*key, rate) for key, rate in mean_rows(0).items()]
    attention_mean = [AttentionPoint(*key, rate) for key, rate in mean_rows(3).items()]
    return (gemm, statistics.fmean(rank[1] for rank in every), mean_table(2), attention_mean, mean_table(4),
            mean_table(5))


def default_device() -> torch.device:
    """This process's GPU under a launch (LOCAL_RANK), the first GPU, or the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    return torch.device("cpu")


def profile_for_device(device: torch.device, dtype: str) -> tuple[DeviceProfile, Path, str]:
    """(profile, path, "cache" or "measured"): the cached profile for this device (and, on a CPU, these
    threads and processes, this host and torch build), with `dtype` and fp32 measured; a quick one is
    measured on first use and cached.

    Call it on every rank at the same point: in a process group the ranks agree whether to
    measure, measure at once (as they will train), and rank 0 writes the cache.
    """
    path = profile_path_for(device)
    dtypes = tuple(dict.fromkeys(("fp32", dtype)))
    try:
        cached: DeviceProfile | None = load_profile(path)
    except UserError:
        cached = None
    if cached is not None and cached.schema_version < SCHEMA_VERSION:
        cached = None  # measured before the operator timings existed: measure it again
    missing = tuple(d for d in dtypes if cached is None or cached.peak_flops(d) is None)
    dist = _process_group()
    if dist is not None:  # every rank must take the same branch
        votes: list = [None] * dist.get_world_size()
        dist.all_gather_object(votes, missing)
        missing = tuple(dict.fromkeys(d for vote in votes for d in vote))
    if not missing:
        return cached, path, "cache"
    fresh = measure_profile(missing if cached is not None else dtypes, device, quick=True,
                            collectives=cached is None and device.type == "cpu")
    if cached is not None:
        fresh = replace(cached, gemm=cached.gemm + fresh.gemm, attention=cached.attention + fresh.attention,
                        notes=cached.notes + fresh.notes)
    if dist is None or dist.get_rank() == 0:
        fresh.save(path)
    if dist is not None:
        dist.barrier()  # the file is whole before any rank reads or hashes it
    return fresh, path, "measured"


# ---------------------------------------------------------------------------- the command


TRAINER_PROCESSES = 2
"""`flopwise train`'s default launch on a CPU: `parallel.nproc_per_node` processes (a test
checks the two agree), one thread each. A CPU profile is kept per threads and processes,
so a calibration launched this way is the one the default training run reads."""


def default_processes() -> int:
    """`--nproc` when not given: the trainer's default launch on a CPU, one process per GPU
    measuring on its own device otherwise."""
    return 1 if torch.cuda.is_available() else TRAINER_PROCESSES


@dataclass(frozen=True)
class Calibration:
    """What `run_calibration` wrote: the profile, where, and where the profile it replaced is kept (if any)."""

    profile: DeviceProfile
    path: Path
    previous: Path | None = None


def run_calibration(out: Path | None, dtypes_text: str | None, quick: bool, threads: int | None,
                    nproc: int | None = None) -> Calibration | None:
    """Measure and write a profile; starts `nproc` processes with torchrun when asked
    (`default_processes()` when None). Returns the `Calibration` on the process that wrote
    it, None on other ranks."""
    if threads is not None:
        if threads < 1:
            raise UserError(f"--threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    if nproc is None:
        nproc = default_processes()
    if nproc < 1:
        raise UserError(f"--nproc must be >= 1, got {nproc}")
    device = default_device()
    dtypes = parse_dtypes(dtypes_text, device.type)  # a bad --dtypes or --out is one line before any launch
    if out is not None:
        check_writable(out)
    inside = all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))
    if nproc > 1 and not inside:
        return _launch(out, dtypes_text, quick, threads, nproc)
    owns_group = False
    if inside and int(os.environ["WORLD_SIZE"]) > 1:
        import torch.distributed as dist

        if not dist.is_initialized():
            if device.type == "cuda":
                torch.cuda.set_device(device)
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
            owns_group = True
    try:
        profile = measure_profile(dtypes, device, quick)
    finally:
        if owns_group:
            import torch.distributed as dist

            dist.destroy_process_group()
    if int(os.environ.get("RANK", "0")) != 0:
        return None
    path = out or default_profile_path(profile.device, profile.threads, profile.processes, profile.host,
                                       profile.torch_version)
    previous = profile.save_keeping_previous(path)
    return Calibration(profile, path, previous)


def check_writable(path: Path) -> None:
    """UserError naming `--out` when a profile cannot be written there (checked before measuring)."""
    if path.is_dir():
        raise UserError(f"--out: {path} is a directory; give a file name such as {path / 'profile.json'}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"--out: cannot create {path.parent} ({err.strerror or err})") from None
    if not os.access(path.parent, os.W_OK):
        raise UserError(f"--out: {path.parent} is not writable")


def _launch(out: Path | None, dtypes_text: str | None, quick: bool, threads: int | None,
            nproc: int) -> Calibration:
    """Run the calibration in `nproc` local processes (torchrun --standalone)."""
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads or env.get("OMP_NUM_THREADS") or 1)
    with tempfile.TemporaryDirectory(prefix="flopwise-calibrate-") as tmp:
        result = Path(tmp) / "where.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "-m", "flopwise", "calibrate", "--report", str(result)]
        if out is not None:
            cmd += ["--out", str(out.resolve())]
        if dtypes_text:
            cmd += ["--dtypes", dtypes_text]
        if quick:
            cmd.append("--quick")
        if threads is not None:
            cmd += ["--threads", str(threads)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0 or not result.exists():
            lines = (proc.stdout + proc.stderr).strip().splitlines()
            said = [line for line in lines if line.startswith("error: ")]  # a rank's own one-line error
            if said:
                raise UserError(said[0].removeprefix("error: "))
            tail = " | ".join(lines[-3:])
            raise UserError(f"flopwise calibrate: torchrun exited with {proc.returncode}: {tail[-400:]}")
        where = json.loads(result.read_text())
    path = Path(where["path"])
    return Calibration(load_profile(path), path, Path(where["previous"]) if where.get("previous") else None)
