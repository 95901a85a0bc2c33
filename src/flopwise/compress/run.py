"""One compression run: measure the float model, compress it, measure again, save.

The order is fixed and readable: baseline -> method -> save -> measure -> result dict
(which `report.py` turns into a table, JSON and a plot).
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

import torch
from torch import nn

from flopwise.compress import evaluate
from flopwise.compress.artifact import save_compressed
from flopwise.compress.config import CompressConfig
from flopwise.compress.finetune import finetune
from flopwise.compress.tasks import Task, relative_quality_loss
from flopwise.errors import UserError

INT8_METHODS = ("int8-static", "int8-dynamic", "qat")


def measure(task: Task, model: nn.Module, run: nn.Module, cfg: CompressConfig, threads: int, disk_bytes: int) -> dict:
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


def resolve_backend(cfg: CompressConfig) -> str:
    """The quantization backend that will run, checked against the method."""
    from flopwise.compress.quantize import default_backend

    if cfg.method not in INT8_METHODS:
        return "torch.nn.utils.prune"
    backend = default_backend(cfg.method) if cfg.backend == "auto" else cfg.backend
    if cfg.method in ("int8-static", "qat") and backend != "pt2e-x86":
        raise UserError(f"compress.backend: {cfg.method} runs on the PT2E flow only (allowed: auto, pt2e-x86; got {backend})")
    return backend


def quantize(task: Task, cfg: CompressConfig, backend: str) -> tuple[nn.Module, dict]:
    """INT8 PTQ (static or dynamic) or QAT; returns the quantized model and method details."""
    from flopwise.compress import quantize as q

    model = copy.deepcopy(task.model).eval()
    example = task.make_input(cfg.batch_size)
    batches = task.train_batches(cfg.batch_size, 123)
    calibration = [next(batches)[0] for _ in range(cfg.calib_batches)]
    details = {"backend": backend, "per_channel": cfg.per_channel, "weight_bits": cfg.weight_bits}
    if cfg.method == "int8-dynamic":
        return q.quantize_dynamic(model, example, backend), details
    details.update(observer=cfg.observer, calib_batches=cfg.calib_batches)
    ptq = q.quantize_static(
        model, example, calibration, observer=cfg.observer, percentile=cfg.percentile,
        per_channel=cfg.per_channel, weight_bits=cfg.weight_bits,
    )
    if cfg.method == "int8-static":
        return ptq, details
    from flopwise.compress.qat import quantize_aware_train

    ptq_quality = task.quality(ptq)
    qat_model, losses = quantize_aware_train(
        copy.deepcopy(task.model), task, cfg.qat_steps, cfg.lr, cfg.batch_size,
        per_channel=cfg.per_channel, weight_bits=cfg.weight_bits,
    )
    details.update(qat_steps=cfg.qat_steps, ptq_quality=ptq_quality, qat_first_loss=losses[0], qat_last_loss=losses[-1])
    return qat_model, details


def sparsify(task: Task, cfg: CompressConfig) -> tuple[nn.Module, dict]:
    """Magnitude pruning (one-shot or gradual) or 2:4 masks, optional fine-tuning, made permanent."""
    from flopwise.compress import prune, sparsity

    model = copy.deepcopy(task.model)
    details: dict = {"finetune_steps": cfg.finetune_steps}
    if cfg.method == "prune":
        if cfg.schedule == "gradual" and cfg.finetune_steps == 0:
            raise UserError("compress.schedule: gradual pruning needs compress.finetune_steps > 0 (or use schedule: oneshot)")
        details.update(target_sparsity=cfg.sparsity, scope=cfg.scope, schedule=cfg.schedule)
        if cfg.schedule == "gradual":
            points = prune.gradual_points(cfg.finetune_steps)

            def raise_sparsity(step: int) -> None:
                # the ramp ends at the last mask update, so fine-tuning after it sees the final sparsity
                if step in points:
                    prune.prune_to(model, prune.cubic_sparsity(step, points[-1], cfg.sparsity), cfg.scope)

            finetune(model.train(), task, cfg.finetune_steps, cfg.lr, cfg.batch_size, before_step=raise_sparsity)
            prune.prune_to(model, cfg.sparsity, cfg.scope)
        else:
            prune.prune_to(model, cfg.sparsity, cfg.scope)
            if cfg.finetune_steps:
                finetune(model.train(), task, cfg.finetune_steps, cfg.lr, cfg.batch_size)
        prune.make_permanent(model)
        details["note"] = ("unstructured sparsity: no speed-up with dense kernels; saved dense with zeros "
                           "and a sparsity_config (compressed-tensors fields)")
    else:
        skipped = sparsity.apply_two_four(model)
        if cfg.finetune_steps:
            finetune(model.train(), task, cfg.finetune_steps, cfg.lr, cfg.batch_size)
        prune.make_permanent(model)
        _, reason = sparsity.semi_structured_supported()
        details.update(skipped_layers=skipped, kernel=reason)
    model.eval()
    details["sparsity"] = prune.sparsity_by_layer(model)
    return model, details


def compress_task(task: Task, cfg: CompressConfig, out: Path, progress=None) -> dict:
    """Run `cfg.method` on `task`, save the result in `out`, and return before/after measurements.

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
    backend = resolve_backend(cfg)
    if cfg.method in INT8_METHODS:
        if cfg.compile and backend != "eager":
            say("compiling and measuring fp32 (torch.compile, Inductor; one graph per batch size, can take minutes) ...")
            compiled_float = measure(task, task.model, compile_for_cpu(copy.deepcopy(task.model)), cfg, threads, before["bytes_on_disk"])
            compiled_float["label"] = "fp32 compiled"
            baselines.append(compiled_float)
        say(f"quantizing: {cfg.method} with {backend} ...")
        model, details = quantize(task, cfg, backend)
        fmt = "pt2" if isinstance(model, torch.fx.GraphModule) else "safetensors"
        run = compile_for_cpu(model) if cfg.compile and backend != "eager" else model
    else:
        say(f"sparsifying: {cfg.method} ...")
        model, details = sparsify(task, cfg)
        fmt, run = "safetensors", model
    if cfg.method == "2:4":
        from flopwise.compress.sparsity import accelerate_two_four

        details["accelerated_layers"] = accelerate_two_four(run)
    manifest = {
        "method": cfg.method,
        "backend": details.get("backend", backend),
        "format": fmt,
        "rebuild": task.rebuild,
        "requantize": backend if fmt == "safetensors" and cfg.method in INT8_METHODS else None,
    }
    if cfg.method in ("prune", "2:4"):
        from flopwise.compress.sparsity_layout import sparsity_config

        manifest["sparsity_config"] = sparsity_config(cfg.method, details)
    example = task.make_input(2)
    saved = model if fmt == "pt2" or cfg.method not in INT8_METHODS else task.model  # torchao / eager: float weights, re-quantized on load
    save_compressed(out, saved, manifest=manifest, example=example, files=task.files)
    compiling = " (compiling the INT8 graph first: can take minutes)" if fmt == "pt2" and cfg.compile else ""
    say(f"measuring {cfg.method}{compiling} ...")
    after = measure(task, model, run, cfg, threads, evaluate.bytes_on_disk(out / ("model.pt2" if fmt == "pt2" else "model.safetensors")))
    after["label"] = cfg.method
    result = {
        "task": task.name,
        "quality_basis": task.quality_basis,
        "method": cfg.method,
        "backend": manifest["backend"],
        "compiled": bool(cfg.compile and fmt == "pt2"),
        "threads": threads,
        "activation_bits": activation_bits(cfg.method, manifest["backend"]),
        "quality_metric": task.quality_metric,
        "details": details,
        "baselines": baselines,
        "compressed": after,
        "out": str(out),
    }
    result["summary"] = summarize(task, result)
    if cfg.method == "qat":
        result["summary"]["qat_recovery"] = qat_recovery(task, before["quality"], details["ptq_quality"], after["quality"])
    return result


def activation_bits(method: str, backend: str) -> int | None:
    """8, or 7 where the x86 CPU lacks an int8 dot product (see `quantize.has_int8_dot_product`)."""
    if method not in INT8_METHODS or backend != "pt2e-x86":
        return None
    from flopwise.compress.quantize import activation_quant_max

    return 8 if activation_quant_max() == 255 else 7


def qat_recovery(task: Task, float_q: dict, ptq_q: dict, qat_q: dict) -> dict:
    """Share of the PTQ quality loss that QAT wins back: (qat - ptq) / (float - ptq), in the metric's direction."""
    metric = task.quality_metric
    ptq_loss = relative_quality_loss(task, float_q[metric], ptq_q[metric])
    qat_loss = relative_quality_loss(task, float_q[metric], qat_q[metric])
    recovered = (ptq_loss - qat_loss) / ptq_loss if ptq_loss > 0 else None
    return {"ptq_relative_loss": ptq_loss, "qat_relative_loss": qat_loss, "recovered_fraction": recovered}


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
