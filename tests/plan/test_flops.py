"""plan/flops.py: training FLOPs against published totals (published.md)."""

import pytest

from flopwise.catalog.models import ModelSpec, get_model
from flopwise.plan.flops import attention_flops_forward, estimate_flops, matmul_params, pf_days, six_n_d
from flopwise.plan.params import count_params


def test_gpt3_175b_training_compute_matches_brown_et_al():
    # Brown et al. 2020, Table D.1: 3.14e23 FLOPs = 3.64e3 PF-days for 174.6B params x 300B tokens (6ND).
    assert six_n_d(174.6e9, 300e9) == pytest.approx(3.14e23, rel=2e-3)
    assert pf_days(six_n_d(174.6e9, 300e9)) == pytest.approx(3.64e3, rel=2e-3)
    spec = get_model("gpt3-175b")
    est = estimate_flops(spec, count_params(spec), 2048, "none", 300e9)
    # Kaplan's N excludes embeddings: within 0.5 % of the paper's total-parameter figure.
    assert est.kaplan_6nd_total == pytest.approx(3.14e23, rel=5e-3)
    # Adding the attention term 12*L*s*d (PaLM App. B) raises it by ~2.8 %.
    assert est.attention_per_unit == pytest.approx(12 * 96 * 2048 * 12288)
    assert est.model_total / est.kaplan_6nd_total == pytest.approx(1.03, abs=0.01)


def test_matmul_params_counts_the_output_projection_even_when_tied():
    spec = get_model("gpt3-175b")  # tied embeddings
    pc = count_params(spec)
    assert pc.output_head == 0
    assert matmul_params(spec, pc) == pc.active_non_embedding + 12288 * spec.vocab_size


def test_recompute_adds_a_forward_to_hardware_flops_only():
    spec = get_model("llama2-7b")
    pc = count_params(spec)
    none = estimate_flops(spec, pc, 4096, "none", 1.0)
    full = estimate_flops(spec, pc, 4096, "full", 1.0)
    selective = estimate_flops(spec, pc, 4096, "selective", 1.0)
    assert none.model_per_unit == full.model_per_unit == selective.model_per_unit
    fwd_attn = attention_flops_forward(32, 4096, 4096)
    assert full.hardware_per_unit == pytest.approx(8 * none.matmul_params + 4 * fwd_attn)  # the "8N" rule
    assert selective.hardware_per_unit == pytest.approx(none.model_per_unit + fwd_attn)


def test_moe_flops_use_active_parameters():
    spec = get_model("mixtral-8x7b")
    pc = count_params(spec)
    est = estimate_flops(spec, pc, 4096, "none", 1.0)
    assert pc.active < 0.3 * pc.total
    assert est.dense_per_unit == pytest.approx(6 * (pc.active_non_embedding + spec.hidden * spec.vocab_size))


def test_cnn_training_is_three_forwards_per_sample():
    resnet = ModelSpec(key="resnet50", name="ResNet-50", arch="cnn", params=25_557_032, flops_per_sample=8.2e9)
    est = estimate_flops(resnet, count_params(resnet), 0, "none", 1.28e6)
    assert est.unit == "sample"
    assert est.model_per_unit == pytest.approx(3 * 8.2e9)
    assert est.model_total == pytest.approx(3 * 8.2e9 * 1.28e6)
    assert estimate_flops(resnet, count_params(resnet), 0, "full", 1.0).hardware_per_unit == pytest.approx(4 * 8.2e9)


def test_mla_scores_use_query_key_heads_and_values_use_value_heads():
    """DeepSeek-V3: Q·Kᵀ over 128 heads of 192, A·V over 128 heads of 128, per layer and token
    2·s·a·192 + 2·s·a·128 forward; the 6·N part uses the 37.6B active parameters and the head."""
    spec = get_model("deepseek-v3")
    pc = count_params(spec)
    est = estimate_flops(spec, pc, 4096, "none", 1.0)
    assert est.attention_per_unit == pytest.approx(3 * 2 * 61 * 4096 * 128 * (192 + 128))
    assert est.dense_per_unit == pytest.approx(6 * (pc.active_non_embedding + 7168 * 129280))
