"""Activation checkpointing: same loss and gradients, fewer saved activations, composes with FSDP2."""

import json

import pytest
import torch

from flopwise.errors import UserError
from flopwise.train.techniques.activation_checkpointing import apply_activation_checkpointing, is_checkpointed
from flopwise.config.schema import ModelConfig
from flopwise.train.model import build_model, transformer_blocks
from tests.train.techniques.fsdp_equivalence import run_fsdp_equivalence

VOCAB = 61


def tiny(kind="llama", **overrides) -> ModelConfig:
    fields = dict(kind=kind, n_layers=4, hidden=32, n_heads=4, max_seq_len=16)
    fields.update(overrides)
    return ModelConfig(**fields)


def loss_and_grads(model, ids, seed=0):
    torch.manual_seed(seed)  # same dropout masks for both models
    logits = model(ids)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def saved_bytes(model, ids) -> int:
    """Bytes autograd keeps for backward during one forward pass."""
    total = 0

    def pack(tensor):
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(ids).sum().backward()
    return total


@pytest.mark.parametrize("kind, dropout", [("llama", 0.0), ("gpt2", 0.1)])
def test_checkpointed_model_gives_the_same_loss_and_gradients(kind, dropout):
    torch.manual_seed(0)
    plain = build_model(tiny(kind, dropout=dropout), VOCAB)
    checkpointed = build_model(tiny(kind, dropout=dropout), VOCAB)
    checkpointed.load_state_dict(plain.state_dict())
    assert apply_activation_checkpointing(checkpointed, True) == 4
    ids = torch.randint(0, VOCAB, (2, 16))

    loss_a, grads_a = loss_and_grads(plain, ids)
    loss_b, grads_b = loss_and_grads(checkpointed, ids)
    assert torch.equal(loss_a, loss_b)
    assert grads_a.keys() == grads_b.keys()  # parameter names are unchanged
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-5, atol=1e-7, msg=name)


def test_blocks_are_recomputed_and_fewer_activations_are_saved():
    torch.manual_seed(0)
    model = build_model(tiny(), VOCAB)
    ids = torch.randint(0, VOCAB, (2, 16))
    before = saved_bytes(model, ids)
    calls = []
    model.blocks[0].attn.wq.register_forward_hook(lambda *_: calls.append(1))
    apply_activation_checkpointing(model, 1)
    after = saved_bytes(model, ids)
    assert len(calls) == 2  # forward, then the recomputation in backward
    assert after < before / 2


def test_every_k_wraps_the_kth_blocks_only():
    model = build_model(tiny(n_layers=5), VOCAB)
    assert apply_activation_checkpointing(model, 2) == 2
    wrapped = [is_checkpointed(block) for block in model.blocks]
    assert wrapped == [False, True, False, True, False]
    assert apply_activation_checkpointing(model, 2) == 0  # already checkpointed
    assert transformer_blocks(model) is model.blocks


def test_a_deep_copy_recomputes_its_own_weights():
    import copy

    model = build_model(tiny(), VOCAB)
    apply_activation_checkpointing(model, 1)
    twin = copy.deepcopy(model)
    assert twin.blocks[0].forward.__self__ is twin.blocks[0]
    with torch.no_grad():
        for p in twin.parameters():
            p.zero_()
    ids = torch.randint(0, VOCAB, (1, 8))
    assert twin(ids).abs().sum() == 0 and model(ids).abs().sum() > 0


@pytest.mark.parametrize("off", [0, False])
def test_off_leaves_the_model_untouched(off):
    model = build_model(tiny(), VOCAB)
    keys = list(model.state_dict())
    assert apply_activation_checkpointing(model, off) == 0
    assert not any(is_checkpointed(m) for m in model.modules())
    assert list(model.state_dict()) == keys


def test_negative_period_is_a_user_error():
    with pytest.raises(UserError, match="training.gradient_checkpointing"):
        apply_activation_checkpointing(build_model(tiny(), VOCAB), -1)


def test_huggingface_layers_are_checkpointed(tmp_path):
    config = {
        "model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 32,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    cfg = ModelConfig(kind="hf", hf_config=tmp_path / "config.json")
    torch.manual_seed(0)
    plain = build_model(cfg, 64)
    checkpointed = build_model(cfg, 64)
    checkpointed.load_state_dict(plain.state_dict())
    assert apply_activation_checkpointing(checkpointed, True) == 2
    assert is_checkpointed(checkpointed.hf.model.layers[0])
    ids = torch.randint(0, 64, (2, 12))
    loss_a, grads_a = loss_and_grads(plain, ids)
    loss_b, grads_b = loss_and_grads(checkpointed, ids)
    torch.testing.assert_close(loss_a, loss_b)
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.slow
@pytest.mark.distributed
def test_checkpointing_composes_with_fsdp2_applied_afterwards(tmp_path):
    run_fsdp_equivalence(tmp_path, ["apply_activation_checkpointing(model, True)"],
                         "assert torch.equal(loss_a, loss_b)\nassert grads_a.keys() == grads_b.keys()")
