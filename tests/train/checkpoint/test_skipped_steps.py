"""fp16 loss scaling when every step overflows: a skipped step leaves the LR schedule where it
was, and `precision.max_skipped_steps` skipped steps in a row stop the run with one line that
names the cause and a non-zero exit, instead of a run that "finishes" with untrained weights.

The overflow is real, not injected: an initial loss scale of 2**64 makes every fp16 gradient
inf (fp16 ends at 65504), and with the scale halving per skip it stays inf for 40+ steps.
"""

from __future__ import annotations

import json

import pytest

from flopwise.train.checkpoint.policy import SkippedStepGuard
from flopwise.config.loading import load_config
from flopwise.train.loop import lr_at
from tests.train.checkpoint.test_policy import config, corpus, train_cli, write  # noqa: F401

LIMIT = 4


def test_the_guard_counts_only_consecutive_skips():
    guard = SkippedStepGuard(3)
    assert [guard.observe(s) for s in (True, True, False, True, True, True)] == [False, False, False, False, False, True]


def test_max_skipped_steps_is_a_validated_setting():
    assert load_config(None, []).precision.max_skipped_steps == 20
    for bad in ("0", "-1", "1e30", ".inf"):
        with pytest.raises(Exception):
            load_config(None, [f"precision.max_skipped_steps={bad}"])


def test_every_step_overflowing_stops_with_one_line_and_the_schedule_never_moved(corpus, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    cfg = config(corpus, run_dir, checkpoint={"every_steps": 2})
    cfg["precision"] = {"mode": "fp16", "initial_scale": 2.0**64, "max_skipped_steps": LIMIT}
    proc = train_cli(write(cfg, tmp_path / "config.yaml"))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 3, out[-2000:] + err[-2000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert lines[0].startswith(f"error: training stopped at step {LIMIT}: {LIMIT} optimizer steps in a row were skipped")
    assert "the loss scale fell to" in lines[0] and "overflows in fp16" in lines[0] and "bf16" in lines[0]

    records = [json.loads(line) for line in (run_dir / "metrics.rank0.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, LIMIT + 1))
    assert all(r["skipped_step"] for r in records)
    training = load_config(tmp_path / "config.yaml").training
    assert {r["lr"] for r in records} == {lr_at(0, training)}  # the warm-up never advanced
    assert lr_at(1, training) != lr_at(0, training)
    scales = [r["loss_scale"] for r in records]
    assert scales == [2.0**64 / 2**k for k in range(1, LIMIT + 1)]
