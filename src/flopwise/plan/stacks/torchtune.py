"""torchtune: FSDP2 fine-tuning recipes on torch in pure bf16, SDPA, a chunked linear cross-entropy."""

from flopwise.plan.stacks.base import Stack

STACK = Stack(
    name="torchtune", title="torchtune (FSDP2, pure bf16, SDPA, chunked linear cross-entropy)", framework="fsdp",
    attention_kernel="fa2",  # torchtune/modules/attention.py: F.scaled_dot_product_attention (flash backend)
    fp8_recipe="tensorwise",  # training/quantization.py: Float8LinearConfig(enable_fsdp_float8_all_gather=True)
    fused_optimizer=True,  # recipes/configs/*: torch.optim.AdamW with fused: True
    # modules/loss/cross_entropy_loss.py LinearCrossEntropyLoss: the output projection and
    # F.cross_entropy(logits.float()) run per chunk of tokens (num_output_chunks=8)
    cross_entropy="eager",
    compiles_loss=True,  # compile: True compiles compute_cross_entropy (apply_compile_strategy)
    overlap_grad_reduce=True, overlap_param_gather=True,  # FSDP2 (training/_distributed.py shard_model)
    tp_comm_overlap=False,
    # `dtype: bf16`: the parameters themselves are bf16 and fully_shard gets no MixedPrecisionPolicy, so
    # gradients are bf16 and reduce-scattered in bf16; AdamW's states follow the parameters (bf16)
    grad_bytes=2.0, reduce_bytes=2.0,
    distributed_optimizer=True,
    fp8_gemm_input_bytes=2.0,  # torchao float8_linear.py saves the bf16 input
    loss_bytes_per_logit=8.0,  # per chunk: the fp32 copy and the fp32 log-softmax F.cross_entropy keeps
    loss_chunks=8,  # only one chunk's logits and fp32 copy exist at a time; every chunk's log-softmax is kept
    # torchtune/__init__.py sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    allocator_reserve=0.02,
    # training/activations.py: ptd_checkpoint_wrapper(NO_REENTRANT, torch.utils.checkpoint), early stop on
    recompute_early_stop=True,
    pure_bf16=("full", "lora", "qlora"),  # recipes' `dtype: bf16`: no fp32 master copy (the trade-off: docs/planner.md)
    # llama3_1/8B_lora.yaml: lora_rank 8; lora_attn_modules q_proj, v_proj, output_proj; apply_lora_to_mlp
    lora_rank=8, lora_targets="q,v,o,gate,up,down",
    memory_options=("torch-compile", "recompute"),
    sources=("pytorch/torchtune recipes/configs/llama3_1/8B_lora.yaml, torchtune/modules/loss/cross_entropy_loss.py, "
             "torchtune/training/_distributed.py, training/activations.py, training/quantization.py, "
             "torchtune/__init__.py at bd2a0fc7 (2026-04-23)",),
)
