"""A run's record, signed: what `export`, `compress` and `generate` read back is what the run wrote.

Someone who can write into a run directory (a shared scratch, a downloaded run, a
colleague's folder) but not this user's key could otherwise change the config a command
rebuilds the model from. So the run signs what it records with this user's key
(`flopwise.user_key`, HMAC-SHA256):

- `config.yaml` ends with a comment line `# flopwise-signature: <hex>` over the text above it
  (YAML readers see a comment);
- a checkpoint's `manifest.json` carries a `signature` field over the rest of the manifest,
  which holds the config and the sha256 of every file of the checkpoint.

A reader refuses a missing or wrong signature with one line, unless the person running the
command passes `--accept-run` (a run from another machine or user, or from a flopwise that
did not sign): then it says once that it accepted it. Either way a file never switches on
remote code (`config/loading.py: config_from_mapping`): only `--trust-remote-code` does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from flopwise.errors import UserError
from flopwise.user_key import key_path, sign, signed_by_user

SIGNATURE_PREFIX = "# flopwise-signature: "
CONFIG_PURPOSE = b"flopwise run config v1\n"
MANIFEST_PURPOSE = b"flopwise checkpoint manifest v1\n"
ACCEPT_HINT = "pass --accept-run to use it anyway if you trust whoever could write that folder"


def signed_config_text(text: str) -> str:
    """`text` (a dumped config) followed by its signature line."""
    body = text if text.endswith("\n") else text + "\n"
    return f"{body}{SIGNATURE_PREFIX}{sign(CONFIG_PURPOSE + body.encode())}\n"


def split_signature(text: str) -> tuple[str, str | None]:
    """(the config text, the signature) of a config.yaml; the signature is None when the last line is not one."""
    body = text[:-1] if text.endswith("\n") else text
    head, _, last = body.rpartition("\n")
    if not last.startswith(SIGNATURE_PREFIX):
        return text, None
    return (head + "\n" if head else ""), last[len(SIGNATURE_PREFIX):].strip()


def verified_config_text(path: Path, *, accept_run: bool) -> str:
    """The text of `path` (a run's config.yaml) after checking this user's signature, read once."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: cannot read the run's config ({err.__class__.__name__})") from None
    body, signature = split_signature(text)
    if not signed_by_user(CONFIG_PURPOSE + body.encode(), signature):
        refuse_or_accept(path, "unsigned" if signature is None else "signed by another key or edited", accept_run)
    return body


def read_run_config(path: Path, *, accept_run: bool, trust_remote_code: bool):
    """The RunConfig a run recorded in `path`, signature checked; remote code only from the flag."""
    from flopwise.config.loading import config_from_mapping, parse_yaml_mapping

    data = parse_yaml_mapping(verified_config_text(path, accept_run=accept_run), Path(path))
    return config_from_mapping(data, path, remote_code_overrides(trust_remote_code))


def remote_code_overrides(trust_remote_code: bool) -> list[str]:
    """The command-line override that switches on remote code, when the person asked for it."""
    return ["model.trust_remote_code=true"] if trust_remote_code else []


def _manifest_bytes(manifest: dict) -> bytes:
    record = {k: v for k, v in manifest.items() if k != "signature"}
    return MANIFEST_PURPOSE + json.dumps(record, sort_keys=True, separators=(",", ":")).encode()


def sign_manifest(manifest: dict) -> dict:
    """`manifest` with this user's `signature` over everything else in it."""
    return {**manifest, "signature": sign(_manifest_bytes(manifest))}


def check_manifest(path: Path, manifest: dict, *, accept_run: bool) -> None:
    """Refuse (one line) a checkpoint manifest that this user's key did not sign, unless `accept_run`."""
    signature = manifest.get("signature") if isinstance(manifest, dict) else None
    if not signed_by_user(_manifest_bytes(manifest), signature):
        refuse_or_accept(Path(path), "unsigned" if signature is None else "signed by another key or edited",
                         accept_run)


def manifest_config(path: Path, manifest: dict, *, trust_remote_code: bool):
    """The RunConfig recorded in a (checked) checkpoint manifest; remote code only from the flag."""
    from flopwise.config.loading import config_from_mapping

    data = manifest.get("config")
    if not isinstance(data, dict):
        raise UserError(f"{path}: the manifest holds no config mapping")
    return config_from_mapping(json.loads(json.dumps(data)), None, remote_code_overrides(trust_remote_code),
                               source=f"{path} (manifest config)")


def refuse_or_accept(path: Path, problem: str, accept_run: bool) -> None:
    """One line: refused, or (with --accept-run) accepted and said so on stderr."""
    if accept_run:
        print(f"note: {path} is {problem} (not by this user's key {key_path()}); accepted (--accept-run)",
              file=sys.stderr, flush=True)
        return
    raise UserError(f"{path}: {problem}, not by this user's flopwise key ({key_path()}): written elsewhere, by "
                    f"a flopwise that did not sign runs, or changed since; {ACCEPT_HINT}")
