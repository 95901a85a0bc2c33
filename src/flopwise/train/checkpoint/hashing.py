"""Checksums of checkpoint files, computed while the bytes are written (one pass, no read-back).

The manifest names the algorithm per file: `blake3` when the `blake3` package is installed
(several times faster than sha256 on a CPU without SHA extensions, which is what decides how
long a save takes), `sha256` otherwise; manifests written before carry `sha256` and verify
as before.

`HashingFileSystem` is DCP's own `FileSystem` with each stream wrapped: every buffer DCP
hands to `write` is counted and queued for a hashing thread as it goes to the file, so the
hash runs beside the write and the file's fsync instead of after them, and when DCP has
fsynced and closed a file its digest and size are known. Buffers inside the staged tensors
(which stay unchanged until the save ends) are hashed in place; the small rest (zip headers,
pickles) is copied. DCP writes `.metadata` as `.metadata.tmp` and renames it; the digest
follows the rename.
"""

from __future__ import annotations

import bisect
import hashlib
import queue
import threading
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem

try:
    import blake3 as _blake3
except ImportError:  # the train extra installs it; sha256 is the fallback
    _blake3 = None

ALGORITHMS = ("blake3", "sha256")
READ_CHUNK = 8 << 20
LARGE_WRITE = 64 << 10  # a buffer this large is worth handing to the hashing thread without a copy
HANDOFF_BYTES = 16 << 20  # written bytes handed to the hashing thread at once


def preferred_algorithm() -> str:
    """The algorithm new manifests use: blake3 when installed, else sha256."""
    return "blake3" if _blake3 is not None else "sha256"


def new_hasher(algorithm: str):
    """A fresh hash object with update()/hexdigest(); blake3 needs the `blake3` package."""
    if algorithm == "sha256":
        return hashlib.sha256()
    if algorithm == "blake3" and _blake3 is not None:
        return _blake3.blake3()
    raise OSError(f"checksum algorithm {algorithm} needs the blake3 package (pip install blake3)")


def algorithm_of(entry: dict) -> str:
    """Which algorithm a manifest entry was hashed with (its key), sha256 for older manifests."""
    for name in ALGORITHMS:
        if name in entry:
            return name
    return "sha256"


