"""diagnose and report on a run directory that `flopwise train` really wrote (2 gloo ranks, FSDP2)."""

import json
import os
import subprocess
import sys

import pytest


@pytest.mark.slow
@pytest.mark.distributed
def test_diagnose_and_report_read_a_real_training_run(tmp_path):
    run_dir = tmp_path / "run"
    overrides = [
        "model.n_layers=2", "model.hidden=64", "model.n_heads=4", "model.max_seq_len=64", "data.seq_len=64",
        "data.vocab_size=512", "data.max_bytes=300000", f"data.cache_dir={tmp_path / 'cache'}",
        "training.max_steps=12", "training.warmup_steps=2", "training.micro_batch_size=4", "training.eval_every=6",
        "parallel.nproc_per_node=2", "parallel.strategy=fsdp", f"logging.run_dir={run_dir}", "logging.progress=false",
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    flopwise = [sys.executable, "-m", "flopwise"]
    train = subprocess.run(flopwise + ["train", *overrides], capture_output=True, text=True, env=env, timeout=900)
    assert train.returncode == 0, train.stderr[-2000:]

    diag = subprocess.run(flopwise + ["diagnose", str(run_dir), "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert diag.returncode == 0, diag.stderr
    data = json.loads(diag.stdout)
    assert data["ranks"] == [0, 1] and data["steps"] == 12
    assert {"data_seconds", "compute_seconds", "optimizer_seconds"} <= set(data["breakdown"][0]["median"])
    names = {row["name"] for row in data["predicted_vs_measured"]}
    assert {"step_seconds", "tokens_per_second", "memory_bytes.activations"} <= names

    report = subprocess.run(flopwise + ["report", str(run_dir)], capture_output=True, text=True, env=env, timeout=300)
    assert report.returncode == 0, report.stderr
    text = (run_dir / "report.md").read_text()
    assert "## Predicted vs measured" in text and "validation loss (held-out batches)" in text
    assert len(list((run_dir / "plots").glob("*.png"))) == 4
