"""How pruned and 2:4 weights are stored: the standard dense layout plus sparsity metadata.

Weights are saved dense, zeros in place, so any safetensors reader (transformers, vLLM,
torchao, plain `safetensors.torch.load_file`) reads them without flopwise. What the
zeros mean is stated in a `sparsity_config` with the fields compressed-tensors uses in a
model's config.json (`format: dense`, `sparsity_structure`, `global_sparsity`, `targets`,
`ignore`), kept in the safetensors metadata and in `compressed.json`. The file is as large
as the float one: the saving is in what a sparse kernel or a compressor can do with it.
"""

from __future__ import annotations

import json

import torch

METADATA_KEY = "sparsity_config"


def sparsity_config(structure: str, details: dict) -> dict:
    """compressed-tensors' SparsityCompressionConfig fields for a pruned ("unstructured") or "2:4" model."""
    layers = details.get("sparsity", {}).get("layers", {})
    return {
        "format": "dense",
        "sparsity_structure": structure,
        "global_sparsity": float(details.get("sparsity", {}).get("overall", 0.0)),
        "targets": sorted(layers),
        "ignore": list(details.get("skipped_layers", [])),
    }


def dense_tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every tensor contiguous and owning its memory (safetensors refuses shared storage)."""
    return {name: tensor.detach().contiguous().clone() for name, tensor in state.items()}


def metadata(config: dict | None) -> dict[str, str]:
    """The safetensors metadata entry for `config` (none for unsparsified models)."""
    return {METADATA_KEY: json.dumps(config, sort_keys=True)} if config else {}
