"""Numerics: autocast, loss scaling, fp32 norms and the FSDP2 mixed-precision policy.

Modes (`precision.mode`; the helpers here take the run's resolved `Precision`,
`config/precision.py`, never the mode string):

- `fp32`: everything fp32.
- `bf16` / `fp16`: fp32 parameters, matmuls under `torch.autocast` (Micikevicius et al.
  2018, "Mixed Precision Training", arXiv:1710.03740). `fp16` adds dynamic loss scaling.
- `bf16-params` / `fp16-params`: as above, and FSDP2 also keeps the unsharded (compute)
  parameters in 16 bits while the sharded master copy, the optimizer and the gradient
  reduction stay fp32 (`MixedPrecisionPolicy`). Without FSDP2 these behave like the plain
  autocast modes.
- `bf16-true`: the model itself is cast to bf16 (`apply_pure_bf16`): parameters, gradients,
  gradient reduction and optimizer states are bf16, with no fp32 master copy. Half the bytes
  per parameter of fp32 AdamW without a master copy (2 + 2 + 4 instead of 4 + 4 + 8), at the
  price of updates below bf16's resolution being rounded away (see `PURE_BF16_TRADE_OFF`).

Norms are numerically touchy in 16 bits (the seed's `MixedPrecisionLayerNorm`), so
`apply_fp32_norm` makes each one compute in fp32. Decision: the norm returns the dtype it
was given. Under plain `bf16`/`fp16` autocast the built-in model's residual stream is
fp32 (embeddings are fp32 and fp32 + bf16 promotes), so norm outputs stay fp32 and
autocast casts them for the next matmul; under `*-params` the residual stream is 16-bit
and a 16-bit output is what the next (16-bit) matmul needs, so no dtype error can arise.
"""

from __future__ import annotations

import contextlib
import types

import torch
import torch.nn.functional as F
from torch import nn

from flopwise.config.precision import Precision
from flopwise.config.schema import PrecisionConfig

NORM_NAME_MARKERS = ("layernorm", "rmsnorm")


TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def compute_dtype(precision: Precision) -> torch.dtype:
    """The torch dtype matmuls run in."""
    return TORCH_DTYPES[precision.compute_dtype]


def autocast_context(precision: Precision, device_type: str):
    """The context the forward pass (and loss) runs in: nothing for fp32, else torch.autocast."""
    dtype = compute_dtype(precision)
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=dtype)


def make_grad_scaler(precision: Precision, settings: PrecisionConfig, device_type: str) -> torch.amp.GradScaler | None:
    """Dynamic loss scaler for fp16 modes (None otherwise); `settings` gives its starting scale and growth interval.

    Doubles the scale after `growth_interval` clean steps and halves it (skipping the
    step) on inf/nan gradients (Micikevicius et al. 2018, sec. 3.2). The plain
    `torch.amp.GradScaler` works for DDP and FSDP2: with FSDP2 the gradients are DTensors
    and DTensor's dispatch all-reduces the found-inf flag across the mesh, so every rank
    skips together (FSDP1's `ShardedGradScaler` is not needed). Gradients must be fp32,
    which holds here: parameters (FSDP2: the sharded ones) are always fp32.
    """
    if not precision.loss_scaling:  # fp16's 5-bit exponent underflows small gradients; bf16 has fp32's range
        return None
    return torch.amp.GradScaler(
        device_type,
        init_scale=settings.initial_scale,
        growth_factor=2.0,
        backoff_factor=0.5,
        growth_interval=settings.growth_interval,
    )


PURE_BF16_TRADE_OFF = (
    "precision bf16-true: parameters, gradients and optimizer states are bf16 with no fp32 master copy; "
    "an update smaller than about 0.4 % of a weight (half of bf16's 2^-7 spacing, 8 significant bits) "
    "is rounded away. Fine for short fine-tunes (torchtune's and litgpt's default), risky for pre-training "
    "(use bf16 or bf16-params there)"
)


