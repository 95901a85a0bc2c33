"""From a `data:` config with `mix` to packed chat rows: read, encode, mix by weight, pack.

`prepare_chat_data` is what the trainer calls (through `prepare.prepare_data`): every k-th
conversation of each file is held out (the same rule as the text corpus,
`files.is_val_document`), the rest are mixed by weight into one epoch of training rows,
and the held-out ones are packed in file order into the validation rows. Everything is
deterministic, so every rank builds the same rows and a resume finds them again.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from flopwise.config.schema import DataConfig
from flopwise.errors import UserError
from flopwise.train.data.chat import ChatEncoder, IGNORE_INDEX, load_chat_tokenizer, read_chat_records
from flopwise.train.data.files import TOKENIZER_FILE, is_val_document
from flopwise.train.data.mixing import mix
from flopwise.train.data.packing import PackedRow, pack_examples


def chat_rows(cfg: DataConfig, tokenizer_folder: Path | None, examples: int, seed: int = 0) -> list[PackedRow]:
    """`examples` conversations drawn from `cfg.mix` by weight, encoded with the tokenizer's chat
    template (labels per `cfg.loss_on`) and packed into rows of `cfg.seq_len` tokens."""
    tokenizer = _tokenizer(cfg, tokenizer_folder)
    encoder = ChatEncoder(tokenizer, loss_on=cfg.loss_on)
    datasets = [[encoder.encode(messages) for messages in read_chat_records(source.path)] for source in cfg.mix]
    chosen = mix(datasets, [source.weight for source in cfg.mix], examples, seed=seed)
    return list(pack_examples(chosen, cfg.seq_len, pad_id=_pad_id(tokenizer)))


@dataclass
class PreparedChat:
    """Chat data ready for `chat_loader.ChatLoader`: packed train and validation rows."""

    train_rows: list[PackedRow]
    val_rows: list[PackedRow]
    vocab_size: int
    tokenizer_path: Path | None
    train_tokens: int  # labelled (trained-on) tokens of one epoch of rows
    val_tokens: int
    meta: dict = field(default_factory=dict, repr=False)

    def rows(self, split: str) -> list[PackedRow]:
        """The packed rows of 'train' or 'val'."""
        if split == "train":
            return self.train_rows
        if split == "val":
            return self.val_rows
        raise UserError(f"data split {split!r} is unknown; allowed: train, val")

    def sha256(self, split: str) -> str:
        """The split's fingerprint (inputs, targets, positions, documents), so a resume on other data is refused."""
        stored = self.meta.setdefault("sha256", {})
        if split not in stored:
            digest = hashlib.sha256()
            for row in self.rows(split):
                for array in (row.input_ids, row.targets, row.position_ids, row.segment_ids):
                    digest.update(np.ascontiguousarray(array, dtype=np.int64).tobytes())
            stored[split] = digest.hexdigest()
        return stored[split]


def prepare_chat_data(cfg: DataConfig, tokenizer_folder: Path | None = None) -> PreparedChat:
    """Encode, split, mix and pack `cfg.mix` (one epoch = as many draws as there are training conversations)."""
    tokenizer = _tokenizer(cfg, tokenizer_folder)
    encoder = ChatEncoder(tokenizer, loss_on=cfg.loss_on)
    train_sets, val_docs = [], []
    for source in cfg.mix:
        train, val = [], []
        for index, messages in enumerate(read_chat_records(source.path)):
            (val if is_val_document(index, cfg.val_fraction) else train).append(encoder.encode(messages))
        if not train:
            raise UserError(f"data.mix: {source.path} has no conversations left for training "
                            "(add conversations or lower data.val_fraction)")
        train_sets.append(train)
        val_docs.extend(val)
    if not val_docs:
        k = max(2, round(1.0 / cfg.val_fraction))
        raise UserError(f"data.mix: no conversation is held out for validation (every {k}-th one is); "
                        "add conversations or raise data.val_fraction")
    draws = sum(len(train) for train in train_sets)
    chosen = mix(train_sets, [source.weight for source in cfg.mix], draws, seed=0)
    pad = _pad_id(tokenizer)
    train_rows = list(pack_examples(chosen, cfg.seq_len, pad_id=pad))
    val_rows = list(pack_examples(val_docs, cfg.seq_len, pad_id=pad))
    folder = Path(tokenizer_folder or cfg.tokenizer).expanduser()
    folder = folder.parent if folder.is_file() else folder
    tokenizer_file = folder / TOKENIZER_FILE
    return PreparedChat(
        train_rows=train_rows, val_rows=val_rows, vocab_size=len(tokenizer),
        tokenizer_path=tokenizer_file if tokenizer_file.is_file() else None,
        train_tokens=_labelled(train_rows), val_tokens=_labelled(val_rows),
    )


def _labelled(rows: list[PackedRow]) -> int:
    return int(sum(int((row.targets != IGNORE_INDEX).sum()) for row in rows))


def _tokenizer(cfg: DataConfig, tokenizer_folder: Path | None):
    if not cfg.mix:
        raise UserError("data.mix: name at least one chat JSONL file ({path, weight})")
    folder = tokenizer_folder or cfg.tokenizer
    if folder is None:
        raise UserError("data.mix: chat data needs the model's tokenizer (set model.pretrained or data.tokenizer)")
    return load_chat_tokenizer(Path(folder))


def _pad_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
