"""Do NVIDIA NeMo's own H100 layouts plan? Every language-model row of NeMo's recommended H100
configurations, planned as a user would type it, with the verdict: plans and fits, plans tight (over
the usable memory by less than the memory forecast's band: kept as stated, no recompute added), plans
but does not fit, or refused / unknown (with the one-line reason).

Source of the layouts (layouts only: no throughput figure is in that file or used here):
NVIDIA/NeMo `scripts/performance/recommended_model_configs/model_configs_h100.csv` at commit
8cfedd7203462cb251a914e700e5605444277561 (2025-09-20). Columns kept: task, model, size, dtype,
num_gpus, seq_len, tp, pp, cp, ep, vp, mbs, gbs, etp, and recompute_modules where a row sets it
(`RECOMPUTE`; its recompute_layers and activation_offload_layers are 0 on every H100 row). Rows of models flopwise does not plan
(vision-language and diffusion models) are listed as skipped.

    .venv/bin/python benchmarks/nemo_recipe_layouts.py   # writes benchmarks/results/nemo_recipe_layouts.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROWS = (
    ('lora', 'llama3', '70b', 'fp8', 8, 4096, 2, 4, 1, 1, 20, 1, 32, None),
    ('lora', 'llama3', '8b', 'bf16', 8, 4096, 1, 1, 1, 1, 1, 1, 32, None),
    ('lora', 'llama3', '8b', 'fp8', 8, 4096, 1, 1, 1, 1, 1, 1, 32, None),
    ('lora', 'llama3', '70b', 'bf16', 8, 4096, 2, 4, 1, 1, 20, 1, 32, None),
    ('lora', 'llama31', '405b', 'bf16', 32, 2048, 8, 6, 1, 1, 8, 1, 32, None),
    ('lora', 'llama31', '405b', 'fp8', 32, 2048, 8, 6, 1, 1, 8, 1, 32, None),
    ('pre_train', 'gpt3', '175b', 'fp8', 512, 2048, 4, 8, 1, 1, 6, 2, 2048, None),
    ('pre_train', 'gpt3', '175b', 'fp8', 128, 2048, 4, 8, 1, 1, 6, 1, 256, None),
    ('pre_train', 'gpt3', '175b', 'bf16', 128, 2048, 4, 8, 1, 1, 6, 1, 256, None),
    ('pre_train', 'llama31', '405b', 'fp8', 1024, 8192, 8, 8, 2, 1, 8, 1, 512, None),
    ('pre_train', 'llama31', '405b', 'bf16', 1024, 8192, 8, 8, 2, 1, 8, 1, 512, None),
    ('pre_train', 'llama3', '70b', 'fp8', 64, 8192, 4, 8, 1, 1, 5, 1, 128, None),
    ('pre_train', 'llama3', '70b', 'bf16', 64, 8192, 4, 4, 2, 1, 5, 1, 128, None),
    ('pre_train', 'llama3', '8b', 'fp8', 8, 8192, 1, 1, 1, 1, 1, 1, 128, None),
    ('pre_train', 'llama3', '8b', 'bf16', 8, 8192, 1, 1, 2, 1, 1, 1, 128, None),
    ('pre_train', 'mixtral', '8x7b', 'fp8', 64, 4096, 1, 4, 1, 8, 8, 1, 256, None),
    ('pre_train', 'mixtral', '8x7b', 'bf16', 64, 4096, 1, 4, 1, 8, 8, 1, 256, None),
    ('pre_train', 'mixtral', '8x22b', 'bf16', 256, 65536, 4, 4, 8, 8, 14, 1, 256, 1),
    ('pre_train', 'mixtral', '8x22b', 'fp8', 256, 65536, 4, 4, 8, 8, 14, 1, 256, 1),
    ('pre_train', 'nemotron3', '22b', 'bf16', 64, 4096, 2, 4, 1, 1, 10, 1, 256, None),
    ('pre_train', 'nemotron3', '22b', 'fp8', 64, 4096, 1, 4, 1, 1, 10, 1, 256, None),
    ('pre_train', 'nemotron3', '8b', 'bf16', 8, 4096, 2, 1, 1, 1, 1, 2, 32, None),
    ('pre_train', 'nemotron3', '8b', 'fp8', 8, 4096, 2, 1, 1, 1, 1, 2, 32, None),
    ('pre_train', 'nemotron4', '15b', 'bf16', 64, 4096, 2, 1, 1, 1, 1, 2, 256, None),
    ('pre_train', 'nemotron4', '15b', 'fp8', 64, 4096, 2, 1, 1, 1, 1, 2, 256, None),
    ('pre_train', 'nemotron4', '340b', 'bf16', 256, 4096, 8, 8, 1, 1, 12, 1, 64, None),
    ('pre_train', 'nemotron4', '340b', 'fp8', 256, 4096, 8, 8, 1, 1, 12, 1, 64, None),
    ('pre_train', 'nemotronh', '8b', 'fp8', 8, 8192, 1, 1, 1, 1, 1, 1, 128, None),
    ('pre_train', 'nemotronh', '47b', 'fp8', 64, 8192, 8, 1, 1, 1, 1, 1, 192, None),
    ('pre_train', 'nemotronh', '56b', 'fp8', 64, 8192, 8, 1, 1, 1, 1, 1, 192, None),
    ('pre_train', 'nemotronh', '56b', 'fp8', 256, 8192, 8, 1, 1, 1, 1, 1, 768, None),
    ('pre_train', 'deepseek', 'v3', 'bf16', 1024, 4096, 2, 16, 1, 64, 1, 1, 8192, 1),
    ('pre_train', 'deepseek', 'v3', 'fp8', 1024, 4096, 2, 16, 1, 64, 1, 1, 8192, 1),
    ('pre_train', 'llama4', 'e16', 'bf16', 256, 8192, 4, 1, 1, 16, 1, 1, 1024, 4),
    ('pre_train', 'llama4', 'e128', 'bf16', 512, 8192, 4, 1, 1, 128, 1, 1, 1024, 4),
    ('pre_train', 'vlm_llama4', 'e16', 'bf16', 256, 8192, 4, 1, 1, 16, 1, 1, 1024, 4),
    ('pre_train', 'vlm_llama4', 'e128', 'bf16', 512, 8192, 4, 1, 1, 128, 1, 1, 1024, 4),
    ('sft', 'llama3', '8b', 'bf16', 8, 4096, 1, 1, 1, 1, 1, 1, 32, None),
    ('sft', 'llama3', '8b', 'fp8', 8, 4096, 1, 1, 1, 1, 1, 1, 32, None),
    ('sft', 'llama3', '70b', 'bf16', 32, 4096, 4, 4, 1, 1, 5, 1, 32, None),
    ('sft', 'llama3', '70b', 'fp8', 32, 4096, 4, 4, 1, 1, 5, 1, 32, None),
    ('sft', 'llama4', 'e128', 'bf16', 256, 4096, 8, 1, 1, 32, 1, 1, 32, 8),
    ('pre_train', 'neva_llama3', '8b', 'bf16', 8, 8192, 1, 1, 2, 1, 1, 1, 128, None),
    ('pre_train', 'flux', '12b', 'bf16', 8, 4096, 1, 1, 1, 1, 1, 1, 64, None),
    ('sft', 'deepseek', 'v3', 'bf16', 992, 4096, 1, 31, 1, 8, 2, 1, 3968, None),
    ('pre_train', 'qwen3', '30b_a3b', 'bf16', 16, 4096, 1, 2, 1, 8, 24, 1, 512, 1),
    ('pre_train', 'qwen3', '235b_a22b', 'bf16', 256, 4096, 2, 8, 1, 32, 4, 1, 2048, 1),
    ('finetune', 'qwen25vl', '7b', 'bf16', 8, 8192, 1, 2, 1, 1, 1, 1, 64, None),
    ('finetune', 'qwen25vl', '32b', 'bf16', 32, 8192, 4, 2, 1, 1, 1, 1, 64, None),
)
"""(task, model, size, dtype, GPUs, seq, tp, pp, cp, ep, vp, micro-batch, global batch, etp or None)."""

CATALOG = {("gpt3", "175b"): "gpt3-175b", ("llama31", "405b"): "llama3.1-405b", ("llama3", "70b"): "llama3-70b",
           ("llama3", "8b"): "llama3-8b", ("mixtral", "8x7b"): "mixtral-8x7b", ("mixtral", "8x22b"): "mixtral-8x22b",
           ("nemotron4", "15b"): "nemotron4-15b", ("nemotron4", "340b"): "nemotron4-340b",
           ("nemotron3", "8b"): "nemotron3-8b", ("nemotron3", "22b"): "nemotron3-22b",
           ("qwen3", "30b_a3b"): "qwen3-30b-a3b", ("qwen3", "235b_a22b"): "qwen3-235b-a22b",
           ("deepseek", "v3"): "deepseek-v3", ("llama4", "e16"): "llama4-scout", ("llama4", "e128"): "llama4-maverick",
           ("nemotronh", "8b"): "nemotron-h-8b", ("nemotronh", "47b"): "nemotron-h-47b",
           ("nemotronh", "56b"): "nemotron-h-56b"}
"""NeMo's (model, size) names -> flopwise catalog keys; anything else is not a language model flopwise plans."""


