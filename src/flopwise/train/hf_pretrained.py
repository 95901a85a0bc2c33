"""Pretrained HuggingFace weights in: `model.kind=hf` with `model.pretrained: FOLDER`.

The folder is what `save_pretrained` writes: config.json and safetensors weights, one file
(`model.safetensors`) or shards listed in `model.safetensors.index.json`. Nothing is read
from the hub.

The model is built with its parameters on the meta device (no memory), so no rank ever
holds a full randomly initialised copy. Weights are then read tensor by tensor from the
memory-mapped shards:

- single / DDP / DeepSpeed: `materialize_pretrained` before wrapping (DDP broadcasts rank 0's
  copy anyway; DeepSpeed partitions what it is given, so each rank holds the full model once
  before ZeRO shards it: there is no `zero.Init` path);
- FSDP2: `fully_shard` runs on the meta model, then `materialize_pretrained` allocates only
  this rank's shards and fills each from the full tensor by slicing locally (one full
  tensor in memory at a time, no communication), the per-rank reading torchtitan uses;
- pipeline: not available for HF models (the stage splitter knows the built-in decoder only).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from flopwise.errors import UserError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a save_pretrained folder (sharded or not), or a one-line error."""
    folder = Path(folder).expanduser()
    if (folder / INDEX_FILE).is_file():
        try:
            index = json.loads((folder / INDEX_FILE).read_text())
            names = sorted(set(index["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise UserError(f"model.pretrained: {folder / INDEX_FILE} is not a safetensors index ({exc})") from None
        missing = [name for name in names if not (folder / name).is_file()]
        if missing:
            raise UserError(f"model.pretrained: {folder} lacks the shard {missing[0]} named in {INDEX_FILE}")
        return [folder / name for name in names]
    if (folder / SINGLE_FILE).is_file():
        return [folder / SINGLE_FILE]
    raise UserError(
        f"model.pretrained: {folder} has no {SINGLE_FILE} or {INDEX_FILE} "
        "(save the model with save_pretrained(..., safe_serialization=True))"
    )


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Create every nn.Parameter on the meta device while buffers stay real.

    Buffers (rotary tables and the like) are small and computed from the config in
    `__init__`; keeping them real means they need no re-computation after loading. This is
    what accelerate's `init_empty_weights(include_buffers=False)` does.
    """
    original = nn.Module.register_parameter

    def register_on_meta(module: nn.Module, name: str, param):
        original(module, name, param)
        if param is not None and param.device.type != "meta":
            kwargs = {"requires_grad": param.requires_grad}
            module._parameters[name] = type(param)(param.to("meta"), **kwargs)

    nn.Module.register_parameter = register_on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = original


def build_pretrained_skeleton(model_cfg, vocab_size: int) -> nn.Module:
    """The HF model of `model_cfg.pretrained` with parameters on meta (filled by `materialize_pretrained`)."""
    from flopwise.hf_logging import quiet_hf_libraries
    from flopwise.train.model import build_hf_model

    quiet_hf_libraries()
    weight_files(model_cfg.pretrained)  # fail before building anything
    with parameters_on_meta():
        return build_hf_model(model_cfg, vocab_size)


def is_on_meta(model: nn.Module) -> bool:
    """Whether the model's parameters still wait for their values."""
    return any(p.is_meta for p in model.parameters())


@torch.no_grad()
def materialize_pretrained(model: nn.Module, folder: Path, device: torch.device) -> int:
    """Allocate the meta parameters on `device` and fill them from `folder`'s safetensors.

    Works on a plain module and on one sharded by FSDP2 (DTensor parameters: each rank
    keeps its own slice). Returns the number of tensors loaded. Tied weights (an LM head
    sharing the embedding) are re-tied on plain modules and loaded from their source key.
    """
    from safetensors import safe_open

    buffers = {name: buf.detach().clone() for name, buf in model.named_buffers() if not buf.is_meta}
    model.to_empty(device=device)
    for name, value in buffers.items():
        model.get_buffer(name).copy_(value)
    hf = getattr(model, "hf", model)
    if hasattr(hf, "tie_weights") and not _is_sharded(model):
        hf.tie_weights()

    prefix = "hf." if hasattr(model, "hf") else ""
    targets = {name[len(prefix):]: tensor for name, tensor in model.state_dict(keep_vars=True).items()
               if name.startswith(prefix) and name[len(prefix):] not in _buffer_names(model, prefix)}
    files = weight_files(folder)
    loaded: set[str] = set()
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():
                if key not in targets:
                    continue
                _copy_into(targets[key], handle.get_tensor(key))
                loaded.add(key)
    for target, source in _tied_keys(hf).items():
        if target in targets and target not in loaded and source in loaded:
            if targets[target] is not targets[source]:
                targets[target].copy_(targets[source])
            loaded.add(target)
    missing = sorted(set(targets) - loaded)
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise UserError(f"model.pretrained: {folder} has no weights for {shown}")
    return len(loaded)


def _copy_into(target: torch.Tensor, full: torch.Tensor) -> None:
    """Copy a full tensor into a parameter, or into this rank's shard of a DTensor parameter."""
    if tuple(full.shape) != tuple(target.shape):
        raise UserError(f"model.pretrained: a weight of shape {tuple(full.shape)} does not fit {tuple(target.shape)}")
    full = full.to(dtype=target.dtype)
    if hasattr(target, "device_mesh"):
        from torch.distributed.tensor import distribute_tensor

        # src_data_rank=None: every rank slices its own part, no scatter.
        local = distribute_tensor(full, target.device_mesh, target.placements, src_data_rank=None).to_local()
        target.to_local().copy_(local)
    else:
        target.copy_(full)


def _is_sharded(model: nn.Module) -> bool:
    return any(hasattr(p, "device_mesh") for p in model.parameters())


def _buffer_names(model: nn.Module, prefix: str) -> set[str]:
    return {name[len(prefix):] for name, _ in model.named_buffers()}


def _tied_keys(hf: nn.Module) -> dict[str, str]:
    """{tied key: its source key} for a model whose config ties the embeddings."""
    config = getattr(hf, "config", None)
    if not getattr(config, "tie_word_embeddings", False):
        return {}
    tied = getattr(hf, "_tied_weights_keys", None) or {}
    if isinstance(tied, dict):
        return dict(tied)
    return {key: "model.embed_tokens.weight" for key in tied}
