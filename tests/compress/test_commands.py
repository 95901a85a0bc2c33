"""`flopwise compress` on the command line: real subprocesses, real files."""

import json
import os
import subprocess
import sys

import pytest

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def run_cli(*args, cwd=None, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "flopwise", "compress", *args],
        capture_output=True, text=True, env=ENV, cwd=cwd, timeout=timeout,
    )


def _error_lines(stderr):
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith(("W1", "Failed to load"))]


def test_bad_method_is_one_line_and_exit_2(tmp_path):
    result = run_cli("--task", "digits-cnn", "--method", "int3")
    assert result.returncode == 2
    lines = _error_lines(result.stderr)
    assert len(lines) == 1 and "int3" in lines[0] and "int8-static" in lines[0]


def test_missing_checkpoint_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "run").mkdir()
    result = run_cli(str(tmp_path / "run"), "--method", "prune")
    assert result.returncode == 2
    lines = _error_lines(result.stderr)
    assert len(lines) == 1 and "export/model.safetensors" in lines[0]
    result = run_cli(str(tmp_path / "nope"), "--method", "prune")
    assert result.returncode == 2 and "no such run directory" in result.stderr


def test_unknown_compress_key_in_yaml_is_named(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("compress:\n  method: prune\n  sparsty: 0.6\n")
    result = run_cli(str(config))
    assert result.returncode == 2
    lines = _error_lines(result.stderr)
    assert len(lines) == 1 and "compress.sparsty" in lines[0]


def test_seed_pruning_yaml_prunes_the_builtin_cnn_and_writes_the_report(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(
        "training:\n  gradient_checkpointing: true\n  pruning: {method: magnitude, sparsity: 0.6}\n"
        f"compress:\n  task: digits-cnn\n  latency_iters: 3\n  out: {tmp_path / 'out'}\n"
    )
    result = run_cli(str(config), "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["method"] == "prune" and report["flow"] == "model"
    assert report["out"] == str(tmp_path / "out") and report["threads"] >= 1
    assert report["details"]["sparsity"]["overall"] == pytest.approx(0.6, abs=1e-3)
    assert report["summary"]["disk_ratio"] == pytest.approx(1.0, abs=0.02)  # dense with zeros: the standard layout
    from safetensors import safe_open

    with safe_open(str(tmp_path / "out" / "model.safetensors"), framework="pt") as handle:
        assert not [k for k in handle.keys() if "__mask__" in k]
        config = json.loads(handle.metadata()["sparsity_config"])
    assert config["format"] == "dense" and config["sparsity_structure"] == "unstructured"
    assert config["global_sparsity"] == pytest.approx(0.6, abs=1e-3)
    for name in ("report.json", "report.md", "report.png", "model.safetensors", "compressed.json"):
        assert (tmp_path / "out" / name).exists(), name


@pytest.mark.slow
def test_int8_static_cli_end_to_end(tmp_path):
    result = run_cli("--task", "digits-cnn", "--method", "int8-static", "--calib-batches", "4", "--out", str(tmp_path), "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["backend"] == "pt2e-x86" and report["compiled"]
    assert report["summary"]["relative_quality_loss"] < 0.02
    assert report["summary"]["memory_ratio"] > 3.0


def test_shipped_compress_configs_validate():
    from pathlib import Path

    from flopwise.compress.commands import resolve_config

    configs = sorted((Path(__file__).parents[2] / "configs").glob("compress_*.yaml"))
    assert len(configs) >= 4
    for path in configs:
        cfg, source = resolve_config(str(path), {})
        assert cfg.method in ("int8-static", "int8-dynamic", "qat", "prune", "2:4"), path
    cfg, _ = resolve_config(str(Path(__file__).parents[2] / "configs" / "compress_prune.yaml"), {})
    assert cfg.method == "prune" and cfg.sparsity == 0.6 and cfg.schedule == "gradual"


def test_latency_batch_one_is_refused_by_a_model_method_before_any_work(tmp_path):
    result = run_cli("--task", "digits-mlp", "--method", "prune", "--latency-batch", "1", "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    lines = _error_lines(result.stderr)
    assert len(lines) == 1 and "--latency-batch 1: batch 1 is always measured" in lines[0]
    assert not (tmp_path / "out").exists()
