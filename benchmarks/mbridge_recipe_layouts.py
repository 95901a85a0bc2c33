"""Do NVIDIA Megatron-Bridge's own performance-recipe layouts plan? Every recipe function of
Megatron-Bridge's flat performance recipes for H100, B200 and GB200 (`perf_recipes/<family>/<chip>/*.py`),
planned under `--stack nemo` on its chip as the recipe states it, with the verdict as
`nemo_recipe_layouts.py` and `nemo_blackwell_layouts.py` give it for NeMo's older CSVs: fits, tight
(over the usable memory by less than the forecast's band), does not fit, refused (the one-line reason),
or skipped (a model the catalog lacks or cannot express, with the reason).

Source of the layouts (settings only: no throughput, TFLOPS or MFU figure from that repository is read
or used here): NVIDIA-NeMo/Megatron-Bridge `src/megatron/bridge/perf_recipes` at commit
067f987df03b8355b03192d88d70f1709fedf51a (2026-08-22), with each family's `common.py` and the base
recipes they start from (`src/megatron/bridge/recipes/<family>/h100/*.py`: `llama3_8b_pretrain_config` is
`llama3_8b_pretrain_2gpu_h100_bf16_config`, and so on) for what a recipe inherits (sequence length, vp,
ep/etp, MTP, dispatcher, recompute). B300, GB300, VR200 and R100 recipes are left out: the hardware
catalog has none of those chips. The table below was transcribed by running each recipe function against
recording stand-ins for its config objects (nothing from Megatron-Bridge is imported here) and checked by
eye; the file of each row group is cited above it.

How a recipe's settings become planner inputs:
  - GPUs: the count in the function's name; seq / tp / pp / vp / cp / ep / etp / micro-batch / global
    batch as set (vp None is 1).
  - precision: `_perf_precision("bf16" | "fp8_cs" | "fp8_ds" | "fp8_mx" | "nvfp4")` as bf16, FP8-CS,
    FP8-DS, MXFP8, NVFP4 (the planner has no fp4: those rows are refused); an fp8_cs config with
    `fp8_recipe = "blockwise"` (the "fp8sc" recipes) as fp8-blockwise.
  - recompute: granularity None as `none` (stated, so no recompute is added to make a row fit);
    full + block + N as `block-layers:N`; full + uniform + 1 as `full`; selective with
    `recompute_modules` as the module list (e.g. `mla_up_proj/mlp`), an empty list as `none`.
  - `cpu_offloading` with `cpu_offloading_num_layers N` as `--offload-activations N`;
    `use_megatron_fsdp` as ZeRO-3; LoRA recipes (`peft_scheme="lora"`, dim 16, `linear_qkv`) as
    `--finetune lora --lora-rank 16 --lora-targets linear_qkv`.
  - dispatcher: `alltoall` as alltoall; `flex` as flex (DeepEP); HybridEP has no planner input and is
    planned as DeepEP (noted).
  - What the planner has no input for is kept in the row's `notes`: a `pipeline_model_parallel_layout`
    (planned with pp/vp as given), DeepSeek-V3's MTP layer, the precision-aware optimizer's bf16 Adam
    moments, Kimi K2's Muon optimizer, MoE paged stash with its expert capacity factor, fine-grained
    module offload, NVFP4's bf16 end layers.

Result at the commit this was written on (2026-12-08): 225 recipes; H100 37 fit, 2 refused, 20 skipped;
B200 36 fit, 2 tight, 1 does not fit, 8 refused, 23 skipped; GB200 48 fit, 4 tight, 12 refused, 32
skipped. 20 of the "fits" fit only with a memory option the recipe does not set (JSON
`options_the_recipe_does_not_set`; mostly `fp8-activation-store`, which no perf recipe sets).

Why the rows that do not simply fit do not (breakdowns from `plan(spec).memory`, busiest stage):
  - refused, NVFP4 (18 rows): the planner has no fp4 precision. Not a layout problem.
  - refused, ep larger than the data-parallel ranks (H100 DeepSeek-V3 "64gpu" bf16/fp8cs: tp 2 pp 8
    ep 64 on 64 GPUs; GB200 Qwen3-235B "64gpu" fp8cs/fp8mx: pp 8 ep 32 on 64 GPUs). Megatron-Core needs
    ep x etp to divide tp x dp x cp (8 here) too: the recipes are not runnable as written (the DeepSeek
    one says it is the 1,024-GPU layout with the global batch scaled down). The planner is right.
  - Nemotron-H 56B at tp 2 (B200 64 fp8cs 105 %, 256 bf16 108 % tight; GB200 64 fp8cs 108 % tight): weights
    + bf16 grads 79-105 GiB, activations 65-79 GiB (118 layers, 0.55-0.67 GiB each, about 10 sbh/tp a
    layer), fp8 weight copies 26 GiB in the fp8 rows. Same verdict as NeMo's GB200 CSV rows at tp 2. Likely
    planner terms: the fp8 transposed-weight copies (26 GiB), which Blackwell's fp8 GEMMs may not need,
    and the Mamba-2 layers' saved tensors; not settled without a measurement.
  - Qwen3-235B B200 128-GPU fp8mx "deepep_dev" (135 %, does not fit): activations 189 GiB (126.5 in-flight
    layers x 1.5 GiB at micro-batch 3, tp 2, top-8 routing). Its sibling at micro-batch 1 fits at 87 %; the
    planner's terms (Megatron's interleaved warm-up, routed-token copies) look right, so this dev recipe
    likely needs something not stated or does not run as written.
  - DeepSeek-V3 GB200 fp8cs (107 % tight with fp8-activation-store, 121 % without): activations 137 GiB
    (71 in-flight layers x 1.9 GiB); it recomputes only `mlp` (the three dense blocks), not MLA's up
    projections as the bf16 row does. The planner leaves out the MTP layer (more memory) and plans Adam
    moments in fp32 (8 GiB more than the recipe's bf16 moments): net, still over. Likely the planner is
    high on MoE activations (routed-token copies of 8 experts kept in 16 bits), unresolved.
  - Kimi K2 GB200 bf16 (109 % tight) and fp8cs (111 % without fp8-activation-store): activations 103-115
    GiB, optimizer + masters 42 GiB planned as AdamW where the base recipe runs Muon (one momentum buffer:
    about 14 GiB less), which alone brings both to about 100 % of the usable memory: the recipe relies on
    an optimizer the planner does not model.
  - Qwen3-30B-A3B 8 GPUs at micro-batch 4 (GB200 bf16 109 % tight; B200 bf16 105 %, GB200 fp8 108 %
    without fp8-activation-store): activations 107 GiB (48 layers x 2.2 GiB) and logits 14 GiB (4 x 4,096
    tokens x 151,936 vocab). Likely planner term: the MoE activations at top-8 (as for DeepSeek above).
  - Llama 3.1 405B 128 B200/GB200 bf16 (114 % / 118 % without fp8-activation-store): activations 140 GiB
    on stage 1 = 141 in-flight one-layer chunks (Megatron's interleaved warm-up (p - i - 1)·2 + (v - 1)·p + 1
    at pp 16, vp 8) x 0.99 GiB (~16 sbh/tp, what Megatron-Core + TE saves). Both terms check out against
    Megatron, so the gap is unexplained: either the recipe relies on something not modelled or it runs
    at the edge. The B200 bf16 recipe's own docstring says "TP=4 PP=8 CP=2" and its userbuffers config is
    `..._tp4_cp2_mbs1_seqlen8192`, while its code sets pp 16, cp 1, vp 8 (the layout planned here): at tp 4
    pp 8 cp 2 each rank keeps half of every sequence and about half the in-flight layers, which fits.
  - DeepSeek-V3 H100 fp8sc (100 %) fits only with fp8 parameters, which the recipe turns off
    (fp8_param_gather False): as stated 106 %, tight (activations 60 GiB: 84 in-flight layers x 0.71
    GiB), by the same MoE-activation term.

    .venv/bin/python benchmarks/mbridge_recipe_layouts.py   # writes benchmarks/results/mbridge_recipe_layouts.json
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from nemo_recipe_layouts import describe, plan_row, write_results  # noqa: E402

HARDWARE = {"h100": "h100-sxm", "b200": "b200", "gb200": "gb200"}

ROWS = (
    # perf_recipes/deepseek/h100/deepseek_v3.py
    ('h100', 'deepseek_v3_pretrain_1024gpu_h100_bf16', 'deepseek-v3', 1024, 'bf16', 4096, 2, 8, 4, 1, 64, 1, 1, 16384, {'recompute': 'mla_up_proj/mlp', 'moe_dispatcher': 'flex'}, "flex/HybridEP planned as DeepEP; layout 'Et|(tt|)*30mL' not taken: pp/vp as given; MTP (1 layer) not modelled; bf16 Adam moments planned as fp32"),
    ('h100', 'deepseek_v3_pretrain_1024gpu_h100_fp8cs', 'deepseek-v3', 1024, 'FP8-CS', 4096, 2, 8, 4, 1, 64, 1, 1, 16384, {'recompute': 'mla_up_proj/mlp', 'moe_dispatcher': 'flex'}, "flex/HybridEP planned as DeepEP; layout 'Et|(tt|)*30mL' not taken: pp/vp as given; MTP (1 layer) not modelled; bf16 Adam moments planned as fp32"),
    ('h100', 'deepseek_v3_pretrain_1024gpu_h100_fp8sc', 'deepseek-v3', 1024, 'fp8-blockwise', 4096, 2, 8, 2, 1, 64, 1, 1, 16384, {'recompute': 'mla_up_proj/mlp', 'moe_dispatcher': 'flex'}, "flex/HybridEP planned as DeepEP; layout 'default map (8,2)' not taken: pp/vp as given; MTP (1 layer) not modelled; bf16 Adam moments planned as fp32; fp8_param_gather off"),
    ('h100', 'deepseek_v3_pretrain_64gpu_h100_bf16', 'deepseek-v3', 64, 'bf16', 4096, 2, 8, 4, 1, 64, 1, 1, 1024, {'recompute': 'mla_up_proj/mlp', 'moe_dispatcher': 'flex'}, "flex/HybridEP planned as DeepEP; layout 'Et|(tt|)*30mL' not taken: pp/vp as given; MTP (1 layer) not modelled; bf16 Adam moments planned as fp32"),
    ('h100', 'deepseek_v3_pretrain_64gpu_h100_fp8cs', 'deepseek-v3', 64, 'FP8-CS', 4096, 2, 8, 4, 1, 64, 1, 1, 1024, {'recompute': 'mla_up_proj/mlp', 'moe_dispatcher': 'flex'}, "flex/HybridEP planned as DeepEP; layout 'Et|(tt|)*30mL' not taken: pp/vp as given; MTP (1 layer) not modelled; bf16 Adam moments planned as fp32"),
    ('h100', 'deepseek_v3_pretrain_1024gpu_h100_fp8sc_large_scale', 'deepseek-v3', 1024, 'fp8-blockwise', 4096, 2, 8, 2, 1, 64, 1, 1, 1024, {'recompute': 'mla_up_proj/mlp', 'moe_dispatcher': 'flex'}, "flex/HybridEP planned as DeepEP; layout 'default map (8,2)' not taken: pp/vp as given; MTP (1 layer) not modelled; bf16 Adam moments planned as fp32; fp8_param_gather off"),
    # perf_recipes/glm_moe_dsa/h100/glm5.py
    ('h100', 'glm51_sft_416gpu_h100_bf16', None, 416, 'GLM-5 (DeepSeek sparse attention): not in the catalog'),
    ('h100', 'glm52_sft_416gpu_h100_bf16', None, 416, 'GLM-5 (DeepSeek sparse attention): not in the catalog'),
    # perf_recipes/gpt_oss/h100/gpt_oss.py
    ('h100', 'gpt_oss_120b_pretrain_64gpu_h100_bf16', 'gpt-oss-120b', 64, 'bf16', 4096, 1, 4, 1, 1, 8, 1, 1, 1280, {'recompute': 'layernorm/moe_act', 'moe_dispatcher': 'alltoall'}, ''),
    ('h100', 'gpt_oss_120b_pretrain_64gpu_h100_fp8cs', 'gpt-oss-120b', 64, 'FP8-CS', 4096, 1, 4, 1, 1, 8, 1, 1, 1280, {'recompute': 'layernorm/moe_act', 'moe_dispatcher': 'alltoall'}, ''),
    # perf_recipes/kimi/h100/kimi_k2.py
    ('h100', 'kimi_k2_pretrain_1024gpu_h100_bf16', 'kimi-k2', 1024, 'bf16', 4096, 8, 16, 2, 1, 64, 1, 1, 8192, {'recompute': 'mla_up_proj/mlp', 'moe_dispatcher': 'alltoall'}, "layout 'Et|(tt|)*30L' not taken: pp/vp as given; Muon planned as AdamW"),
    ('h100', 'kimi_k2_pretrain_1024gpu_h100_fp8cs', 'kimi-k2', 1024, 'FP8-CS', 4096, 8, 16, 2, 1, 64, 1, 1, 8192, {'recompute': 'mla_up_proj/mlp', 'moe_dispatcher': 'alltoall'}, "layout 'Et|(tt|)*30L' not taken: pp/vp as given; Muon planned as AdamW"),
    ('h100', 'kimi_k2_pretrain_1024gpu_h100_fp8sc', 'kimi-k2', 1024, 'fp8-blockwise', 4096, 8, 16, 2, 1, 64, 1, 1, 8192, {'recompute': 'mla_up_proj/mlp', 'moe_dispatcher': 'alltoall'}, "layout 'Et|(tt|)*30L' not taken: pp/vp as given; Muon planned as AdamW; fp8_param_gather off"),
    # perf_recipes/llama/h100/llama3.py
    ('h100', 'llama3_8b_pretrain_8gpu_h100_bf16', 'llama3-8b', 8, 'bf16', 8192, 1, 1, 1, 2, 1, None, 1, 128, {'recompute': 'none'}, ''),
    ('h100', 'llama3_8b_pretrain_8gpu_h100_fp8cs', 'llama3-8b', 8, 'FP8-CS', 8192, 1, 1, 1, 1, 1, None, 1, 128, {'recompute': 'block-layers:5'}, ''),
    ('h100', 'llama3_70b_pretrain_64gpu_h100_bf16', 'llama3-70b', 64, 'bf16', 8192, 4, 4, 5, 2, 1, None, 1, 256, {'recompute': 'none'}, ''),
    ('h100', 'llama3_70b_pretrain_64gpu_h100_fp8cs', 'llama3-70b', 64, 'FP8-CS', 8192, 4, 8, 5, 1, 1, None, 1, 256, {'recompute': 'none'}, "layout 'Et*2|(t*2|)*34,t*3|(t*2|)*3,tL' not taken: pp/vp as given"),
    ('h100', 'llama3_8b_sft_8gpu_h100_bf16', 'llama3-8b', 8, 'bf16', 4096, 1, 1, 1, 1, 1, None, 1, 32, {'recompute': 'none'}, ''),
    ('h100', 'llama3_8b_sft_8gpu_h100_fp8cs', 'llama3-8b', 8, 'FP8-CS', 4096, 1, 1, 1, 1, 1, None, 1, 32, {'recompute': 'none'}, ''),
    ('h100', 'llama3_70b_sft_32gpu_h100_bf16', 'llama3-70b', 32, 'bf16', 4096, 4, 4, 5, 1, 1, None, 1, 32, {'recompute': 'none'}, ''),
    ('h100', 'llama3_70b_sft_32gpu_h100_fp8cs', 'llama3-70b', 32, 'FP8-CS', 4096, 4, 4, 5, 1, 1, None, 1, 32, {'recompute': 'none'}, ''),
    ('h100', 'llama3_70b_peft_8gpu_h100_bf16', 'llama3-70b', 8, 'bf16', 4096, 1, 4, 20, 1, 1, None, 1, 32, {'recompute': 'block-layers:1', 'finetune': 'lora', 'lora_rank': 16, 'lora_targets': 'linear_qkv'}, ''),
    ('h100', 'llama3_70b_peft_8gpu_h100_fp8cs', 'llama3-70b', 8, 'FP8-CS', 4096, 2, 4, 20, 1, 1, None, 1, 32, {'recompute': 'none', 'finetune': 'lora', 'lora_rank': 16, 'lora_targets': 'linear_qkv'}, ''),
    ('h100', 'llama3_8b_pretrain_64gpu_h100_bf16', 'llama3-8b', 64, 'bf16', 8192, 1, 1, 1, 2, 1, None, 1, 1024, {'recompute': 'none'}, ''),
    ('h100', 'llama3_8b_pretrain_64gpu_h100_fp8cs', 'llama3-8b', 64, 'FP8-CS', 8192, 1, 1, 1, 1, 1, None, 1, 1024, {'recompute': 'block-layers:5'}, ''),
    # perf_recipes/llama/h100/llama31.py
    ('h100', 'llama31_405b_pretrain_1024gpu_h100_bf16', 'llama3.1-405b', 1024, 'bf16', 8192, 8, 8, 8, 2, 1, None, 1, 1536, {'recompute': 'none'}, ''),
    ('h100', 'llama31_405b_pretrain_1024gpu_h100_fp8cs', 'llama3.1-405b', 1024, 'FP8-CS', 8192, 8, 8, 8, 2, 1, None, 1, 1536, {'recompute': 'none'}, ''),
    ('h100', 'llama31_405b_pretrain_512gpu_h100_bf16', 'llama3.1-405b', 512, 'bf16', 8192, 8, 8, 8, 2, 1, None, 1, 768, {'recompute': 'none'}, ''),
    ('h100', 'llama31_405b_pretrain_512gpu_h100_fp8cs', 'llama3.1-405b', 512, 'FP8-CS', 8192, 8, 8, 8, 2, 1, None, 1, 768, {'recompute': 'none'}, ''),
    # perf_recipes/nemotronh/h100/nemotronh.py
    ('h100', 'nemotronh_56b_pretrain_64gpu_h100_fp8cs', 'nemotron-h-56b', 64, 'FP8-CS', 8192, 8, 1, 1, 1, 1, None, 1, 192, {'recompute': 'none'}, ''),
    ('h100', 'nemotron_3_super_pretrain_64gpu_h100_bf16', None, 64, 'Nemotron 3 Super (hybrid Mamba MoE, latent MoE): not in the catalog'),
    ('h100', 'nemotron_3_nano_pretrain_16gpu_h100_bf16', None, 16, 'Nemotron 3 Nano (hybrid Mamba MoE): not in the catalog'),
    ('h100', 'nemotron_3_nano_pretrain_16gpu_h100_fp8cs', None, 16, 'Nemotron 3 Nano (hybrid Mamba MoE): not in the catalog'),
    ('h100', 'nemotron_3_5_lightning_pretrain_16gpu_h100_bf16', None, 16, 'Nemotron 3.5 Lightning (built on the Nemotron 3 Nano recipe, hybrid Mamba MoE): not in the catalog'),
    ('h100', 'nemotron_3_5_lightning_pretrain_16gpu_h100_fp8cs', None, 16, 'Nemotron 3.5 Lightning (built on the Nemotron 3 Nano recipe, hybrid Mamba MoE): not in the catalog'),
    # perf_recipes/qwen/h100/qwen3_moe.py
    ('h100', 'qwen3_30b_a3b_pretrain_16gpu_h100_bf16', 'qwen3-30b-a3b', 16, 'bf16', 4096, 1, 1, 1, 1, 16, 1, 1, 1024, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP; bf16 Adam moments planned as fp32'),
    ('h100', 'qwen3_30b_a3b_pretrain_16gpu_h100_fp8cs', 'qwen3-30b-a3b', 16, 'FP8-CS', 4096, 1, 1, 1, 1, 16, 1, 1, 1024, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP'),
    ('h100', 'qwen3_30b_a3b_pretrain_16gpu_h100_fp8ds', 'qwen3-30b-a3b', 16, 'FP8-DS', 4096, 1, 1, 1, 1, 16, 1, 1, 1024, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP'),
    ('h100', 'qwen3_235b_a22b_pretrain_256gpu_h100_bf16', 'qwen3-235b-a22b', 256, 'bf16', 4096, 2, 8, 4, 1, 32, 1, 1, 8192, {'recompute': 'none', 'moe_dispatcher': 'alltoall'}, ''),
    ('h100', 'qwen3_235b_a22b_pretrain_256gpu_h100_fp8cs', 'qwen3-235b-a22b', 256, 'FP8-CS', 4096, 2, 8, 4, 1, 32, 1, 1, 8192, {'recompute': 'none', 'moe_dispatcher': 'alltoall'}, ''),
    ('h100', 'qwen3_235b_a22b_pretrain_256gpu_h100_fp8cs_large_scale', 'qwen3-235b-a22b', 256, 'FP8-CS', 4096, 2, 8, 4, 1, 32, 1, 1, 512, {'recompute': 'none', 'moe_dispatcher': 'alltoall'}, ''),
    ('h100', 'qwen3_30b_a3b_pretrain_64gpu_h100_bf16', 'qwen3-30b-a3b', 64, 'bf16', 4096, 1, 1, 1, 1, 16, 1, 1, 4096, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP; bf16 Adam moments planned as fp32'),
    ('h100', 'qwen3_30b_a3b_pretrain_64gpu_h100_fp8cs', 'qwen3-30b-a3b', 64, 'FP8-CS', 4096, 1, 1, 1, 1, 16, 1, 1, 4096, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP'),
    ('h100', 'qwen3_next_80b_a3b_pretrain_128gpu_h100_bf16', None, 128, 'Qwen3-Next 80B-A3B (gated DeltaNet hybrid attention): not in the catalog'),
    ('h100', 'qwen3_next_80b_a3b_pretrain_128gpu_h100_fp8cs', None, 128, 'Qwen3-Next 80B-A3B (gated DeltaNet hybrid attention): not in the catalog'),
    ('h100', 'qwen3_30b_a3b_pretrain_32gpu_h100_bf16_dev', 'qwen3-30b-a3b', 32, 'bf16', 4096, 1, 1, 1, 1, 8, 1, 1, 256, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP'),
    ('h100', 'qwen3_30b_a3b_pretrain_32gpu_h100_fp8sc_dev', 'qwen3-30b-a3b', 32, 'fp8-blockwise', 4096, 1, 1, 1, 1, 8, 1, 1, 256, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP; bf16 Adam moments planned as fp32'),
    ('h100', 'qwen3_235b_a22b_pretrain_256gpu_h100_bf16_hybridep_dev', 'qwen3-235b-a22b', 256, 'bf16', 4096, 2, 8, 3, 1, 32, 1, 1, 2048, {'recompute': 'moe_act/layernorm', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP'),
    # perf_recipes/qwen_vl/h100/qwen35_vl.py
    ('h100', 'qwen35_vl_35b_a3b_pretrain_16gpu_h100_bf16', None, 16, 'Qwen3.5-VL: a vision-language model, not planned'),
    ('h100', 'qwen35_vl_35b_a3b_pretrain_16gpu_h100_fp8cs', None, 16, 'Qwen3.5-VL: a vision-language model, not planned'),
    ('h100', 'qwen35_vl_122b_a10b_pretrain_128gpu_h100_bf16', None, 128, 'Qwen3.5-VL: a vision-language model, not planned'),
    ('h100', 'qwen35_vl_122b_a10b_pretrain_128gpu_h100_fp8cs', None, 128, 'Qwen3.5-VL: a vision-language model, not planned'),
    ('h100', 'qwen35_vl_397b_a17b_pretrain_256gpu_h100_bf16', None, 256, 'Qwen3.5-VL: a vision-language model, not planned'),
    ('h100', 'qwen35_vl_397b_a17b_pretrain_256gpu_h100_fp8cs', None, 256, 'Qwen3.5-VL: a vision-language model, not planned'),
    # perf_recipes/qwen_vl/h100/qwen3_vl.py
    ('h100', 'qwen3_vl_235b_a22b_pretrain_256gpu_h100_bf16', None, 256, 'Qwen3-VL: a vision-language model, not planned'),
    ('h100', 'qwen3_vl_235b_a22b_pretrain_256gpu_h100_fp8cs', None, 256, 'Qwen3-VL: a vision-language model, not planned'),
    ('h100', 'qwen3_vl_30b_a3b_pretrain_16gpu_h100_bf16', None, 16, 'Qwen3-VL: a vision-language model, not planned'),
    ('h100', 'qwen3_vl_30b_a3b_pretrain_16gpu_h100_fp8cs', None, 16, 'Qwen3-VL: a vision-language model, not planned'),
    # perf_recipes/wan/h100/wan.py
    ('h100', 'wan_14b_pretrain_32gpu_h100_bf16', None, 32, 'Wan: a video diffusion model, not planned'),
    # perf_recipes/deepseek/b200/deepseek_v3.py
    ('b200', 'deepseek_v3_pretrain_256gpu_b200_bf16', 'deepseek-v3', 256, 'bf16', 4096, 1, 16, 1, 1, 8, 1, 1, 4096, {'recompute': 'mla_up_proj', 'moe_dispatcher': 'flex'}, "flex/HybridEP planned as DeepEP; layout 'default map (16,1)' not taken: pp/vp as given; MTP (1 layer) not modelled; bf16 Adam moments planned as fp32"),
    ('b200', 'deepseek_v3_pretrain_256gpu_b200_fp8cs', 'deepseek-v3', 256, 'FP8-CS', 4096, 1, 16, 1, 1, 8, 1, 1, 4096, {'recompute': 'mla_up_proj', 'moe_dispatcher': 'flex'}, "flex/HybridEP planned as DeepEP; layout 'default map (16,1)' not taken: pp/vp as given; MTP (1 layer) not modelled; bf16 Adam moments planned as fp32"),
    ('b200', 'deepseek_v3_pretrain_256gpu_b200_fp8mx', 'deepseek-v3', 256, 'MXFP8', 4096, 1, 8, 2, 1, 32, 1, 1, 4096, {'recompute': 'mla_up_proj/mlp', 'moe_dispatcher': 'flex'}, "layout 'default map (8,2)' not taken: pp/vp as given; MTP (1 layer) not modelled; bf16 Adam moments planned as fp32"),
    ('b200', 'deepseek_v3_pretrain_256gpu_b200_nvfp4', 'deepseek-v3', 256, 'NVFP4', 4096, 1, 8, 2, 1, 32, 1, 1, 4096, {'recompute': 'mla_up_proj/layernorm/moe_act', 'moe_dispatcher': 'flex'}, "layout 'default map (8,2)' not taken: pp/vp as given; MTP (1 layer) not modelled; bf16 Adam moments planned as fp32"),
    ('b200', 'deepseek_v3_pretrain_256gpu_b200_fp8mx_large_scale', 'deepseek-v3', 256, 'MXFP8', 4096, 1, 16, 1, 1, 8, 1, 1, 256, {'recompute': 'mla_up_proj', 'moe_dispatcher': 'flex'}, "flex/HybridEP planned as DeepEP; layout 'default map (16,1)' not taken: pp/vp as given; MTP (1 layer) not modelled; bf16 Adam moments planned as fp32"),
    # perf_recipes/gpt_oss/b200/gpt_oss.py
    ('b200', 'gpt_oss_120b_pretrain_64gpu_b200_bf16', 'gpt-oss-120b', 64, 'bf16', 4096, 1, 1, 1, 1, 8, 1, 4, 1280, {'recompute': 'layernorm/moe_act', 'moe_dispatcher': 'alltoall'}, ''),
    ('b200', 'gpt_oss_120b_pretrain_64gpu_b200_fp8mx', 'gpt-oss-120b', 64, 'MXFP8', 4096, 1, 1, 1, 1, 8, 1, 4, 1280, {'recompute': 'layernorm/moe_act', 'moe_dispatcher': 'alltoall'}, ''),
    # perf_recipes/kimi/b200/kimi_k2.py
    ('b200', 'kimi_k2_pretrain_256gpu_b200_bf16', 'kimi-k2', 256, 'bf16', 4096, 1, 16, 1, 1, 16, 1, 1, 2048, {'recompute': 'mla_up_proj', 'moe_dispatcher': 'alltoall'}, "layout 'default map (16,1)' not taken: pp/vp as given; Muon planned as AdamW"),
    ('b200', 'kimi_k2_pretrain_256gpu_b200_fp8cs', 'kimi-k2', 256, 'FP8-CS', 4096, 1, 16, 1, 1, 16, 1, 1, 2048, {'recompute': 'mla_up_proj', 'moe_dispatcher': 'alltoall'}, "layout 'default map (16,1)' not taken: pp/vp as given; Muon planned as AdamW"),
    ('b200', 'kimi_k2_pretrain_256gpu_b200_fp8mx', 'kimi-k2', 256, 'MXFP8', 4096, 1, 16, 1, 1, 16, 1, 1, 2048, {'recompute': 'mla_up_proj', 'moe_dispatcher': 'alltoall'}, "layout 'default map (16,1)' not taken: pp/vp as given; Muon planned as AdamW; fp8_param_gather off"),
    # perf_recipes/llama/b200/llama3.py
    ('b200', 'llama3_8b_pretrain_8gpu_b200_bf16', 'llama3-8b', 8, 'bf16', 8192, 1, 1, 1, 1, 1, None, 2, 128, {'recompute': 'none'}, ''),
    ('b200', 'llama3_8b_pretrain_8gpu_b200_fp8cs', 'llama3-8b', 8, 'FP8-CS', 8192, 1, 1, 1, 1, 1, None, 2, 128, {'recompute': 'none'}, ''),
    ('b200', 'llama3_8b_pretrain_8gpu_b200_fp8mx', 'llama3-8b', 8, 'MXFP8', 8192, 1, 1, 1, 1, 1, None, 2, 128, {'recompute': 'none'}, ''),
    ('b200', 'llama3_8b_pretrain_8gpu_b200_nvfp4', 'llama3-8b', 8, 'NVFP4', 8192, 1, 1, 1, 1, 1, None, 4, 128, {'recompute': 'none'}, ''),
    ('b200', 'llama3_70b_pretrain_64gpu_b200_bf16', 'llama3-70b', 64, 'bf16', 8192, 2, 4, 5, 2, 1, None, 1, 256, {'recompute': 'none'}, ''),
    ('b200', 'llama3_70b_pretrain_64gpu_b200_fp8cs', 'llama3-70b', 64, 'FP8-CS', 8192, 1, 1, 1, 1, 1, None, 1, 256, {'recompute': 'none', 'offload_activations': 5, 'zero': 3}, ''),
    ('b200', 'llama3_70b_pretrain_64gpu_b200_fp8mx', 'llama3-70b', 64, 'MXFP8', 8192, 2, 4, 5, 1, 1, None, 1, 256, {'recompute': 'none'}, ''),
    ('b200', 'llama3_70b_pretrain_64gpu_b200_nvfp4', 'llama3-70b', 64, 'NVFP4', 8192, 2, 4, 5, 1, 1, None, 1, 256, {'recompute': 'none'}, ''),
    ('b200', 'llama3_70b_peft_8gpu_b200_bf16', 'llama3-70b', 8, 'bf16', 4096, 1, 2, 1, 1, 1, None, 1, 32, {'recompute': 'none', 'finetune': 'lora', 'lora_rank': 16, 'lora_targets': 'linear_qkv'}, ''),
    ('b200', 'llama3_70b_peft_8gpu_b200_fp8cs', 'llama3-70b', 8, 'FP8-CS', 4096, 1, 2, 20, 1, 1, None, 1, 32, {'recompute': 'none', 'finetune': 'lora', 'lora_rank': 16, 'lora_targets': 'linear_qkv'}, ''),
    ('b200', 'llama3_70b_peft_8gpu_b200_fp8mx', 'llama3-70b', 8, 'MXFP8', 4096, 1, 2, 1, 1, 1, None, 1, 32, {'recompute': 'none', 'finetune': 'lora', 'lora_rank': 16, 'lora_targets': 'linear_qkv'}, ''),
    ('b200', 'llama3_8b_pretrain_64gpu_b200_bf16', 'llama3-8b', 64, 'bf16', 8192, 1, 1, 1, 1, 1, None, 2, 1024, {'recompute': 'none'}, ''),
    ('b200', 'llama3_8b_pretrain_64gpu_b200_fp8cs', 'llama3-8b', 64, 'FP8-CS', 8192, 1, 1, 1, 1, 1, None, 2, 1024, {'recompute': 'none'}, ''),
    # perf_recipes/llama/b200/llama31.py
    ('b200', 'llama31_405b_pretrain_128gpu_b200_bf16', 'llama3.1-405b', 128, 'bf16', 8192, 4, 16, 8, 1, 1, None, 1, 768, {'recompute': 'none'}, ''),
    ('b200', 'llama31_405b_pretrain_128gpu_b200_fp8cs', 'llama3.1-405b', 128, 'FP8-CS', 8192, 4, 16, 4, 1, 1, None, 1, 768, {'recompute': 'none'}, ''),
    ('b200', 'llama31_405b_pretrain_128gpu_b200_fp8mx', 'llama3.1-405b', 128, 'MXFP8', 8192, 4, 16, 8, 1, 1, None, 1, 768, {'recompute': 'none'}, ''),
    ('b200', 'llama31_405b_pretrain_128gpu_b200_nvfp4', 'llama3.1-405b', 128, 'NVFP4', 8192, 4, 16, 8, 1, 1, None, 1, 768, {'recompute': 'none'}, ''),
    ('b200', 'llama31_405b_pretrain_256gpu_b200_nvfp4', 'llama3.1-405b', 256, 'NVFP4', 8192, 4, 16, 8, 1, 1, None, 1, 1536, {'recompute': 'none'}, ''),
    # perf_recipes/nemotronh/b200/nemotronh.py
    ('b200', 'nemotronh_56b_pretrain_64gpu_b200_fp8cs', 'nemotron-h-56b', 64, 'FP8-CS', 8192, 2, 1, 1, 1, 1, None, 1, 192, {'recompute': 'none'}, ''),
    ('b200', 'nemotron_3_super_pretrain_64gpu_b200_bf16', None, 64, 'Nemotron 3 Super (hybrid Mamba MoE, latent MoE): not in the catalog'),
    ('b200', 'nemotron_3_super_pretrain_64gpu_b200_fp8mx', None, 64, 'Nemotron 3 Super (hybrid Mamba MoE, latent MoE): not in the catalog'),
    ('b200', 'nemotron_3_super_pretrain_64gpu_b200_nvfp4', None, 64, 'Nemotron 3 Super (hybrid Mamba MoE, latent MoE): not in the catalog'),
    ('b200', 'nemotron_3_nano_pretrain_8gpu_b200_bf16', None, 8, 'Nemotron 3 Nano (hybrid Mamba MoE): not in the catalog'),
    ('b200', 'nemotron_3_nano_pretrain_8gpu_b200_fp8mx', None, 8, 'Nemotron 3 Nano (hybrid Mamba MoE): not in the catalog'),
    ('b200', 'nemotron_3_nano_pretrain_8gpu_b200_nvfp4', None, 8, 'Nemotron 3 Nano (hybrid Mamba MoE): not in the catalog'),
    ('b200', 'nemotronh_56b_pretrain_256gpu_b200_bf16', 'nemotron-h-56b', 256, 'bf16', 8192, 2, 1, 1, 1, 1, None, 1, 192, {'recompute': 'none'}, ''),
    ('b200', 'nemotronh_56b_pretrain_256gpu_b200_fp8cs', 'nemotron-h-56b', 256, 'FP8-CS', 8192, 2, 1, 1, 1, 1, None, 1, 768, {'recompute': 'none'}, ''),
    # perf_recipes/qwen/b200/qwen3_moe.py
    ('b200', 'qwen3_235b_a22b_pretrain_64gpu_b200_bf16', 'qwen3-235b-a22b', 64, 'bf16', 4096, 1, 8, 4, 1, 8, 1, 1, 2048, {'recompute': 'none', 'moe_dispatcher': 'alltoall'}, ''),
    ('b200', 'qwen3_235b_a22b_pretrain_64gpu_b200_fp8cs', 'qwen3-235b-a22b', 64, 'FP8-CS', 4096, 1, 8, 1, 1, 8, 1, 1, 2048, {'recompute': 'none', 'moe_dispatcher': 'alltoall'}, ''),
    ('b200', 'qwen3_235b_a22b_pretrain_64gpu_b200_fp8mx', 'qwen3-235b-a22b', 64, 'MXFP8', 4096, 1, 8, 1, 1, 8, 1, 1, 2048, {'recompute': 'none', 'moe_dispatcher': 'alltoall'}, ''),
    ('b200', 'qwen3_30b_a3b_pretrain_8gpu_b200_bf16', 'qwen3-30b-a3b', 8, 'bf16', 4096, 1, 1, 1, 1, 8, 1, 4, 512, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP'),
    ('b200', 'qwen3_30b_a3b_pretrain_8gpu_b200_fp8cs', 'qwen3-30b-a3b', 8, 'FP8-CS', 4096, 1, 1, 1, 1, 8, 1, 4, 512, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP'),
    ('b200', 'qwen3_30b_a3b_pretrain_8gpu_b200_fp8mx', 'qwen3-30b-a3b', 8, 'MXFP8', 4096, 1, 1, 1, 1, 8, 1, 4, 512, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP'),
    ('b200', 'qwen3_235b_a22b_pretrain_256gpu_b200_bf16', 'qwen3-235b-a22b', 256, 'bf16', 4096, 1, 8, 4, 1, 8, 1, 1, 8192, {'recompute': 'none', 'moe_dispatcher': 'alltoall'}, ''),
    ('b200', 'qwen3_235b_a22b_pretrain_256gpu_b200_fp8cs', 'qwen3-235b-a22b', 256, 'FP8-CS', 4096, 1, 8, 1, 1, 8, 1, 1, 8192, {'recompute': 'none', 'moe_dispatcher': 'alltoall'}, ''),
    ('b200', 'qwen3_235b_a22b_pretrain_256gpu_b200_fp8mx', 'qwen3-235b-a22b', 256, 'MXFP8', 4096, 1, 8, 3, 1, 8, 1, 1, 8192, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP; paged stash (capacity 1.5) not modelled'),
    ('b200', 'qwen3_235b_a22b_pretrain_256gpu_b200_fp8mx_large_scale', 'qwen3-235b-a22b', 256, 'MXFP8', 4096, 1, 8, 3, 1, 8, 1, 1, 512, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP; paged stash (capacity 1.5) not modelled'),
    ('b200', 'qwen3_235b_a22b_pretrain_64gpu_b200_nvfp4', 'qwen3-235b-a22b', 64, 'NVFP4', 4096, 1, 8, 1, 1, 8, 1, 1, 2048, {'recompute': 'none', 'moe_dispatcher': 'alltoall'}, ''),
    ('b200', 'qwen3_235b_a22b_pretrain_256gpu_b200_nvfp4', 'qwen3-235b-a22b', 256, 'NVFP4', 4096, 1, 8, 1, 1, 8, 1, 1, 8192, {'recompute': 'none', 'moe_dispatcher': 'alltoall'}, ''),
    ('b200', 'qwen3_30b_a3b_pretrain_8gpu_b200_nvfp4', 'qwen3-30b-a3b', 8, 'NVFP4', 4096, 1, 1, 1, 1, 8, 1, 4, 512, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP'),
    ('b200', 'qwen3_30b_a3b_pretrain_64gpu_b200_bf16', 'qwen3-30b-a3b', 64, 'bf16', 4096, 1, 1, 1, 1, 8, 1, 4, 4096, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP'),
    ('b200', 'qwen3_30b_a3b_pretrain_64gpu_b200_fp8cs', 'qwen3-30b-a3b', 64, 'FP8-CS', 4096, 1, 1, 1, 1, 8, 1, 4, 4096, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP'),
    ('b200', 'qwen3_next_80b_a3b_pretrain_64gpu_b200_bf16', None, 64, 'Qwen3-Next 80B-A3B (gated DeltaNet hybrid attention): not in the catalog'),
    ('b200', 'qwen3_next_80b_a3b_pretrain_64gpu_b200_fp8mx', None, 64, 'Qwen3-Next 80B-A3B (gated DeltaNet hybrid attention): not in the catalog'),
    ('b200', 'qwen3_235b_a22b_pretrain_128gpu_b200_fp8mx_deepep_dev', 'qwen3-235b-a22b', 128, 'MXFP8', 4096, 2, 4, 2, 1, 16, 1, 3, 3072, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'bf16 Adam moments planned as fp32'),
    # perf_recipes/qwen_vl/b200/qwen35_vl.py
    ('b200', 'qwen35_vl_35b_a3b_pretrain_8gpu_b200_bf16', None, 8, 'Qwen3.5-VL: a vision-language model, not planned'),
    ('b200', 'qwen35_vl_35b_a3b_pretrain_8gpu_b200_fp8cs', None, 8, 'Qwen3.5-VL: a vision-language model, not planned'),
    ('b200', 'qwen35_vl_35b_a3b_pretrain_8gpu_b200_fp8mx', None, 8, 'Qwen3.5-VL: a vision-language model, not planned'),
    ('b200', 'qwen35_vl_122b_a10b_pretrain_32gpu_b200_bf16', None, 32, 'Qwen3.5-VL: a vision-language model, not planned'),
    ('b200', 'qwen35_vl_122b_a10b_pretrain_32gpu_b200_fp8cs', None, 32, 'Qwen3.5-VL: a vision-language model, not planned'),
    ('b200', 'qwen35_vl_122b_a10b_pretrain_32gpu_b200_fp8mx', None, 32, 'Qwen3.5-VL: a vision-language model, not planned'),
    ('b200', 'qwen35_vl_397b_a17b_pretrain_64gpu_b200_bf16', None, 64, 'Qwen3.5-VL: a vision-language model, not planned'),
    ('b200', 'qwen35_vl_397b_a17b_pretrain_64gpu_b200_fp8cs', None, 64, 'Qwen3.5-VL: a vision-language model, not planned'),
    ('b200', 'qwen35_vl_397b_a17b_pretrain_64gpu_b200_fp8mx', None, 64, 'Qwen3.5-VL: a vision-language model, not planned'),
    # perf_recipes/qwen_vl/b200/qwen3_vl.py
    ('b200', 'qwen3_vl_235b_a22b_pretrain_64gpu_b200_bf16', None, 64, 'Qwen3-VL: a vision-language model, not planned'),
    ('b200', 'qwen3_vl_235b_a22b_pretrain_64gpu_b200_fp8cs', None, 64, 'Qwen3-VL: a vision-language model, not planned'),
    ('b200', 'qwen3_vl_235b_a22b_pretrain_64gpu_b200_fp8mx', None, 64, 'Qwen3-VL: a vision-language model, not planned'),
    ('b200', 'qwen3_vl_30b_a3b_pretrain_8gpu_b200_bf16', None, 8, 'Qwen3-VL: a vision-language model, not planned'),
    ('b200', 'qwen3_vl_30b_a3b_pretrain_8gpu_b200_fp8cs', None, 8, 'Qwen3-VL: a vision-language model, not planned'),
    ('b200', 'qwen3_vl_30b_a3b_pretrain_8gpu_b200_fp8mx', None, 8, 'Qwen3-VL: a vision-language model, not planned'),
    # perf_recipes/deepseek/gb200/deepseek_v3.py
    ('gb200', 'deepseek_v3_pretrain_256gpu_gb200_bf16', 'deepseek-v3', 256, 'bf16', 4096, 1, 4, 4, 1, 64, 1, 1, 4096, {'recompute': 'mla_up_proj', 'moe_dispatcher': 'flex'}, "flex/HybridEP planned as DeepEP; layout 'default map (4,4)' not taken: pp/vp as given; MTP (1 layer) not modelled; bf16 Adam moments planned as fp32"),
    ('gb200', 'deepseek_v3_pretrain_256gpu_gb200_fp8cs', 'deepseek-v3', 256, 'FP8-CS', 4096, 1, 4, 4, 1, 64, 1, 1, 4096, {'recompute': 'mlp', 'moe_dispatcher': 'flex'}, "flex/HybridEP planned as DeepEP; layout 'default map (4,4)' not taken: pp/vp as given; MTP (1 layer) not modelled; bf16 Adam moments planned as fp32"),
    ('gb200', 'deepseek_v3_pretrain_256gpu_gb200_fp8mx', 'deepseek-v3', 256, 'MXFP8', 4096, 1, 4, 4, 1, 64, 1, 1, 4096, {'recompute': 'mla_up_proj', 'moe_dispatcher': 'flex'}, "flex/HybridEP planned as DeepEP; layout 'default map (4,4)' not taken: pp/vp as given; MTP (1 layer) not modelled; bf16 Adam moments planned as fp32; paged stash (capacity 1.5) not modelled"),
    ('gb200', 'deepseek_v3_pretrain_256gpu_gb200_nvfp4', 'deepseek-v3', 256, 'NVFP4', 4096, 1, 4, 4, 1, 64, 1, 1, 4096, {'recompute': 'mlp', 'moe_dispatcher': 'flex'}, "flex/HybridEP planned as DeepEP; layout 'default map (4,4)' not taken: pp/vp as given; MTP (1 layer) not modelled; bf16 Adam moments planned as fp32"),
    ('gb200', 'deepseek_v3_pretrain_256gpu_gb200_fp8mx_large_scale', 'deepseek-v3', 256, 'MXFP8', 4096, 1, 4, 4, 1, 64, 1, 1, 256, {'recompute': 'mla_up_proj', 'moe_dispatcher': 'flex'}, "flex/HybridEP planned as DeepEP; layout 'default map (4,4)' not taken: pp/vp as given; MTP (1 layer) not modelled; bf16 Adam moments planned as fp32; paged stash (capacity 1.5) not modelled"),
    ('gb200', 'deepseek_v3_pretrain_256gpu_gb200_fp8mx_partial_cg_dev', 'deepseek-v3', 256, 'MXFP8', 4096, 1, 4, 2, 1, 64, 1, 1, 8192, {'recompute': 'mla_up_proj', 'moe_dispatcher': 'flex'}, "flex/HybridEP planned as DeepEP; layout 'Et*4|(tttt|)*14tmL' not taken: pp/vp as given; MTP (1 layer) not modelled; bf16 Adam moments planned as fp32; fine-grained offload of ['expert_fc1']: not modelled"),
    # perf_recipes/deepseek/gb200/deepseek_v4.py
    ('gb200', 'deepseek_v4_flash_pretrain_128gpu_gb200_fp8mx', None, 128, 'DeepSeek-V4 (compressed sparse attention, hyper-connections): not in the catalog'),
    # perf_recipes/glm_moe_dsa/gb200/glm5.py
    ('gb200', 'glm51_sft_192gpu_gb200_bf16', None, 192, 'GLM-5 (DeepSeek sparse attention): not in the catalog'),
    ('gb200', 'glm52_sft_192gpu_gb200_bf16', None, 192, 'GLM-5 (DeepSeek sparse attention): not in the catalog'),
    # perf_recipes/gpt_oss/gb200/gpt_oss.py
    ('gb200', 'gpt_oss_20b_pretrain_8gpu_gb200_nvfp4', 'gpt-oss-20b', 8, 'NVFP4', 8192, 1, 1, 1, 2, 4, 1, 1, 4, {'recompute': 'none', 'moe_dispatcher': 'flex'}, "cpu_offloading_num_layers=95 without cpu_offloading: nothing offloaded; flex/HybridEP planned as DeepEP; fp8_param_gather off; vocab 128256 planned at the catalog's 201088; last layers in bf16"),
    ('gb200', 'gpt_oss_20b_pretrain_72gpu_gb200_nvfp4', 'gpt-oss-20b', 72, 'NVFP4', 8192, 1, 1, 1, 2, 4, 1, 1, 36, {'recompute': 'none', 'moe_dispatcher': 'flex'}, "cpu_offloading_num_layers=95 without cpu_offloading: nothing offloaded; flex/HybridEP planned as DeepEP; fp8_param_gather off; vocab 128256 planned at the catalog's 201088; last layers in bf16"),
    ('gb200', 'gpt_oss_20b_pretrain_512gpu_gb200_fp8mx', 'gpt-oss-20b', 512, 'MXFP8', 8192, 2, 1, 1, 4, 8, 1, 1, 64, {'recompute': 'none', 'moe_dispatcher': 'flex'}, "cpu_offloading_num_layers=95 without cpu_offloading: nothing offloaded; flex/HybridEP planned as DeepEP; fp8_param_gather off; vocab 128256 planned at the catalog's 201088"),
    ('gb200', 'gpt_oss_120b_pretrain_64gpu_gb200_bf16', 'gpt-oss-120b', 64, 'bf16', 4096, 1, 1, 1, 1, 64, 1, 4, 1280, {'recompute': 'layernorm/moe_act', 'moe_dispatcher': 'alltoall'}, ''),
    ('gb200', 'gpt_oss_120b_pretrain_64gpu_gb200_fp8mx', 'gpt-oss-120b', 64, 'MXFP8', 4096, 1, 1, 1, 1, 64, 1, 4, 1280, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP; paged stash (capacity 1.5) not modelled'),
    # perf_recipes/kimi/gb200/kimi_k2.py
    ('gb200', 'kimi_k2_pretrain_256gpu_gb200_bf16', 'kimi-k2', 256, 'bf16', 4096, 1, 4, 4, 1, 64, 1, 1, 2048, {'recompute': 'mla_up_proj', 'moe_dispatcher': 'flex'}, "flex/HybridEP planned as DeepEP; layout 'default map (4,4)' not taken: pp/vp as given; Muon planned as AdamW"),
    ('gb200', 'kimi_k2_pretrain_256gpu_gb200_fp8cs', 'kimi-k2', 256, 'FP8-CS', 4096, 1, 4, 4, 1, 64, 1, 1, 2048, {'recompute': 'mla_up_proj', 'moe_dispatcher': 'flex'}, "flex/HybridEP planned as DeepEP; layout 'default map (4,4)' not taken: pp/vp as given; Muon planned as AdamW"),
    ('gb200', 'kimi_k2_pretrain_256gpu_gb200_fp8mx', 'kimi-k2', 256, 'MXFP8', 4096, 1, 4, 4, 1, 64, 1, 1, 2048, {'recompute': 'mla_up_proj', 'moe_dispatcher': 'flex'}, "flex/HybridEP planned as DeepEP; layout 'default map (4,4)' not taken: pp/vp as given; Muon planned as AdamW; fp8_param_gather off"),
    # perf_recipes/llama/gb200/llama3.py
    ('gb200', 'llama3_8b_pretrain_8gpu_gb200_bf16', 'llama3-8b', 8, 'bf16', 8192, 1, 1, 1, 1, 1, None, 2, 128, {'recompute': 'none'}, ''),
    ('gb200', 'llama3_8b_pretrain_8gpu_gb200_fp8cs', 'llama3-8b', 8, 'FP8-CS', 8192, 1, 1, 1, 1, 1, None, 2, 128, {'recompute': 'none'}, ''),
    ('gb200', 'llama3_8b_pretrain_8gpu_gb200_fp8mx', 'llama3-8b', 8, 'MXFP8', 8192, 1, 1, 1, 1, 1, None, 2, 128, {'recompute': 'none'}, ''),
    ('gb200', 'llama3_8b_pretrain_8gpu_gb200_nvfp4', 'llama3-8b', 8, 'NVFP4', 8192, 1, 1, 1, 1, 1, None, 4, 128, {'recompute': 'none'}, ''),
    ('gb200', 'llama3_70b_pretrain_64gpu_gb200_bf16', 'llama3-70b', 64, 'bf16', 8192, 1, 1, 1, 1, 1, None, 1, 256, {'recompute': 'none', 'offload_activations': 20, 'zero': 3}, ''),
    ('gb200', 'llama3_70b_pretrain_64gpu_gb200_fp8cs', 'llama3-70b', 64, 'FP8-CS', 8192, 1, 1, 1, 1, 1, None, 2, 256, {'recompute': 'none', 'offload_activations': 40, 'zero': 3}, ''),
    ('gb200', 'llama3_70b_pretrain_64gpu_gb200_fp8mx', 'llama3-70b', 64, 'MXFP8', 8192, 2, 4, 5, 1, 1, None, 1, 256, {'recompute': 'none'}, ''),
    ('gb200', 'llama3_70b_pretrain_64gpu_gb200_nvfp4', 'llama3-70b', 64, 'NVFP4', 8192, 2, 4, 5, 1, 1, None, 1, 256, {'recompute': 'none'}, ''),
    ('gb200', 'llama3_8b_sft_8gpu_gb200_bf16', 'llama3-8b', 8, 'bf16', 16384, 1, 1, 1, 1, 1, None, 1, 8, {'recompute': 'none'}, ''),
    ('gb200', 'llama3_8b_sft_8gpu_gb200_fp8cs', 'llama3-8b', 8, 'FP8-CS', 16384, 1, 1, 1, 1, 1, None, 1, 8, {'recompute': 'none'}, ''),
    ('gb200', 'llama3_70b_sft_32gpu_gb200_bf16', 'llama3-70b', 32, 'bf16', 4096, 1, 8, 10, 1, 1, None, 1, 32, {'recompute': 'none'}, ''),
    ('gb200', 'llama3_70b_sft_32gpu_gb200_fp8cs', 'llama3-70b', 32, 'FP8-CS', 4096, 1, 8, 10, 1, 1, None, 1, 32, {'recompute': 'none'}, ''),
    ('gb200', 'llama3_70b_peft_8gpu_gb200_bf16', 'llama3-70b', 8, 'bf16', 2048, 1, 2, 20, 1, 1, None, 1, 64, {'recompute': 'none', 'finetune': 'lora', 'lora_rank': 16, 'lora_targets': 'linear_qkv'}, ''),
    ('gb200', 'llama3_70b_peft_8gpu_gb200_fp8cs', 'llama3-70b', 8, 'FP8-CS', 4096, 1, 2, 20, 1, 1, None, 1, 32, {'recompute': 'none', 'finetune': 'lora', 'lora_rank': 16, 'lora_targets': 'linear_qkv'}, ''),
    ('gb200', 'llama3_70b_peft_8gpu_gb200_fp8mx', 'llama3-70b', 8, 'MXFP8', 4096, 1, 4, 20, 1, 1, None, 1, 32, {'recompute': 'none', 'finetune': 'lora', 'lora_rank': 16, 'lora_targets': 'linear_qkv'}, ''),
    ('gb200', 'llama3_8b_sft_8gpu_gb200_fp8mx', 'llama3-8b', 8, 'MXFP8', 16384, 1, 1, 1, 1, 1, None, 1, 8, {'recompute': 'none'}, ''),
    ('gb200', 'llama3_70b_sft_32gpu_gb200_fp8mx', 'llama3-70b', 32, 'MXFP8', 4096, 1, 8, 10, 1, 1, None, 1, 32, {'recompute': 'none'}, ''),
    ('gb200', 'llama3_8b_pretrain_32gpu_gb200_bf16', 'llama3-8b', 32, 'bf16', 8192, 1, 1, 1, 1, 1, None, 2, 512, {'recompute': 'none'}, ''),
    ('gb200', 'llama3_8b_pretrain_32gpu_gb200_fp8cs', 'llama3-8b', 32, 'FP8-CS', 8192, 1, 1, 1, 1, 1, None, 2, 512, {'recompute': 'none'}, ''),
    ('gb200', 'llama3_70b_pretrain_32gpu_gb200_bf16', 'llama3-70b', 32, 'bf16', 8192, 1, 1, 1, 1, 1, None, 1, 128, {'recompute': 'none', 'offload_activations': 20, 'zero': 3}, ''),
    ('gb200', 'llama3_70b_pretrain_32gpu_gb200_fp8cs', 'llama3-70b', 32, 'FP8-CS', 8192, 1, 1, 1, 1, 1, None, 2, 128, {'recompute': 'none', 'offload_activations': 40, 'zero': 3}, ''),
    # perf_recipes/llama/gb200/llama31.py
    ('gb200', 'llama31_405b_pretrain_128gpu_gb200_bf16', 'llama3.1-405b', 128, 'bf16', 8192, 4, 16, 8, 1, 1, None, 1, 768, {'recompute': 'none'}, ''),
    ('gb200', 'llama31_405b_pretrain_128gpu_gb200_fp8cs', 'llama3.1-405b', 128, 'FP8-CS', 8192, 4, 16, 4, 1, 1, None, 1, 768, {'recompute': 'none'}, ''),
    ('gb200', 'llama31_405b_pretrain_128gpu_gb200_fp8mx', 'llama3.1-405b', 128, 'MXFP8', 8192, 4, 16, 8, 1, 1, None, 1, 768, {'recompute': 'none'}, ''),
    ('gb200', 'llama31_405b_pretrain_128gpu_gb200_nvfp4', 'llama3.1-405b', 128, 'NVFP4', 8192, 4, 16, 8, 1, 1, None, 1, 768, {'recompute': 'none'}, ''),
    ('gb200', 'llama31_405b_pretrain_256gpu_gb200_bf16', 'llama3.1-405b', 256, 'bf16', 8192, 4, 16, 8, 1, 1, None, 1, 1536, {'recompute': 'none'}, ''),
    ('gb200', 'llama31_405b_pretrain_256gpu_gb200_fp8cs', 'llama3.1-405b', 256, 'FP8-CS', 8192, 4, 16, 4, 1, 1, None, 1, 1536, {'recompute': 'none'}, ''),
    ('gb200', 'llama31_405b_pretrain_256gpu_gb200_fp8mx', 'llama3.1-405b', 256, 'MXFP8', 8192, 4, 16, 8, 1, 1, None, 1, 1536, {'recompute': 'none'}, ''),
    ('gb200', 'llama31_405b_pretrain_256gpu_gb200_nvfp4', 'llama3.1-405b', 256, 'NVFP4', 8192, 4, 16, 8, 1, 1, None, 1, 1536, {'recompute': 'none'}, ''),
    # perf_recipes/nemotronh/gb200/nemotronh.py
    ('gb200', 'nemotronh_56b_pretrain_64gpu_gb200_fp8cs', 'nemotron-h-56b', 64, 'FP8-CS', 8192, 2, 1, 1, 1, 1, None, 1, 192, {'recompute': 'none'}, ''),
    ('gb200', 'nemotron_3_super_pretrain_64gpu_gb200_bf16', None, 64, 'Nemotron 3 Super (hybrid Mamba MoE, latent MoE): not in the catalog'),
    ('gb200', 'nemotron_3_super_pretrain_64gpu_gb200_fp8mx', None, 64, 'Nemotron 3 Super (hybrid Mamba MoE, latent MoE): not in the catalog'),
    ('gb200', 'nemotron_3_super_pretrain_64gpu_gb200_nvfp4', None, 64, 'Nemotron 3 Super (hybrid Mamba MoE, latent MoE): not in the catalog'),
    ('gb200', 'nemotron_3_ultra_pretrain_256gpu_gb200_fp8mx', None, 256, 'Nemotron 3 Ultra (hybrid Mamba MoE): not in the catalog'),
    ('gb200', 'nemotron_3_nano_pretrain_8gpu_gb200_bf16', None, 8, 'Nemotron 3 Nano (hybrid Mamba MoE): not in the catalog'),
    ('gb200', 'nemotron_3_nano_pretrain_8gpu_gb200_fp8mx', None, 8, 'Nemotron 3 Nano (hybrid Mamba MoE): not in the catalog'),
    ('gb200', 'nemotron_3_nano_pretrain_8gpu_gb200_nvfp4', None, 8, 'Nemotron 3 Nano (hybrid Mamba MoE): not in the catalog'),
    ('gb200', 'nemotron_3_5_lightning_pretrain_8gpu_gb200_bf16', None, 8, 'Nemotron 3.5 Lightning (built on the Nemotron 3 Nano recipe, hybrid Mamba MoE): not in the catalog'),
    ('gb200', 'nemotron_3_5_lightning_pretrain_8gpu_gb200_fp8mx', None, 8, 'Nemotron 3.5 Lightning (built on the Nemotron 3 Nano recipe, hybrid Mamba MoE): not in the catalog'),
    ('gb200', 'nemotron_3_5_lightning_pretrain_8gpu_gb200_fp8mx_fsdp', None, 8, 'Nemotron 3.5 Lightning (built on the Nemotron 3 Nano recipe, hybrid Mamba MoE): not in the catalog'),
    ('gb200', 'nemotron_3_5_lightning_pretrain_8gpu_gb200_nvfp4', None, 8, 'Nemotron 3.5 Lightning (built on the Nemotron 3 Nano recipe, hybrid Mamba MoE): not in the catalog'),
    # perf_recipes/qwen/gb200/qwen3_moe.py
    ('gb200', 'qwen3_235b_a22b_pretrain_64gpu_gb200_bf16', 'qwen3-235b-a22b', 64, 'bf16', 4096, 1, 8, 1, 1, 8, 1, 1, 2048, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP'),
    ('gb200', 'qwen3_235b_a22b_pretrain_64gpu_gb200_fp8cs', 'qwen3-235b-a22b', 64, 'FP8-CS', 4096, 1, 8, 1, 1, 32, 1, 1, 2048, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP'),
    ('gb200', 'qwen3_235b_a22b_pretrain_64gpu_gb200_fp8mx', 'qwen3-235b-a22b', 64, 'MXFP8', 4096, 1, 8, 3, 1, 32, 1, 1, 2048, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP; paged stash (capacity 1.5) not modelled'),
    ('gb200', 'qwen3_30b_a3b_pretrain_8gpu_gb200_bf16', 'qwen3-30b-a3b', 8, 'bf16', 4096, 1, 1, 1, 1, 8, 1, 4, 512, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP'),
    ('gb200', 'qwen3_30b_a3b_pretrain_8gpu_gb200_fp8cs', 'qwen3-30b-a3b', 8, 'FP8-CS', 4096, 1, 1, 1, 1, 8, 1, 4, 512, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP'),
    ('gb200', 'qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx', 'qwen3-30b-a3b', 8, 'MXFP8', 4096, 1, 1, 1, 1, 8, 1, 4, 512, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP; paged stash (capacity 1.5) not modelled'),
    ('gb200', 'qwen3_235b_a22b_pretrain_256gpu_gb200_bf16', 'qwen3-235b-a22b', 256, 'bf16', 4096, 1, 8, 1, 1, 8, 1, 1, 8192, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP'),
    ('gb200', 'qwen3_235b_a22b_pretrain_256gpu_gb200_fp8cs', 'qwen3-235b-a22b', 256, 'FP8-CS', 4096, 1, 8, 1, 1, 32, 1, 1, 8192, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP'),
    ('gb200', 'qwen3_235b_a22b_pretrain_256gpu_gb200_fp8mx', 'qwen3-235b-a22b', 256, 'MXFP8', 4096, 1, 8, 3, 1, 32, 1, 1, 8192, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP; paged stash (capacity 1.5) not modelled'),
    ('gb200', 'qwen3_235b_a22b_pretrain_256gpu_gb200_fp8mx_large_scale', 'qwen3-235b-a22b', 256, 'MXFP8', 4096, 1, 8, 3, 1, 32, 1, 1, 512, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP; paged stash (capacity 1.5) not modelled'),
    ('gb200', 'qwen3_235b_a22b_pretrain_64gpu_gb200_nvfp4', 'qwen3-235b-a22b', 64, 'NVFP4', 4096, 1, 8, 1, 1, 32, 1, 1, 2048, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP'),
    ('gb200', 'qwen3_235b_a22b_pretrain_256gpu_gb200_nvfp4', 'qwen3-235b-a22b', 256, 'NVFP4', 4096, 1, 8, 1, 1, 32, 1, 1, 8192, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP'),
    ('gb200', 'qwen3_30b_a3b_pretrain_8gpu_gb200_nvfp4', 'qwen3-30b-a3b', 8, 'NVFP4', 4096, 1, 1, 1, 1, 8, 1, 4, 512, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP; bf16 Adam moments planned as fp32'),
    ('gb200', 'qwen3_30b_a3b_pretrain_32gpu_gb200_bf16', 'qwen3-30b-a3b', 32, 'bf16', 4096, 1, 1, 1, 1, 8, 1, 4, 2048, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP'),
    ('gb200', 'qwen3_30b_a3b_pretrain_32gpu_gb200_fp8cs', 'qwen3-30b-a3b', 32, 'FP8-CS', 4096, 1, 1, 1, 1, 8, 1, 4, 2048, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP'),
    ('gb200', 'qwen3_next_80b_a3b_pretrain_64gpu_gb200_bf16', None, 64, 'Qwen3-Next 80B-A3B (gated DeltaNet hybrid attention): not in the catalog'),
    ('gb200', 'qwen3_next_80b_a3b_pretrain_64gpu_gb200_fp8mx', None, 64, 'Qwen3-Next 80B-A3B (gated DeltaNet hybrid attention): not in the catalog'),
    ('gb200', 'qwen3_30b_a3b_pretrain_16gpu_gb200_bf16_dev', 'qwen3-30b-a3b', 16, 'bf16', 4096, 1, 1, 1, 1, 16, 1, 4, 512, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP'),
    ('gb200', 'qwen3_30b_a3b_pretrain_16gpu_gb200_fp8mx_partial_cg_dev', 'qwen3-30b-a3b', 16, 'MXFP8', 4096, 1, 1, 1, 1, 16, 1, 4, 512, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP; fp8_param_gather off'),
    ('gb200', 'qwen3_30b_a3b_pretrain_16gpu_gb200_fp8mx_paged_stash_dev', 'qwen3-30b-a3b', 16, 'MXFP8', 4096, 1, 1, 1, 1, 16, 1, 4, 512, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP; paged stash (capacity 1.5) not modelled; fp8_param_gather off'),
    ('gb200', 'qwen3_235b_a22b_pretrain_128gpu_gb200_fp8mx_paged_stash_dev', 'qwen3-235b-a22b', 128, 'MXFP8', 4096, 1, 1, 1, 1, 64, 1, 1, 8192, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP; bf16 Adam moments planned as fp32; paged stash (capacity 1.2) not modelled'),
    ('gb200', 'qwen3_235b_a22b_pretrain_128gpu_gb200_fp8mx_partial_cg_dev', 'qwen3-235b-a22b', 128, 'MXFP8', 4096, 1, 1, 1, 1, 64, 1, 1, 8192, {'recompute': 'none', 'moe_dispatcher': 'flex'}, 'flex/HybridEP planned as DeepEP; bf16 Adam moments planned as fp32'),
    # perf_recipes/qwen_vl/gb200/qwen35_vl.py
    ('gb200', 'qwen35_vl_35b_a3b_pretrain_8gpu_gb200_bf16', None, 8, 'Qwen3.5-VL: a vision-language model, not planned'),
    ('gb200', 'qwen35_vl_35b_a3b_pretrain_8gpu_gb200_fp8cs', None, 8, 'Qwen3.5-VL: a vision-language model, not planned'),
    ('gb200', 'qwen35_vl_35b_a3b_pretrain_8gpu_gb200_fp8mx', None, 8, 'Qwen3.5-VL: a vision-language model, not planned'),
    ('gb200', 'qwen35_vl_122b_a10b_pretrain_32gpu_gb200_bf16', None, 32, 'Qwen3.5-VL: a vision-language model, not planned'),
    ('gb200', 'qwen35_vl_122b_a10b_pretrain_32gpu_gb200_fp8cs', None, 32, 'Qwen3.5-VL: a vision-language model, not planned'),
    ('gb200', 'qwen35_vl_122b_a10b_pretrain_32gpu_gb200_fp8mx', None, 32, 'Qwen3.5-VL: a vision-language model, not planned'),
    ('gb200', 'qwen35_vl_397b_a17b_pretrain_64gpu_gb200_bf16', None, 64, 'Qwen3.5-VL: a vision-language model, not planned'),
    ('gb200', 'qwen35_vl_397b_a17b_pretrain_64gpu_gb200_fp8cs', None, 64, 'Qwen3.5-VL: a vision-language model, not planned'),
    ('gb200', 'qwen35_vl_397b_a17b_pretrain_64gpu_gb200_fp8mx', None, 64, 'Qwen3.5-VL: a vision-language model, not planned'),
    # perf_recipes/qwen_vl/gb200/qwen3_vl.py
    ('gb200', 'qwen3_vl_235b_a22b_pretrain_64gpu_gb200_bf16', None, 64, 'Qwen3-VL: a vision-language model, not planned'),
    ('gb200', 'qwen3_vl_235b_a22b_pretrain_64gpu_gb200_fp8cs', None, 64, 'Qwen3-VL: a vision-language model, not planned'),
    ('gb200', 'qwen3_vl_235b_a22b_pretrain_64gpu_gb200_fp8mx', None, 64, 'Qwen3-VL: a vision-language model, not planned'),
    ('gb200', 'qwen3_vl_30b_a3b_pretrain_8gpu_gb200_bf16', None, 8, 'Qwen3-VL: a vision-language model, not planned'),
    ('gb200', 'qwen3_vl_30b_a3b_pretrain_8gpu_gb200_fp8cs', None, 8, 'Qwen3-VL: a vision-language model, not planned'),
    ('gb200', 'qwen3_vl_30b_a3b_pretrain_8gpu_gb200_fp8mx', None, 8, 'Qwen3-VL: a vision-language model, not planned'),
    # perf_recipes/wan/gb200/wan.py
    ('gb200', 'wan_14b_pretrain_16gpu_gb200_bf16', None, 16, 'Wan: a video diffusion model, not planned'),
)
"""(chip, recipe, catalog model, GPUs, precision, seq, tp, pp, vp, cp, ep, etp, micro-batch, global batch,
planner options the recipe states, notes); a skipped recipe is (chip, recipe, None, GPUs, reason)."""


def task_of(recipe: str) -> str:
    """The recipe's task as the NeMo sweeps name it: lora, sft or pre_train."""
    return "lora" if "_peft_" in recipe else "sft" if "_sft_" in recipe else "pre_train"


