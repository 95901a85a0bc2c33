"""flash-attention's own trainer (training/ in Dao-AILab/flash-attention): Lightning DDP/FSDP,
fused kernels (FlashAttention-2, fused dense, fused cross-entropy), A100."""

from flopwise.plan.stacks.base import Stack

STACK = Stack(
    name="flash-attn", title="flash-attention's trainer (FA2, fused kernels)", framework="fsdp",
    attention_kernel="fa2",  # flash_attn/modules/mha.py
    fp8_recipe="tensorwise",  # unused: fp8_training is off
    fp8_training=False,  # training/: Lightning precision 16 / bf16 only, no fp8 recipe
    fused_optimizer=True,  # apex FusedAdam (training/configs/optimizer/adamw-apex.yaml)
    cross_entropy="single-pass",  # flash_attn/losses/cross_entropy.py (inplace_backward)
    overlap_grad_reduce=True, overlap_param_gather=False,  # DDP buckets overlap backward
    tp_comm_overlap=False,
    # training/Dockerfile: pytorch-lightning 1.8.6, whose `precision: bf16` (configs/experiment/pile/base.yaml)
    # is native AMP: fp32 parameters under torch.autocast, so DDP all-reduces fp32 gradients
    grad_bytes=2.0, reduce_bytes=4.0,
    fp32_params=True,  # the same: weights 4 + gradients 4 + Adam 8 bytes/param, a bf16 copy per weight saved
    # training/configs/experiment/{pile,owt}/gpt*-flash.yaml set residual_in_fp32: True: the residual stream, which
    # the fused dropout-add-LayerNorm saves as each norm's input (flash_attn/ops/layer_norm.py), stays fp32
    norm_input_bytes=4.0,
    # training/configs/model/gpt2.yaml builds transformers' GPT2Config, whose resid/embd/attn_pdrop default to
    # 0.1; no experiment config sets them: its models train with dropout, masks saved by the fused kernels
    dropout=True,
    distributed_optimizer=True,  # ZeRO-2 style sharded optimizer (training/configs)
    fp8_gemm_input_bytes=2.0,
    loss_bytes_per_logit=2.0,  # inplace_backward: the gradient overwrites the logits
    allocator_reserve=0.10,
    memory_options=("recompute",),
    sources=("Dao-AILab/flash-attention flash_attn/losses/cross_entropy.py, flash_attn/modules/mha.py",
             "Dao-AILab/flash-attention flash_attn/ops/fused_dense.py (FusedDenseFunc casts the weight under "
             "autocast and saves the cast for the backward), training/Dockerfile (pytorch-lightning 1.8.6), "
             "training/configs/experiment/pile/base.yaml (precision: bf16)",
             "Dao-AILab/flash-attention training/configs/experiment/pile/gpt3s-flash.yaml, owt/gpt2s-flash.yaml "
             "(residual_in_fp32, fused_dropout_add_ln), training/configs/model/gpt2.yaml (transformers GPT2Config: "
             "dropout 0.1), at 0251105a (settings only)"),
)
