"""HuggingFace `datasets` sources in: `data.hf_dataset`, tokenised into the trainer's cached shards.

Sources that work offline: local json/jsonl, csv, parquet and text files (one file or a
folder of them), and a folder written by `Dataset.save_to_disk`; any of them can be read
streaming (`data.hf_dataset.streaming: true`: records are read lazily, nothing is copied
into an Arrow cache). Each record is one document: its `text_field`, or its
`messages_field` (a list of {role, content}) rendered with the tokenizer's chat template.

The documents go through the same tokenizer and shard writer as plain text files
(`data.build_text_shards`), under a cache key that hashes the source files and every
setting, so the token stream, the held-out split and exact resume behave as for any corpus.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

from flopwise.errors import UserError
from flopwise.config.schema import DataConfig, HFDatasetConfig
from flopwise.train.data.corpus import Piece
from flopwise.train.data.shards import new_staging_dir, publish

SUFFIX_FORMATS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text"}
SAVE_TO_DISK_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")
KEY_VERSION = 1


def prepare_hf_dataset(cfg: DataConfig):
    """Build (once) or load the shards of `cfg.hf_dataset`; same result type as `data.prepare_data`."""
    from flopwise.train.data.files import META_FILE, _load_entry, build_text_shards, write_meta

    source = cfg.hf_dataset
    fmt = source_format(source)
    key = cache_key(cfg, fmt)
    cache_dir = Path(cfg.cache_dir).expanduser()
    entry = cache_dir / key
    if (entry / META_FILE).is_file():
        return _load_entry(entry, cache_hit=True)
    chat = chat_renderer(cfg) if source.messages_field else None
    staging = new_staging_dir(cache_dir, key)
    try:
        meta = build_text_shards(
            lambda: DatasetPieces(cfg, fmt, chat),
            lambda: _sample_texts(DatasetPieces(cfg, fmt, chat), cfg),
            cfg, staging, str(source.path),
        )
        from flopwise.train.data.files import CACHE_VERSION

        meta.update(version=CACHE_VERSION, key=key, input_files=len(source_files(source.path, fmt)),
                    hf_dataset=source.model_dump(mode="json"))
        write_meta(staging, meta)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    built_here = publish(staging, entry)
    return _load_entry(entry, cache_hit=not built_here)


def source_format(source: HFDatasetConfig) -> str:
    """The `datasets` builder for the path: json, csv, parquet, text, or disk (save_to_disk)."""
    path = Path(source.path).expanduser()
    if not path.exists():
        raise UserError(f"data.hf_dataset.path: {path} does not exist")
    if source.format != "auto":
        return source.format
    if path.is_dir():
        if any((path / marker).is_file() for marker in SAVE_TO_DISK_MARKERS):
            return "disk"
        formats = {SUFFIX_FORMATS[f.suffix] for f in path.rglob("*") if f.suffix in SUFFIX_FORMATS}
        if len(formats) != 1:
            raise UserError(
                f"data.hf_dataset.path: {path} holds {'no' if not formats else 'mixed'} data files "
                f"({', '.join(sorted(SUFFIX_FORMATS))}); set data.hf_dataset.format"
            )
        return formats.pop()
    fmt = SUFFIX_FORMATS.get(path.suffix)
    if fmt is None:
        raise UserError(
            f"data.hf_dataset.path: cannot tell the format of {path.name} "
            f"(known suffixes: {', '.join(SUFFIX_FORMATS)}); set data.hf_dataset.format"
        )
    return fmt


def source_files(path: Path, fmt: str) -> list[Path]:
    """The files the source reads, sorted: the cache key hashes their size and mtime."""
    path = Path(path).expanduser()
    if path.is_file():
        return [path]
    if fmt == "disk":
        return sorted(f for f in path.rglob("*") if f.is_file())
    suffixes = [s for s, f in SUFFIX_FORMATS.items() if f == fmt]
    return sorted(f for f in path.rglob("*") if f.is_file() and f.suffix in suffixes)


def cache_key(cfg: DataConfig, fmt: str) -> str:
    """Hash of the source files (path, size, mtime), the hf_dataset settings and the tokenizer settings."""
    from flopwise.train.data.files import CACHE_VERSION
    from flopwise.train.data.shards import shards_sha256
    from flopwise.train.data.tokenizer import tokenizer_files

    files = [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in source_files(cfg.hf_dataset.path, fmt)]
    settings = {
        "version": CACHE_VERSION,
        "hf_dataset_version": KEY_VERSION,
        "source": cfg.hf_dataset.model_dump(mode="json", exclude={"streaming"}),  # streaming reads the same records
        "format": fmt,
        "files": files,
        "val_fraction": cfg.val_fraction,
        "max_bytes": cfg.max_bytes,
        "vocab_size": cfg.vocab_size,
    }
    if cfg.tokenizer is not None:
        settings["tokenizer_sha256"] = shards_sha256(tokenizer_files(cfg.tokenizer))
    else:
        settings["tokenizer_train_bytes"] = cfg.tokenizer_train_bytes
    return "hf-" + hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:20]


def load_records(source: HFDatasetConfig, fmt: str, cache_dir: Path):
    """The `datasets` Dataset (or IterableDataset when streaming) for one split, offline."""
    from flopwise.hf_logging import quiet_hf_libraries

    quiet_hf_libraries()
    import datasets

    datasets.disable_progress_bars()
    path = Path(source.path).expanduser()
    try:
        if fmt == "disk":
            loaded = datasets.load_from_disk(str(path))
            if isinstance(loaded, datasets.DatasetDict):
                if source.split not in loaded:
                    raise UserError(f"data.hf_dataset.split: {source.split!r} is not in {path} "
                                    f"(splits: {', '.join(loaded)})")
                loaded = loaded[source.split]
            return loaded.to_iterable_dataset() if source.streaming else loaded
        files = [str(f) for f in source_files(path, fmt)]
        return datasets.load_dataset(
            fmt, data_files={source.split: files}, split=source.split, streaming=source.streaming,
            cache_dir=str(Path(cache_dir).expanduser() / "hf-datasets"),
        )
    except UserError:
        raise
    except Exception as exc:  # datasets raises many kinds; the first line says what
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"data.hf_dataset: cannot read {path} as {fmt}: {first[:200]}") from None


class DatasetPieces:
    """The source's records as documents (one Piece each), capped by `data.max_bytes` and `max_records`.

    Records the bytes read and whether a cap cut the corpus short, as `data.CappedPieces` does.
    """

    def __init__(self, cfg: DataConfig, fmt: str, chat=None):
        self.cfg = cfg
        self.fmt = fmt
        self.chat = chat
        self.bytes_read = 0
        self.truncated = False

    def __iter__(self) -> Iterator[Piece]:
        source = self.cfg.hf_dataset
        records = load_records(source, self.fmt, self.cfg.cache_dir)
        cap = self.cfg.max_bytes
        for index, record in enumerate(records):
            if source.max_records is not None and index >= source.max_records:
                self.truncated = True
                return
            text = self._text_of(record, index)
            size = len(text.encode("utf-8"))
            if cap is not None and self.bytes_read + size > cap:
                text = text.encode("utf-8")[: cap - self.bytes_read].decode("utf-8", errors="ignore")
                self.bytes_read += len(text.encode("utf-8"))
                self.truncated = True
                yield Piece(index, text, True)
                return
            self.bytes_read += size
            yield Piece(index, text, True)

    def _text_of(self, record: dict, index: int) -> str:
        source = self.cfg.hf_dataset
        field = source.messages_field or source.text_field
        if field not in record:
            which = "messages_field" if source.messages_field else "text_field"
            raise UserError(
                f"data.hf_dataset.{which}: {field!r} is not a column of {source.path} "
                f"(columns: {', '.join(record)})"
            )
        value = record[field]
        if self.chat is not None:
            return self.chat(value, index)
        if not isinstance(value, str):
            raise UserError(f"data.hf_dataset.text_field: record {index} of {source.path} has a "
                            f"{type(value).__name__} in {field!r}, not text")
        return value


def chat_renderer(cfg: DataConfig):
    """A function rendering one record's messages with the tokenizer's chat template (as text)."""
    if cfg.tokenizer is None:
        raise UserError("data.hf_dataset.messages_field: a chat template needs the model's tokenizer "
                        "(set model.pretrained or data.tokenizer to a folder's tokenizer.json)")
    folder = Path(cfg.tokenizer).expanduser()
    folder = folder if folder.is_dir() else folder.parent
    from flopwise.hf_logging import quiet_hf_libraries

    quiet_hf_libraries()
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True,
                                                  trust_remote_code=False)  # a chat template needs no code
    except Exception as exc:
        raise UserError(f"data.hf_dataset.messages_field: cannot load the tokenizer in {folder} "
                        f"({str(exc).splitlines()[0][:160]})") from None
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(f"data.hf_dataset.messages_field: the tokenizer in {folder} has no chat_template "
                        "(tokenizer_config.json or chat_template.jinja)")

    def render(messages, index: int) -> str:
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise UserError(f"data.hf_dataset.messages_field: record {index} of {cfg.hf_dataset.path} "
                            "is not a list of {role, content} messages")
        return tokenizer.apply_chat_template(messages, tokenize=False)

    return render


def _sample_texts(pieces: DatasetPieces, cfg: DataConfig) -> Iterator[str]:
    """The first `tokenizer_train_bytes` of training documents, for a BPE learned from this data."""
    from flopwise.train.data.files import is_val_document

    taken = 0
    for piece in pieces:
        if is_val_document(piece.doc_index, cfg.val_fraction):
            continue
        yield piece.text
        taken += len(piece.text)
        if taken >= cfg.tokenizer_train_bytes:
            return
