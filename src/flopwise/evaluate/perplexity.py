"""Perplexity of a causal LM on local text: exp(mean negative log-likelihood per predicted token).

The documents (text or JSONL files, read as `flopwise train` reads them) are tokenized, joined
with the end-of-text token and cut into non-overlapping windows of `seq_len`; every token but
each window's first is predicted once. Non-overlapping windows give a slightly higher figure
than a sliding window (less context per token) at a fraction of the cost; the window is in the
result so figures are compared like for like.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

from flopwise.errors import UserError


@dataclass(frozen=True)
class Perplexity:
    files: list[str]
    seq_len: int
    tokens: int  # predicted tokens
    mean_nll: float
    perplexity: float

    def as_dict(self) -> dict:
        return asdict(self)


def corpus_token_ids(files: list[str], tokenizer, text_field: str = "text", max_tokens: int | None = None) -> list[int]:
    """The files' documents as one token stream, documents separated by the tokenizer's end-of-text id."""
    from flopwise.train.data.corpus import read_pieces, resolve_inputs

    if not files:
        raise UserError("eval --data: name at least one text or JSONL file")
    import glob

    for name in files:
        if not glob.has_magic(str(name)) and not Path(name).expanduser().exists():
            raise UserError(f"eval --data: {name} does not exist")
    inputs = resolve_inputs([str(f) for f in files], "auto")
    ids: list[int] = []
    document: list[str] = []
    separator = tokenizer.eos_token_id
    for piece in read_pieces(inputs, text_field):
        document.append(piece.text)
        if piece.last:
            ids.extend(tokenizer("".join(document), add_special_tokens=False)["input_ids"])
            if separator is not None:
                ids.append(separator)
            document = []
            if max_tokens is not None and len(ids) >= max_tokens:
                return ids[:max_tokens]
    return ids


def perplexity(model, tokenizer, files: list[str], seq_len: int = 512, batch_size: int = 4,
               max_tokens: int | None = None, text_field: str = "text") -> Perplexity:
    """Perplexity of `model` on `files`, windows of `seq_len` tokens."""
    import torch

    if seq_len < 2:
        raise UserError(f"eval --seq-len: {seq_len} is below 2")
    ids = corpus_token_ids(files, tokenizer, text_field, max_tokens)
    windows = [ids[i:i + seq_len] for i in range(0, len(ids), seq_len)]
    windows = [w for w in windows if len(w) >= 2]
    if not windows:
        raise UserError(f"eval --data: {', '.join(map(str, files))} hold fewer than 2 tokens")
    device = next(model.parameters()).device
    total_nll, predicted = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(windows), batch_size):
            batch = windows[start:start + batch_size]
            width = max(len(w) for w in batch)
            inputs = torch.zeros(len(batch), width, dtype=torch.long)
            targets = torch.full((len(batch), width), -100, dtype=torch.long)
            mask = torch.zeros(len(batch), width, dtype=torch.long)
            for row, window in enumerate(batch):
                inputs[row, :len(window)] = torch.tensor(window)
                targets[row, :len(window) - 1] = torch.tensor(window[1:])
                mask[row, :len(window)] = 1
            logits = model(input_ids=inputs.to(device), attention_mask=mask.to(device)).logits.float()
            nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.to(device).flatten(),
                                                    ignore_index=-100, reduction="sum")
            total_nll += float(nll)
            predicted += int((targets != -100).sum())
    mean = total_nll / predicted
    return Perplexity([str(Path(f)) for f in files], seq_len, predicted, mean, math.exp(mean))
