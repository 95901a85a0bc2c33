"""Before/after measurements: latency, throughput, bytes in memory and on disk, parameters.

Latency is the median of `iters` timed calls after `warmup` untimed ones, at a stated
intra-op thread count, under `torch.no_grad()`. Quality is measured by the task
(accuracy or validation loss), not here.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Callable, Iterator

import torch
from torch import nn


def _tensors_of(value) -> Iterator[torch.Tensor]:
    """Plain tensors inside a value: tensor subclasses (torchao) and packed tuples are opened up."""
    if isinstance(value, torch.Tensor):
        if hasattr(value, "__tensor_flatten__") and type(value) is not torch.Tensor and not isinstance(value, nn.Parameter):
            names, _ = value.__tensor_flatten__()
            for name in names:
                yield from _tensors_of(getattr(value, name))
        elif isinstance(value, nn.Parameter) and type(value.data) is not torch.Tensor:
            yield from _tensors_of(value.data)
        else:
            yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors_of(item)


def model_tensors(model: nn.Module) -> Iterator[torch.Tensor]:
    """Every tensor a model holds: parameters, buffers, packed (eager-quantized) weights and graph constants."""
    if isinstance(model, torch.fx.GraphModule):
        # only what the graph reads: a converted PT2E graph may still hold unused fp32 originals
        for node in model.graph.nodes:
            if node.op == "get_attr":
                target = model
                for part in node.target.split("."):
                    target = getattr(target, part, None)
                if isinstance(target, torch.Tensor):
                    yield from _tensors_of(target)
        return
    yield from _tensors_of(list(model.state_dict(keep_vars=True).values()))


def bytes_in_memory(model: nn.Module) -> int:
    """Bytes of the model's tensors, each storage counted once (tied weights, views)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for tensor in model_tensors(model):
        if tensor.is_quantized:
            key = (id(tensor), 0)
            nbytes = tensor.numel() * tensor.element_size()
        else:
            storage = tensor.untyped_storage()
            key = (storage.data_ptr(), storage.nbytes())
            nbytes = storage.nbytes()
        if key in seen:
            continue
        seen.add(key)
        total += nbytes
    return total


def parameter_count(model: nn.Module) -> int:
    """Trainable-parameter count of a float model (tied weights once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def nonzero_parameters(model: nn.Module) -> int:
    """Parameters that are not exactly zero: what pruning removes."""
    unique = {id(p): p for p in model.parameters()}.values()
    # quantized tensor subclasses (torchao) cannot count zeros; quantization does not create sparsity anyway
    return sum(int(torch.count_nonzero(p)) if type(p.data) is torch.Tensor else p.numel() for p in unique)


def bytes_on_disk(path: Path) -> int:
    """Size of a file, or of every file under a folder."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def measure_latency(run: Callable[[torch.Tensor], torch.Tensor], example: torch.Tensor, warmup: int, iters: int) -> dict:
    """Median / p10 / p90 wall time of `run(example)` in ms, and samples per second at the median."""
    times = []
    with torch.no_grad():
        for _ in range(warmup):
            run(example)
        for _ in range(iters):
            start = time.perf_counter()
            run(example)
            times.append(time.perf_counter() - start)
    times.sort()
    median = statistics.median(times)
    q1, q3 = (statistics.quantiles(times, n=4, method="inclusive")[i] for i in (0, 2)) if len(times) > 1 else (median, median)
    return {
        "batch_size": int(example.shape[0]),
        "median_ms": median * 1e3,
        "q1_ms": q1 * 1e3,  # quartiles: a speed-up is claimed only when two [q1, q3] ranges are apart
        "q3_ms": q3 * 1e3,
        "p10_ms": times[len(times) // 10] * 1e3,
        "p90_ms": times[(len(times) * 9) // 10] * 1e3,
        "throughput_per_s": example.shape[0] / median,
        "iters": iters,
        "warmup": warmup,
    }


def latency_profile(run, make_input: Callable[[int], torch.Tensor], batch_sizes: list[int], warmup: int, iters: int, threads: int) -> dict:
    """Latency at each batch size with `threads` intra-op threads (restored afterwards)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return {
            "threads": torch.get_num_threads(),
            "by_batch": [measure_latency(run, make_input(b), warmup, iters) for b in batch_sizes],
        }
    finally:
        torch.set_num_threads(before)
