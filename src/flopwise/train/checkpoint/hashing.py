"""Checksums of checkpoint files, computed while the bytes are written (one pass, no read-back).

The manifest names the algorithm per file: `blake3` when the `blake3` package is installed
(several times faster than sha256 on a CPU without SHA extensions, which is what decides how
long a save takes), `sha256` otherwise; manifests written before carry `sha256` and verify
as before.

`HashingFileSystem` is DCP's own `FileSystem` with each stream wrapped: every buffer DCP
hands to `write` is hashed and counted before it goes to the file, so when DCP has fsynced
and closed a file its digest and size are already known. DCP writes `.metadata` as
`.metadata.tmp` and renames it; the digest follows the rename.
"""

from __future__ import annotations

import hashlib
import threading
from contextlib import contextmanager
from pathlib import Path

from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem

try:
    import blake3 as _blake3
except ImportError:  # the train extra installs it; sha256 is the fallback
    _blake3 = None

ALGORITHMS = ("blake3", "sha256")
READ_CHUNK = 8 << 20


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


class _HashingStream:
    """A binary file whose writes are hashed and counted on their way to the file."""

    def __init__(self, raw, algorithm: str):
        self._raw = raw
        self.hasher = new_hasher(algorithm)
        self.size = 0

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        self.hasher.update(view)
        self.size += view.nbytes
        return self._raw.write(view)

    def __getattr__(self, name):  # tell, flush, fileno, close, ...: the file's own
        return getattr(self._raw, name)


class HashingFileSystem(FileSystem):
    """DCP's local file system, recording (bytes, digest) of every file it writes, by path."""

    def __init__(self, algorithm: str):
        super().__init__()
        self.algorithm = algorithm
        self.written: dict[Path, tuple[int, str]] = {}
        self._lock = threading.Lock()  # DCP may write with several threads

    @contextmanager
    def create_stream(self, path, mode: str):
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with super().create_stream(path, mode) as raw:
            stream = _HashingStream(raw, self.algorithm)
            yield stream
        with self._lock:
            self.written[Path(path)] = (stream.size, stream.hasher.hexdigest())

    def rename(self, path, new_path) -> None:
        super().rename(path, new_path)
        with self._lock:
            if Path(path) in self.written:
                self.written[Path(new_path)] = self.written.pop(Path(path))


def hashing_writer(folder: Path, algorithm: str) -> FileSystemWriter:
    """DCP's FileSystemWriter (fsynced files) that hashes while it writes; digests in `.fs.written`."""
    writer = FileSystemWriter(folder, sync_files=True)
    writer.fs = HashingFileSystem(algorithm)
    return writer
