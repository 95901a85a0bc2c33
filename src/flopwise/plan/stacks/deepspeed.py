"""DeepSpeed ZeRO with a Hugging Face model (the deepspeed engine's own conventions)."""

from flopwise.plan.stacks.base import Stack

STACK = Stack(
    name="deepspeed", title="DeepSpeed ZeRO (Hugging Face model)", framework="deepspeed",
    attention_kernel="fa2",  # HF attn_implementation="flash_attention_2" or SDPA
    fp8_recipe="delayed",  # fp8 through Transformer Engine modules
    fused_optimizer=True,  # deepspeed/ops/adam/fused_adam.py (FusedAdam)
    cross_entropy="eager",  # HF models: F.cross_entropy on logits upcast to fp32
    overlap_grad_reduce=True,  # zero_optimization.overlap_comm
    overlap_param_gather=True,  # ZeRO-3 prefetch (stage3_prefetch_bucket_size)
    tp_comm_overlap=False,
    grad_bytes=2.0, reduce_bytes=2.0,  # 16-bit grads + an fp32 partition (runtime/zero/stage_1_and_2.py)
    distributed_optimizer=True,
    fp8_gemm_input_bytes=2.0,
    loss_bytes_per_logit=8.0,
    allocator_reserve=0.10,
    # ZeRO-3 fetches parameters module by module (runtime/zero/partitioned_param_coordinator.py)
    zero3_gathers_modules=True,
    # bf16 at ZeRO-0/1 runs DeepSpeed's BF16_Optimizer (runtime/bf16_optimizer.py): a full-size fp32
    # gradient buffer (`fp32_groups_gradients_flat`) filled from the bf16 .grad after backward
    bf16_optimizer_fp32_grads=True,
    memory_options=("recompute",),
    sources=("microsoft/DeepSpeed deepspeed/runtime/zero/stage_1_and_2.py, stage3.py",
             "microsoft/DeepSpeed deepspeed/ops/adam/fused_adam.py"),
)
