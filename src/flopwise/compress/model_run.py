"""One compression run of a "model" method: measure the float model, compress it, measure again, save.

The order is fixed and readable: baseline -> method -> save -> measure -> result dict
(which `report.py` turns into a table, JSON and a plot). It is the same for every method;
what differs is the `ModelMethod` (`methods/model_flow.py`) it is given.
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

import torch
from torch import nn

from flopwise.compress import evaluate
from flopwise.compress.artifact import save_compressed
from flopwise.compress.result import CompressResult
from flopwise.compress.tasks import Task, relative_quality_loss


def measure(task: Task, model: nn.Module, run: nn.Module, cfg, threads: int, disk_bytes: int) -> dict:
    """Parameters, bytes, latency at batch 1 and `latency_batch`, and quality of one model."""
    return {
        "parameters": evaluate.parameter_count(task.model),
        "nonzero_parameters": evaluate.nonzero_parameters(model) if not isinstance(model, torch.fx.GraphModule) else None,
        "bytes_in_memory": evaluate.bytes_in_memory(model),
        "bytes_on_disk": disk_bytes,
        "latency": evaluate.latency_profile(run, task.make_input, [1, cfg.latency_batch], cfg.latency_warmup, cfg.latency_iters, threads),
        "quality": task.quality(run),
    }


def float_disk_bytes(model: nn.Module) -> int:
    """Size of the float model written as plain safetensors (what the trainer's export writes)."""
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.safetensors"
        state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
        save_file(state, str(path))
        return path.stat().st_size


def compress_with(method, task: Task, cfg, out: Path, progress=None) -> dict:
    """Run `method` (a `ModelMethod`) on `task`, save the result in `out`, and return before/after measurements.

    `progress(line)`, when given, hears each phase as it starts (compiling takes minutes on a CPU).
    """
    from flopwise.compress.quantize import compile_for_cpu

    say = progress or (lambda line: None)
    threads = cfg.threads or torch.get_num_threads()
    task.model.eval()
    say(f"measuring fp32 eager ({threads} thread(s), batches 1 and {cfg.latency_batch}) ...")
    before = measure(task, task.model, task.model, cfg, threads, float_disk_bytes(task.model))
    before["label"] = "fp32 eager"
    baselines = [before]
    backend = method.backend(cfg)
    compiled = method.quantizes and cfg.compile and backend != "eager"  # INT8 runs through Inductor's INT8 kernels
    if compiled:
        say("compiling and measuring fp32 (torch.compile, Inductor; one graph per batch size, can take minutes) ...")
        compiled_float = measure(task, task.model, compile_for_cpu(copy.deepcopy(task.model)), cfg, threads, before["bytes_on_disk"])
        compiled_float["label"] = "fp32 compiled"
        baselines.append(compiled_float)
    say(f"quantizing: {method.name} with {backend} ..." if method.quantizes else f"sparsifying: {method.name} ...")
    model, details = method.apply(task, cfg, backend)
    fmt = "pt2" if isinstance(model, torch.fx.GraphModule) else "safetensors"
    run = compile_for_cpu(model) if compiled else model
    if method.accelerate is not None:
        details["accelerated_layers"] = method.accelerate(run)
    manifest = {
        "method": method.name,
        "backend": details.get("backend", backend),
        "format": fmt,
        "rebuild": task.rebuild,
        "requantize": backend if fmt == "safetensors" and method.quantizes else None,
    }
    if method.sparsity_structure is not None:
        from flopwise.compress.sparsity_layout import sparsity_config

        manifest["sparsity_config"] = sparsity_config(method.sparsity_structure, details)
    example = task.make_input(2)
    saved = model if fmt == "pt2" or not method.quantizes else task.model  # torchao / eager: float weights, re-quantized on load
    save_compressed(out, saved, manifest=manifest, example=example, files=task.files)
    compiling = " (compiling the INT8 graph first: can take minutes)" if fmt == "pt2" and cfg.compile else ""
    say(f"measuring {method.name}{compiling} ...")
    after = measure(task, model, run, cfg, threads, evaluate.bytes_on_disk(out / ("model.pt2" if fmt == "pt2" else "model.safetensors")))
    after["label"] = method.name
    result = {
        "task": task.name,
        "quality_basis": task.quality_basis,
        "method": method.name,
        "flow": method.flow,
        "backend": manifest["backend"],
        "compiled": bool(cfg.compile and fmt == "pt2"),
        "threads": threads,
        "activation_bits": activation_bits(method, manifest["backend"]),
        "quality_metric": task.quality_metric,
        "details": details,
        "baselines": baselines,
        "compressed": after,
        "out": str(out),
    }
    result["summary"] = summarize(task, result)
    if method.extra_summary is not None:
        result["summary"].update(method.extra_summary(task, before, after, details))
    return result


def run_job(method, job) -> CompressResult:
    """The command's run of a "model" method: build the task, compress, write report.json/.md/.png."""
    from flopwise.compress.report import model_result, write_report
    from flopwise.compress.tasks import task_for

    task = task_for(job.cfg, job.source, trust_remote_code=job.trust_remote_code, accept_run=job.accept_run)
    result = compress_with(method, task, job.cfg, Path(job.out), progress=job.progress)
    result["report"] = write_report(result, Path(job.out))
    return model_result(result, job.out)


def activation_bits(method, backend: str) -> int | None:
    """8, or 7 where the x86 CPU lacks an int8 dot product (see `quantize.has_int8_dot_product`)."""
    if not method.quantizes or backend != "pt2e-x86":
        return None
    from flopwise.compress.quantize import activation_quant_max

    return 8 if activation_quant_max() == 255 else 7


def ranges_apart(a: dict, b: dict) -> bool:
    """Whether two latency measurements' [q1, q3] ranges do not overlap (older records: p10/p90)."""
    lo_a, hi_a = a.get("q1_ms", a["p10_ms"]), a.get("q3_ms", a["p90_ms"])
    lo_b, hi_b = b.get("q1_ms", b["p10_ms"]), b.get("q3_ms", b["p90_ms"])
    return hi_a < lo_b or hi_b < lo_a


def summarize(task: Task, result: dict) -> dict:
    """Speed-up (vs the fastest fp32 baseline), size ratios and quality change in one place."""
    after = result["compressed"]
    metric = task.quality_metric
    base = result["baselines"][0]
    speedups = {}
    for i, lat in enumerate(after["latency"]["by_batch"]):
        fastest = min((b["latency"]["by_batch"][i] for b in result["baselines"]), key=lambda x: x["median_ms"])
        eager = base["latency"]["by_batch"][i]
        speedups[str(lat["batch_size"])] = {
            "vs_fp32_eager": eager["median_ms"] / lat["median_ms"],
            "vs_fastest_fp32": fastest["median_ms"] / lat["median_ms"],
            # False when the interquartile ranges overlap: the ratio is then not a measured difference
            "measurable_vs_fp32_eager": ranges_apart(eager, lat),
            "measurable_vs_fastest_fp32": ranges_apart(fastest, lat),
        }
    return {
        "speedup": speedups,
        "memory_ratio": base["bytes_in_memory"] / max(after["bytes_in_memory"], 1),
        "disk_ratio": base["bytes_on_disk"] / max(after["bytes_on_disk"], 1),
        "quality_before": base["quality"][metric],
        "quality_after": after["quality"][metric],
        "relative_quality_loss": relative_quality_loss(task, base["quality"][metric], after["quality"][metric]),
    }
