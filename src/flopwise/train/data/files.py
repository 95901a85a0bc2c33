"""Offline shard building: `prepare_file_data` turns a file corpus into cached token shards once.

resolve inputs -> tokenizer (trained or loaded) -> uint16/uint32 shards with a held-out
validation split, all cached under `cache_dir/<content-hash>/` and published with an atomic
rename, so rank 0 builds and every other rank (or a second run) just loads. The runtime side,
which serves the shards to each rank, is `train/data/loader.py: TokenLoader`.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from flopwise.errors import UserError
from flopwise.config.schema import DataConfig
from flopwise.train.data.corpus import (
    InputFile,
    Piece,
    open_token_file,
    read_pieces,
    resolve_inputs,
    total_input_bytes,
)
from flopwise.train.data.shards import (
    ShardWriter,
    new_staging_dir,
    open_shard,
    publish,
    shards_sha256,
    token_dtype_for,
)
from flopwise.train.data.tokenizer import end_of_text_id, load_tokenizer, tokenizer_files, train_bpe

CACHE_VERSION = 1
META_FILE = "meta.json"
TOKENIZER_FILE = "tokenizer.json"
ENCODE_BATCH_CHARS = 4 << 20  # text handed to one `encode_batch` call
TOKEN_COPY_CHUNK = 1 << 24  # ids copied per step from pre-tokenized files


@dataclass
class PreparedData:
    """A ready corpus: where its shards are and what the model needs to know about it."""

    path: Path  # the cache entry
    vocab_size: int  # the model must embed ids 0 .. vocab_size-1
    token_dtype: str
    train_shards: list[Path]
    val_shards: list[Path]
    train_tokens: int
    val_tokens: int
    tokenizer_path: Path | None
    tokenizer: Tokenizer | None
    eot_id: int | None
    input_files: int
    input_bytes: int
    truncated: bool  # max_bytes cut the corpus short
    cache_hit: bool  # loaded an existing entry instead of building it
    meta: dict = field(default_factory=dict, repr=False)

    def sha256(self, split: str) -> str:
        """The split's fingerprint: stored in meta.json when the entry was built (hashed here for older entries)."""
        stored = self.meta.setdefault("sha256", {})
        if split not in stored:
            stored[split] = shards_sha256(self.shards(split))
        return stored[split]

    def shards(self, split: str) -> list[Path]:
        """The shard files of 'train' or 'val'."""
        if split == "train":
            return self.train_shards
        if split == "val":
            return self.val_shards
        raise UserError(f"data split {split!r} is unknown; allowed: train, val")


def prepare_file_data(cfg: DataConfig) -> PreparedData:
    """Build (once) or load the token shards of `cfg.paths`; safe to call from several processes.

    `train/data/prepare.py: prepare_data` is the entry that also serves `datasets` sources.
    """
    inputs = resolve_inputs(list(cfg.paths), cfg.format)
    key = cache_key(inputs, cfg)
    cache_dir = Path(cfg.cache_dir).expanduser()
    entry = cache_dir / key
    if (entry / META_FILE).is_file():
        return _load_entry(entry, cache_hit=True)
    staging = new_staging_dir(cache_dir, key)
    try:
        if inputs[0].format == "tokens":
            meta = _build_from_tokens(inputs, cfg, staging)
        else:
            meta = _build_from_text(inputs, cfg, staging)
        meta.update(version=CACHE_VERSION, key=key, input_files=len(inputs))
        write_meta(staging, meta)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    built_here = publish(staging, entry)
    return _load_entry(entry, cache_hit=not built_here)


def cache_key(inputs: list[InputFile], cfg: DataConfig) -> str:
    """Hash of everything the shards depend on: input files (path, size, mtime), format, tokenizer settings, split."""
    is_tokens = inputs[0].format == "tokens"
    files = []
    for item in inputs:
        stat = item.path.stat()
        files.append([str(item.path.resolve()), item.format, stat.st_size, stat.st_mtime_ns])
    settings = {
        "version": CACHE_VERSION,
        "files": files,
        "val_fraction": cfg.val_fraction,
        "max_bytes": cfg.max_bytes,
        "vocab_size": cfg.vocab_size,
    }
    if is_tokens:
        settings["token_dtype"] = cfg.token_dtype
    else:
        settings["text_field"] = cfg.text_field
        if cfg.tokenizer is not None:
            settings["tokenizer_sha256"] = shards_sha256(tokenizer_files(cfg.tokenizer))
        else:
            settings["tokenizer_train_bytes"] = cfg.tokenizer_train_bytes
    blob = json.dumps(settings, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:20]


def is_val_document(doc_index: int, val_fraction: float) -> bool:
    """Every k-th document (k = round(1/val_fraction)) is held out: deterministic, spread over the corpus."""
    k = max(2, round(1.0 / val_fraction))
    return doc_index % k == k - 1


