"""Do NVIDIA NeMo's own Blackwell layouts plan? Every language-model row of NeMo's recommended B200 and
GB200 configurations, planned under `--stack nemo` on the row's chip as the row states it, with the
verdict (fits / tight / does not fit / refused, as `nemo_recipe_layouts.py` gives it for H100).

Source of the layouts (layouts only: no throughput figure is in those files or used here): NVIDIA/NeMo
`scripts/performance/recommended_model_configs/model_configs_b200.csv` and `model_configs_gb200.csv` at
commit 8cfedd7203462cb251a914e700e5605444277561 (2025-09-20). Beyond the H100 columns they state
`use_mcore_fsdp` (Megatron-Core's FSDP: parameters, gradients and optimizer states sharded, planned as
ZeRO-3), `recompute_layers` (granularity full, method block: N blocks of each pipeline stage,
`blocks:F`), `activation_offload_layers` (the saved activations of N blocks of each stage kept in host
memory, `--offload-activations N`: Transformer Engine's CPU offload, plan/activation_offload.py) and
`recompute_modules`. Blackwell plans are low
confidence (`plan/gemm.py` ASSUMED_SUSTAINED): this checks that the layouts plan, not their speed.

    .venv/bin/python benchmarks/nemo_blackwell_layouts.py   # writes benchmarks/results/nemo_blackwell_layouts.json
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from nemo_recipe_layouts import describe, plan_row, write_results  # noqa: E402

ROWS = (
    ('lora', 'llama3', '70b', 'b200', 'fp8', 8, 4096, 1, 4, 1, 1, 20, 1, 32, None, 0, 0, 0, None),
    ('lora', 'llama3', '70b', 'b200', 'bf16', 8, 4096, 1, 4, 1, 1, 20, 1, 32, None, 0, 0, 0, None),
    ('lora', 'llama3', '8b', 'b200', 'bf16', 8, 16384, 1, 1, 1, 1, 1, 1, 8, None, 0, 0, 0, None),
    ('lora', 'llama3', '8b', 'b200', 'fp8', 8, 16384, 1, 1, 1, 1, 1, 1, 8, None, 0, 0, 0, None),
    ('lora', 'llama31', '405b', 'b200', 'fp8', 32, 2048, 4, 4, 1, 1, 4, 1, 32, None, 0, 0, 0, None),
    ('lora', 'llama31', '405b', 'b200', 'bf16', 32, 4096, 4, 4, 1, 1, 4, 1, 32, None, 0, 0, 0, None),
    ('pre_train', 'gpt3', '175b', 'b200', 'bf16', 128, 2048, 4, 4, 1, 1, 12, 2, 256, None, 0, 0, 0, None),
    ('pre_train', 'gpt3', '175b', 'b200', 'fp8', 128, 2048, 4, 4, 1, 1, 12, 2, 256, None, 0, 0, 0, None),
    ('pre_train', 'gpt3', '175b', 'b200', 'fp8', 512, 2048, 4, 4, 1, 1, 6, 2, 2048, None, 0, 0, 0, None),
    ('pre_train', 'llama3', '8b', 'b200', 'bf16', 8, 8192, 1, 1, 1, 1, 1, 2, 128, None, 0, 0, 0, None),
    ('pre_train', 'llama3', '8b', 'b200', 'fp8', 8, 8192, 1, 1, 1, 1, 1, 2, 128, None, 0, 0, 0, None),
    ('pre_train', 'llama3', '70b', 'b200', 'fp8', 64, 8192, 1, 1, 1, 1, 1, 1, 128, None, 1, 10, 0, None),
    ('pre_train', 'llama3', '70b', 'b200', 'bf16', 64, 8192, 2, 4, 2, 1, 5, 1, 128, None, 0, 0, 0, None),
    ('pre_train', 'llama31', '405b', 'b200', 'bf16', 128, 8192, 4, 8, 2, 1, 8, 1, 64, None, 0, 0, 0, None),
    ('pre_train', 'llama31', '405b', 'b200', 'fp8', 128, 8192, 4, 8, 2, 1, 8, 1, 64, None, 0, 0, 0, None),
    ('pre_train', 'mixtral', '8x7b', 'b200', 'bf16', 64, 4096, 1, 1, 1, 8, 1, 2, 256, None, 0, 0, 0, None),
    ('pre_train', 'mixtral', '8x7b', 'b200', 'fp8', 64, 4096, 1, 1, 1, 8, 1, 2, 256, None, 0, 0, 0, None),
    ('pre_train', 'mixtral', '8x22b', 'b200', 'bf16', 256, 65536, 2, 4, 8, 8, 14, 1, 64, 1, 0, 0, 0, None),
    ('pre_train', 'mixtral', '8x22b', 'b200', 'fp8', 256, 65536, 2, 4, 8, 8, 14, 1, 64, 1, 0, 0, 0, None),
    ('pre_train', 'nemotron4', '15b', 'b200', 'bf16', 64, 4096, 1, 1, 1, 1, 1, 2, 256, None, 0, 0, 0, None),
    ('pre_train', 'nemotron4', '340b', 'b200', 'bf16', 128, 4096, 8, 4, 1, 1, 12, 1, 32, None, 0, 0, 0, None),
    ('pre_train', 'nemotron4', '340b', 'b200', 'fp8', 128, 4096, 8, 4, 1, 1, 12, 1, 32, None, 0, 0, 0, None),
    ('pre_train', 'nemotron4', '15b', 'b200', 'fp8', 64, 4096, 1, 1, 1, 1, 1, 2, 256, None, 0, 0, 0, None),
    ('pre_train', 'deepseek', 'v3', 'b200', 'bf16', 1024, 4096, 2, 16, 1, 8, 1, 1, 8192, 1, 0, 0, 0, None),
    ('pre_train', 'deepseek', 'v3', 'b200', 'bf16', 256, 4096, 2, 16, 1, 8, 1, 1, 2048, 1, 0, 0, 0, None),
    ('pre_train', 'deepseek', 'v3', 'b200', 'bf16', 128, 4096, 2, 16, 1, 8, 1, 1, 1024, 1, 0, 0, 0, None),
    ('pre_train', 'nemotronh', '8b', 'gb200', 'fp8', 8, 8192, 1, 1, 1, 1, 1, 2, 128, None, 0, 0, 0, None),
    ('pre_train', 'nemotronh', '47b', 'gb200', 'fp8', 64, 8192, 2, 1, 1, 1, 1, 1, 192, None, 0, 0, 0, None),
    ('pre_train', 'nemotronh', '56b', 'gb200', 'fp8', 64, 8192, 4, 1, 1, 1, 1, 2, 192, None, 0, 0, 0, None),
    ('pre_train', 'nemotronh', '56b', 'gb200', 'fp8', 256, 8192, 4, 1, 1, 1, 1, 2, 768, None, 0, 0, 0, None),
    ('sft', 'llama3', '8b', 'b200', 'fp8', 8, 16384, 1, 1, 1, 1, 1, 1, 8, None, 0, 0, 0, None),
    ('sft', 'llama3', '70b', 'b200', 'bf16', 32, 4096, 2, 4, 1, 1, 5, 1, 32, None, 0, 0, 0, None),
    ('sft', 'llama3', '70b', 'b200', 'fp8', 32, 4096, 2, 4, 1, 1, 5, 1, 32, None, 0, 0, 0, None),
    ('sft', 'llama3', '8b', 'b200', 'bf16', 8, 16384, 1, 1, 1, 1, 1, 1, 8, None, 0, 0, 0, None),
    ('sft', 'llama4', 'e128', 'b200', 'bf16', 256, 4096, 8, 1, 1, 32, 1, 1, 32, 8, 0, 0, 0, None),
    ('pre_train', 'llama4', 'e16', 'b200', 'bf16', 64, 8192, 1, 2, 1, 8, 24, 1, 1024, 1, 0, 0, 0, None),
    ('pre_train', 'llama4', 'e128', 'b200', 'bf16', 128, 8192, 1, 2, 1, 64, 12, 1, 1024, 1, 0, 0, 0, None),
    ('pre_train', 'vlm_llama4', 'e16', 'b200', 'bf16', 64, 8192, 1, 1, 1, 16, 1, 1, 1024, 1, 0, 0, 0, None),
    ('pre_train', 'vlm_llama4', 'e128', 'b200', 'bf16', 128, 8192, 1, 2, 1, 64, 12, 1, 1024, 1, 0, 0, 0, None),
    ('pre_train', 'qwen3', '30b_a3b', 'b200', 'bf16', 8, 4096, 1, 1, 1, 8, 1, 1, 512, 1, 0, 0, 0, None),
    ('pre_train', 'qwen3', '235b_a22b', 'b200', 'bf16', 64, 4096, 1, 8, 1, 8, 12, 1, 1024, 1, 0, 0, 0, None),
    ('finetune', 'qwen25vl', '7b', 'b200', 'bf16', 8, 8192, 1, 1, 1, 1, 1, 1, 64, None, 0, 0, 0, None),
    ('finetune', 'qwen25vl', '32b', 'b200', 'bf16', 16, 8192, 4, 1, 1, 1, 1, 1, 64, None, 0, 0, 0, None),
    ('lora', 'llama3', '70b', 'gb200', 'fp8', 8, 2048, 1, 4, 1, 1, 20, 1, 64, None, 0, 0, 0, None),
    ('lora', 'llama3', '70b', 'gb200', 'bf16', 8, 2048, 1, 4, 1, 1, 20, 1, 64, None, 0, 0, 0, None),
    ('lora', 'llama3', '8b', 'gb200', 'bf16', 8, 16384, 1, 1, 1, 1, 1, 1, 8, None, 0, 0, 0, None),
    ('lora', 'llama3', '8b', 'gb200', 'fp8', 8, 16384, 1, 1, 1, 1, 1, 1, 8, None, 0, 0, 0, None),
    ('lora', 'llama31', '405b', 'gb200', 'fp8', 32, 2048, 4, 4, 1, 1, 16, 1, 32, None, 0, 0, 0, None),
    ('lora', 'llama31', '405b', 'gb200', 'bf16', 32, 2048, 4, 4, 1, 1, 16, 1, 32, None, 0, 0, 0, None),
    ('pre_train', 'gpt3', '175b', 'gb200', 'bf16', 128, 2048, 4, 4, 1, 1, 12, 2, 256, None, 0, 0, 0, None),
    ('pre_train', 'gpt3', '175b', 'gb200', 'fp8', 128, 2048, 4, 4, 1, 1, 12, 2, 256, None, 0, 0, 0, None),
    ('pre_train', 'llama3', '8b', 'gb200', 'bf16', 8, 8192, 1, 1, 1, 1, 1, 2, 128, None, 0, 0, 0, None),
    ('pre_train', 'llama3', '8b', 'gb200', 'fp8', 8, 8192, 1, 1, 1, 1, 1, 4, 128, None, 0, 0, 0, None),
    ('pre_train', 'llama3', '70b', 'gb200', 'fp8', 64, 8192, 1, 1, 1, 1, 1, 1, 128, None, 1, 0, 0, None),
    ('pre_train', 'llama3', '70b', 'gb200', 'bf16', 64, 8192, 1, 1, 1, 1, 1, 1, 128, None, 1, 20, 0, None),
    ('pre_train', 'llama31', '405b', 'gb200', 'bf16', 128, 8192, 4, 8, 2, 1, 8, 1, 64, None, 0, 0, 0, None),
    ('pre_train', 'llama31', '405b', 'gb200', 'fp8', 128, 8192, 2, 1, 1, 1, 1, 1, 256, None, 1, 0, 95, None),
    ('pre_train', 'mixtral', '8x7b', 'gb200', 'bf16', 64, 4096, 1, 1, 1, 8, 1, 2, 256, None, 0, 0, 0, None),
    ('pre_train', 'mixtral', '8x7b', 'gb200', 'fp8', 64, 4096, 1, 1, 1, 8, 1, 2, 256, None, 0, 0, 0, None),
    ('pre_train', 'nemotron4', '15b', 'gb200', 'bf16', 64, 4096, 1, 1, 1, 1, 1, 2, 256, None, 0, 0, 0, None),
    ('pre_train', 'nemotron4', '15b', 'gb200', 'fp8', 64, 4096, 1, 1, 1, 1, 1, 2, 256, None, 0, 0, 0, None),
    ('pre_train', 'nemotron4', '340b', 'gb200', 'bf16', 128, 4096, 4, 8, 1, 1, 12, 1, 32, None, 0, 0, 0, None),
    ('pre_train', 'nemotron4', '340b', 'gb200', 'fp8', 128, 4096, 8, 4, 1, 1, 12, 1, 32, None, 0, 0, 0, None),
    ('pre_train', 'deepseek', 'v3', 'gb200', 'bf16', 1024, 4096, 2, 4, 1, 64, 4, 1, 8192, 1, 0, 0, 0, None),
    ('pre_train', 'deepseek', 'v3', 'gb200', 'bf16', 256, 4096, 2, 4, 1, 64, 1, 1, 2048, 1, 0, 0, 0, None),
    ('pre_train', 'deepseek', 'v3', 'gb200', 'bf16', 128, 4096, 2, 4, 1, 32, 1, 1, 1024, 1, 0, 0, 0, None),
    ('pre_train', 'nemotronh', '8b', 'gb200', 'fp8', 8, 8192, 1, 1, 1, 1, 1, 2, 128, None, 0, 0, 0, None),
    ('pre_train', 'nemotronh', '47b', 'gb200', 'fp8', 64, 8192, 2, 1, 1, 1, 1, 1, 192, None, 0, 0, 0, None),
    ('pre_train', 'nemotronh', '56b', 'gb200', 'fp8', 64, 8192, 2, 1, 1, 1, 1, 1, 192, None, 0, 0, 0, None),
    ('pre_train', 'nemotronh', '56b', 'gb200', 'fp8', 256, 8192, 2, 1, 1, 1, 1, 1, 768, None, 0, 0, 0, None),
    ('pre_train', 'llama4', 'e16', 'gb200', 'bf16', 64, 8192, 1, 1, 1, 16, 1, 1, 1024, 1, 0, 0, 0, None),
    ('pre_train', 'llama4', 'e16', 'gb200', 'fp8', 64, 8192, 1, 1, 1, 16, 1, 1, 1024, 1, 0, 0, 0, None),
    ('pre_train', 'llama4', 'e128', 'gb200', 'bf16', 128, 8192, 1, 2, 1, 64, 12, 1, 1024, 1, 0, 0, 0, None),
    ('pre_train', 'vlm_llama4', 'e16', 'gb200', 'bf16', 64, 8192, 1, 1, 2, 16, 1, 1, 1024, 1, 0, 0, 0, None),
    ('pre_train', 'vlm_llama4', 'e128', 'gb200', 'bf16', 128, 8192, 2, 1, 1, 64, 1, 1, 1024, 1, 0, 0, 0, None),
    ('sft', 'llama3', '8b', 'gb200', 'fp8', 8, 16384, 1, 1, 1, 1, 1, 1, 8, None, 0, 0, 0, None),
    ('sft', 'llama3', '8b', 'gb200', 'bf16', 8, 16384, 1, 1, 1, 1, 1, 1, 8, None, 0, 0, 0, None),
    ('sft', 'llama3', '70b', 'gb200', 'bf16', 32, 4096, 2, 4, 1, 1, 5, 1, 32, None, 0, 0, 0, None),
    ('sft', 'llama3', '70b', 'gb200', 'fp8', 32, 4096, 2, 4, 1, 1, 5, 1, 32, None, 0, 0, 0, None),
    ('pre_train', 'qwen3', '30b_a3b', 'gb200', 'bf16', 8, 4096, 1, 1, 1, 8, 1, 1, 512, 1, 0, 0, 0, None),
    ('pre_train', 'qwen3', '235b_a22b', 'gb200', 'bf16', 64, 4096, 2, 1, 1, 64, 1, 1, 1024, 1, 0, 0, 0, None),
    ('finetune', 'qwen25vl', '7b', 'gb200', 'bf16', 8, 8192, 1, 1, 1, 1, 1, 1, 64, None, 0, 0, 0, None),
    ('finetune', 'qwen25vl', '32b', 'gb200', 'bf16', 16, 8192, 4, 1, 1, 1, 1, 1, 64, None, 0, 0, 0, None),
)
"""(task, model, size, system, dtype, GPUs, seq, tp, pp, cp, ep, vp, micro-batch, global batch, etp or None,
use_mcore_fsdp, recompute_layers, activation_offload_layers, recompute_modules or None)."""


def plan_blackwell_row(row: tuple) -> dict:
    """One row planned on its chip with what it states beyond the H100 columns."""
    *layout, system, dtype = row[:5]
    task, model, size = layout
    gpus, seq, tp, pp, cp, ep, vp, mbs, gbs, etp, fsdp, recompute_layers, offload_layers, modules = row[5:]
    stated: dict = {}
    if fsdp:
        stated["zero"] = 3
    if recompute_layers:
        stated["recompute"] = f"block-layers:{recompute_layers}"
    elif modules:
        stated["recompute"] = modules
    if offload_layers:
        stated["offload_activations"] = offload_layers
    out = plan_row((task, model, size, dtype, gpus, seq, tp, pp, cp, ep, vp, mbs, gbs, etp), hardware=system, **stated)
    out.update(system=system, use_mcore_fsdp=bool(fsdp), recompute_layers=recompute_layers,
               activation_offload_layers=offload_layers)
    if offload_layers:
        out["note"] = f"{offload_layers} blocks' activations offloaded to host memory"
    return out


def main() -> int:
    results = [plan_blackwell_row(row) for row in ROWS]
    planned = [r for r in results if r["verdict"] != "skipped"]
    for r in planned:
        print(f"{r['system']:5s} {describe(r)} {r.get('note', '')}")
    summary = {"rows": len(results), "language_model_rows": len(planned),
               **Counter(r["verdict"] for r in planned)}
    write_results(summary, results, "nemo_blackwell_layouts")
    return 0

if __name__ == "__main__":
    sys.exit(main())
