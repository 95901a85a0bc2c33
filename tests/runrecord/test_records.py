"""runrecord/records.py: the run directory's layout and record types, written and read back."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from flopwise.errors import UserError
from flopwise.runrecord.records import (
    SCHEMA_VERSION, Comparison, MemoryBytes, StepRecord, json_line, metrics_files, metrics_path, read_comparison,
    write_comparison,
)


def _step(**overrides) -> StepRecord:
    values = dict(step=3, rank=1, loss=2.5, lr=1e-3, grad_norm=0.7, tokens_per_second=1000.0, step_seconds=0.2,
                  data_seconds=0.01, compute_seconds=0.15, optimizer_seconds=0.04, tokens_seen=3000,
                  memory=MemoryBytes(parameters=10, gradients=10, optimizer=20, saved_activations=30))
    values.update(overrides)
    return StepRecord(**values)


def test_a_step_record_is_the_metrics_line_diagnose_reads():
    line = _step().to_dict()
    assert list(line)[:13] == ["step", "rank", "loss", "lr", "grad_norm", "tokens_per_second", "step_seconds",
                               "data_seconds", "compute_seconds", "optimizer_seconds", "tokens_seen", "mfu",
                               "skipped_step"]
    assert line["memory_saved_activations_bytes"] == 30 and "memory_cuda_peak_allocated_bytes" not in line
    assert "sync_wait_seconds" not in line and "val_loss" not in line and "loss_scale" not in line
    line = _step(sync_wait_seconds=0.05, val_loss=3.0, loss_scale=1024.0).to_dict()
    assert (line["sync_wait_seconds"], line["val_loss"], line["loss_scale"]) == (0.05, 3.0, 1024.0)
    assert json.loads(json_line(_step(loss=float("nan")).to_dict()))["loss"] is None
    # a step the meters skipped (training.measure_every) has no memory figures, not zeros
    assert not [key for key in _step(memory=None).to_dict() if key.startswith("memory_")]


def test_metrics_files_are_one_per_rank(tmp_path):
    for rank in (1, 0):
        metrics_path(tmp_path, rank).write_text(json_line(_step(rank=rank).to_dict()))
    assert [p.name for p in metrics_files(tmp_path)] == ["metrics.rank0.jsonl", "metrics.rank1.jsonl"]


def test_a_comparison_round_trips_with_its_schema_version(tmp_path):
    comparison = Comparison(
        hardware={"key": "cpu-measured", "name": "CPU", "devices": 2},
        predicted={"memory_bytes": {"weights": 100.0, "total": 300.0}, "tokens_per_second": 2000.0, "mfu": None},
        measured={"memory_bytes": {"weights": 100, "total": 330}, "tokens_per_second": 1000.0, "mfu": 0.2,
                  "hardware": "cpu-measured"},
        measured_over_predicted={"tokens_per_second": 0.5},
    )
    write_comparison(tmp_path, comparison)
    assert json.loads((tmp_path / "predicted_vs_measured.json").read_text())["schema_version"] == SCHEMA_VERSION
    back = read_comparison(tmp_path)
    assert back == comparison and back.measured_mfu == 0.2
    assert back.rows() == [("memory_bytes.weights", 100.0, 100.0), ("memory_bytes.total", 300.0, 330.0),
                           ("tokens_per_second", 2000.0, 1000.0)]
    assert read_comparison(tmp_path / "elsewhere") is None


def test_a_file_of_another_shape_is_a_one_line_error(tmp_path):
    (tmp_path / "predicted_vs_measured.json").write_text("{not json")
    with pytest.raises(UserError, match="not readable as JSON"):
        read_comparison(tmp_path)
    (tmp_path / "predicted_vs_measured.json").write_text(json.dumps({"predicted": {}}))
    with pytest.raises(UserError, match="needs a 'measured' object"):
        read_comparison(tmp_path)


def test_the_run_record_imports_no_torch():
    code = "import sys, flopwise.runrecord.records; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60).returncode == 0
