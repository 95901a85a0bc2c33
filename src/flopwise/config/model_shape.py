"""The built-in decoder's shape from `model:`: MLP width, key/value heads, head layout checks, the HF config file.

Torch-free and in one place, so the model the trainer builds (`train/model.py`) and the one
the planner counts (`plan/from_config.py: model_spec_from_config`) cannot differ.
"""

from __future__ import annotations

import math
from pathlib import Path

from flopwise.errors import UserError

FFN_MULTIPLE_OF = 64


def llama_ffn_hidden(hidden: int, multiple_of: int = FFN_MULTIPLE_OF) -> int:
    """SwiGLU width that keeps the MLP's parameters at ~8h^2, as a 4h GELU MLP has.

    LLaMA's rule (Meta `llama/model.py`, FeedForward): int(2 * 4h / 3), rounded up to a
    multiple of `multiple_of` (Meta uses 256; 64 here so small models stay close to 8h/3).
    """
    width = int(2 * 4 * hidden / 3)
    return multiple_of * math.ceil(width / multiple_of)


def ffn_hidden_of(model) -> int:
    """The MLP width: `model.ffn_hidden`, else the LLaMA rule (llama) or 4h (gpt2)."""
    if model.ffn_hidden is not None:
        return model.ffn_hidden
    return llama_ffn_hidden(model.hidden) if model.kind == "llama" else 4 * model.hidden


def kv_heads_of(model) -> int:
    """Key/value heads: `model.n_kv_heads`, else one per query head (plain multi-head)."""
    return model.n_kv_heads if model.n_kv_heads is not None else model.n_heads


def check_shape(model) -> None:
    """Reject head layouts the attention cannot split, naming the config keys."""
    if model.hidden % model.n_heads:
        raise UserError(f"model.hidden={model.hidden} must be divisible by model.n_heads={model.n_heads}")
    n_kv = kv_heads_of(model)
    if model.n_heads % n_kv:
        raise UserError(f"model.n_heads={model.n_heads} must be a multiple of model.n_kv_heads={n_kv}")
    if model.kind == "llama" and (model.hidden // model.n_heads) % 2:
        raise UserError(
            f"model.hidden / model.n_heads = {model.hidden // model.n_heads} must be even for rotary embeddings"
        )


def hf_config_path(model) -> Path:
    """The config.json named by `model.hf_config` (a file, or a folder holding config.json)."""
    if model.hf_config is None:
        raise UserError("model.hf_config is required when model.kind=hf (path to a config.json)")
    path = Path(model.hf_config).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise UserError(f"model.hf_config: {path} does not exist")
    return path
