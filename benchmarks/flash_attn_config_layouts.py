"""Do flash-attention's own training configs plan? Every GPT configuration of its trainer
(`training/configs/experiment/{owt,pile}/*-flash*.yaml`, the fused-kernel ones) on 8 A100, planned as a
user would type it (`--stack flash-attn`, the config's per-GPU batch for the card, its global batch, its
optimizer's ZeRO stage, no activation checkpointing), with the verdict: fits, tight (over the usable
memory by less than the memory forecast's band), does not fit, or refused (the one-line reason).

Source of the layouts (settings only: no throughput figure is in those files or used here):
Dao-AILab/flash-attention at 0251105a, training/configs/experiment/owt/gpt2{s,m,l,xl}-flash.yaml (seq 1,024,
Lightning `precision: 16`, global batch 512) and pile/gpt3{s,m,l,xl,-2.7B}-flash{,-8k}.yaml (seq 2,048 or
8,192, `precision: bf16`, global batch 256 / 512 / 64 / 128). The per-GPU batch is each config's
`train.gpu_mem` formula: nvidia-smi's memory.total over 1,000, rounded, so 80 on an A100 80GB (81,920 MiB)
and 41 on an A100 40GB (40,960 MiB). `optimizer: adamw-zero` is torch's ZeroRedundancyOptimizer
(ZeRO-1), `adamw-apex` plain DDP with apex FusedAdam (ZeRO-0). The configs leave `mlp_checkpoint_lvl` at 0.
The rotary variants share their base config's shapes and are left out.

    .venv/bin/python benchmarks/flash_attn_config_layouts.py   # writes benchmarks/results/flash_attn_config_layouts.json
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nemo_recipe_layouts import write_results  # noqa: E402

ROWS = (
    ("owt/gpt2s-flash", "gpt2-124m", 1024, "fp16", 0, 64, 64, 512),
    ("owt/gpt2m-flash", "gpt2-355m", 1024, "fp16", 0, 64, 32, 512),
    ("owt/gpt2l-flash", "gpt2-774m", 1024, "fp16", 1, 32, 16, 512),
    ("owt/gpt2xl-flash", "gpt2-1.5b", 1024, "fp16", 1, 16, 8, 512),
    ("pile/gpt3s-flash", "gpt3-125m", 2048, "bf16", 0, 32, 32, 256),
    ("pile/gpt3m-flash", "gpt3-350m", 2048, "bf16", 0, 32, 16, 256),
    ("pile/gpt3l-flash", "gpt3-760m", 2048, "bf16", 1, 16, 8, 256),
    ("pile/gpt3xl-flash", "gpt3-1.3b", 2048, "bf16", 1, 8, 4, 512),
    ("pile/gpt3-2.7B-flash", "gpt3-2.7b", 2048, "bf16", 1, 4, 2, 512),
    ("pile/gpt3s-flash-8k", "gpt3-125m", 8192, "bf16", 0, 8, 8, 64),
    ("pile/gpt3m-flash-8k", "gpt3-350m", 8192, "bf16", 0, 8, 8, 64),
    ("pile/gpt3l-flash-8k", "gpt3-760m", 8192, "bf16", 1, 4, 2, 64),
    ("pile/gpt3xl-flash-8k", "gpt3-1.3b", 8192, "bf16", 1, 4, 2, 128),
    ("pile/gpt3-2.7B-flash-8k", "gpt3-2.7b", 8192, "bf16", 1, 4, 2, 128),
)
"""(config, catalog model, sequence length, precision, ZeRO stage, batch per GPU on an A100 80GB, on an
A100 40GB, global batch)."""


def plan_row(config: str, model: str, seq: int, precision: str, zero: int, mbs: int, hardware: str,
             global_batch: int) -> dict:
    """The verdict for one configuration on one card, planned under --stack flash-attn as it states it."""
    from flopwise.errors import UserError
    from flopwise.plan.planner import build_runspec, plan

    out = {"config": config, "model": model, "hardware": hardware, "gpus": 8, "seq": seq, "micro_batch": mbs,
           "global_batch": max(global_batch, 8 * mbs), "zero": zero, "precision": precision}
    try:
        result = plan(build_runspec(model=model, hardware=hardware, stack="flash-attn", gpus=8, tp=1, zero=zero,
                                    micro_batch=mbs, global_batch=out["global_batch"], seq_len=seq,
                                    precision=precision, recompute="none"))
    except UserError as err:
        return {**out, "verdict": "refused", "reason": str(err).splitlines()[0]}
    memory, time = result.memory, result.time
    return {**out, "verdict": memory.verdict,
            "allocated_share_of_usable": round(memory.allocated_bytes / memory.capacity_bytes, 3),
            "mfu": round(time.mfu, 4), "tokens_per_second_per_device": round(time.tokens_per_second_per_device, 1)}


def main() -> int:
    rows = [plan_row(config, model, seq, precision, zero, mbs, hardware, gbs)
            for config, model, seq, precision, zero, mbs80, mbs40, gbs in ROWS
            for hardware, mbs in (("a100-80gb", mbs80), ("a100-40gb", mbs40))]
    write_results({"rows": len(rows), **Counter(row["verdict"] for row in rows)}, rows, "flash_attn_config_layouts")
    for row in rows:
        if row["verdict"] != "fits":
            print({k: row[k] for k in ("config", "hardware", "micro_batch", "verdict")},
                  row.get("allocated_share_of_usable", row.get("reason")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
