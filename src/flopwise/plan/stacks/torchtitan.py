"""torchtitan: FSDP2 + TP/PP/CP on torch, SDPA (flash) or FlexAttention, torchao float8."""

from flopwise.plan.stacks.base import Stack

STACK = Stack(
    name="torchtitan", title="torchtitan (FSDP2, SDPA, torchao float8)", framework="fsdp",
    attention_kernel="fa2",  # torchtitan/models/attention.py: F.scaled_dot_product_attention (flash backend)
    fp8_recipe="tensorwise",  # torchtitan/components/quantization/float8.py: recipe_name None -> tensorwise
    fused_optimizer=True,  # torchtitan/components/optimizer.py: implementation "fused" default
    fused_cross_entropy=False,  # torchtitan/components/loss.py: F.cross_entropy(pred.float(), ...)
    overlap_grad_reduce=True, overlap_param_gather=True,  # FSDP2 prefetch / reduce-scatter in backward
    tp_comm_overlap=False,  # async TP is opt-in (parallelize.py enable_async_tensor_parallel)
    grad_bytes=2.0, reduce_bytes=4.0,  # parallelize.py: MixedPrecisionPolicy(param=bf16, reduce=fp32)
    distributed_optimizer=True,
    fp8_gemm_input_bytes=2.0,  # torchao float8_linear.py saves the bf16 input
    loss_bytes_per_logit=8.0,  # fp32 copy + fp32 log-softmax kept by F.cross_entropy's autograd
    allocator_reserve=0.10,
    memory_options=("recompute",),
    sources=("pytorch/torchtitan torchtitan/models/llama3/infra/parallelize.py",
             "pytorch/torchtitan torchtitan/components/loss.py, components/quantization/float8.py",
             "pytorch/ao torchao/float8/float8_linear.py"),
)
