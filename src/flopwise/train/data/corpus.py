"""Finding the input files of a corpus and reading them as documents, one format each.

Formats: plain text (any text file; one file is one document), JSONL (one JSON object per
line, text under a field), TFRecord of `tf.train.Example` (a bytes feature; read with the
`tfrecord` package, no TensorFlow) and pre-tokenized token files (`.bin` raw, `.npy`).
Nothing here imports torch.
"""

from __future__ import annotations

import glob
import json
import os
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flopwise.errors import UserError

JSONL_SUFFIXES = (".jsonl", ".ndjson")
TFRECORD_SUFFIXES = (".tfrecord", ".tfrecords", ".tfrec")
TOKEN_SUFFIXES = (".bin", ".npy")
# Directory names left out of the default corpus: third-party code and test fixtures
# (the latter include deliberately broken or non-UTF-8 files).
STDLIB_EXCLUDED_DIRS = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
)
# Plain-text files are read in pieces this large (cut at a newline) so a huge file never
# has to fit in memory at once.
TEXT_PIECE_CHARS = 1 << 20


@dataclass(frozen=True)
class InputFile:
    """One input file and the format it is read with."""

    path: Path
    format: str  # "text" | "jsonl" | "tfrecord" | "tokens"


@dataclass(frozen=True)
class Piece:
    """A run of text from one document; `last` marks the document's final piece."""

    doc_index: int
    text: str
    last: bool


