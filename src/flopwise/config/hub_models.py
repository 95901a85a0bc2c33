"""`model.pretrained: org/name`: a model id found in the local Hugging Face cache, never downloaded.

Training runs offline (and on many ranks at once), so a hub id resolves only to a snapshot
already in the cache (`HF_HUB_CACHE`, else `HF_HOME/hub`, else ~/.cache/huggingface/hub: the
layout `huggingface_hub` writes, models--org--name/snapshots/<revision>/ with refs/main). A
model that is not there is one line saying how to download it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# A hub id: `name` or `org/name`, letters, digits and - _ . (huggingface_hub's own rule).
HUB_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*$")


def hub_cache_dir() -> Path:
    """The hub cache the environment names now (read at call time, not at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def looks_like_hub_id(value: str | Path) -> bool:
    """`org/name` that is not a folder here: a relative path that does not exist and fits the id rule."""
    text = str(value)
    return not Path(text).expanduser().exists() and bool(HUB_ID.match(text)) and "/" in text \
        and not text.startswith((".", "~"))


def resolve_hub_model(model_id: str, revision: str | None = None) -> Path:
    """The cached snapshot folder of `model_id`; ValueError with the download command if not cached."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = hub_cache_dir()
    try:
        folder = snapshot_download(model_id, revision=revision, cache_dir=str(cache), local_files_only=True)
    except LocalEntryNotFoundError:
        raise ValueError(
            f"model.pretrained: {model_id} is not a folder and not in the Hugging Face cache {cache}; download it first with "
            f"`hf download {model_id}` (older huggingface_hub: `huggingface-cli download {model_id}`), "
            "or give the folder it is saved in"
        ) from None
    except Exception as exc:  # noqa: BLE001  (an id the hub refuses, a broken cache entry)
        raise ValueError(f"model.pretrained: {model_id} cannot be read from the Hugging Face cache {cache} ({exc})") from None
    return Path(folder)
