"""Parameter counts against published totals and against hand-derived formulas.

Published figures: /work/shared/validation/published.md ("Architecture configs" table; D
figures are exact arithmetic, so the tolerance is the rounding of the quoted digits).
The independent oracle (models built by transformers) is in tests/catalog/test_models.py.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from flopwise.catalog.models import ModelSpec, get_model
from flopwise.plan.params import ParamCount, attention_params, count_params, mlp_params

# key -> (published total, absolute tolerance): the quoted digits' rounding.
PUBLISHED_TOTALS = {
    "gpt3-175b": (174.60e9, 0.005e9),
    "opt-175b": (174.60e9, 0.005e9),
    "bert-large": (335.1e6, 0.05e6),
    "llama2-7b": (6.74e9, 0.005e9),
    "llama2-13b": (13.02e9, 0.005e9),
    "llama2-70b": (68.98e9, 0.005e9),
    "llama3-8b": (8.03e9, 0.005e9),
    "llama3-70b": (70.55e9, 0.005e9),
    "llama3.1-405b": (405.85e9, 0.005e9),
    "bloom-176b": (176.247e9, 0.0005e9),  # BigScience reports 176,247M
    "gpt-oss-120b": (116.83e9, 0.005e9),  # OpenAI's gpt-oss model card, Table 1
    "gpt-oss-20b": (20.91e9, 0.005e9),
}

# LLaMA-1 paper, Table 2 (V): one decimal place, truncated (65.29B is printed as 65.2B).
LLAMA1_PAPER = {"llama-7b": 6.7e9, "llama-13b": 13.0e9, "llama-33b": 32.5e9, "llama-65b": 65.2e9}


@pytest.mark.parametrize("key", sorted(PUBLISHED_TOTALS))
def test_catalog_totals_match_published(key):
    expected, tolerance = PUBLISHED_TOTALS[key]
    assert count_params(get_model(key)).total == pytest.approx(expected, abs=tolerance)


@pytest.mark.parametrize("key", sorted(LLAMA1_PAPER))
def test_llama1_totals_truncate_to_paper(key):
    total = count_params(get_model(key)).total
    assert LLAMA1_PAPER[key] <= total < LLAMA1_PAPER[key] + 0.1e9


def test_gpt3_175b_exact_breakdown():
    """Every term of GPT-3 175B by hand: 12·h² + 13·h per layer (with biases and 2 LNs)."""
    h, layers, vocab, ctx = 12288, 96, 50257, 2048
    counts = count_params(get_model("gpt3-175b"))
    assert counts.embedding == vocab * h + ctx * h
    assert counts.output_head == 0  # tied to the token embedding
    assert counts.attention_per_layer == 4 * h * h + 4 * h
    assert counts.mlp_per_layer == 8 * h * h + 5 * h
    assert counts.norms_per_layer == 4 * h
    assert counts.final_norm == 2 * h
    assert counts.total == layers * (12 * h * h + 13 * h) + vocab * h + ctx * h + 2 * h == 174_604_259_328


def test_mixtral_total_and_active():
    """Mixtral 8x7B: 46.7B parameters, 12.9B used per token (Jiang et al. 2024: 47B / 13B)."""
    counts = count_params(get_model("mixtral-8x7b"))
    assert counts.total == 46_702_792_704
    assert counts.active == 12_879_925_248
    h, f = 4096, 14336
    assert counts.mlp_per_layer == 8 * 3 * h * f + h * 8  # 8 SwiGLU experts + router
    assert counts.mlp_active_per_layer == 2 * 3 * h * f + h * 8


def test_bert_large_breakdown():
    """BERT-Large (BertModel): token + position + type embeddings, embedding LN, pooler, no head."""
    h = 1024
    counts = count_params(get_model("bert-large"))
    assert counts.embedding == (30522 + 512 + 2) * h
    assert counts.output_head == 0
    assert counts.final_norm == 0
    assert counts.other == 2 * h + h * h + h
    assert counts.total == 335_141_888


def _decoder(**changes) -> ModelSpec:
    base = ModelSpec(
        key="t", name="t", n_layers=3, hidden=64, n_heads=8, ffn_hidden=176, vocab_size=1000,
        seq_len=128, max_positions=128, mlp="swiglu", norm="rmsnorm", position="rope",
    )
    return dataclasses.replace(base, **changes)


def test_gqa_shrinks_k_and_v_only():
    h, heads, kv = 64, 8, 2
    mha = attention_params(_decoder())
    gqa = attention_params(_decoder(n_kv_heads=kv))
    assert mha == 4 * h * h
    assert mha - gqa == 2 * h * h - 2 * h * (kv * h // heads)


def test_explicit_head_dim_sets_attention_width():
    spec = _decoder(n_heads=4, n_kv_heads=2, head_dim=32)  # a·d = 128 != hidden 64
    assert attention_params(spec) == 64 * 128 + 2 * 64 * 64 + 128 * 64


def test_qkv_bias_without_output_bias():
    """Qwen2: q/k/v carry biases, o_proj does not."""
    plain = attention_params(_decoder(n_kv_heads=2))
    qwen2 = attention_params(_decoder(n_kv_heads=2, attn_bias=True, attn_out_bias=False))
    both = attention_params(_decoder(n_kv_heads=2, attn_bias=True))
    assert qwen2 - plain == 64 + 2 * 16
    assert both - qwen2 == 64


def test_mlp_matrices_and_biases():
    assert mlp_params(64, 176, "swiglu", False) == 3 * 64 * 176
    assert mlp_params(64, 256, "gelu", False) == 2 * 64 * 256
    assert mlp_params(64, 256, "relu", True) == 2 * 64 * 256 + 256 + 64
    assert mlp_params(64, 176, "swiglu", True) == 3 * 64 * 176 + 2 * 176 + 64


def test_tied_embeddings_count_once():
    untied = count_params(_decoder())
    tied = count_params(_decoder(tied_embeddings=True))
    assert untied.output_head == 1000 * 64
    assert tied.output_head == 0
    assert untied.total - tied.total == 1000 * 64


def test_layernorm_has_weight_and_bias():
    rms = count_params(_decoder())
    ln = count_params(_decoder(norm="layernorm"))
    assert rms.norms_per_layer == 2 * 64 and ln.norms_per_layer == 4 * 64
    assert ln.final_norm == 2 * rms.final_norm == 128


def test_learned_positions_are_embedding():
    rope = count_params(_decoder())
    learned = count_params(_decoder(position="learned"))
    assert learned.embedding - rope.embedding == 128 * 64


def test_shared_expert_is_always_active():
    spec = _decoder(n_experts=4, experts_per_token=2, ffn_hidden=32, shared_expert_ffn_hidden=96)
    counts = count_params(spec)
    shared = 3 * 64 * 96 + 64  # SwiGLU shared expert + its h -> 1 gate
    assert counts.mlp_per_layer == 4 * 3 * 64 * 32 + 64 * 4 + shared
    assert counts.mlp_active_per_layer == 2 * 3 * 64 * 32 + 64 * 4 + shared


def test_deepseek_shared_expert_has_no_gate():
    spec = _decoder(n_experts=4, experts_per_token=2, ffn_hidden=32, shared_expert_ffn_hidden=64,
                    shared_expert_gate=False)
    assert count_params(spec).mlp_per_layer == 4 * 3 * 64 * 32 + 64 * 4 + 3 * 64 * 64


def _mla(**overrides) -> ModelSpec:
    return _decoder(**{**dict(kv_lora_rank=32, q_lora_rank=48, qk_nope_head_dim=16, qk_rope_head_dim=8,
                              v_head_dim=12), **overrides})


def test_mla_projections_have_their_own_widths():
    """DeepseekV3Attention with h 64, 8 heads: q_a 64x48, q_b 48x8(16+8), kv_a 64x(32+8), kv_b 32x8(16+12),
    o 8x12x64; the latents' RMSNorms (48 + 32) are counted with the norms."""
    spec = _mla()
    assert attention_params(spec) == 64 * 48 + 48 * 8 * 24 + 64 * 40 + 32 * 8 * 28 + 8 * 12 * 64
    assert count_params(spec).norms_per_layer == 2 * 64 + 48 + 32
    # without a query latent, one q_proj h -> a·(nope + rope), bias-free even with attention_bias
    plain_query = attention_params(_mla(q_lora_rank=0, attn_bias=True))
    assert plain_query == 64 * 8 * 24 + 64 * 40 + 40 + 32 * 8 * 28 + 8 * 12 * 64 + 64


