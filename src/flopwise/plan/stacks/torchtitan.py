"""torchtitan: FSDP2 + TP/PP/CP on torch, SDPA (flash) or FlexAttention, torchao float8."""

from flopwise.plan.stacks.base import Stack

STACK = Stack(
    name="torchtitan", title="torchtitan (FSDP2, SDPA, torchao float8)", framework="fsdp",
    attention_kernel="fa2",  # torchtitan/models/attention.py: F.scaled_dot_product_attention (flash backend)
    fp8_recipe="tensorwise",  # torchtitan/components/quantization/float8.py: recipe_name None -> tensorwise
    fused_optimizer=True,  # torchtitan/components/optimizer.py: implementation "fused" default
    cross_entropy="eager",  # torchtitan/components/loss.py: F.cross_entropy(pred.float(), ...)
    compiles_loss=True,  # build_cross_entropy_loss: torch.compile(loss_fn) when compile is on
    # activation_checkpoint mode "selective" with selective_ac_option "op" in its Llama 3 configs
    # (torchtitan/models/llama3/train_configs/*.toml): save every second matmul's output, recompute the rest
    selective_recompute="op",
    overlap_grad_reduce=True, overlap_param_gather=True,  # FSDP2 prefetch / reduce-scatter in backward
    tp_comm_overlap=False,  # async TP is opt-in (parallelize.py enable_async_tensor_parallel)
    grad_bytes=2.0, reduce_bytes=4.0,  # parallelize.py: MixedPrecisionPolicy(param=bf16, reduce=fp32)
    distributed_optimizer=True,
    fp8_gemm_input_bytes=2.0,  # torchao float8_linear.py saves the bf16 input
    loss_bytes_per_logit=8.0,  # fp32 copy + fp32 log-softmax kept by F.cross_entropy's autograd
    # run_train.sh launches with PYTORCH_ALLOC_CONF=expandable_segments:True (as Megatron-Core's stack)
    allocator_reserve=0.02,
    # parallelize.py apply_tp: the norms are SequenceParallel() and the blocks' inputs/outputs
    # Shard(1) whenever tensor parallelism is on
    sequence_parallel=True,
    # compile.enable (on in llama3_405b of models/llama3/config_registry.py): see conventions.py
    # torchtitan/distributed/activation_checkpoint.py FullAC: ptd_checkpoint_wrapper(early_stop=False) since
    # 25413d224 (2025-08-29): a full recompute re-runs the whole block
    recompute_early_stop=False,
    memory_options=("torch-compile", "recompute"),
    sources=("pytorch/torchtitan torchtitan/models/llama3/infra/parallelize.py",
             "pytorch/torchtitan torchtitan/components/loss.py, components/quantization/float8.py",
             "pytorch/ao torchao/float8/float8_linear.py",
             "pytorch/torchtitan run_train.sh (expandable_segments), torchtitan/models/llama3/config_registry.py "
             "(llama3_405b: CompileConfig(enable=True)) at b5bcd76c (2026-08-21)"),
)
