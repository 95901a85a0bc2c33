"""Token shards on disk: flat little-endian uint16/uint32 files, memory-mapped for reading.

The layout is nanoGPT's `train.bin` (raw ids, no header): any tool can read it with
`np.memmap(path, dtype)`. A split longer than `SHARD_TOKENS` rolls over into more files so
no single file gets unwieldy. A cache entry is built in a temporary folder and renamed into
place, so a reader sees either nothing or a complete entry.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

SHARD_TOKENS = 1 << 28  # 256 Mi tokens: 512 MiB as uint16


def token_dtype_for(vocab_size: int) -> np.dtype:
    """The narrowest dtype that holds every id below `vocab_size`."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


class ShardWriter:
    """Appends token ids to `<prefix>_NNN.bin` files, starting a new file every `shard_tokens`."""

    def __init__(self, folder: Path, prefix: str, dtype: np.dtype, shard_tokens: int = SHARD_TOKENS):
        self.folder = folder
        self.prefix = prefix
        self.dtype = np.dtype(dtype)
        self.shard_tokens = shard_tokens
        self.paths: list[Path] = []
        self.tokens = 0
        self._handle = None
        self._in_current = 0

    def write(self, ids: np.ndarray) -> None:
        """Append ids (any integer array); the caller has checked they fit the dtype."""
        ids = np.asarray(ids).astype(self.dtype, copy=False)
        while ids.size:
            if self._handle is None or self._in_current == self.shard_tokens:
                self._open_next()
            room = self.shard_tokens - self._in_current
            head, ids = ids[:room], ids[room:]
            head.tofile(self._handle)
            self._in_current += head.size
            self.tokens += head.size

    def close(self) -> list[Path]:
        """Flush and return the shard paths written (empty when nothing was written)."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        return self.paths

    def _open_next(self) -> None:
        if self._handle is not None:
            self._handle.close()
        path = self.folder / f"{self.prefix}_{len(self.paths):03d}.bin"
        self._handle = open(path, "wb")
        self.paths.append(path)
        self._in_current = 0


def shards_sha256(paths: list[Path]) -> str:
    """sha256 of the token stream the shards hold, in order: what a resumed run must read again."""
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as handle:
            while block := handle.read(1 << 24):
                digest.update(block)
    return digest.hexdigest()


def open_shard(path: Path, dtype: str) -> np.ndarray:
    """Memory-map one shard read-only."""
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


def new_staging_dir(cache_dir: Path, key: str) -> Path:
    """A private folder next to the final entry, on the same file system so rename is atomic."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{key}.tmp-", dir=cache_dir))


def publish(staging: Path, final: Path) -> bool:
    """Rename the finished entry into place; False if another process published it first."""
    try:
        os.rename(staging, final)
        return True
    except OSError:
        if final.is_dir():
            shutil.rmtree(staging, ignore_errors=True)
            return False
        raise