RECOMPUTE = {("pre_train", "deepseek", "v3"): "mla_up_proj/mlp/moe"}
"""The rows' recompute_modules column (Megatron-Core's per-module recompute), as the CSV writes it."""


def plan_row(row: tuple, hardware: str = "h100-sxm", **stated) -> dict:
    """The verdict for one row: its layout planned under --stack nemo as the row states it (`stated`:
    more `build_runspec` options the row states, e.g. zero=3 for Megatron-Core FSDP; `catalog`: the
    flopwise model key, for a row whose (model, size) is not in CATALOG)."""
    from flopwise.errors import UserError
    from flopwise.plan.planner import build_runspec, plan

    task, model, size, dtype, gpus, seq, tp, pp, cp, ep, vp, mbs, gbs, etp = row
    out = {"task": task, "model": f"{model} {size}", "dtype": dtype, "gpus": gpus,
           "layout": f"tp {tp} pp {pp} cp {cp} ep {ep} vp {vp} etp {etp} mbs {mbs} gbs {gbs} seq {seq}"}
    key = stated.pop("catalog", None) or CATALOG.get((model, size))
    if key is None:
        return {**out, "verdict": "skipped", "reason": "not a language model flopwise plans"}
    kwargs = dict(model=key, hardware=hardware, stack="nemo", gpus=gpus, tp=tp, pp=pp, cp=cp, ep=ep,
                  micro_batch=mbs, global_batch=gbs, seq_len=seq, precision=dtype)
    if vp > 1:
        kwargs.update(schedule="interleaved", virtual_stages=vp)
    if etp is not None and ep > 1:
        kwargs["etp"] = etp
    if task == "lora":
        kwargs.update(finetune="lora", tokens="1B")
    if (task, model, size) in RECOMPUTE and hardware == "h100-sxm":
        kwargs["recompute"] = RECOMPUTE[(task, model, size)]
    kwargs.update(stated)
    try:
        result = plan(build_runspec(**kwargs))
    except (UserError, TypeError) as err:  # TypeError: an option this tree does not have
        return {**out, "catalog": key, "verdict": "refused", "reason": str(err).splitlines()[0]}
    memory, time = result.memory, result.time
    verdict = "fits" if result.fits else "tight" if memory.may_fit else "does not fit"
    return {**out, "catalog": key, "verdict": verdict,
            "memory_share_of_usable": memory.total_bytes / memory.capacity_bytes,
            "recompute": result.spec.layout.recompute, "fits_with": list(memory.fits_with),
            "mfu_16bit_peak": time.mfu_16bit_peak or time.mfu, "tokens_per_second_per_device": time.tokens_per_second_per_device}


