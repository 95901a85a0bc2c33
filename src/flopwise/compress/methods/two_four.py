"""2:4 semi-structured sparsity: two of every four consecutive input weights set to zero.

Fixed masks keep the two largest |w| of each group (`compress/sparsity.py`), optional
fine-tuning recovers quality; on a CUDA GPU with Sparse Tensor Cores, eligible layers move
to `to_sparse_semi_structured`. On a CPU no kernel exploits 2:4, and the report says so.
"""

from __future__ import annotations

import copy

from flopwise.compress.methods.model_flow import ModelMethod, finetune_with_masks


def two_four(task, cfg, backend: str):
    """The 2:4-masked copy of `task.model` (masks folded in), with the layers skipped and the kernel available."""
    from flopwise.compress import prune, sparsity

    model = copy.deepcopy(task.model)
    details: dict = {"finetune_steps": cfg.finetune_steps}
    skipped = sparsity.apply_two_four(model)
    if cfg.finetune_steps:
        finetune_with_masks(model, task, cfg)
    prune.make_permanent(model)
    _, reason = sparsity.semi_structured_supported()
    details.update(skipped_layers=skipped, kernel=reason)
    model.eval()
    details["sparsity"] = prune.sparsity_by_layer(model)
    return model, details


def accelerate(model) -> list:
    """Names of the layers stored in the compressed 2:4 format (none without a capable GPU)."""
    from flopwise.compress.sparsity import accelerate_two_four

    return accelerate_two_four(model)


METHOD = ModelMethod(
    name="2:4",
    summary="2:4 semi-structured sparsity (fixed masks, optional fine-tuning; to_sparse_semi_structured on capable GPUs)",
    apply=two_four,
    sparsity_structure="2:4",
    accelerate=accelerate,
)