def test_leading_dense_blocks_are_counted_apart():
    """DeepSeek's first blocks hold a dense MLP in place of the experts: the total counts each block
    as it is, and a pipeline stage's share follows where its blocks sit."""
    moe = dict(n_experts=4, experts_per_token=2, ffn_hidden=32, n_layers=4)
    spec = _decoder(**moe, dense_layers=1, dense_ffn_hidden=96)
    counts, uniform = count_params(spec), count_params(_decoder(**moe))
    dense_mlp = 3 * 64 * 96
    assert counts.dense_mlp_per_layer == dense_mlp and counts.moe_layers == 3
    assert uniform.total - counts.total == uniform.mlp_per_layer - dense_mlp
    assert counts.active - (uniform.active - uniform.mlp_active_per_layer + dense_mlp) == 0
    ends = counts.embedding + counts.output_head + counts.final_norm + counts.other
    assert counts.total == ends + counts.blocks_held(0, 4)
    assert counts.blocks_held(0, 2) == counts.per_layer + counts.attention_per_layer + counts.norms_per_layer + dense_mlp
    assert counts.blocks_held(2, 2) == 2 * counts.per_layer
    # expert parallelism over 4 ranks: a rank holds a quarter of each MoE block's routed experts only
    assert counts.blocks_held(0, 4) - counts.blocks_held(0, 4, ep=4) == 3 * counts.experts_per_layer * 3 / 4


