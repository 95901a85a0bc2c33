"""Packing several documents into one fixed-length row without letting them see each other.

Concatenating short conversations fills the row (no compute spent on padding), but plain
concatenation lets each token attend to the previous documents and predicts a document's
first token from the one before it. Here each row keeps, per token, the document it belongs
to (`segment_ids`) and its position inside that document (`position_ids`, restarting at 0);
targets across a boundary are IGNORE_INDEX, and `block_causal_mask` turns the segments into
the attention mask (causal within a document, nothing across), the "packing with
block-diagonal attention" of Krell et al. 2021, "Efficient Sequence Packing without
Cross-contamination". `attention_inputs` gives what a HuggingFace llama takes on CPU: a 4D
additive mask, accepted as-is by transformers 4.x and 5.x (eager and sdpa attention), and the
restarting position ids (rotary phases then match each document run alone). On GPUs the same
segments map to flash-attention's varlen `cu_seqlens`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from flopwise.train.data.chat import IGNORE_INDEX, ChatExample

PAD_SEGMENT = -1


@dataclass(frozen=True)
class PackedRow:
    """One training row: inputs, next-token targets, restarting positions and document ids."""

    input_ids: np.ndarray  # int64 [seq_len]
    targets: np.ndarray  # int64 [seq_len]: the label of the next token of the same document, else -100
    position_ids: np.ndarray  # int64 [seq_len]: 0.. within each document
    segment_ids: np.ndarray  # int64 [seq_len]: 0, 1, ... per document; PAD_SEGMENT for padding


def pack_examples(examples: Iterable[ChatExample], seq_len: int, pad_id: int = 0) -> Iterator[PackedRow]:
    """Fill rows of `seq_len` tokens with whole documents, first fit in arrival order.

    A document longer than a row is cut to `seq_len` tokens (its tail is lost, never spilled
    into the next row, where it would start mid-sentence at position 0). A document that does
    not fit in the rest of the current row starts the next one; the rest is padding.
    """
    pending: list[ChatExample] = []
    used = 0
    for example in examples:
        if not example.input_ids:
            continue
        if len(example.input_ids) > seq_len:
            example = ChatExample(example.input_ids[:seq_len], example.labels[:seq_len])
        if used + len(example.input_ids) > seq_len:
            yield _row(pending, seq_len, pad_id)
            pending, used = [], 0
        pending.append(example)
        used += len(example.input_ids)
    if pending:
        yield _row(pending, seq_len, pad_id)


def _row(documents: list[ChatExample], seq_len: int, pad_id: int) -> PackedRow:
    input_ids = np.full(seq_len, pad_id, dtype=np.int64)
    targets = np.full(seq_len, IGNORE_INDEX, dtype=np.int64)
    positions = np.zeros(seq_len, dtype=np.int64)
    segments = np.full(seq_len, PAD_SEGMENT, dtype=np.int64)
    start = 0
    for number, doc in enumerate(documents):
        n = len(doc.input_ids)
        input_ids[start:start + n] = doc.input_ids
        # token t predicts token t+1 of the same document; the document's last token predicts nothing
        targets[start:start + n - 1] = doc.labels[1:]
        positions[start:start + n] = np.arange(n)
        segments[start:start + n] = number
        start += n
    return PackedRow(input_ids, targets, positions, segments)


def block_causal_mask(segment_ids):
    """Boolean [batch, 1, T, T]: query i sees key j when both are in the same document and j <= i.

    Padding tokens see themselves only, so no row of the mask is empty (an all-masked row
    turns softmax into NaN).
    """
    import torch

    segments = torch.as_tensor(segment_ids)
    if segments.dim() == 1:
        segments = segments.unsqueeze(0)
    length = segments.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=segments.device).tril()
    same = segments.unsqueeze(-1) == segments.unsqueeze(-2)
    eye = torch.eye(length, dtype=torch.bool, device=segments.device)
    return ((same & causal) | eye).unsqueeze(1)


def attention_inputs(segment_ids, position_ids, dtype=None) -> dict:
    """`attention_mask` (4D additive: 0 to attend, the dtype's minimum to block) and `position_ids`
    for a HuggingFace causal LM's forward."""
    import torch

    dtype = dtype or torch.float32
    allowed = block_causal_mask(segment_ids)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    positions = torch.as_tensor(position_ids)
    if positions.dim() == 1:
        positions = positions.unsqueeze(0)
    return {"attention_mask": mask, "position_ids": positions}


def cu_seqlens(segment_ids) -> np.ndarray:
    """Cumulative document lengths of one row (flash-attention varlen's `cu_seqlens`), padding excluded."""
    segments = np.asarray(segment_ids)
    segments = segments[segments != PAD_SEGMENT]
    if segments.size == 0:
        return np.zeros(1, dtype=np.int32)
    boundaries = np.flatnonzero(np.diff(segments)) + 1
    return np.concatenate([[0], boundaries, [segments.size]]).astype(np.int32)