def default_corpus_files() -> list[Path]:
    """The Python standard library's own `.py` sources: a corpus every machine with Python has."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in STDLIB_EXCLUDED_DIRS]
        files.extend(Path(dirpath) / f for f in filenames if f.endswith(".py"))
    if not files:
        raise UserError(f"data.paths is empty and no Python sources were found under {root}")
    return sorted(files)


def resolve_inputs(paths: list[str], fmt: str) -> list[InputFile]:
    """Expand files, folders and globs into a sorted file list, each with its format.

    An empty `paths` means the standard library. Folders are walked recursively, skipping
    hidden entries and `__pycache__`. Sorting makes the corpus order, and so the cache key
    and the validation split, the same on every machine.
    """
    files = default_corpus_files() if not paths else _expand(paths)
    inputs = [InputFile(p, fmt if fmt != "auto" else format_of(p)) for p in files]
    formats = {i.format for i in inputs}
    if "tokens" in formats and len(formats) > 1:
        mixed = next(i.path for i in inputs if i.format != "tokens")
        raise UserError(
            f"data.paths mixes pre-tokenized files (.bin/.npy) with text ({mixed}); "
            "use one kind per run"
        )
    return inputs


def format_of(path: Path) -> str:
    """The format `auto` picks for a file, by its extension."""
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        return "jsonl"
    if suffix in TFRECORD_SUFFIXES:
        return "tfrecord"
    if suffix in TOKEN_SUFFIXES:
        return "tokens"
    return "text"


def _expand(paths: list[str]) -> list[Path]:
    found: dict[Path, None] = {}
    for entry in paths:
        expanded = os.path.expanduser(entry)
        if glob.has_magic(expanded):
            matches = [Path(m) for m in glob.glob(expanded, recursive=True)]
            matches = [m for m in matches if m.is_file()]
            if not matches:
                raise UserError(f"data.paths: the pattern {entry!r} matches no files")
        else:
            path = Path(expanded)
            if path.is_dir():
                matches = _walk(path)
                if not matches:
                    raise UserError(f"data.paths: the folder {path} contains no files")
            elif path.is_file():
                matches = [path]
            else:
                raise UserError(f"data.paths: {path} does not exist")
        for m in matches:
            found[m.resolve()] = None
    return sorted(found)


def _walk(folder: Path) -> list[Path]:
    files = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d != "__pycache__"]
        files.extend(Path(dirpath) / f for f in filenames if not f.startswith("."))
    return sorted(files)


def read_pieces(inputs: list[InputFile], text_field: str) -> Iterator[Piece]:
    """Yield the corpus as text pieces, numbering documents across all files in order."""
    doc_index = 0
    for item in inputs:
        if item.format == "text":
            reader = _text_documents(item.path)
        elif item.format == "jsonl":
            reader = _jsonl_documents(item.path, text_field)
        elif item.format == "tfrecord":
            reader = _tfrecord_documents(item.path, text_field)
        else:
            raise UserError(f"{item.path} holds token ids; it cannot be read as text")
        for pieces in reader:
            has_text = False  # empty documents get no separator either
            for text, last in pieces:
                if text or (last and has_text):
                    has_text = True
                    yield Piece(doc_index, text, last)
            doc_index += 1


def _text_documents(path: Path) -> Iterator[Iterator[tuple[str, bool]]]:
    yield _text_pieces(path)


def _text_pieces(path: Path) -> Iterator[tuple[str, bool]]:
    carry = ""
    try:
        with open(path, encoding="utf-8") as handle:
            while True:
                chunk = handle.read(TEXT_PIECE_CHARS)
                if not chunk:
                    break
                text = carry + chunk
                cut = text.rfind("\n") + 1
                if cut == 0:
                    carry = text
                    continue
                carry = text[cut:]
                yield text[:cut], False
    except UnicodeDecodeError as exc:
        raise UserError(
            f"{path} is not UTF-8 text (byte {exc.start}); leave it out of data.paths "
            "or convert it"
        ) from None
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    yield carry, True


def _jsonl_documents(path: Path, text_field: str) -> Iterator[Iterator[tuple[str, bool]]]:
    try:
        with open(path, encoding="utf-8") as handle:
            for line_no, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise UserError(f"{path}:{line_no}: not valid JSON ({exc.msg})") from None
                if not isinstance(record, dict) or text_field not in record:
                    raise UserError(
                        f"{path}:{line_no}: no field {text_field!r} (set data.text_field)"
                    )
                text = record[text_field]
                if not isinstance(text, str):
                    raise UserError(
                        f"{path}:{line_no}: field {text_field!r} is "
                        f"{type(text).__name__}, expected a string"
                    )
                yield iter([(text, True)])
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text; JSONL must be UTF-8") from None
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None


def _tfrecord_documents(path: Path, text_field: str) -> Iterator[Iterator[tuple[str, bool]]]:
    from tfrecord import example_pb2
    from tfrecord.reader import tfrecord_iterator

    try:
        for number, record in enumerate(tfrecord_iterator(str(path)), start=1):
            example = example_pb2.Example()
            example.ParseFromString(bytes(record))
            features = example.features.feature
            if text_field not in features:
                raise UserError(
                    f"{path}: record {number} has no feature {text_field!r} (set data.text_field)"
                )
            values = features[text_field].bytes_list.value
            if not values:
                raise UserError(
                    f"{path}: record {number}: feature {text_field!r} is not a bytes feature"
                )
            try:
                text = b"".join(values).decode("utf-8")
            except UnicodeDecodeError:
                raise UserError(
                    f"{path}: record {number}: feature {text_field!r} is not UTF-8 text"
                ) from None
            yield iter([(text, True)])
    except UserError:
        raise
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    except Exception as exc:  # the reader raises RuntimeError / DecodeError on corrupt files
        raise UserError(f"{path} is not a readable TFRecord file ({exc})") from None


def open_token_file(path: Path, token_dtype: str) -> np.ndarray:
    """Memory-map a pre-tokenized file: `.npy` keeps its own dtype, `.bin` uses `token_dtype`."""
    try:
        if path.suffix.lower() == ".npy":
            array = np.load(path, mmap_mode="r", allow_pickle=False)
        else:
            size = path.stat().st_size
            itemsize = np.dtype(token_dtype).itemsize
            if size % itemsize:
                raise UserError(
                    f"{path} is {size} bytes, not a whole number of {token_dtype} tokens "
                    "(check data.token_dtype)"
                )
            if size == 0:
                return np.zeros(0, dtype=token_dtype)
            array = np.memmap(path, dtype=token_dtype, mode="r")
    except UserError:
        raise
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read token file {path}: {exc}") from None
    if array.dtype not in (np.uint16, np.uint32):
        raise UserError(f"{path} holds {array.dtype} tokens; allowed: uint16, uint32")
    return array.reshape(-1)


def total_input_bytes(inputs: list[InputFile]) -> int:
    """Sum of the input files' sizes (an upper bound on the text they hold)."""
    return sum(i.path.stat().st_size for i in inputs)
