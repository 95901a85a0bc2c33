"""Who may hand us a compressed model: the trust boundary of `load_compressed`.

`model.pt2` is read by `torch.export.load`, which unpickles its constants, so loading a
file can run code written into it. A compressed folder therefore records, in
`compressed.json`, the SHA-256 of every file it ships and an HMAC-SHA256 over that
record made with a key private to this user on this machine
(`flopwise.user_key`: `$XDG_CONFIG_HOME/flopwise/artifact.key`, mode 0600).

On load:
- a file whose SHA-256 differs from the record is always refused (changed or corrupt);
- a folder without a valid signature from this user's key (written elsewhere, or the
  record edited) is refused unless the caller passes `trust=True`, saying they trust
  its source as they would trust running its code.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat
from pathlib import Path

from flopwise.errors import UserError
from flopwise.user_key import key_path, user_key

HASH_CHUNK = 1 << 20


def sha256_of(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(HASH_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _signature(record: dict, key: bytes) -> str:
    canonical = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key, canonical, hashlib.sha256).hexdigest()


def seal(folder: Path, manifest: dict, names: list[str]) -> dict:
    """`manifest` plus the SHA-256 of each named file and this user's signature over both."""
    record = {**manifest, "files": {name: sha256_of(folder / name) for name in sorted(names)}}
    record.pop("signature", None)
    return {**record, "signature": _signature(record, user_key())}


def verified_files(folder: Path, manifest: dict, *, trust: bool) -> dict[str, bytes]:
    """The bytes of every file the record lists, each read once and checked against its SHA-256.

    The caller loads from these bytes, never from the names again: a file swapped after the
    check is never read (verify and load the same bytes). Without `trust` the record must also
    carry this user's signature. A one-line UserError otherwise.
    """
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        if trust:
            return {}
        raise UserError(f"{folder}: compressed.json records no file hashes (written elsewhere or by an older "
                        "flopwise); loading it can run code stored in the file — pass trust=True (--trust) "
                        "only if you trust its source")
    if not trust:
        record = {k: v for k, v in manifest.items() if k != "signature"}
        if not hmac.compare_digest(str(manifest.get("signature", "")), _signature(record, user_key())):
            raise UserError(f"{folder}: not signed by this user's flopwise key ({key_path()}), so it was written "
                            "elsewhere or edited; loading it can run code stored in the file — pass trust=True "
                            "(--trust) only if you trust its source")
    contents = {}
    for name, expected in files.items():
        data = read_plain_file(folder, name)
        if not hmac.compare_digest(hashlib.sha256(data).hexdigest(), str(expected)):
            raise UserError(f"{folder / name}: SHA-256 does not match the one recorded in compressed.json "
                            "(changed or corrupt after it was written); refusing to load it")
        contents[name] = data
    return contents


def read_plain_file(folder: Path, name: str) -> bytes:
    """The whole of `folder/name`, a regular file named without any folder part, opened without following a link."""
    if not isinstance(name, str) or Path(name).name != name or name in (".", ".."):
        raise UserError(f"{folder}: {name!r} listed in compressed.json is missing or not a plain file name")
    try:
        fd = os.open(Path(folder) / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        raise UserError(f"{folder}: {name!r} listed in compressed.json is missing or not a plain file name") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UserError(f"{folder / name}: not a regular file; refusing to load it")
    with os.fdopen(fd, "rb") as handle:
        return handle.read()
