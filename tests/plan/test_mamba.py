"""Hybrid Mamba-2 / Transformer models (plan/mamba.py): NVIDIA Nemotron-H's sizes, Megatron's FLOPs, the
reduction of an attention/MLP pattern to the uniform block, and NeMo's recommended layouts."""

import dataclasses

import pytest

from flopwise.catalog.hardware import get_hardware
from flopwise.catalog.models import get_model
from flopwise.errors import UserError
from flopwise.plan import mamba, memory, ops
from flopwise.plan.flops import estimate_flops
from flopwise.plan.gemm import device_rates
from flopwise.plan.params import count_params
from flopwise.plan.planner import build_runspec, plan
from flopwise.plan.timing import tp_collectives_per_layer


def megatron_hybrid_flops_per_token(spec, seq_len: int) -> float:
    """Megatron-LM's model FLOPs of a hybrid model per token, written out from
    megatron/training/training.py (`hybrid_flops`, `mamba_layer_flops`, `attn_layer_flops`,
    `mlp_layer_flops`; commit d98e8a64) for one sequence of `seq_len` tokens, without MTP."""
    h, s = spec.hidden, seq_len
    pattern = spec.hybrid_pattern
    n_mamba, n_attn, n_mlp = pattern.count("M"), pattern.count("*"), pattern.count("-")
    # mamba_layer_flops: d_in = 2h, num_heads given
    d_in = 2 * h
    mamba_layer = (2 * s * h * (2 * d_in + 2 * spec.mamba_groups * spec.mamba_state + spec.mamba_heads)
                   + 7 * s * d_in * spec.mamba_state + 2 * s * d_in * h)
    # attn_layer_flops with kv_channels = hidden / heads (p = 1) and gqa groups g
    p = 1
    g = spec.n_kv_heads
    attn_layer = 4 * s * h * p * (h + h * (g / spec.n_heads)) + 2 * (s * s) * h * p
    # mlp_layer_flops: expansion = ffn / h, no swiglu
    mlp_layer = 4 * (spec.ffn_hidden / h) * s * h ** 2
    logits = 2 * s * h * spec.vocab_size
    forward = n_attn * attn_layer + n_mlp * mlp_layer + n_mamba * mamba_layer + logits
    return 3 * forward / s


NEMOTRON_H = ("nemotron-h-8b", "nemotron-h-47b", "nemotron-h-56b")


def test_nemotron_h_8b_counts_every_weight_of_megatrons_modules():
    spec = get_model("nemotron-h-8b")
    h, d, groups, state, heads = 4096, 8192, 8, 128, 128
    conv = d + 2 * groups * state
    mixer = h * (2 * d + 2 * groups * state + heads) + conv * 4 + conv + 3 * heads + d + d * h
    attention = h * 4096 + 2 * h * 1024 + 4096 * h
    mlp = 2 * h * 21504
    expected = 24 * mixer + 4 * attention + 24 * mlp + 52 * h + 2 * 131072 * h + h
    assert mamba.mixer_params(spec) == mixer
    assert count_params(spec).total == expected == 8_100_852_736


@pytest.mark.parametrize("key", NEMOTRON_H)
def test_nemotron_h_sizes_are_within_3_percent_of_their_names(key):
    spec = get_model(key)
    total = count_params(spec).total
    assert abs(total / spec.reported_params - 1) < 0.03  # 8.10B, 46.79B, 56.32B


@pytest.mark.parametrize("key", NEMOTRON_H)
def test_model_flops_are_megatrons_hybrid_flops_but_for_the_stated_conventions(key):
    spec = get_model(key)
    s = 8192
    pc = count_params(spec)
    flops = estimate_flops(spec, pc, s, "none", 1.0)
    megatron = megatron_hybrid_flops_per_token(spec, s)
    mix = mamba.layer_mix(spec)
    # the planner counts the attention scores over the whole s x s (Megatron halves them for the mask) ...
    causal_half = 3 * mix.attention * 2 * s * spec.n_heads * 128
    # ... and every weight at 6 FLOPs per token, norms and the Mamba mixer's conv1d, dt_bias, A_log, D too
    d, conv = mamba.inner_width(spec), mamba.conv_channels(spec)
    not_gemm = spec.n_layers * spec.hidden + spec.hidden + mix.mamba * (conv * 5 + 3 * spec.mamba_heads + d)
    assert flops.model_per_unit == pytest.approx(megatron + causal_half + 6 * not_gemm, rel=1e-12)
    assert flops.model_per_unit / megatron == pytest.approx(1.0, abs=0.02)


