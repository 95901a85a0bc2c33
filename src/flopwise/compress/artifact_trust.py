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


def verify(folder: Path, manifest: dict, *, trust: bool) -> None:
    """Raise a one-line UserError unless every recorded file matches and (without trust) the signature is ours."""
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        if trust:
            return
        raise UserError(f"{folder}: compressed.json records no file hashes (written elsewhere or by an older "
                        "flopwise); loading it can run code stored in the file — pass trust=True (--trust) "
                        "only if you trust its source")
    for name, expected in files.items():
        target = folder / name
        if Path(name).name != name or not target.is_file():
            raise UserError(f"{folder}: {name!r} listed in compressed.json is missing or not a plain file name")
        if not hmac.compare_digest(sha256_of(target), str(expected)):
            raise UserError(f"{target}: SHA-256 does not match the one recorded in compressed.json "
                            "(changed or corrupt after it was written); refusing to load it")
    if trust:
        return
    record = {k: v for k, v in manifest.items() if k != "signature"}
    if not hmac.compare_digest(str(manifest.get("signature", "")), _signature(record, user_key())):
        raise UserError(f"{folder}: not signed by this user's flopwise key ({key_path()}), so it was written "
                        "elsewhere or edited; loading it can run code stored in the file — pass trust=True "
                        "(--trust) only if you trust its source")
