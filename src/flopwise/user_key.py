"""This user's signing key, and HMAC-SHA256 signatures made with it.

A folder anyone could have written (a run directory on a shared scratch, a downloaded run,
a compressed model) is trusted only when its record carries a signature made with a key
that only this user on this machine can read: `$XDG_CONFIG_HOME/flopwise/artifact.key`
(default `~/.config`), 32 random bytes, mode 0600, created on first use. Compressed
models (`compress/artifact_trust.py`) and run records (`train/run_signature.py`) sign
with it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

KEY_FILE = "artifact.key"
KEY_BYTES = 32


def key_path() -> Path:
    """This user's signing key: $XDG_CONFIG_HOME/flopwise/artifact.key (default ~/.config)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "flopwise" / KEY_FILE


def user_key() -> bytes:
    """The local key, created (32 random bytes, owner-only) the first time something is signed."""
    path = key_path()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return path.read_bytes()  # another process created it first
        with os.fdopen(fd, "wb") as handle:
            handle.write(secrets.token_bytes(KEY_BYTES))
    return path.read_bytes()


def sign(data: bytes) -> str:
    """Hex HMAC-SHA256 of `data` under this user's key."""
    return hmac.new(user_key(), data, hashlib.sha256).hexdigest()


def signed_by_user(data: bytes, signature: object) -> bool:
    """Whether `signature` is this user's signature of `data` (constant-time comparison)."""
    return isinstance(signature, str) and hmac.compare_digest(signature, sign(data))