def describe(row: dict) -> str:
    """One printed line for a planned row: what it is, its verdict and why."""
    detail = row.get("reason") or f"{row['memory_share_of_usable']:.0%} of usable, MFU {row['mfu_16bit_peak']:.1%}"
    return f"{row['task']:9s} {row['model']:16s} {row['dtype']:4s} {row['gpus']:5d}  {row['verdict']:12s} {detail}"


def write_results(summary: dict, results: list[dict], name: str) -> None:
    """Print the summary and write it with every row to benchmarks/results/<name>.json."""
    print(json.dumps(summary))
    path = Path(__file__).resolve().parent / "results" / f"{name}.json"
    path.write_text(json.dumps({"summary": summary, "rows": results}, indent=1) + "\n")
    print(f"wrote {path}")


def main() -> int:
    results = [plan_row(row) for row in ROWS]
    planned = [r for r in results if r["verdict"] != "skipped"]
    fits = [r for r in planned if r["verdict"] == "fits"]
    tight = [r for r in planned if r["verdict"] == "tight"]
    for r in planned:
        print(describe(r))
    summary = {"rows": len(results), "language_model_rows": len(planned), "plan_and_fit": len(fits),
               "plan_tight": len(tight), "skipped": len(results) - len(planned)}
    write_results(summary, results, "nemo_recipe_layouts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
