"""Read a DCP checkpoint as data: nothing in the files can name or call code.

A torch.distributed.checkpoint (DCP) folder holds two kinds of pickle that stock DCP
reads with the full `pickle` machinery, so a forged file could run anything:

- `.metadata`, written by `pickle.dump` of DCP's metadata dataclasses. We read it with an
  unpickler that resolves only an exact list of (module, name) pairs — DCP's metadata
  classes, `torch.Size`, torch dtypes and layouts, paths — and refuses every other global,
  dotted names included (protocol 4 resolves `mod.a.b` by attribute walk, which is how a
  prefix allow-list leaks `os.system`). Since pickle can only call what a global resolved
  to, nothing outside that list can be called.
- non-tensor entries (optimizer hyper-parameters, ...) stored in the `.distcp` shards, which
  `DefaultLoadPlanner.load_bytes` reads with `torch.load(weights_only=False)`. Our planner
  reads them with `weights_only=True` (plain containers and numbers only).

Tensors themselves already come through `torch.load(weights_only=True)` inside DCP.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import pickle
import pickletools
import struct
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint._traverse import set_element

from flopwise.errors import UserError

from flopwise.train.checkpoint.confined_open import (
    REFUSED, CheckpointPathRefused, check_relative_name, open_in_checkpoint,
)
# REFUSED is carried by every refusal, so it can be found inside DCP's wrapped exceptions.

_DCP_METADATA = "torch.distributed.checkpoint.metadata"
ALLOWED_GLOBALS = frozenset(
    {(_DCP_METADATA, name) for name in (
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
        "TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING",
    )}
    | {
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),
        ("collections", "OrderedDict"),
        ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),
        ("pathlib", "WindowsPath"), ("pathlib", "PureWindowsPath"),
    }
)
"""Every global DCP writes into `.metadata` (torch 2.6-2.13); each is a plain-data class or a
lookup by name, harmless to construct with any arguments."""


MAX_METADATA_BYTES = 1 << 30
"""A `.metadata` larger than this is refused unread. DCP's metadata lists each tensor's chunks
(a few hundred bytes per chunk): tens of MB for the largest models, far below 1 GiB."""

_MEMO_STORES = {"PUT", "BINPUT", "LONG_BINPUT"}
_MEMO_READS = {"GET", "BINGET", "LONG_BINGET"}


def check_pickle_bounds(data: bytes) -> None:
    """Refuse, before anything is unpickled, a pickle that would make the unpickler allocate more than it holds.

    The C unpickler sizes its memo table by the largest index it is asked to store (a 9-byte
    file asking for index 2^27 costs 2 GiB) and a frame or a byte string by its stated length.
    Python's pickler numbers memo entries 0, 1, 2, ... in order, so an index beyond the entries
    stored so far, or a length beyond the bytes left in the file, is refused in one line.
    Every other allocation is at most one object per opcode, so bounded by the file's size.
    """
    if len(data) > MAX_METADATA_BYTES:
        raise pickle.UnpicklingError(f"{REFUSED}: .metadata is larger than {MAX_METADATA_BYTES >> 30} GiB")
    stored = 0
    try:
        for opcode, arg, position in pickletools.genops(data):
            name = opcode.name
            if name == "MEMOIZE":
                stored += 1
            elif name in _MEMO_STORES:
                if not isinstance(arg, int) or arg > stored:
                    raise pickle.UnpicklingError(f"{REFUSED}: .metadata stores memo entry {arg} after only "
                                                 f"{stored} entries (at byte {position})")
                stored = max(stored, arg + 1)
            elif name in _MEMO_READS and (not isinstance(arg, int) or arg >= stored):
                raise pickle.UnpicklingError(f"{REFUSED}: .metadata reads memo entry {arg}, which it never "
                                             f"stored (at byte {position})")
            elif name == "FRAME" and arg > len(data) - position:
                raise pickle.UnpicklingError(f"{REFUSED}: .metadata announces a frame of {arg} bytes, more than "
                                             f"the file holds (at byte {position})")
    except pickle.UnpicklingError:
        raise
    except (ValueError, TypeError, struct.error, UnicodeDecodeError) as exc:  # pickletools' own checks of lengths
        first = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        raise pickle.UnpicklingError(f"{REFUSED}: .metadata is not a well-formed pickle ({first})") from None


class MetadataUnpickler(pickle.Unpickler):
    """Resolves only ALLOWED_GLOBALS and torch dtypes; refuses everything else."""

    def find_class(self, module: str, name: str):
        if "." not in name:
            if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
                return getattr(torch, name)
            if (module, name) in ALLOWED_GLOBALS:
                return getattr(importlib.import_module(module), name)
        raise pickle.UnpicklingError(f"{REFUSED}: .metadata names {module}.{name}, which is not DCP metadata")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError(f"{REFUSED}: .metadata holds a persistent id")


class ConfinedFileSystem(FileSystem):
    """DCP's local file system, reading only regular files inside the checkpoint folder (`confined_open.py`)."""

    def __init__(self, root: Path):
        super().__init__()
        self.root = Path(root)

    @contextlib.contextmanager
    def create_stream(self, path, mode: str):
        if mode != "rb":
            raise CheckpointPathRefused(f"{REFUSED}: the checkpoint reader only reads (asked for mode {mode!r})")
        try:
            relative = Path(path).relative_to(self.root)
        except ValueError:
            relative = path  # absolute, or outside: check_relative_name refuses it with its name
        what = "the checkpoint" if str(relative) == ".metadata" else ".metadata"
        with open_in_checkpoint(self.root, relative, what) as stream:
            yield stream


