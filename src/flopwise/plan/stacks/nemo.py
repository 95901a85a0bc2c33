"""NVIDIA's performance recipes on Megatron-Core: what NeMo's and Megatron-Bridge's published
throughput tables run. Megatron-Core + Transformer Engine with one convention changed: the
data-parallel gradients are kept and reduced in bf16 at every precision."""

import dataclasses

from flopwise.plan.stacks.megatron_core import STACK as MEGATRON_CORE

STACK = dataclasses.replace(
    MEGATRON_CORE,
    name="nemo", title="NeMo / Megatron-Bridge performance recipes (Megatron-Core + TE, bf16 gradient reduction)",
    # NeMo scripts/performance/helpers.py set_precision_configs: `recipe.trainer.plugins.grad_reduce_in_fp32 =
    # False` for bf16 and fp8 alike since 5cb6e3f4fb ("bf16 grads for bf16 jobs", 2025-06-25, the 25.07 perf
    # scripts); Megatron-Bridge src/megatron/bridge/perf_recipes/_common.py `_benchmark_common` and
    # `_perf_precision`: `ddp.grad_reduce_in_fp32 = False` for every compute dtype. Megatron's main_grad buffer
    # takes the reduction's dtype (param_and_grad_buffer.py). Their training recipes (bf16_mixed) keep fp32:
    # a run from those is planned with --grad-reduce fp32, or as megatron-core.
    grad_bytes=2.0, reduce_bytes=2.0, fp8_reduce_bytes=2.0,
    memory_options=tuple(o for o in MEGATRON_CORE.memory_options if o != "bf16-grad-reduce"),
    sources=("NVIDIA/NeMo scripts/performance/helpers.py set_precision_configs at 8cfedd72 (grad_reduce_in_fp32 = "
             "False for every compute dtype since 5cb6e3f4fb, 2025-06-25)",
             "NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/perf_recipes/_common.py (_benchmark_common, "
             "_perf_precision: grad_reduce_in_fp32 = False), perf_recipes/llama/h100/llama3.py, at 067f987d "
             "(settings only)",
             *MEGATRON_CORE.sources),
)
