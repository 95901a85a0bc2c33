"""Unstructured magnitude pruning: layer-wise or global, one-shot or gradual, then made permanent.

Masks are `torch.nn.utils.prune` masks (weight = weight_orig * mask), so fine-tuning
between pruning steps cannot revive a pruned weight. Unstructured sparsity gives NO
speed-up with dense kernels: the zeros are still multiplied. What shrinks is the file,
when it is written in a sparse format (see `flopwise.compress.artifact`).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils import prune


def prunable_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Linear and Conv weights, except a Linear whose weight is tied to an embedding (pruning it prunes the input too)."""
    embedding_weights = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    layers = []
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d)):
            weight = getattr(module, "weight_orig", module.weight)
            if id(weight) not in embedding_weights:
                layers.append((name, module))
    return layers


def cubic_sparsity(step: int, total_steps: int, final: float, initial: float = 0.0) -> float:
    """Sparsity target at `step` of a gradual schedule.

    Zhu & Gupta 2017, "To prune, or not to prune" (arXiv:1710.01878), eq. 1:
    s_t = s_f + (s_i - s_f) * (1 - t / T)^3 — prune fast early, slowly near the end.
    """
    if total_steps <= 0:
        return final
    progress = min(max(step / total_steps, 0.0), 1.0)
    return final + (initial - final) * (1.0 - progress) ** 3


def prune_to(model: nn.Module, sparsity: float, scope: str = "layer") -> None:
    """Set masks so `sparsity` of the prunable weights (per layer, or over all of them) are zero.

    Already-pruned weights are folded in first; as they have magnitude 0 they are the first
    ones chosen again, so repeated calls with rising targets implement a gradual schedule.
    """
    layers = prunable_layers(model)
    make_permanent(model)
    if scope == "global":
        prune.global_unstructured([(m, "weight") for _, m in layers], pruning_method=prune.L1Unstructured, amount=sparsity)
    else:
        for _, module in layers:
            prune.l1_unstructured(module, "weight", amount=sparsity)


def make_permanent(model: nn.Module) -> nn.Module:
    """Fold every pruning mask into its weight (weight_orig * mask) and drop the re-parametrisation."""
    for module in model.modules():
        for hook in list(module._forward_pre_hooks.values()):
            if isinstance(hook, prune.BasePruningMethod):
                prune.remove(module, hook._tensor_name)
    return model


def sparsity_by_layer(model: nn.Module) -> dict:
    """Achieved fraction of exact zeros per prunable layer and over all of them."""
    per_layer = {}
    zeros = total = 0
    for name, module in prunable_layers(model):
        weight = module.weight.detach()
        layer_zeros = int((weight == 0).sum())
        per_layer[name] = {"zeros": layer_zeros, "numel": weight.numel(), "sparsity": layer_zeros / weight.numel()}
        zeros += layer_zeros
        total += weight.numel()
    return {"overall": zeros / max(total, 1), "zeros": zeros, "numel": total, "layers": per_layer}


def gradual_points(total_steps: int, n_points: int = 10) -> list[int]:
    """Steps at which the gradual schedule raises the sparsity (the mask update frequency Δt of Zhu & Gupta)."""
    n_points = max(1, min(n_points, total_steps))
    return sorted({round(i * total_steps / n_points) for i in range(n_points)})


@torch.no_grad()
def zero_fraction(tensor: torch.Tensor) -> float:
    """Fraction of exact zeros in a tensor."""
    return float((tensor == 0).sum()) / max(tensor.numel(), 1)
