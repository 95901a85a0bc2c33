"""8-bit activation compression: ~4x fewer saved bytes for fp32, close gradients, training still learns.

Tolerances (measured on these tiny models: ~0.5% whole-gradient error, <1% per tensor):
the whole gradient vector's relative L2 error < 2% and cosine similarity > 0.999; each
parameter's gradient within 3% relative L2 error. Attention key biases are excluded per
tensor: softmax is shift-invariant, so their exact gradient is 0 and only rounding is left.
"""

import contextlib

import pytest
import torch
from torch import nn

from flopwise.train.techniques.activation_compression import (
    Int8Tensor,
    activation_compression_context,
    dequantize_int8,
    int8_saved_activations,
    is_weight,
    quantize_int8,
)
from flopwise.train.techniques.activation_checkpointing import apply_activation_checkpointing
from flopwise.config.precision import precision_of
from flopwise.config.schema import ModelConfig
from flopwise.train.model import build_model
from flopwise.train.techniques.precision import autocast_context

VOCAB = 100


def tiny(kind="llama") -> ModelConfig:
    return ModelConfig(kind=kind, n_layers=2, hidden=64, n_heads=4, max_seq_len=32)


def gradients(model, ids, context):
    model.zero_grad()
    with context as stats:
        loss = nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}, stats


def test_round_trip_error_is_at_most_half_a_step_per_row():
    torch.manual_seed(0)
    x = torch.randn(6, 50) * torch.arange(1, 7).unsqueeze(1)
    x[2] = 0.0
    packed = quantize_int8(x)
    assert packed.values.dtype == torch.int8 and packed.scales.shape == (6, 1)
    restored = dequantize_int8(packed)
    assert restored.shape == x.shape and restored.dtype == x.dtype
    step = x.abs().amax(dim=1, keepdim=True) / 127
    assert ((restored - x).abs() <= step / 2 + 1e-6).all()
    assert torch.equal(restored[2], torch.zeros(50))
    per_tensor = quantize_int8(x, per_row=False)
    assert per_tensor.scales.numel() == 1


def test_fp32_activations_are_stored_in_about_a_quarter_of_the_bytes():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))
    x = torch.randn(64, 256, requires_grad=True)
    with int8_saved_activations(min_numel=1024) as stats:
        mlp(x).sum().backward()
    assert stats.tensors_compressed >= 3  # x, the pre-GELU and post-GELU activations
    assert 3.9 < stats.ratio <= 4.0  # int8 + one fp32 scale per row of 256/1024 values


def test_bf16_activations_are_stored_in_about_half_the_bytes():
    mlp = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))
    with autocast_context(precision_of("bf16"), "cpu"), int8_saved_activations(min_numel=1024) as stats:
        mlp(torch.randn(64, 256)).float().sum().backward()
    assert 1.8 < stats.ratio <= 2.0


def test_built_in_model_saves_several_times_fewer_activation_bytes():
    torch.manual_seed(0)
    model = build_model(tiny(), VOCAB)
    ids = torch.randint(0, VOCAB, (4, 32))
    *_, stats = gradients(model, ids, int8_saved_activations(min_numel=1024))
    assert stats.ratio > 3.3  # small tensors (norm statistics, ids) stay as they are


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
@pytest.mark.parametrize("mode", ["fp32", "bf16"])
def test_gradients_stay_close_to_the_uncompressed_ones(kind, mode):
    torch.manual_seed(0)
    model = build_model(tiny(kind), VOCAB)
    ids = torch.randint(0, VOCAB, (4, 32))
    with autocast_context(precision_of(mode), "cpu"):
        loss_a, exact, _ = gradients(model, ids, contextlib.nullcontext())
        loss_b, approx, stats = gradients(model, ids, int8_saved_activations(min_numel=1024))
    assert stats.tensors_compressed > 10
    assert torch.equal(loss_a, loss_b)  # the forward pass is untouched
    flat_exact = torch.cat([g.flatten() for g in exact.values()])
    flat_approx = torch.cat([g.flatten() for g in approx.values()])
    assert (flat_approx - flat_exact).norm() / flat_exact.norm() < 0.02
    assert nn.functional.cosine_similarity(flat_exact, flat_approx, dim=0) > 0.999
    for name in exact:
        if name.endswith("wk.bias"):
            continue
        error = (approx[name] - exact[name]).norm() / exact[name].norm()
        assert error < 0.03, (name, error.item())


