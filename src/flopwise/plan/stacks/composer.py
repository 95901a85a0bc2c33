"""Composer / llm-foundry (MosaicML): FSDP (FULL_SHARD), flash attention, TE fp8."""

from flopwise.plan.stacks.base import Stack

STACK = Stack(
    name="composer", title="Composer / llm-foundry (FSDP, flash attention)", framework="fsdp",
    attention_kernel="fa2",  # llmfoundry/models/layers/attention.py flash_attn_func (FlashAttention-2)
    fp8_recipe="delayed",  # llm-foundry fp8 through te.fp8_autocast(DelayedScaling) (composer precision amp_fp8)
    fused_optimizer=False,  # llmfoundry DecoupledLionW / torch AdamW (foreach)
    cross_entropy="single-pass",  # loss_fn "fused_crossentropy" (flash_attn.losses.cross_entropy)
    overlap_grad_reduce=True, overlap_param_gather=True,  # FSDP backward/forward prefetch
    tp_comm_overlap=False,
    # fsdp_config mixed_precision PURE (llm-foundry's pretrain yamls; scripts/train/benchmarking/submit_benchmarks.py
    # --fsdp_config_mixed_precision default): bf16 params, reduce and buffers; composer's DEFAULT would reduce fp32
    # (composer/distributed/mosaic_parallelism.py get_mixed_precision): plan such a run with --grad-reduce fp32
    grad_bytes=2.0, reduce_bytes=2.0,
    distributed_optimizer=True,
    fp8_gemm_input_bytes=1.0,  # TE Linear saves the fp8 input under fp8_autocast
    loss_bytes_per_logit=2.0,  # flash-attn's cross_entropy writes the gradient into the logits buffer
    allocator_reserve=0.10,
    # activation_checkpointing_reentrant: false (llm-foundry's pretrain yamls): composer wraps each block in
    # checkpoint_wrapper(CheckpointImpl.NO_REENTRANT) without overriding early stop, PyTorch's default
    recompute_early_stop=True,
    memory_options=("recompute",),
    sources=("mosaicml/llm-foundry llmfoundry/models/layers/attention.py, models/mpt/modeling_mpt.py",
             "mosaicml/composer composer/core/precision.py (amp_fp8), composer/distributed/mosaic_parallelism.py "
             "(get_mixed_precision: PURE reduces in the run's 16-bit dtype, DEFAULT in fp32)",
             "mosaicml/llm-foundry scripts/train/yamls/pretrain/mpt-*.yaml (mixed_precision: PURE), "
             "scripts/train/benchmarking/submit_benchmarks.py (default PURE), at 4c99952d0 (settings only)",
             "mosaicml/composer composer/distributed/activation_checkpointing.py (checkpoint_wrapper, NO_REENTRANT); "
             "pytorch/pytorch torch/utils/checkpoint.py (_enable_checkpoint_early_stop, default True)",
             "Dao-AILab/flash-attention flash_attn/ops/triton/cross_entropy.py"),
)