class SafeFileSystemReader(FileSystemReader):
    """DCP's file reader: `.metadata` read by MetadataUnpickler within bounds, every file confined to the folder."""

    def __init__(self, path, *args, **kwargs):
        super().__init__(path, *args, **kwargs)
        self.fs = ConfinedFileSystem(Path(self.path))

    def read_metadata(self, *args, **kwargs):
        from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            data = stream.read(MAX_METADATA_BYTES + 1)
        check_pickle_bounds(data)
        metadata = MetadataUnpickler(io.BytesIO(data)).load()
        if not isinstance(metadata, Metadata):
            raise pickle.UnpicklingError(f"{REFUSED}: .metadata holds a {type(metadata).__name__}, not DCP Metadata")
        for entry in (metadata.storage_data or {}).values():  # every file it names: relative, inside the folder
            check_relative_name(getattr(entry, "relative_path", None), ".metadata")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, reading non-tensor entries with `weights_only=True`."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
            raise pickle.UnpicklingError(
                f"{REFUSED}: entry {read_item.dest_index.fqn} is not plain data ({first})"
            ) from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def refusal_in(exc: BaseException) -> str | None:
    """The refusal line carried by `exc` (DCP wraps reader errors, per rank, as text), or None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        for line in str(exc).splitlines():
            if REFUSED in line:
                return line[line.index(REFUSED):].split("; rank local")[0].strip()
        exc = exc.__cause__ or exc.__context__
    return None


LOAD_ERRORS = (Exception, CheckpointException)
"""What a failed `dcp.load` raises: DCP's CheckpointException is a BaseException."""


def safe_dcp_load(state_dict: dict, path: Path) -> None:
    """`dcp.load(state_dict)` from `path` with the safe reader and planner.

    A forged file is one UserError line; other errors (a shape mismatch) propagate unchanged.
    """
    try:  # read the metadata first: DCP would log its own fallback traceback for a refused file
        SafeFileSystemReader(path).read_metadata()
    except (pickle.UnpicklingError, FileNotFoundError, CheckpointPathRefused) as exc:
        if REFUSED in str(exc):
            raise UserError(f"checkpoint {path}: {exc}; a checkpoint is data and may not name code") from None
    except Exception as exc:  # truncated or garbled: not a pickle at all
        raise UserError(f"checkpoint {path}: unreadable .metadata ({type(exc).__name__}: {str(exc)[:120]})") from None
    try:
        dcp.load(state_dict, storage_reader=SafeFileSystemReader(path), planner=SafeLoadPlanner())
    except LOAD_ERRORS as exc:
        refusal = refusal_in(exc)
        if refusal is not None:
            raise UserError(f"checkpoint {path}: {refusal}; a checkpoint is data and may not name code") from None
        raise