def apply_pure_bf16(model: nn.Module) -> int:
    """Cast every floating-point parameter of `model` to bf16 (`bf16-true`); returns how many were cast.

    Buffers (rotary tables) stay fp32: they are computed, not learned, and the forward still runs
    under bf16 autocast, which casts what meets a matmul. Quantised weights (NF4) are left alone."""
    cast = 0
    for module in model.modules():
        for _, param in module.named_parameters(recurse=False):
            if param.dtype.is_floating_point and type(param.data) is torch.Tensor and param.dtype != torch.bfloat16:
                param.data = param.data.to(torch.bfloat16)
                cast += 1
    return cast


def pretrained_precision_default(cfg, device: torch.device) -> str | None:
    """`config.finetune_defaults.pretrained_precision_default` on this device: bf16 on a CUDA GPU with bf16,
    fp32 kept on a CPU (measure/bf16_on_cpu.py: its bf16 matmuls are emulated)."""
    from flopwise.config.finetune_defaults import pretrained_precision_default as rule

    bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    return rule(cfg, bf16, "this GPU")


def frozen_base_dtype(precision: Precision) -> torch.dtype:
    """The dtype a frozen (LoRA/QLoRA) base is held in: the compute dtype. It gets no gradient and no
    optimizer state, so no fp32 master copy is needed (as in QLoRA, sec. 3, and torchtune)."""
    return compute_dtype(precision)


def fsdp_mixed_precision_policy(precision: Precision):
    """FSDP2 policy: 16-bit compute parameters for `*-params`, fp32 gradient reduction; None otherwise."""
    if precision.param_dtype == "fp32" or precision.pure:  # pure bf16: the parameters already are
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=TORCH_DTYPES[precision.param_dtype], reduce_dtype=torch.float32)


def fp32_layer_norm_forward(self: nn.LayerNorm, input: torch.Tensor) -> torch.Tensor:
    """The seed's MixedPrecisionLayerNorm: F.layer_norm on fp32 input and weights, cast back."""
    with torch.autocast(device_type=input.device.type, enabled=False):
        out = F.layer_norm(
            input.float(),
            self.normalized_shape,
            self.weight.float() if self.weight is not None else None,
            self.bias.float() if self.bias is not None else None,
            self.eps,
        )
    return out.to(input.dtype)


def fp32_rms_norm_forward(self: nn.RMSNorm, input: torch.Tensor) -> torch.Tensor:
    """RMSNorm (Zhang & Sennrich 2019) on fp32 input and weight, cast back to the input dtype."""
    with torch.autocast(device_type=input.device.type, enabled=False):
        out = F.rms_norm(
            input.float(),
            self.normalized_shape,
            self.weight.float() if self.weight is not None else None,
            self.eps,
        )
    return out.to(input.dtype)


def fp32_wrapped_forward(original):
    """For norms of other libraries (HF's LlamaRMSNorm, ...): run their own forward on fp32 input.

    Their weights may be 16-bit (FSDP2 `*-params`); multiplying them with the fp32 input
    promotes to fp32, so the arithmetic is fp32 whatever the weight dtype.
    """

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        with torch.autocast(device_type=hidden_states.device.type, enabled=False):
            out = original(self, hidden_states.float(), *args, **kwargs)
        return out.to(hidden_states.dtype)

    return forward


def is_norm(module: nn.Module) -> bool:
    """LayerNorm / RMSNorm of torch or of any library (matched by class name, e.g. LlamaRMSNorm)."""
    if isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
        return True
    name = type(module).__name__.lower()
    is_leaf = next(module.children(), None) is None  # not a block that merely has "Norm" in its name
    return is_leaf and any(marker in name for marker in NORM_NAME_MARKERS)


def apply_fp32_norm(model: nn.Module) -> int:
    """Make every LayerNorm/RMSNorm in `model` compute in fp32; returns how many were changed.

    Idempotent. Only the forward changes (per instance), so parameters, state_dict keys
    and checkpoints are untouched; apply it before FSDP2 / activation checkpointing.
    """
    changed = 0
    for module in model.modules():
        if not is_norm(module) or getattr(module, "fp32_norm", False):
            continue
        if type(module) is nn.LayerNorm:
            forward = fp32_layer_norm_forward
        elif type(module) is nn.RMSNorm:
            forward = fp32_rms_norm_forward
        else:
            forward = fp32_wrapped_forward(type(module).forward)
        module.forward = types.MethodType(forward, module)
        module.fp32_norm = True
        changed += 1
    return changed