def plan_recipe(row: tuple) -> dict:
    """One recipe planned on its chip as it states it, or skipped with the reason."""
    chip, recipe, catalog, gpus = row[:4]
    if catalog is None:
        return {"chip": chip, "recipe": recipe, "task": task_of(recipe), "model": recipe, "gpus": gpus,
                "verdict": "skipped", "reason": row[4]}
    precision, seq, tp, pp, vp, cp, ep, etp, mbs, gbs, stated, notes = row[4:]
    out = plan_row((task_of(recipe), catalog, "", precision, gpus, seq, tp, pp, cp, ep, vp, mbs, gbs, etp),
                   hardware=HARDWARE[chip], catalog=catalog, **stated)
    out.update(chip=chip, recipe=recipe, model=catalog, stated=stated, notes=notes)
    # a memory option the planner applied that the recipe does not set: no perf recipe sets
    # activation_func_fp8_input_store; fp8 params only where an fp8 recipe keeps fp8_param_gather on
    unset = [o for o in out.get("fits_with", ()) if o == "fp8-activation-store" or (
        o == "fp8-params" and (precision == "bf16" or "fp8_param_gather off" in notes))]
    if unset:
        out["options_the_recipe_does_not_set"] = unset
    return out


def main() -> int:
    results = [plan_recipe(row) for row in ROWS]
    for r in results:
        if r["verdict"] != "skipped":
            print(f"{r['chip']:5s} {describe(r)}  {r['recipe']}")
    summary = {"recipes": len(results), **{chip: dict(Counter(r["verdict"] for r in results if r["chip"] == chip))
                                           for chip in HARDWARE},
               "fit_only_with_an_option_the_recipe_does_not_set": sorted(
                   r["recipe"] for r in results if r.get("options_the_recipe_does_not_set"))}
    write_results(summary, results, "mbridge_recipe_layouts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
