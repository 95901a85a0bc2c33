"""This user's signing key, and HMAC-SHA256 signatures made with it.

A folder anyone could have written (a run directory on a shared scratch, a downloaded run,
a compressed model) is trusted only when its record carries a signature made with a key
that only this user on this machine can read: `$XDG_CONFIG_HOME/flopwise/artifact.key`
(default `~/.config`), 32 random bytes, mode 0600, created on first use. Compressed
models (`compress/artifact_trust.py`) and run records (`config/signature.py`) sign
with it.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

from flopwise.errors import UserError

KEY_FILE = "artifact.key"
KEY_BYTES = 32


def key_path() -> Path:
    """This user's signing key: $XDG_CONFIG_HOME/flopwise/artifact.key (default ~/.config)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "flopwise" / KEY_FILE


def user_key() -> bytes:
    """The local key, created (32 random bytes, owner-only) the first time something is signed.

    A key that anyone but this user could have written or read signs nothing: it must be a
    regular file (not a link), owned by this user, without group or other permissions, and
    hold at least 32 bytes (an interrupted first write of an older flopwise left an empty
    file, which would let anyone sign). Each problem is one line naming the file and the fix.
    """
    path = key_path()
    if not os.path.lexists(path):
        create_key(path)
    return read_key(path)


def create_key(path: Path) -> None:
    """Write a new key atomically: a private temporary file, fsynced, then linked to its name.

    `os.link` never replaces: when another process created the key first, its key stays and
    this one is dropped, so every process signs with the same key.
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(secrets.token_bytes(KEY_BYTES))
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process won; read its key
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def read_key(path: Path) -> bytes:
    """The key's bytes, after checking it is this user's private regular file of 32 bytes or more."""
    fix = f"remove {path} and flopwise makes a new one (folders it signed must then be accepted explicitly)"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as err:
        what = "a symbolic link" if os.path.islink(path) else f"unreadable ({err.strerror})"
        raise UserError(f"{path}: the signing key is {what}; {fix}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise UserError(f"{path}: the signing key is not a regular file; {fix}")
    with os.fdopen(fd, "rb") as handle:
        if info.st_uid != os.getuid():
            raise UserError(f"{path}: the signing key belongs to user id {info.st_uid}, not to you "
                            f"({os.getuid()}); {fix}")
        if info.st_mode & 0o077:
            raise UserError(f"{path}: the signing key is readable or writable by others (mode "
                            f"{stat.S_IMODE(info.st_mode):o}); run `chmod 600 {path}`, or {fix}")
        key = handle.read(1 << 16)
    if len(key) < KEY_BYTES:
        raise UserError(f"{path}: the signing key holds {len(key)} bytes, fewer than {KEY_BYTES} (an interrupted "
                        f"first write?); {fix}")
    return key


def sign(data: bytes) -> str:
    """Hex HMAC-SHA256 of `data` under this user's key."""
    return hmac.new(user_key(), data, hashlib.sha256).hexdigest()


def signed_by_user(data: bytes, signature: object) -> bool:
    """Whether `signature` is this user's signature of `data` (constant-time comparison)."""
    return isinstance(signature, str) and hmac.compare_digest(signature, sign(data))