def train(model, ids, steps, context_factory):
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(steps):
        loss, _, _ = gradients(model, ids, context_factory())
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_training_loss_still_falls_with_compression():
    ids = torch.randint(0, VOCAB, (4, 32), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    compressed = train(build_model(tiny(), VOCAB), ids, 25, lambda: int8_saved_activations(min_numel=1024))
    torch.manual_seed(0)
    plain = train(build_model(tiny(), VOCAB), ids, 25, contextlib.nullcontext)
    assert compressed[-1] < 0.6 * compressed[0]
    assert abs(compressed[-1] - plain[-1]) < 0.05 * plain[-1]


def test_weights_small_and_integer_tensors_are_left_alone():
    weight = nn.Parameter(torch.randn(64, 64))
    assert is_weight(weight) and is_weight(weight.t()) and is_weight(weight.to(torch.bfloat16))
    x = torch.randn(64, 64, requires_grad=True)
    assert not is_weight(x @ weight)
    assert not is_weight(x) and not is_weight(x.t())  # an input that wants a gradient is not a weight
    assert not is_weight(torch.randn(3, 3))  # data without grad is an activation

    with int8_saved_activations(min_numel=1024) as stats:
        layer = nn.Linear(64, 64)
        out = layer(torch.randn(8, 64, requires_grad=True))  # 512 values: under min_numel
        emb = nn.Embedding(10, 64)(torch.randint(0, 10, (32,)))  # saves int64 ids
        (out.sum() + emb.sum()).backward()
    assert stats.tensors_compressed == 0
    assert stats.original_bytes == stats.stored_bytes > 0


def test_non_finite_activations_still_reach_the_gradients():
    layer = nn.Linear(8, 4096)
    x = torch.randn(2, 8, requires_grad=True)
    with int8_saved_activations(min_numel=16):
        h = layer(x)
        h = h * torch.tensor(float("inf")).where(torch.arange(4096) == 3, torch.tensor(1.0))
        out = torch.tanh(h).pow(2).sum()
    out.backward()
    assert not torch.isfinite(x.grad).all()


def test_composes_with_activation_checkpointing():
    torch.manual_seed(0)
    model = build_model(tiny(), VOCAB)
    ids = torch.randint(0, VOCAB, (4, 32))
    _, exact, _ = gradients(model, ids, contextlib.nullcontext())
    apply_activation_checkpointing(model, 2)
    _, approx, stats = gradients(model, ids, int8_saved_activations(min_numel=1024))
    assert stats.tensors_compressed > 0
    for name in exact:
        if not name.endswith("wk.bias"):
            assert (approx[name] - exact[name]).norm() / exact[name].norm() < 0.03, name


def test_config_switch():
    with activation_compression_context("none") as stats:
        nn.Linear(64, 64)(torch.randn(64, 64)).sum().backward()
    assert stats.tensors_seen == 0
    with activation_compression_context("int8", min_numel=16) as stats:
        nn.Linear(64, 64)(torch.randn(64, 64)).sum().backward()
    assert stats.tensors_compressed == 1
    packed = quantize_int8(torch.randn(4, 4))
    assert isinstance(packed, Int8Tensor) and packed.nbytes == 16 + 4 * 4


def test_pack_and_unpack_pair_for_other_saved_tensor_hooks():
    from flopwise.train.techniques.activation_compression import pack_int8, unpack_int8

    x = torch.randn(128, 64)
    packed = pack_int8(x)
    held = [t for t in packed if isinstance(t, torch.Tensor)]  # a tuple: meters can count what it holds
    assert sum(t.numel() * t.element_size() for t in held) == packed.nbytes == 128 * 64 + 128 * 4
    torch.testing.assert_close(unpack_int8(packed), x, rtol=0, atol=x.abs().max().item() / 254 + 1e-6)
    small = torch.randn(3)
    assert pack_int8(small) is small and unpack_int8(small) is small
    weight = nn.Parameter(torch.randn(128, 64))
    assert pack_int8(weight) is weight