def test_totals_are_the_sum_of_the_parts():
    for key in ("gpt3-175b", "bert-large", "llama3.1-405b", "mixtral-8x7b", "bloom-176b"):
        c = count_params(get_model(key))
        parts = c.embedding + c.output_head + c.final_norm + c.other
        assert c.total == parts + c.n_layers * c.per_layer
        assert c.active == parts + c.n_layers * c.active_per_layer
        assert c.non_embedding == c.total - c.embedding - c.output_head
        assert c.active_non_embedding == c.active - c.embedding - c.output_head


def test_dense_models_are_fully_active():
    counts = count_params(get_model("llama3-70b"))
    assert counts.active == counts.total
    assert counts.mlp_active_per_layer == counts.mlp_per_layer


def test_cnn_params_taken_as_given():
    counts = count_params(get_model("resnet50"))
    assert counts == ParamCount(25_557_032, 25_557_032, 0, 0, 0, 0, 0, 0, 0, 25_557_032, 25_557_032, 0)


def test_plan_params_never_imports_torch():
    code = (
        "import sys, flopwise.plan.params as p, flopwise.catalog.models as m;"
        "p.count_params(m.get_model('llama3-8b'));"
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_qwen3_counts_its_per_head_qk_norms_and_they_cost_memory_and_time():
    """Qwen3's q_norm and k_norm (one head_dim weight each per block) are parameters; the norms
    keep their inputs for the backward and read + write q and k: more activation memory and a
    longer step than the same shapes without them."""
    from flopwise.plan.planner import build_runspec, plan

    qwen3 = get_model("qwen3-8b")
    plain = dataclasses.replace(qwen3, qk_norm=False)
    assert count_params(qwen3).total - count_params(plain).total == 36 * 2 * 128
    assert count_params(qwen3).non_embedding == pytest.approx(6.95e9, rel=2e-3)  # the report's 6.95B
    spec = build_runspec(model="qwen3-8b", hardware="h100-sxm", gpus=8, seq_len=4096, micro_batch=1,
                         global_batch=64)
    with_norms, without = plan(spec), plan(dataclasses.replace(spec, model=plain))
    assert with_norms.memory.activations > without.memory.activations
    assert with_norms.time.memory_bound_seconds > without.time.memory_bound_seconds


@pytest.mark.parametrize(("key", "active"), [("gpt-oss-120b", 5.13e9), ("gpt-oss-20b", 3.61e9)])
def test_gpt_oss_active_counts_match_the_model_card(key, active):
    """The card's active figure counts the output head but not the embedding (5,132,849,472 and
    3,608,307,264 here); the biases, sinks and router bias are what bring the totals to its 116.83B and 20.91B."""
    spec = get_model(key)
    pc = count_params(spec)
    assert pc.active - pc.embedding == pytest.approx(active, abs=0.005e9)
    bare = dataclasses.replace(spec, attn_bias=False, mlp_bias=False, attn_sinks=False, router_bias=False)
    per_layer = count_params(spec).total - count_params(bare).total
    heads, kv, d, h, f, e = 64, 8, 64, 2880, 2880, spec.n_experts
    biases = (heads + 2 * kv) * d + h + heads + e * (2 * f + h) + e  # q, k, v, o biases; sinks; experts; router
    assert per_layer == spec.n_layers * biases
