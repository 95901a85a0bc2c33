"""flopwise.compress.prune: exact sparsity, schedules, permanence."""

import copy

import pytest
import torch
from torch.nn.utils import prune as torch_prune

from flopwise.compress import prune


def test_layerwise_pruning_hits_the_fraction_in_every_layer(mlp_task):
    model = copy.deepcopy(mlp_task.model)
    prune.prune_to(model, 0.6, "layer")
    prune.make_permanent(model)
    report = prune.sparsity_by_layer(model)
    for name, layer in report["layers"].items():
        assert layer["zeros"] == round(0.6 * layer["numel"]), name
    assert report["overall"] == pytest.approx(0.6, abs=1e-3)


def test_global_pruning_hits_the_fraction_overall_not_per_layer(mlp_task):
    model = copy.deepcopy(mlp_task.model)
    prune.prune_to(model, 0.6, "global")
    prune.make_permanent(model)
    report = prune.sparsity_by_layer(model)
    assert report["zeros"] == round(0.6 * report["numel"])
    per_layer = [layer["sparsity"] for layer in report["layers"].values()]
    assert max(per_layer) - min(per_layer) > 0.01  # global magnitude picks different rates per layer


def test_pruned_weights_are_the_smallest_magnitudes(mlp_task):
    model = copy.deepcopy(mlp_task.model)
    original = model.blocks[0].up.weight.detach().clone()
    prune.prune_to(model, 0.5, "layer")
    prune.make_permanent(model)
    kept = model.blocks[0].up.weight != 0
    assert original.abs()[~kept].max() <= original.abs()[kept].min()


def test_make_permanent_removes_the_reparametrisation(mlp_task):
    model = copy.deepcopy(mlp_task.model)
    prune.prune_to(model, 0.3)
    assert hasattr(model.stem, "weight_orig")
    prune.make_permanent(model)
    assert not hasattr(model.stem, "weight_orig") and not hasattr(model.stem, "weight_mask")
    assert isinstance(model.stem.weight, torch.nn.Parameter)


def test_cubic_schedule_starts_at_initial_ends_at_final_and_rises():
    values = [prune.cubic_sparsity(t, 100, 0.6) for t in range(0, 101, 10)]
    assert values[0] == 0.0 and values[-1] == pytest.approx(0.6)
    assert all(a <= b for a, b in zip(values, values[1:]))
    assert values[1] - values[0] > values[-1] - values[-2]  # fast early, slow late (Zhu & Gupta)


def test_rising_targets_never_revive_pruned_weights(mlp_task):
    model = copy.deepcopy(mlp_task.model)
    prune.prune_to(model, 0.3)
    zeros_before = prune.make_permanent(model).stem.weight == 0
    prune.prune_to(model, 0.5)
    prune.make_permanent(model)
    assert bool((model.stem.weight[zeros_before] == 0).all())


def test_masks_hold_during_finetuning(mlp_task):
    from flopwise.compress.finetune import finetune

    model = copy.deepcopy(mlp_task.model)
    prune.prune_to(model, 0.6)
    finetune(model.train(), mlp_task, steps=5, lr=1e-2, batch_size=16)
    prune.make_permanent(model)
    assert prune.sparsity_by_layer(model)["overall"] == pytest.approx(0.6, abs=1e-3)
    assert not any(isinstance(h, torch_prune.BasePruningMethod) for m in model.modules() for h in m._forward_pre_hooks.values())