def test_the_scan_is_recomputed_with_full_recompute_and_not_with_selective():
    spec = get_model("nemotron-h-8b")
    pc = count_params(spec)
    none, full, selective = (estimate_flops(spec, pc, 8192, r, 1.0) for r in ("none", "full", "selective"))
    scan = 24 * 7 * 8192 * 128
    attention = 4 * 4 * 8192 * 4096
    assert full.hardware_per_unit - none.hardware_per_unit == pytest.approx(2 * full.matmul_params + attention + scan)
    assert selective.hardware_per_unit - none.hardware_per_unit == pytest.approx(attention)


def _uniform_as_hybrid(spec):
    """A uniform model written as Megatron's hybrid pattern: each block an attention layer and an MLP layer."""
    return dataclasses.replace(spec, key=spec.key + "-hybrid", n_layers=2 * spec.n_layers, norms_per_layer=1,
                               hybrid_pattern="*-" * spec.n_layers)


def test_an_attention_and_mlp_pattern_is_the_uniform_model():
    dense = get_model("llama3-8b")
    hybrid = _uniform_as_hybrid(dense)
    assert count_params(hybrid).total == count_params(dense).total
    pd, ph = count_params(dense), count_params(hybrid)
    for recompute in ("none", "full", "selective"):
        assert estimate_flops(hybrid, ph, 4096, recompute, 1.0) == estimate_flops(dense, pd, 4096, recompute, 1.0)
    hw = get_hardware("h100-sxm")
    for precision, recompute in (("bf16", "none"), ("fp8", "full"), ("bf16", "selective")):
        rates = device_rates(hw, precision, hw.peak_flops(precision))
        t_dense = ops.layer_times(dense, 4096, 1, 2, True, True, False, recompute, precision, rates)
        t_hybrid = ops.layer_times(hybrid, 4096, 1, 2, True, True, False, recompute, precision, rates)
        for name in ops.HYBRID_AVERAGED:  # the seconds fields (a dense model has no shared expert either)
            assert 2 * getattr(t_hybrid, name) == pytest.approx(getattr(t_dense, name), rel=1e-12), name
        assert t_hybrid.shared_up == t_dense.shared_up == (0.0, 0.0, 0.0)
    for flash in (True, False):
        terms_d = memory.activation_terms(dense, 4096, 2, 2.0, True, flash, gemm_input_bytes=1.0)
        terms_h = memory.activation_terms(hybrid, 4096, 2, 2.0, True, flash, gemm_input_bytes=1.0)
        for policy in ("none", "selective"):
            kept_d = memory.activation_bytes_per_layer(terms_d, 2, True, policy)
            kept_h = memory.activation_bytes_per_layer(terms_h, 2, True, policy)
            assert 2 * kept_h == pytest.approx(kept_d, rel=1e-12), policy
        # full recompute checkpoints every layer's input, the MLP layer's too: twice the uniform block's
        kept_d = memory.activation_bytes_per_layer(terms_d, 2, True, "full")
        assert memory.activation_bytes_per_layer(terms_h, 2, True, "full") == kept_d


def test_the_pattern_plans_as_the_uniform_model():
    hybrid = _uniform_as_hybrid(get_model("llama3-8b"))
    kwargs = dict(hardware="h100-sxm", gpus=16, tp=2, micro_batch=1, global_batch=64, seq_len=4096,
                  precision="bf16", stack="nemo", recompute="none")
    a = plan(build_runspec(model="llama3-8b", **kwargs))
    spec = build_runspec(model="llama3-8b", **kwargs)
    b = plan(dataclasses.replace(spec, model=hybrid))
    assert b.time.step_seconds == pytest.approx(a.time.step_seconds, rel=1e-9)
    assert b.memory.total_bytes == pytest.approx(a.memory.total_bytes, rel=1e-9)
    assert b.time.mfu == pytest.approx(a.time.mfu, rel=1e-9)


def test_a_mamba_layer_keeps_what_megatrons_mixer_saves():
    spec = get_model("nemotron-h-8b")
    only = dataclasses.replace(spec, hybrid_pattern="M" * spec.n_layers)
    sb, e, g = 8192 * 1, 2.0, 1.0
    terms = memory.activation_terms(only, 8192, 1, e, False, True, rmsnorm_saves_normalized=False,
                                    gemm_input_bytes=g)
    # pre-norm input + in_proj input (replicated); zxBCdt, out_x, the gated norm's input, out_proj's input
    assert terms.replicated == sb * (e * 4096 + g * 4096)
    assert terms.sharded == sb * (e * (18560 + 8192 + 8192) + g * 8192)
    assert terms.scores == terms.flash_stats == 0.0


