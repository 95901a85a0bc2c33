"""Megatron-DeepSpeed (BLOOM, MT-NLG): Megatron's model code on DeepSpeed's ZeRO-1 and pipeline."""

from flopwise.plan.stacks.base import Stack

STACK = Stack(
    name="megatron-deepspeed", title="Megatron-DeepSpeed (BLOOM, MT-NLG)", framework="deepspeed",
    attention_kernel="fa2",
    fp8_recipe="delayed",
    fused_optimizer=True,  # apex / deepspeed FusedAdam
    cross_entropy="megatron",  # megatron/mpu/cross_entropy.py _VocabParallelCrossEntropy
    overlap_grad_reduce=False, overlap_param_gather=False,  # pipeline engine reduces after the step's micro-batches
    tp_comm_overlap=False,
    grad_bytes=2.0, reduce_bytes=2.0,  # 16-bit grads + fp32 partition under ZeRO-1 (stage_1_and_2.py)
    distributed_optimizer=True,
    fp8_gemm_input_bytes=2.0,
    loss_bytes_per_logit=4.0,  # vocab-parallel cross-entropy keeps the fp32 softmax
    allocator_reserve=0.10,
    # ZeRO-3 fetches parameters module by module (runtime/zero/partitioned_param_coordinator.py)
    zero3_gathers_modules=True,
    # bf16 at ZeRO-0/1 runs DeepSpeed's BF16_Optimizer (runtime/bf16_optimizer.py): a full-size fp32
    # gradient buffer (`fp32_groups_gradients_flat`) filled from the bf16 .grad after backward
    bf16_optimizer_fp32_grads=True,
    # the BF16_Optimizer of BLOOM's time (DeepSpeed 2022, runtime/bf16_optimizer.py: "TODO: Need to only
    # track fp32 params of this partition") keeps `fp32_groups_flat`, a whole fp32 copy, and steps a
    # narrow() view of its partition; later DeepSpeed keeps only the partition (the deepspeed stack).
    # Which one BLOOM ran is not settled by its sources: its README names DeepSpeed's
    # olruwase/bf16-updates branch at the start and olruwase/elastic-ckpt-refresh (2022-07-20,
    # partition only) at the end; with the partition only, BLOOM's 60 GB reads -15 % instead of +10 %.
    bf16_optimizer_full_fp32_master=True,
    memory_options=("recompute",),
    sources=("microsoft/Megatron-DeepSpeed megatron/mpu/cross_entropy.py",
             "microsoft/DeepSpeed deepspeed/runtime/pipe/engine.py, runtime/zero/stage_1_and_2.py"),
)