class CappedPieces:
    """The corpus's text pieces, stopped after `max_bytes` of UTF-8; records what it read."""

    def __init__(self, inputs: list[InputFile], text_field: str, max_bytes: int | None):
        self.inputs = inputs
        self.text_field = text_field
        self.max_bytes = max_bytes
        self.bytes_read = 0
        self.truncated = False

    def __iter__(self) -> Iterator[Piece]:
        for piece in read_pieces(self.inputs, self.text_field):
            size = len(piece.text.encode("utf-8"))
            if self.max_bytes is not None and self.bytes_read + size > self.max_bytes:
                room = self.max_bytes - self.bytes_read
                text = piece.text.encode("utf-8")[:room].decode("utf-8", errors="ignore")
                self.bytes_read += len(text.encode("utf-8"))
                self.truncated = True
                yield Piece(piece.doc_index, text, True)
                return
            self.bytes_read += size
            yield piece


def tokenizer_sample(inputs: list[InputFile], cfg: DataConfig) -> Iterator[str]:
    """Training documents spread evenly over the corpus, about `tokenizer_train_bytes` in all."""
    available = total_input_bytes(inputs)
    if cfg.max_bytes is not None:
        available = min(available, cfg.max_bytes)
    stride = max(1, -(-available // cfg.tokenizer_train_bytes))
    taken = 0
    for piece in CappedPieces(inputs, cfg.text_field, cfg.max_bytes):
        if piece.doc_index % stride or is_val_document(piece.doc_index, cfg.val_fraction):
            continue
        yield piece.text
        taken += len(piece.text)
        if taken >= cfg.tokenizer_train_bytes:
            return


def _build_from_text(inputs: list[InputFile], cfg: DataConfig, staging: Path) -> dict:
    return build_text_shards(lambda: CappedPieces(inputs, cfg.text_field, cfg.max_bytes),
                             lambda: tokenizer_sample(inputs, cfg), cfg, staging, _describe(inputs))


def build_text_shards(read, sample, cfg: DataConfig, staging: Path, what: str) -> dict:
    """Tokenize the documents `read()` yields (Pieces; `.bytes_read`, `.truncated`) into train/val
    shards in `staging`; `sample()` gives the texts a new BPE learns from. Returns the entry's meta."""
    if cfg.tokenizer is not None:
        tokenizer = load_tokenizer(cfg.tokenizer)
        source = str(cfg.tokenizer)
    else:  # never for a pretrained model: the config points data.tokenizer at its folder
        tokenizer = train_bpe(sample(), cfg.vocab_size)
        source = "the trained tokenizer"
    eot = end_of_text_id(tokenizer, source)
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    dtype = token_dtype_for(vocab_size)
    tokenizer.save(str(staging / TOKENIZER_FILE))

    writers = {"train": ShardWriter(staging, "train", dtype), "val": ShardWriter(staging, "val", dtype)}
    documents = {"train": 0, "val": 0}
    pieces = read()
    batch: list[Piece] = []
    batch_chars = 0
    for piece in pieces:
        batch.append(piece)
        batch_chars += len(piece.text)
        if batch_chars >= ENCODE_BATCH_CHARS:
            _encode_into(batch, tokenizer, eot, cfg.val_fraction, writers, documents)
            batch, batch_chars = [], 0
    _encode_into(batch, tokenizer, eot, cfg.val_fraction, writers, documents)
    train_paths, val_paths = writers["train"].close(), writers["val"].close()
    if writers["train"].tokens + writers["val"].tokens == 0:
        raise UserError(f"the corpus ({what}) holds no text")
    if writers["val"].tokens == 0:
        # Too few documents to hold one out: take the tail of the token stream instead.
        val_paths = _split_tail(train_paths, staging, dtype, cfg.val_fraction)
    return {
        "vocab_size": vocab_size,
        "token_dtype": dtype.name,
        "train_shards": [p.name for p in train_paths],
        "val_shards": [p.name for p in val_paths],
        "tokenizer": TOKENIZER_FILE,
        "eot_id": eot,
        "documents": documents,
        "input_bytes": pieces.bytes_read,
        "truncated": pieces.truncated,
    }


def _encode_into(batch, tokenizer, eot, val_fraction, writers, documents) -> None:
    if not batch:
        return
    encodings = tokenizer.encode_batch([p.text for p in batch], add_special_tokens=False)
    parts: dict[str, list[np.ndarray]] = {"train": [], "val": []}
    for piece, encoding in zip(batch, encodings):
        split = "val" if is_val_document(piece.doc_index, val_fraction) else "train"
        parts[split].append(np.asarray(encoding.ids, dtype=np.uint32))
        if piece.last:
            parts[split].append(np.asarray([eot], dtype=np.uint32))
            documents[split] += 1
    for split, arrays in parts.items():
        if arrays:
            writers[split].write(np.concatenate(arrays))


def _split_tail(train_paths: list[Path], staging: Path, dtype: np.dtype, val_fraction: float) -> list[Path]:
    last = train_paths[-1]
    tokens = open_shard(last, dtype.name)
    count = len(tokens)
    tail = min(count - 1, max(1, round(sum(_shard_len(p, dtype) for p in train_paths) * val_fraction)))
    if tail <= 0:
        return []
    writer = ShardWriter(staging, "val", dtype)
    writer.write(np.array(tokens[count - tail :]))
    del tokens
    with open(last, "r+b") as handle:
        handle.truncate((count - tail) * dtype.itemsize)
    return writer.close()


def _shard_len(path: Path, dtype: np.dtype) -> int:
    return path.stat().st_size // dtype.itemsize


def _build_from_tokens(inputs: list[InputFile], cfg: DataConfig, staging: Path) -> dict:
    arrays = [(item.path, open_token_file(item.path, cfg.token_dtype)) for item in inputs]
    for path, array in arrays:
        _check_ids(path, array, cfg.vocab_size)
    available = sum(len(a) for _, a in arrays)
    if cfg.max_bytes is not None:
        arrays = _cap_token_arrays(arrays, cfg.max_bytes)
    total = sum(len(a) for _, a in arrays)
    if total == 0:
        raise UserError(f"the token files ({_describe(inputs)}) hold no tokens")
    dtype = token_dtype_for(cfg.vocab_size)
    val_tokens = max(1, round(total * cfg.val_fraction)) if total > 1 else 0
    cut = total - val_tokens
    writers = {"train": ShardWriter(staging, "train", dtype), "val": ShardWriter(staging, "val", dtype)}
    offset = 0
    for _, array in arrays:
        for start in range(0, len(array), TOKEN_COPY_CHUNK):
            chunk = np.asarray(array[start : start + TOKEN_COPY_CHUNK])
            here = offset + start
            split_at = min(max(cut - here, 0), len(chunk))
            writers["train"].write(chunk[:split_at])
            writers["val"].write(chunk[split_at:])
        offset += len(array)
    input_bytes = sum(a.nbytes for _, a in arrays)
    return {
        "vocab_size": cfg.vocab_size,
        "token_dtype": dtype.name,
        "train_shards": [p.name for p in writers["train"].close()],
        "val_shards": [p.name for p in writers["val"].close()],
        "tokenizer": None,
        "eot_id": None,
        "documents": None,
        "input_bytes": input_bytes,
        "truncated": total < available,
    }


def _check_ids(path: Path, array: np.ndarray, vocab_size: int) -> None:
    top = -1
    for start in range(0, len(array), TOKEN_COPY_CHUNK):
        top = max(top, int(np.asarray(array[start : start + TOKEN_COPY_CHUNK]).max()))
    if top >= vocab_size:
        raise UserError(
            f"{path} holds token id {top}, but data.vocab_size is {vocab_size}; "
            f"set data.vocab_size to at least {top + 1}"
        )


def _cap_token_arrays(arrays, max_bytes: int):
    capped, used = [], 0
    for path, array in arrays:
        room = (max_bytes - used) // array.dtype.itemsize
        if room <= 0:
            break
        part = array[:room]
        capped.append((path, part))
        used += part.nbytes
    return capped


def _load_entry(entry: Path, cache_hit: bool) -> PreparedData:
    meta = json.loads((entry / META_FILE).read_text())
    if meta.get("version") != CACHE_VERSION:
        raise UserError(f"{entry} was written by another flopwise version; delete it to rebuild")
    tokenizer_path = entry / meta["tokenizer"] if meta["tokenizer"] else None
    train_shards = [entry / name for name in meta["train_shards"]]
    val_shards = [entry / name for name in meta["val_shards"]]
    itemsize = np.dtype(meta["token_dtype"]).itemsize
    return PreparedData(
        path=entry,
        vocab_size=meta["vocab_size"],
        token_dtype=meta["token_dtype"],
        train_shards=train_shards,
        val_shards=val_shards,
        train_tokens=sum(p.stat().st_size for p in train_shards) // itemsize,
        val_tokens=sum(p.stat().st_size for p in val_shards) // itemsize,
        tokenizer_path=tokenizer_path,
        tokenizer=Tokenizer.from_file(str(tokenizer_path)) if tokenizer_path else None,
        eot_id=meta["eot_id"],
        input_files=meta["input_files"],
        input_bytes=meta["input_bytes"],
        truncated=meta["truncated"],
        cache_hit=cache_hit,
        meta=meta,
    )


def _describe(inputs: list[InputFile]) -> str:
    first = inputs[0].path
    return str(first) if len(inputs) == 1 else f"{len(inputs)} files from {first}"


def write_meta(staging: Path, meta: dict) -> None:
    """meta.json of an entry being built, with each split's sha256, so a resume checks its data for free."""
    meta["sha256"] = {split: shards_sha256([staging / name for name in meta[f"{split}_shards"]])
                      for split in ("train", "val")}
    _write_json(staging / META_FILE, meta)


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True))
