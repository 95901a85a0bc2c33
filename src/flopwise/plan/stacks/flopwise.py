"""flopwise's own trainer (`flopwise train`): FSDP2 + torch SDPA, torchao float8. The default
stack, and what a run's plan.json is planned with."""

from flopwise.plan.stacks.base import Stack

STACK = Stack(
    name="flopwise", title="flopwise trainer (FSDP2, torch SDPA, torchao float8)", framework="fsdp",
    attention_kernel="fa2",  # torch SDPA's flash backend is FlashAttention-2 (torch/nn/attention, sdp_kernel)
    fp8_recipe="tensorwise",  # torchao Float8LinearConfig default: dynamic tensorwise scaling
    fused_optimizer=True,  # torch.optim.AdamW(fused=True) on CUDA (train/optim.py)
    cross_entropy="eager",  # train/step.py: F.cross_entropy(logits.float()), outside the compiled blocks
    overlap_grad_reduce=True, overlap_param_gather=True,  # FSDP2 reduce-scatter / prefetched all-gather
    tp_comm_overlap=False,
    # FSDP2 MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) (train/techniques/precision.py
    # fsdp_mixed_precision): bf16 gradients, reduce-scattered in fp32; DDP under autocast reduces fp32 ones
    grad_bytes=2.0, reduce_bytes=4.0,
    distributed_optimizer=True,  # FSDP shards optimizer states with the parameters
    fp8_gemm_input_bytes=2.0,  # torchao float8 linear saves the high-precision input (float8_linear.py)
    loss_bytes_per_logit=8.0,  # fp32 copy + fp32 log-softmax (memory.loss_logits_bytes_per_element)
    allocator_reserve=0.10,  # PyTorch caching allocator slack: stated assumption (docs/planner.md)
    # train/techniques/activation_checkpointing.py: torch.utils.checkpoint(use_reentrant=False), early stop on
    recompute_early_stop=True,
    memory_options=("recompute",),
    sources=("flopwise train/ (FSDP2 fully_shard, MixedPrecisionPolicy)",
             "pytorch/ao torchao/float8/float8_linear.py (saves the bf16 input), config.py (tensorwise default)"),
)
