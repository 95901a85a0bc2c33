"""The seed's "8-bit activation compression": keep tensors saved for backward as int8.

Autograd keeps each layer's inputs/outputs until the backward pass; those activations
dominate training memory at long sequences. Storing them as int8 with an absmax scale
(per row of the last dimension, or per tensor) and dequantising in backward cuts their
bytes ~4x for fp32 and ~2x for bf16/fp16, at the price of a small gradient error
(compressed-activation training: Chakrabarti & Moseley 2019, "Backprop with Approximate
Activations", arXiv:1901.07988; Chen et al. 2021, "ActNN", arXiv:2104.14129 — both 2-8 bit).
The seed claims 50% memory saving with <1% accuracy loss on BERT-large; that figure is
the seed's and is not asserted here (50% matches int8 vs 16-bit activations only).

Left alone: integer/bool tensors, tensors under `min_numel` elements (the scale would
cost more than it saves), and parameters or plain casts/views of them (autocast's 16-bit
weight copies, `weight.t()`): those are weights, not activations, and compressing them
would perturb every input gradient while freeing nothing.

Inside activation-checkpointed blocks nothing is saved (PyTorch's checkpoint hooks are
innermost), so the two compose: int8 applies to what checkpointing still stores.
Non-finite values stay non-finite after the round trip (the row's scale is inf/nan), so an
fp16 overflow still reaches the gradients and the loss scaler still skips the step.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

INT8_MAX = 127
DEFAULT_MIN_NUMEL = 4096
# Autograd nodes that only view or cast their input: a tensor reached from a parameter
# through these alone is a weight, not an activation.
WEIGHT_TRANSFORMS = {
    "ToCopyBackward0", "TBackward0", "ViewBackward0", "PermuteBackward0", "TransposeBackward0",
    "ExpandBackward0", "UnsqueezeBackward0", "SqueezeBackward0", "SqueezeBackward1",
    "ReshapeAliasBackward0", "UnsafeViewBackward0",
}
MAX_TRANSFORM_DEPTH = 4


@dataclass
class CompressionStats:
    """Activation bytes autograd would have kept vs bytes kept inside the context (weights excluded)."""

    tensors_seen: int = 0
    tensors_compressed: int = 0
    original_bytes: int = 0
    stored_bytes: int = 0

    @property
    def ratio(self) -> float:
        """original / stored; 1.0 when nothing was saved."""
        return self.original_bytes / self.stored_bytes if self.stored_bytes else 1.0


class Int8Tensor(NamedTuple):
    """A saved tensor as int8 values, their fp32 scales and what is needed to restore it.

    A tuple, so generic saved-tensor meters that count the tensors inside a packed
    object (`train/metrics.py`) see exactly the bytes held.
    """

    values: torch.Tensor
    scales: torch.Tensor
    shape: torch.Size
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        """Bytes actually held: the int8 values plus the fp32 scales."""
        return self.values.numel() * self.values.element_size() + self.scales.numel() * self.scales.element_size()


def is_weight(tensor: torch.Tensor) -> bool:
    """True for parameters and for tensors that are only views/casts of one parameter."""
    if tensor.is_leaf:
        return isinstance(tensor, nn.Parameter)
    node = tensor.grad_fn
    for _ in range(MAX_TRANSFORM_DEPTH):
        if node is None:
            return False
        if type(node).__name__ == "AccumulateGrad":
            return isinstance(node.variable, nn.Parameter)
        if node.name() not in WEIGHT_TRANSFORMS:
            return False
        parents = [parent for parent, _ in node.next_functions if parent is not None]
        if len(parents) != 1:
            return False
        node = parents[0]
    return False


def quantize_int8(tensor: torch.Tensor, per_row: bool = True) -> Int8Tensor:
    """Symmetric absmax int8: q = round(x / s), s = max|x| / 127, per row of the last dim or per tensor."""
    x = tensor.detach().float()
    rows = x.reshape(-1, x.shape[-1]) if per_row and x.dim() > 0 else x.reshape(1, -1)
    scales = rows.abs().amax(dim=1, keepdim=True) / INT8_MAX
    safe = torch.where(scales == 0, torch.ones_like(scales), scales)
    values = torch.round(rows / safe).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return Int8Tensor(values, scales, tensor.shape, tensor.dtype)


def dequantize_int8(packed: Int8Tensor) -> torch.Tensor:
    """The saved tensor back in its dtype and shape (contiguous)."""
    return (packed.values.float() * packed.scales).to(packed.dtype).reshape(packed.shape)


def pack_int8(tensor: torch.Tensor, min_numel: int = DEFAULT_MIN_NUMEL, per_row: bool = True):
    """saved_tensors_hooks pack: an `Int8Tensor` for large floating activations, else the tensor itself."""
    if not tensor.is_floating_point() or tensor.numel() < min_numel or is_weight(tensor):
        return tensor
    return quantize_int8(tensor, per_row)


def unpack_int8(saved):
    """saved_tensors_hooks unpack: the inverse of `pack_int8`."""
    return dequantize_int8(saved) if isinstance(saved, Int8Tensor) else saved


@contextlib.contextmanager
def int8_saved_activations(min_numel: int = DEFAULT_MIN_NUMEL, per_row: bool = True):
    """Within this context, floating-point activations saved for backward are stored as int8.

    Wrap the forward pass (and loss); backward may run inside or after it. Yields a
    `CompressionStats` that counts what was compressed, for logging.
    """
    stats = CompressionStats()

    def pack(tensor: torch.Tensor):
        if is_weight(tensor):
            return tensor  # held by the model anyway: neither counted nor compressed
        packed = pack_int8(tensor, min_numel, per_row)
        stats.tensors_seen += 1
        stats.original_bytes += tensor.numel() * tensor.element_size()
        if isinstance(packed, Int8Tensor):
            stats.tensors_compressed += 1
            stats.stored_bytes += packed.nbytes
        else:
            stats.stored_bytes += tensor.numel() * tensor.element_size()
        return packed

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack_int8):
        yield stats


def activation_compression_context(mode: str, min_numel: int = DEFAULT_MIN_NUMEL):
    """The context for `training.activation_compression`: "int8" compresses, "none" does nothing."""
    if mode == "int8":
        return int8_saved_activations(min_numel=min_numel)
    return contextlib.nullcontext(CompressionStats())
