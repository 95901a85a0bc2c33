"""Megatron-LM as Narayanan et al. 2021 ran it: fp16, fp32 gradient accumulation, no
distributed optimizer, apex fused kernels, attention unfused (pre-FlashAttention)."""

from flopwise.plan.stacks.base import Stack

STACK = Stack(
    name="megatron-lm", title="Megatron-LM 2021 (Narayanan et al.)", framework="megatron",
    attention_kernel="fa2",  # timed through the planner's attention-core model; flash_attention=False in layouts
    fp8_recipe="delayed",  # no fp8 in 2021; TE's default recipe if asked
    fused_optimizer=True,  # apex FusedAdam (megatron/optimizer/__init__.py, 2021)
    cross_entropy="megatron",  # _VocabParallelCrossEntropy (megatron/mpu/cross_entropy.py)
    # 2021: train_step all-reduces the gradients after the whole forward-backward (megatron/training.py
    # l. 372-380 at fda81a21: model.allreduce_gradients() for DDP_impl "local"); the time model exposes
    # it (timing.stack_dp_overlap)
    overlap_grad_reduce=False, overlap_param_gather=False,
    tp_comm_overlap=False,
    grad_bytes=4.0, reduce_bytes=4.0,  # bf16 forces fp32 main_grad and reduction; fp16 keeps 16-bit (conventions.py)
    distributed_optimizer=False,
    fp8_gemm_input_bytes=2.0,
    loss_bytes_per_logit=4.0,  # _VocabParallelCrossEntropy keeps the fp32 softmax
    allocator_reserve=0.10,
    # Megatron-LM's trainer has taken --account-for-embedding-in-pipeline-split and
    # --account-for-loss-in-pipeline-split since 2025-02 (megatron/training/arguments.py, Megatron-Core's
    # split rule): one or two chunks more than layers plan as today's trainer runs them (the 2021 tree refused)
    ends_in_pipeline_split=True,
    memory_options=("recompute",),
    sources=("NVIDIA/Megatron-LM megatron/arguments.py, megatron/mpu/cross_entropy.py (2021 tree)",),
)
