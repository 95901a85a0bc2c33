"""Benchmark `flopwise compress` on this CPU: INT8 speed, QAT recovery, pruning cost, CNN INT8.

Writes JSON (default benchmarks/results/compress.json). Cases:

- int8 on a Linear-heavy model (digits-mlp, ~17M params) at batch 1 and a larger batch:
  static PT2E (compiled) and dynamic PT2E / eager fallback; target >= 3x latency speed-up at
  batch >= 16 with <= 1% relative accuracy loss and ~4x smaller weights;
- QAT vs PTQ on the CNN in a setting where PTQ loses measurably (2-bit per-tensor weights);
- 60% magnitude pruning (one-shot, and gradual with fine-tuning) with its accuracy cost;
- 2:4 masks (quality only on CPU);
- the CNN's INT8 accuracy and latency vs fp32.

Latency figures depend on what else runs on the machine; run it on a quiet one.
Usage: python benchmarks/compress.py [--out PATH] [--threads N] [--cases a,b [--update]] [--quick]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

from machine import cpu_name

from flopwise.compress.config import CompressConfig
from flopwise.compress.run import compress_task
from flopwise.compress.tasks import digits_task

CASES = ("mlp-int8-static", "mlp-int8-dynamic", "mlp-int8-eager", "cnn-int8-static", "cnn-qat", "cnn-prune", "cnn-prune-gradual", "mlp-prune", "mlp-2:4")


def compact(result: dict) -> dict:
    """The figures a reader needs from one compress run (per-layer detail dropped)."""
    details = {k: v for k, v in result["details"].items() if k != "sparsity"}
    if "sparsity" in result["details"]:
        details["sparsity_overall"] = result["details"]["sparsity"]["overall"]
        details["sparsity_by_layer"] = {k: round(v["sparsity"], 4) for k, v in result["details"]["sparsity"]["layers"].items()}
    models = []
    for entry in result["baselines"] + [result["compressed"]]:
        models.append({
            "label": entry["label"],
            "parameters": entry["parameters"],
            "nonzero_parameters": entry["nonzero_parameters"],
            "bytes_in_memory": entry["bytes_in_memory"],
            "bytes_on_disk": entry["bytes_on_disk"],
            "latency": entry["latency"],
            "quality": entry["quality"],
        })
    return {"method": result["method"], "backend": result["backend"], "compiled": result["compiled"],
            "threads": result["threads"], "details": details, "models": models, "summary": result["summary"]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/compress.json"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--batch", type=int, default=32, help="the larger latency batch (>= 16)")
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="smaller MLP and fewer steps (a smoke run)")
    parser.add_argument("--update", action="store_true",
                        help="rerun only --cases and replace them in an existing --out file (the others are kept)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    cases = [c for c in args.cases.split(",") if c]
    unknown = set(cases) - set(CASES)
    if unknown:
        parser.error(f"unknown cases {sorted(unknown)} (allowed: {', '.join(CASES)})")

    mlp_kwargs = {"width": 256, "ffn": 1024, "n_blocks": 2} if args.quick else {"width": 1024, "ffn": 4096, "n_blocks": 2}
    tasks = {}
    started = time.time()
    if any(c.startswith("mlp") for c in cases):
        tasks["mlp"] = digits_task("digits-mlp", mlp_kwargs, epochs=3 if args.quick else 6)
    if any(c.startswith("cnn") for c in cases):
        tasks["cnn"] = digits_task("digits-cnn", epochs=8 if args.quick else 20)
    steps = 60 if args.quick else 300
    common = dict(threads=args.threads, latency_batch=args.batch, latency_iters=args.iters, latency_warmup=5, calib_batches=16)
    configs = {
        "mlp-int8-static": ("mlp", CompressConfig(method="int8-static", **common)),
        "mlp-int8-dynamic": ("mlp", CompressConfig(method="int8-dynamic", **common)),
        "mlp-int8-eager": ("mlp", CompressConfig(method="int8-dynamic", backend="eager", **common)),
        "cnn-int8-static": ("cnn", CompressConfig(method="int8-static", **common)),
        # 2-bit per-tensor weights: a setting where PTQ measurably loses accuracy (4-bit loses nothing measurable here)
        "cnn-qat": ("cnn", CompressConfig(method="qat", weight_bits=2, per_channel=False, qat_steps=steps, lr=1e-3, **common)),
        "cnn-prune": ("cnn", CompressConfig(method="prune", sparsity=0.6, **common)),
        "cnn-prune-gradual": ("cnn", CompressConfig(method="prune", sparsity=0.6, schedule="gradual", finetune_steps=steps, lr=5e-4, **common)),
        "mlp-prune": ("mlp", CompressConfig(method="prune", sparsity=0.6, **common)),
        "mlp-2:4": ("mlp", CompressConfig(method="2:4", finetune_steps=steps // 3, lr=1e-4, **common)),
    }
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            task_name, cfg = configs[case]
            t0 = time.time()
            print(f"[compress bench] {case} ...", file=sys.stderr, flush=True)
            result = compress_task(tasks[task_name], cfg, Path(tmp) / case.replace(":", "-"))
            results[case] = {**compact(result), "seconds": time.time() - t0}
            s = result["summary"]
            print(f"[compress bench] {case}: speedup {json.dumps({b: round(v['vs_fp32_eager'], 2) for b, v in s['speedup'].items()})} "
                  f"quality {s['quality_before']:.4f}->{s['quality_after']:.4f} disk {s['disk_ratio']:.2f}x "
                  f"mem {s['memory_ratio']:.2f}x", file=sys.stderr, flush=True)

    checks = {}
    if "mlp-int8-static" in results:
        s = results["mlp-int8-static"]["summary"]
        big = s["speedup"][str(args.batch)]
        checks["int8_linear_speedup_at_batch_%d" % args.batch] = {
            "vs_fp32_eager": big["vs_fp32_eager"], "vs_fastest_fp32": big["vs_fastest_fp32"],
            "target": 3.0, "met": big["vs_fp32_eager"] >= 3.0,
        }
        checks["int8_linear_relative_quality_loss"] = {"value": s["relative_quality_loss"], "target": 0.01, "met": s["relative_quality_loss"] <= 0.01}
        checks["int8_linear_memory_ratio"] = {"value": s["memory_ratio"], "target": "~4x"}
    if "cnn-qat" in results:
        r = results["cnn-qat"]["summary"]["qat_recovery"]
        checks["qat_recovered_fraction_of_ptq_loss"] = {**r, "target": 0.5, "met": (r["recovered_fraction"] or 0) >= 0.5}
    for case in ("cnn-prune", "cnn-prune-gradual", "mlp-prune"):
        if case in results:
            checks[f"{case}_60pct_relative_accuracy_loss"] = results[case]["summary"]["relative_quality_loss"]
    report = {
        "benchmark": "compress",
        "machine": {"cpu": cpu_name(), "threads": args.threads, "torch": torch.__version__,
                    "torchao": __import__("torchao").__version__, "python": platform.python_version()},
        "note": "latency is the median of N calls after warm-up; figures from a shared machine are noisy",
        "mlp_network": mlp_kwargs,
        "seconds": time.time() - started,
        "cases": results,
        "checks": checks,
    }
    if args.update and args.out.exists():
        previous = json.loads(args.out.read_text())
        report["cases"] = {**{k: results.get(k, v) for k, v in previous["cases"].items()}, **results}
        report["checks"] = {**previous.get("checks", {}), **checks}
        report["updated_cases"] = {**previous.get("updated_cases", {}),
                                   **{case: time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()) for case in results}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str))
    print(json.dumps(checks, indent=2, default=str))
    return report


if __name__ == "__main__":
    main()
