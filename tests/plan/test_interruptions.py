"""Hardware interruptions at scale: the expected job beside the uninterrupted one (plan/interruptions.py)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flopwise.plan import interruptions as it
from flopwise.plan.planner import build_runspec, plan

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}


def llama3_405b(gpus: int, **kwargs):
    """Llama 3.1 405B at its paper's layout (tp 8, pp 16, ZeRO-2, 2,048 sequences of 8,192)."""
    return plan(build_runspec(model="llama3.1-405b", hardware="h100-sxm", gpus=gpus, tp=8, pp=16, zero=2,
                              global_batch=2048, seq_len=8192, tokens="15T", recompute="none", stack="torchtitan",
                              **kwargs))


def test_the_default_rate_is_llama3s_record_and_reproduces_its_effective_training_time():
    assert it.INTERRUPTIONS_PER_DEVICE_DAY == pytest.approx(419 / 54 / 16_384)
    est = llama3_405b(16_384).interruptions
    assert est.per_day == pytest.approx(419 / 54, rel=1e-9)
    assert est.mtbf_seconds / 3600 == pytest.approx(3.09, abs=0.01)
    # "higher than 90 % effective training time" (Llama Team 2024, sec. 3.3.4): a check, not a fit
    assert 0.90 < est.effective_training_time < 0.97
    assert est.expected_interruptions == pytest.approx(est.expected_seconds / est.mtbf_seconds)
    parts = est.work_seconds + est.restart_overhead_seconds + est.lost_work_seconds + est.checkpoint_overhead_seconds
    assert parts == pytest.approx(est.expected_seconds, rel=1e-9)


def test_the_overhead_grows_with_the_device_count():
    small = it.estimate_interruptions(30 * 86_400, 64, 1.0)
    large = it.estimate_interruptions(30 * 86_400, 16_384, 1.0)
    assert 0 < small.overhead < 0.005 < large.overhead
    assert large.expected_device_hours > large.work_seconds * 16_384 / 3600


def test_daly_trades_checkpoint_cost_against_lost_work():
    cheap = it.estimate_interruptions(86_400 * 10, 4096, 0.5)
    dear = it.estimate_interruptions(86_400 * 10, 4096, 60.0)
    assert cheap.interval_seconds < dear.interval_seconds
    assert cheap.lost_work_seconds < dear.lost_work_seconds and cheap.expected_seconds < dear.expected_seconds


def test_zero_rate_leaves_the_job_uninterrupted_and_the_table_without_the_rows():
    est = it.estimate_interruptions(1000.0, 1024, 1.0, per_device_day=0.0)
    assert est.expected_seconds == 1000.0 and est.overhead == 0.0 and math.isinf(est.mtbf_seconds)
    args = [sys.executable, "-m", "flopwise", "plan", "--model", "llama2-7b", "--hardware", "a100-80gb", "--gpus",
            "2048", "--tokens", "2T"]
    with_rows = subprocess.run(args, capture_output=True, text=True, env=ENV, check=True).stdout
    without = subprocess.run([*args, "--interruptions-per-device-day", "0"], capture_output=True, text=True, env=ENV,
                             check=True).stdout
    assert "whole job with interruptions" in with_rows and "Llama 3's rate" in with_rows
    assert "interruptions" not in without
    data = json.loads(subprocess.run([*args, "--json", "--restart-seconds", "1200"], capture_output=True, text=True,
                                     env=ENV, check=True).stdout)
    assert data["interruptions"]["restart_seconds"] == 1200
    assert data["interruptions"]["expected_device_hours"] > data["gpu_hours"]


def test_a_bad_rate_is_one_line_naming_the_flag():
    out = subprocess.run([sys.executable, "-m", "flopwise", "plan", "--model", "llama2-7b", "--gpus", "8",
                          "--interruptions-per-device-day", "-1"], capture_output=True, text=True, env=ENV)
    assert out.returncode != 0 and "Traceback" not in out.stderr + out.stdout
    assert "--interruptions-per-device-day" in (out.stderr + out.stdout).strip().splitlines()[-1]


def test_a_job_too_short_to_expect_one_shows_no_rows():
    out = subprocess.run([sys.executable, "-m", "flopwise", "plan", "--model", "llama2-7b", "--gpus", "8",
                          "--tokens", "1B"], capture_output=True, text=True, env=ENV, check=True).stdout
    assert "interruptions" not in out and "whole job" in out
