"""Activation offload: same loss and gradients; what the device keeps for backward shrinks as the planner says."""

import copy

import pytest
import torch

from flopwise.config.loading import load_config
from flopwise.config.schema import ModelConfig
from flopwise.errors import UserError
from flopwise.train.model import build_model
from flopwise.train.techniques.activation_checkpointing import apply_activation_checkpointing
from flopwise.train.techniques.activation_offload import apply_activation_offload, offloaded_block_count
from tests.train.techniques.fsdp_equivalence import run_fsdp_equivalence

VOCAB = 61


def tiny(**overrides) -> ModelConfig:
    return ModelConfig(**{**dict(kind="llama", n_layers=4, hidden=32, n_heads=4, max_seq_len=16), **overrides})


def loss_and_grads(model, ids):
    loss = torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def outer_saved_bytes(model, ids) -> int:
    """Bytes an outer saved-tensor hook sees, as the trainer's meter does: an offloaded block's own
    (innermost) hook takes its tensors, so they are not kept where the meter looks."""
    total = 0

    def pack(tensor):
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(ids).sum().backward()
    return total


@pytest.mark.parametrize("setting, checkpoint", [("all", False), (2, False), ("all", True)])
def test_offloaded_blocks_give_the_same_loss_and_gradients(setting, checkpoint):
    torch.manual_seed(0)
    plain = build_model(tiny(), VOCAB)
    offloaded = copy.deepcopy(plain)
    if checkpoint:
        apply_activation_checkpointing(offloaded, True)
    assert apply_activation_offload(offloaded, setting) == (4 if setting == "all" else 2)
    ids = torch.randint(0, VOCAB, (2, 16))
    loss_a, grads_a = loss_and_grads(plain, ids)
    loss_b, grads_b = loss_and_grads(offloaded, ids)
    torch.testing.assert_close(loss_a, loss_b)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-5, atol=1e-7, msg=name)


def test_the_device_keeps_only_what_the_blocks_left_on_it():
    torch.manual_seed(0)
    model = build_model(tiny(), VOCAB)
    ids = torch.randint(0, VOCAB, (2, 16))
    before = outer_saved_bytes(model, ids)
    half = copy.deepcopy(model)
    apply_activation_offload(half, 2)
    apply_activation_offload(model, "all")
    assert apply_activation_offload(model, "all") == 4  # applied again: nothing more changes
    after_half, after_all = outer_saved_bytes(half, ids), outer_saved_bytes(model, ids)
    blocks = before - after_all  # what all four blocks saved; the embedding and head keep the rest
    assert 0 < after_all < before / 2
    assert after_half == pytest.approx(before - blocks / 2, rel=0.01)


def test_a_deep_copy_runs_its_own_blocks():
    model = build_model(tiny(), VOCAB)
    apply_activation_checkpointing(model, 1)
    apply_activation_offload(model, "all")
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.parameters():
            p.zero_()
    ids = torch.randint(0, VOCAB, (1, 8))
    assert twin(ids).abs().sum() == 0 and model(ids).abs().sum() > 0


def test_counts_and_config_errors():
    assert offloaded_block_count("all", 6) == 6 and offloaded_block_count(9, 6) == 6
    with pytest.raises(UserError, match="training.offload_activations"):
        offloaded_block_count(-1, 6)
    with pytest.raises(UserError, match="offload_activations"):
        load_config(None, ["training.offload_activations=-2"])
    with pytest.raises(UserError, match="offload_activations"):
        load_config(None, ["training.offload_activations=some"])
    assert load_config(None, ["training.offload_activations=all"]).training.offload_activations == "all"


def test_a_config_plans_its_offload():
    """`plan --config` (and every run's plan.json) reads the setting: the device's activations drop."""
    from flopwise.catalog.hardware import get_hardware
    from flopwise.config.resolve import resolve_run
    from flopwise.plan.from_config import runspec_from_config
    from flopwise.plan.planner import plan

    def planned(*extra):
        cfg = load_config(None, ["model.n_layers=8", "data.seq_len=256", *extra])
        return plan(runspec_from_config(cfg, resolve_run(cfg, processes=1), get_hardware("h100"), vocab_size=32000))

    plain, offloaded = planned(), planned("training.offload_activations=all")
    assert offloaded.spec.layout.offload_activations >= 8
    assert offloaded.memory.activations < plain.memory.activations
    assert offloaded.memory.cpu_offload_bytes > 0 and offloaded.time.offload_seconds > 0


@pytest.mark.slow
@pytest.mark.distributed
def test_offload_composes_with_fsdp2_applied_afterwards(tmp_path):
    run_fsdp_equivalence(tmp_path, ["apply_activation_checkpointing(model, 2)", "apply_activation_offload(model, 'all')"],
                         "torch.testing.assert_close(loss_a, loss_b)")