def test_tensor_parallelism_splits_mamba_heads_and_groups_and_reduces_once_each_way():
    spec = get_model("nemotron-h-56b")
    assert tp_collectives_per_layer(spec) == (1, 1)
    one = mamba.ssd_products(spec, 8192, 1, 1)
    eight = mamba.ssd_products(spec, 8192, 1, 8)
    assert [c for *_, c in one] == [8 * c for *_, c in eight]
    with pytest.raises(UserError, match="Mamba heads"):
        plan(build_runspec(model="nemotron-h-56b", hardware="h100-sxm", gpus=64, tp=16, stack="nemo",
                           seq_len=8192, precision="fp8", global_batch=64))
    with pytest.raises(UserError, match="context parallelism"):
        plan(build_runspec(model="nemotron-h-8b", hardware="h100-sxm", gpus=8, cp=2, stack="nemo",
                           seq_len=8192, precision="fp8", global_batch=64))


# NeMo scripts/performance/recommended_model_configs/model_configs_h100.csv (commit 8cfedd72), nemotronh rows
NEMO_LAYOUTS = (("nemotron-h-8b", 8, 1, 128), ("nemotron-h-47b", 64, 8, 192), ("nemotron-h-56b", 64, 8, 192),
                ("nemotron-h-56b", 256, 8, 768))


@pytest.mark.parametrize("key,gpus,tp,gbs", NEMO_LAYOUTS)
def test_nemos_recommended_layouts_plan_and_fit(key, gpus, tp, gbs):
    """The rows recompute nothing (recompute_layers 0) and are planned so: each fits, or (the 8B) is
    tight, within the memory forecast's band, and kept as stated rather than given recompute."""
    result = plan(build_runspec(model=key, hardware="h100-sxm", stack="nemo", gpus=gpus, tp=tp, micro_batch=1,
                                global_batch=gbs, seq_len=8192, precision="fp8"))
    assert result.memory.may_fit and result.spec.layout.recompute == "none"
    assert 0.3 < result.time.mfu_16bit_peak < 0.9
    assert result.band.extrapolates and "hybrid Mamba layers never validated" in result.band.reasons
    # the scan and conv are there: a Mamba layer takes longer than its two GEMMs alone
    assert result.time.attention_seconds > 0


def test_a_pipeline_says_its_stages_hold_the_average_layer():
    result = plan(build_runspec(model="nemotron-h-56b", hardware="h100-sxm", stack="nemo", gpus=64, tp=4, pp=4,
                                micro_batch=1, global_batch=192, seq_len=8192, precision="fp8"))
    assert any("average layer" in w for w in result.warnings)


# Before hybrid layers existed (main at 5cf6dbb): step seconds, memory bytes, model FLOPs per token, MFU;
# the bf16 rows' step times since the data-parallel reduction moves fp32 gradients as their stacks do
# (Megatron-Core at bf16, FSDP2 with an fp32 reduce dtype: stacks.conventions.gradient_reduce_bytes), and
# the two bf16 `nemo` rows' step times and memory since that stack is NVIDIA's performance recipes, whose
# main grads and reduction are bf16 (stacks/nemo.py); the fp8 row's memory since an H100 holds the 79.6 GiB
# its driver exposes (one memory option fewer: TE's fp8 weights alone); the FSDP row's step since the
# flopwise trainer's full recompute (non-reentrant, early stop) skips each block's down projection.
UNCHANGED = {
    "llama3-8b": (dict(model="llama3-8b", hardware="h100-sxm", gpus=8, tp=1, micro_batch=1, global_batch=128,
                       seq_len=8192, precision="fp8", stack="nemo"),
                  (10.0520257505579, 81368024842.24, 57914449920.0, 0.3816097137741277)),
    "llama3-70b": (dict(model="llama3-70b", hardware="h100-sxm", gpus=64, tp=4, pp=4, micro_batch=1,
                        global_batch=128, seq_len=4096, precision="bf16", stack="nemo", schedule="interleaved",
                        virtual_stages=5),
                   (7.367280965770509, 58363736621.056, 449230454784.0, 0.5048705003710532)),
    # tp 2, no expert parallelism: the MoE all-to-all model is not exercised
    "mixtral-8x7b": (dict(model="mixtral-8x7b", hardware="h100-sxm", gpus=64, tp=2, pp=4, micro_batch=1,
                          global_batch=256, seq_len=4096, precision="bf16", stack="nemo"),
                     (3.2260601113797525, 51972001628.16, 82935570432.0, 0.4257125114080341)),
    "llama3-8b-fsdp": (dict(model="llama3-8b", hardware="h100-sxm", gpus=16, micro_batch=2, global_batch=256,
                            seq_len=4096, precision="bf16", recompute="full"),
                       (9.089392255345944, 73203485696.0, 51471998976.0, 0.3750975379730579)),
}


@pytest.mark.parametrize("name", sorted(UNCHANGED))
def test_uniform_models_plan_bit_for_bit_as_before(name):
    kwargs, expected = UNCHANGED[name]
    result = plan(build_runspec(**kwargs))
    got = (result.time.step_seconds, result.memory.total_bytes, result.flops.model_per_unit, result.time.mfu)
    assert got == expected
