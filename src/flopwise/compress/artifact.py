"""Writing a compressed model to disk and loading it back with one call.

A compressed model is a folder:

- `compressed.json`: what it is (method, backend, format) and how to rebuild it;
- `model.pt2` for INT8 graphs: a `torch.export` program holding int8 weights and the
  q/dq graph (PT2E's native format), or `model.safetensors` for float / pruned weights,
  stored dense with the zeros in place plus a `sparsity_config` in the metadata
  (`sparsity_layout.py`: the standard layout any safetensors reader understands). Folders
  written before that stored zeros as a 1-bit mask (`.__mask__` keys); they still load;
- `config.yaml` for language models (to rebuild the architecture); `report.*`.

`compressed.json` also records the SHA-256 of the files above and this user's signature
(flopwise.compress.artifact_trust); `load_compressed` checks both before reading a byte
of the model, because `torch.export.load` unpickles.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from torch import nn

from flopwise.compress.artifact_trust import seal, verify
from flopwise.errors import UserError

MANIFEST = "compressed.json"
MASK_SUFFIX = ".__mask__"
# A 1-bit mask costs 1/32 of fp32; below this zero fraction, dense is smaller.
MIN_SPARSE_FRACTION = 0.05


def sparse_state_dict(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Bitmask + non-zero values for tensors with enough zeros; dense for the rest. Also the shapes (metadata)."""
    tensors, metadata = {}, {}
    for name, tensor in state.items():
        tensor = tensor.detach().contiguous()
        zeros = float((tensor == 0).sum()) / max(tensor.numel(), 1)
        if tensor.is_floating_point() and tensor.numel() >= 64 and zeros >= MIN_SPARSE_FRACTION:
            mask = (tensor != 0).flatten()
            tensors[name] = tensor.flatten()[mask].clone()
            tensors[name + MASK_SUFFIX] = torch.from_numpy(np.packbits(mask.numpy()))
            metadata[name] = json.dumps(list(tensor.shape))
        else:
            tensors[name] = tensor.clone()
    return tensors, metadata


def dense_state_dict(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> dict[str, torch.Tensor]:
    """Inverse of `sparse_state_dict`."""
    state = {}
    for name, tensor in tensors.items():
        if name.endswith(MASK_SUFFIX):
            continue
        if name in metadata:
            shape = json.loads(metadata[name])
            numel = int(np.prod(shape))
            bits = np.unpackbits(tensors[name + MASK_SUFFIX].numpy(), count=numel).astype(bool)
            dense = torch.zeros(numel, dtype=tensor.dtype)
            dense[torch.from_numpy(bits)] = tensor
            state[name] = dense.reshape(shape)
        else:
            state[name] = tensor
    return state


def save_compressed(out: Path, model: nn.Module, *, manifest: dict, example: torch.Tensor, files: dict | None = None) -> Path:
    """Write `model` in the format named by manifest["format"] ("pt2" or "safetensors") plus the manifest."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in (files or {}).items():
        (out / name).write_text(text, encoding="utf-8")
    if manifest["format"] == "pt2":
        from flopwise.compress.export_shapes import dynamic_shapes

        program = torch.export.export(model, (example,), dynamic_shapes=dynamic_shapes(example))
        torch.export.save(program, str(out / "model.pt2"))
        weights = out / "model.pt2"
    else:
        from flopwise.compress.sparsity_layout import dense_tensors, metadata

        save_file(dense_tensors(model.state_dict()), str(out / "model.safetensors"),
                  metadata=metadata(manifest.get("sparsity_config")))
        weights = out / "model.safetensors"
    manifest = {**manifest, "example_shape": list(example.shape), "example_dtype": str(example.dtype).removeprefix("torch.")}
    manifest = seal(out, manifest, [weights.name, *(files or {})])
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    return weights


def rebuild_float_model(path: Path, rebuild: dict) -> nn.Module:
    """The untrained float architecture described by a manifest's `rebuild` entry."""
    if rebuild["task"] == "lm":
        from flopwise.config.loading import load_config
        from flopwise.train.model import build_model

        return build_model(load_config(path / "config.yaml").model, rebuild["vocab_size"])
    from flopwise.compress.models import build_network

    return build_network(rebuild["task"], **rebuild.get("network_kwargs", {}))


def register_quantized_ops() -> None:
    """Register the `quantized_decomposed` q/dq operators a PT2E INT8 graph calls.

    PT2E (torchao) registers them as a side effect of its own imports; a fresh process that
    only loads a saved graph has not imported it, and deserialization fails with
    "quantized_decomposed.dequantize_per_channel ... not registered". This torch module
    defines them (no torchao needed to run the graph).
    """
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers the ops on import)


def load_compressed(path: str | Path, compile: bool = False, trust: bool = False) -> nn.Module:
    """Load a model written by `flopwise compress` for inference.

    INT8 graphs come back as the exported q/dq program (correct in eager mode);
    `compile=True` also runs it through Inductor with freezing to get the INT8 kernels
    (call it under torch.no_grad()). Pruned / 2:4 models come back as ordinary float
    modules with the zeros in place.

    Trust boundary: the folder's files must match the SHA-256 recorded at save time, and
    the record must carry this user's signature; `trust=True` accepts a folder written
    elsewhere (its hashes are still checked when present). Loading a `.pt2` can run code
    stored in it, so pass `trust=True` only for sources you would run code from.
    """
    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.exists():
        raise UserError(f"{path}: not a compressed model folder (no {MANIFEST})")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{manifest_path}: not valid JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") not in ("pt2", "safetensors"):
        raise UserError(f"{manifest_path}: 'format' must be 'pt2' or 'safetensors'")
    verify(path, manifest, trust=trust)
    if manifest["format"] == "pt2":
        register_quantized_ops()
        model = torch.export.load(str(path / "model.pt2")).module()
    else:
        from safetensors import safe_open

        with safe_open(str(path / "model.safetensors"), framework="pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}
        model = rebuild_float_model(path, manifest["rebuild"])
        model.load_state_dict(dense_state_dict(tensors, metadata))
        model.eval()
        requantize = manifest.get("requantize")
        if requantize:
            from flopwise.compress.quantize import quantize_dynamic

            example = torch.zeros(manifest["example_shape"], dtype=getattr(torch, manifest["example_dtype"]))
            model = quantize_dynamic(model, example, requantize)
    if compile:
        from flopwise.compress.quantize import compile_for_cpu

        model = compile_for_cpu(model)
    return model
