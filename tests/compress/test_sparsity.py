"""flopwise.compress.sparsity: exact 2:4 patterns."""

import copy

import torch

from flopwise.compress import sparsity
from flopwise.compress.prune import make_permanent


def test_mask_keeps_exactly_two_of_every_four_along_the_input_dim():
    weight = torch.randn(16, 32)
    mask = sparsity.two_four_mask(weight)
    groups = mask.reshape(16, 8, 4)
    assert bool((groups.sum(-1) == 2).all())
    kept = (weight.abs() * mask).reshape(16, 8, 4)
    dropped = (weight.abs() * (1 - mask)).reshape(16, 8, 4)
    assert bool((dropped.max(-1).values <= kept.max(-1).values).all())


def test_model_gets_two_four_in_every_eligible_linear_and_keeps_it_after_finetuning(mlp_task):
    from flopwise.compress.finetune import finetune

    model = copy.deepcopy(mlp_task.model)
    skipped = sparsity.apply_two_four(model)
    finetune(model.train(), mlp_task, steps=5, lr=1e-2, batch_size=16)
    make_permanent(model)
    eligible, _ = sparsity.two_four_layers(model)
    assert eligible and skipped == []
    for name, module in eligible:
        groups = module.weight.detach().reshape(module.out_features, -1, 4)
        assert bool(((groups == 0).sum(-1) == 2).all()), name
        assert sparsity.is_two_four(module.weight)


def test_layers_with_input_dim_not_divisible_by_four_are_skipped():
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Linear(8, 4))
    assert sparsity.apply_two_four(model) == ["0"]


def test_cpu_says_masks_and_quality_only():
    if torch.cuda.is_available():
        return
    supported, reason = sparsity.semi_structured_supported()
    assert not supported and "quality only" in reason
    assert sparsity.accelerate_two_four(torch.nn.Linear(2048, 2048)) == []
