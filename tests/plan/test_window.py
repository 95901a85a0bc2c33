"""plan/window.py: sliding-window attention in the FLOP count, the attention time and the activations.

gpt-oss attends through a 128-token band on every other block (OpenAI 2025, gpt-oss model card §2);
the oracle for the band's work is the count of causal query-key pairs it keeps, and for "no effect"
the same model with every block attending to the whole prefix.
"""

import dataclasses
import os
import subprocess
import sys

import pytest

from flopwise.catalog.models import get_model, windowed_layers
from flopwise.plan.flops import attention_dim, estimate_flops
from flopwise.plan.params import count_params
from flopwise.plan.planner import build_runspec, plan
from flopwise.plan.window import attention_work_share, kept_share


def _pairs(window: int, seq_len: int) -> int:
    """Causal query-key pairs a window of `window` keys keeps, counted one query at a time."""
    return sum(min(window, i) for i in range(1, seq_len + 1))


@pytest.mark.parametrize(("window", "seq_len"), [(128, 4096), (4, 10), (1, 7), (127, 128), (4096, 8192)])
def test_kept_share_is_the_share_of_causal_pairs_the_window_keeps(window, seq_len):
    assert kept_share(window, seq_len) == pytest.approx(_pairs(window, seq_len) / _pairs(seq_len, seq_len), rel=1e-12)


def test_a_window_no_shorter_than_the_sequence_keeps_everything():
    assert kept_share(128, 128) == kept_share(4096, 128) == kept_share(0, 128) == 1.0
    assert kept_share(127, 128) < 1.0
    # w << s: about 2w/s, the band's w keys per query against a full layer's s/2 causal ones
    assert kept_share(128, 131072) == pytest.approx(2 * 128 / 131072, rel=1e-3)


def test_gpt_oss_windows_every_other_block():
    for key, layers in (("gpt-oss-120b", 36), ("gpt-oss-20b", 24)):
        spec = get_model(key)
        assert spec.sliding_window == 128 and windowed_layers(spec) == layers // 2
        assert spec.window_layers == "SF" * (layers // 2)  # transformers' layer_types: sliding on blocks 0, 2, ...
        assert attention_work_share(spec, 4096) == pytest.approx(0.5 + 0.5 * kept_share(128, 4096))


def _all_full(spec):
    return dataclasses.replace(spec, sliding_window=0, window_layers="")


def test_windowed_attention_flops_follow_the_project_convention():
    """Full blocks count 12·s·d per token (no causal halving); windowed ones that times the share of the
    causal pairs they keep, so the windowed-to-full ratio is Megatron-Bridge's w - w(w-1)/(2s) over s/2."""
    spec = get_model("gpt-oss-120b")
    s, d, L = 4096, attention_dim(spec), 36
    windowed = estimate_flops(spec, count_params(spec), s, "none", 1.0)
    full = estimate_flops(_all_full(spec), count_params(spec), s, "none", 1.0)
    assert full.attention_per_unit == pytest.approx(12 * L * s * d)
    megatron_ratio = (128 - 128 * 127 / (2 * s)) / ((s + 1) / 2)  # calculate_swa_context, causal s/2 context
    assert windowed.attention_per_unit == pytest.approx(12 * s * d * (L / 2 + L / 2 * megatron_ratio))
    assert windowed.model_per_unit < full.model_per_unit
    assert windowed.dense_per_unit == full.dense_per_unit  # the window touches only the scores


def _plans(key: str, seq_len: int, flash: bool = True, **layout):
    spec = build_runspec(model=key, hardware="h100-sxm", seq_len=seq_len, micro_batch=1, flash_attention=flash,
                         **layout)
    return plan(spec), plan(dataclasses.replace(spec, model=_all_full(spec.model)))


def test_windowed_gpt_oss_plans_less_attention_work_and_time():
    windowed, full = _plans("gpt-oss-20b", 8192, gpus=8, ep=8, global_batch=64)
    assert windowed.flops.attention_per_unit < 0.6 * full.flops.attention_per_unit
    assert windowed.time.attention_seconds < 0.75 * full.time.attention_seconds
    assert windowed.time.step_seconds < full.time.step_seconds
    assert windowed.memory.activations == full.memory.activations  # flash keeps no scores, window or not


def test_the_window_changes_nothing_when_the_sequence_fits_in_it():
    windowed, full = _plans("gpt-oss-20b", 128, gpus=8, ep=8, global_batch=64)
    assert windowed.flops.to_dict() == full.flops.to_dict()
    assert windowed.time.step_seconds == full.time.step_seconds
    assert windowed.memory.total_bytes == full.memory.total_bytes


def test_unfused_attention_computes_and_keeps_the_whole_masked_matrix():
    """Without flash, the s×s scores are built and masked (transformers' eager attention): the window
    lowers the counted FLOPs but neither the attention time nor the saved scores."""
    windowed, full = _plans("gpt-oss-20b", 2048, flash=False, gpus=8, ep=8, global_batch=64)
    assert windowed.flops.attention_per_unit < full.flops.attention_per_unit
    assert windowed.time.attention_seconds == full.time.attention_seconds
    assert windowed.memory.activations == full.memory.activations


def test_context_parallel_ranks_share_the_window_of_the_whole_sequence():
    windowed, full = _plans("gpt-oss-20b", 16384, gpus=16, cp=2, ep=8, global_batch=64)
    assert windowed.time.attention_seconds < full.time.attention_seconds


def test_plan_cli_plans_gpt_oss_120b_with_expert_parallelism():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "160"}
    out = subprocess.run([sys.executable, "-m", "flopwise", "plan", "--model", "gpt-oss-120b", "--hardware",
                          "h100-sxm", "--gpus", "64", "--tp", "1", "--ep", "8", "--seq-len", "4096"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "gpt-oss-120b" in out.stdout and "116.83B" in out.stdout
    assert "18 layers windowed to 128 keys" in out.stdout
