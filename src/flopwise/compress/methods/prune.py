"""Unstructured magnitude pruning: layer-wise or global, one-shot or gradual, then made permanent.

The masks and schedules are `compress/prune.py` (Zhu & Gupta's cubic schedule for `gradual`);
fine-tuning keeps pruned weights at zero. Saved dense with the zeros in place and a
compressed-tensors `sparsity_config`: no speed-up with dense kernels, and the report says so.
"""

from __future__ import annotations

import copy

from flopwise.compress.methods.model_flow import ModelMethod, finetune_with_masks
from flopwise.errors import UserError


def refuse(cfg, where: str) -> None:
    """A gradual schedule raises the sparsity during fine-tuning, so it needs fine-tuning steps."""
    if cfg.schedule == "gradual" and cfg.finetune_steps == 0:
        raise UserError(f"{where}: compress.schedule: gradual pruning needs compress.finetune_steps > 0 (or schedule: oneshot)")


def magnitude_prune(task, cfg, backend: str):
    """The pruned copy of `task.model` (masks folded in), with the achieved sparsity per layer."""
    from flopwise.compress import prune

    model = copy.deepcopy(task.model)
    details: dict = {"finetune_steps": cfg.finetune_steps}
    refuse(cfg, "compress settings")  # settings built without parse_compress_config
    details.update(target_sparsity=cfg.sparsity, scope=cfg.scope, schedule=cfg.schedule)
    if cfg.schedule == "gradual":
        points = prune.gradual_points(cfg.finetune_steps)

        def raise_sparsity(step: int) -> None:
            # the ramp ends at the last mask update, so fine-tuning after it sees the final sparsity
            if step in points:
                prune.prune_to(model, prune.cubic_sparsity(step, points[-1], cfg.sparsity), cfg.scope)

        finetune_with_masks(model, task, cfg, before_step=raise_sparsity)
        prune.prune_to(model, cfg.sparsity, cfg.scope)
    else:
        prune.prune_to(model, cfg.sparsity, cfg.scope)
        if cfg.finetune_steps:
            finetune_with_masks(model, task, cfg)
    prune.make_permanent(model)
    details["note"] = ("unstructured sparsity: no speed-up with dense kernels; saved dense with zeros "
                       "and a sparsity_config (compressed-tensors fields)")
    model.eval()
    details["sparsity"] = prune.sparsity_by_layer(model)
    return model, details


METHOD = ModelMethod(
    name="prune",
    summary="unstructured magnitude pruning, one-shot or gradual (torch.nn.utils.prune), saved dense with zeros",
    apply=magnitude_prune,
    sparsity_structure="unstructured",
    refuse=refuse,
)