def file_digest(path: Path, algorithm: str) -> str:
    """The digest of a file already on disk (verification; saving never reads back)."""
    digest = new_hasher(algorithm)
    with open(path, "rb") as handle:
        while chunk := handle.read(READ_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def bytes_digest(data: bytes, algorithm: str) -> str:
    """The digest of bytes about to be written."""
    digest = new_hasher(algorithm)
    digest.update(data)
    return digest.hexdigest()


class StableMemory:
    """Address ranges of tensors that nobody changes while a checkpoint is written (the staged copy).

    A buffer DCP writes that lies inside one of them can be hashed later, in another thread,
    without copying it; any other buffer (zip headers, pickles: memory torch frees after the
    call) is copied before `write` returns.
    """

    def __init__(self, state_dict: dict | None = None):
        ranges = sorted({(start, size) for start, size in map(_address_range, _storages(state_dict)) if size})
        self._starts = [start for start, _ in ranges]
        self._ends = [start + size for start, size in ranges]

    def holds(self, view: memoryview) -> bool:
        """Whether all of `view` lies inside one stable tensor."""
        if not self._starts:
            return False
        start = np.frombuffer(view, dtype=np.uint8).ctypes.data
        index = bisect.bisect_right(self._starts, start) - 1
        return index >= 0 and start + view.nbytes <= self._ends[index]


def _address_range(storage) -> tuple[int, int]:
    """(start, bytes) of a storage; (0, 0) for one with no memory of its own (a tensor subclass's
    wrapper): buffers inside it are then copied before they are hashed, which is always correct."""
    try:
        return storage.data_ptr(), storage.nbytes()
    except RuntimeError:
        return 0, 0


def _storages(value):
    if isinstance(value, torch.Tensor):
        local = getattr(value, "to_local", None)  # a DTensor (FSDP2, TP): its shard holds the bytes
        yield (local() if callable(local) else value).untyped_storage()
    elif isinstance(value, dict):
        for item in value.values():
            yield from _storages(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _storages(item)


class _HashingStream:
    """A binary file whose bytes are hashed in a second thread while they are written and fsynced.

    The hash then costs the save no time of its own where a core is free, and overlaps the
    file's fsync (a wait for the disk) where none is. Writes are handed to the thread in
    groups of `HANDOFF_BYTES` (each hand-over wakes the thread, and a woken thread takes the
    GIL from the writer: one per buffer cost more than the hash saved on a busy machine),
    and the rest when DCP asks for the descriptor to fsync it. Order is kept: small writes are
    copied into a batch that joins the group before the next large buffer.
    """

    def __init__(self, raw, algorithm: str, stable: StableMemory):
        self._raw = raw
        self._stable = stable
        self.hasher = new_hasher(algorithm)
        self.size = 0
        self._batch = bytearray()
        self._group: list = []
        self._group_bytes = 0
        self._queue: queue.SimpleQueue | None = None
        self._thread: threading.Thread | None = None

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        if view.nbytes >= LARGE_WRITE and self._stable.holds(view):
            self._close_batch()
            self._group.append(view)
        else:
            self._batch += view
        self._group_bytes += view.nbytes
        if self._group_bytes >= HANDOFF_BYTES:
            self._hand_over()
        self.size += view.nbytes
        return self._raw.write(view)

    def fileno(self) -> int:
        """The file's descriptor; DCP asks for it to fsync the file, so what is left is hashed meanwhile."""
        self._hand_over()
        return self._raw.fileno()

    def digest(self) -> str:
        """The hex digest of everything written (waits for the hashing thread)."""
        self.stop()
        self._close_batch()
        for chunk in self._group:  # a small file never started the thread
            self.hasher.update(chunk)
        self._group, self._group_bytes = [], 0
        return self.hasher.hexdigest()

    def stop(self) -> None:
        """End the hashing thread (also after a failed write)."""
        if self._thread is not None:
            self._hand_over()
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def _close_batch(self) -> None:
        if self._batch:
            self._group.append(self._batch)
            self._batch = bytearray()

    def _hand_over(self) -> None:
        self._close_batch()
        if not self._group:
            return
        if self._thread is None:
            self._queue = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._hash_queued, name="checkpoint-hash", daemon=True)
            self._thread.start()
        self._queue.put(self._group)
        self._group, self._group_bytes = [], 0

    def _hash_queued(self) -> None:
        while (group := self._queue.get()) is not None:
            for chunk in group:
                self.hasher.update(chunk)  # blake3 and hashlib release the GIL on large buffers

    def __getattr__(self, name):  # tell, flush, close, ...: the file's own
        return getattr(self._raw, name)


class HashingFileSystem(FileSystem):
    """DCP's local file system, recording (bytes, digest) of every file it writes, by path."""

    def __init__(self, algorithm: str, stable: StableMemory | None = None):
        super().__init__()
        self.algorithm = algorithm
        self.stable = stable or StableMemory()
        self.written: dict[Path, tuple[int, str]] = {}
        self._lock = threading.Lock()  # DCP may write with several threads

    @contextmanager
    def create_stream(self, path, mode: str):
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with super().create_stream(path, mode) as raw:
            stream = _HashingStream(raw, self.algorithm, self.stable)
            try:
                yield stream
            finally:
                stream.stop()
        with self._lock:
            self.written[Path(path)] = (stream.size, stream.digest())

    def rename(self, path, new_path) -> None:
        super().rename(path, new_path)
        with self._lock:
            if Path(path) in self.written:
                self.written[Path(new_path)] = self.written.pop(Path(path))


def hashing_writer(folder: Path, algorithm: str, state_dict: dict | None = None) -> FileSystemWriter:
    """DCP's FileSystemWriter (fsynced files) that hashes while it writes; digests in `.fs.written`.

    `state_dict`: the tensors about to be written, unchanged until the save returns (a staged
    copy); their bytes are hashed in place by a second thread instead of being copied.
    """
    writer = FileSystemWriter(folder, sync_files=True)
    writer.fs = HashingFileSystem(algorithm, StableMemory(state_dict))
    return writer
