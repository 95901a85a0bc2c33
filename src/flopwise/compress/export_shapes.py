"""Which input dimensions an exported compressed graph leaves free.

The batch is always dynamic. For a language model (integer token ids [B, T]) the sequence
length is dynamic too, bounded by the model's context (`max_seq_len` of the built-in decoder,
`max_position_embeddings` of an HF model) when it is known, so one `.pt2` serves every
prompt length instead of failing a shape guard away from the calibration length.
"""

from __future__ import annotations

import torch
from torch import nn

MIN_SEQ_LEN = 2  # torch.export specializes sizes 0 and 1; any real prompt is longer


def max_sequence_length(model: nn.Module) -> int | None:
    """The longest sequence the model accepts, if it says (built-in decoder or HF config)."""
    cfg = getattr(model, "cfg", None)
    if cfg is not None and getattr(cfg, "max_seq_len", None):
        return int(cfg.max_seq_len)
    hf = getattr(model, "hf", None)
    length = getattr(getattr(hf, "config", None), "max_position_embeddings", None)
    return int(length) if length else None


def dynamic_shapes(example: torch.Tensor, max_len: int | None = None) -> tuple[dict]:
    """`dynamic_shapes` for `torch.export.export(model, (example,), ...)`."""
    shapes = {0: torch.export.Dim.DYNAMIC}
    if example.dim() == 2 and not example.is_floating_point():
        if max_len is not None and max_len > MIN_SEQ_LEN:
            shapes[1] = torch.export.Dim("seq_len", min=MIN_SEQ_LEN, max=max_len)
        else:
            shapes[1] = torch.export.Dim.DYNAMIC
    return (shapes,)
