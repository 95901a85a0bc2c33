"""Real multi-process runs: `flopwise train` starts torchrun (gloo, 2 CPU processes).

Stated tolerance: with the same global batch and seed, the per-step loss of a 2-process
run (mean of the ranks' losses) matches a 1-process run within 1e-4 relative over 6
AdamW steps in fp32 (the differences are float summation order in the gradient
reduction). Only the FSDP2 run is in the default suite; each torchrun start costs
seconds on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from flopwise.config.loading import load_config
from flopwise.train.loop import run_training
from flopwise.train.parallel.distributed import init_distributed

STEPS = 6
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    (root / "text").mkdir()
    text = "".join(f"class Item{i % 31}:\n    size = {i % 17}\n    name = 'item {i}'\n" for i in range(3000))
    (root / "text" / "items.py").write_text(text)
    return root


def base_config(corpus: Path, run_dir: Path, micro_batch: int, **parallel) -> dict:
    """A tiny run; every parameter's first dimension is even so FSDP2 shards split exactly."""
    return {
        "model": {"n_layers": 2, "hidden": 32, "n_heads": 2, "max_seq_len": 64},
        "data": {"paths": [str(corpus / "text")], "cache_dir": str(corpus / "cache"), "vocab_size": 320,
                 "seq_len": 32, "prefetch": 2, "tokenizer_train_bytes": 200000},
        "parallel": parallel,
        "training": {"max_steps": STEPS, "micro_batch_size": micro_batch, "warmup_steps": 2, "lr": 1e-2,
                     "eval_every": STEPS, "eval_batches": 2},
        "logging": {"run_dir": str(run_dir), "progress": False},
    }


def run_cli(config: dict, tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID")}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run([sys.executable, "-m", "flopwise", "train", str(path), *overrides], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)


def metrics(run_dir: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (run_dir / f"metrics.rank{rank}.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def single_process_reference(corpus, tmp_path_factory):
    """One process, micro-batch 8 (the same global batch as 2 ranks x 4), run in this process."""
    run_dir = tmp_path_factory.mktemp("single") / "run"
    config = base_config(corpus, run_dir, 8, strategy="single", nproc_per_node=1)
    path = run_dir.parent / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    cfg = load_config(path)
    run_training(cfg, init_distributed(cfg.parallel))
    return metrics(run_dir, 0)


def assert_same_trajectory(reference: list[dict], run_dir: Path) -> None:
    ranks = [metrics(run_dir, 0), metrics(run_dir, 1)]
    assert [r["step"] for r in ranks[0]] == list(range(1, STEPS + 1))
    for step in range(STEPS):
        mean_loss = (ranks[0][step]["loss"] + ranks[1][step]["loss"]) / 2
        assert mean_loss == pytest.approx(reference[step]["loss"], rel=TOLERANCE), f"step {step + 1}"
        assert ranks[0][step]["grad_norm"] == pytest.approx(reference[step]["grad_norm"], rel=1e-3)


@pytest.mark.distributed
def test_fsdp2_on_two_processes_matches_one_process_and_shards_parameters(corpus, tmp_path, single_process_reference):
    run_dir = tmp_path / "fsdp"
    result = run_cli(base_config(corpus, run_dir, 4, strategy="fsdp", nproc_per_node=2), tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "predicted vs measured" in result.stdout
    assert_same_trajectory(single_process_reference, run_dir)

    full = single_process_reference[-1]
    for rank in (0, 1):
        last = metrics(run_dir, rank)[-1]
        assert last["rank"] == rank
        assert last["memory_parameters_bytes"] * 2 == full["memory_parameters_bytes"]
        assert last["memory_gradients_bytes"] * 2 == full["memory_gradients_bytes"]
        assert last["memory_optimizer_bytes"] * 2 == full["memory_optimizer_bytes"]
    assert {p.name for p in run_dir.iterdir()} >= {"config.yaml", "plan.json", "metrics.rank0.jsonl",
                                                   "metrics.rank1.jsonl", "predicted_vs_measured.json"}
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["inputs"]["layout"]["dp"] == 2 and plan["inputs"]["layout"]["zero_stage"] == 3
    comparison = json.loads((run_dir / "predicted_vs_measured.json").read_text())
    assert comparison["hardware"]["devices"] == 2
    assert comparison["measured"]["memory_bytes"]["weights"] == full["memory_parameters_bytes"] // 2
    # one step's collectives, counted as they ran: the gradients reduce-scattered once (half of them
    # sent by each rank), the weights gathered for forward and again for backward except the root's
    sent = comparison["measured"]["comm_bytes_by_kind"]["dp"]
    assert sent["reduce_scatter"] == full["memory_gradients_bytes"] / 2
    assert full["memory_parameters_bytes"] / 2 < sent["all_gather"] <= full["memory_parameters_bytes"]
    assert comparison["measured_over_predicted"]["comm_dp"] == pytest.approx(1.0, abs=0.25)


@pytest.mark.slow
@pytest.mark.distributed
def test_ddp_on_two_processes_matches_one_process(corpus, tmp_path, single_process_reference):
    run_dir = tmp_path / "ddp"
    result = run_cli(base_config(corpus, run_dir, 4, strategy="ddp", nproc_per_node=2, ddp_bucket_mb=1), tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_trajectory(single_process_reference, run_dir)
    full = single_process_reference[-1]
    assert metrics(run_dir, 1)[-1]["memory_parameters_bytes"] == full["memory_parameters_bytes"]  # replicated


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp2_with_accumulation_and_checkpointing_matches_one_process(corpus, tmp_path, single_process_reference):
    """2 ranks x 2 micro-steps x 2 sequences, gradient sync only on the last micro-step."""
    run_dir = tmp_path / "fsdp_accum"
    config = base_config(corpus, run_dir, 2, strategy="fsdp", nproc_per_node=2)
    config["training"].update(global_batch_size=8, gradient_checkpointing=True)
    result = run_cli(config, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_trajectory(single_process_reference, run_dir)


@pytest.mark.distributed
def test_fsdp2_syncing_every_micro_step_trains_the_same_and_reduces_each_time(corpus, tmp_path,
                                                                            single_process_reference):
    """`parallel.fsdp_grad_sync=every_micro_step`: 2 ranks x 2 micro-steps reduce-scatter twice per step
    (as measured and as planned), keep only gradient shards (as planned), and train as one process does."""
    run_dir = tmp_path / "fsdp_every"
    config = base_config(corpus, run_dir, 2, strategy="fsdp", nproc_per_node=2, fsdp_grad_sync="every_micro_step")
    config["training"].update(global_batch_size=8)
    result = run_cli(config, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_trajectory(single_process_reference, run_dir)
    full = single_process_reference[-1]
    comparison = json.loads((run_dir / "predicted_vs_measured.json").read_text())
    sent = comparison["measured"]["comm_bytes_by_kind"]["dp"]
    assert sent["reduce_scatter"] == 2 * full["memory_gradients_bytes"] / 2  # two micro-steps, half sent each
    assert comparison["measured_over_predicted"]["comm_dp"] == pytest.approx(1.0, abs=0.25)
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["memory"]["gradients"] == pytest.approx(full["memory_gradients_bytes"] / 2, rel=0.02)


def block_mib(model: dict) -> float:
    """MiB of fp32 parameters in one block of the `model` section's decoder."""
    from flopwise.config.schema import ModelConfig
    from flopwise.train.model import build_model

    built = build_model(ModelConfig(**model), 320)
    return sum(p.numel() * p.element_size() for p in built.blocks[0].parameters()) / 2**20


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp2_units_of_grouped_blocks_train_as_per_block_units_and_resume_exactly(corpus, tmp_path):
    """3 blocks as units of 2 + 1 (with activation checkpointing) against one unit per block:
    the same math in fewer collectives; a resume repeats the steps bit for bit, and the
    checkpoint loads under the other grouping (DCP keys are parameter names, not units)."""
    def config(name: str, unit_mb: float) -> dict:
        cfg = base_config(corpus, tmp_path / name, 4, strategy="fsdp", nproc_per_node=2, fsdp_unit_mb=unit_mb)
        cfg["model"]["n_layers"] = 3
        cfg["training"]["gradient_checkpointing"] = unit_mb > 0
        cfg["checkpoint"] = {"every_steps": 3, "keep_last": 2}
        return cfg

    def losses(run_dir: Path, rank: int) -> dict[int, float]:
        return {r["step"]: r["loss"] for r in metrics(run_dir, rank)}

    unit_mb = 1.5 * block_mib(config("x", 0)["model"])  # two blocks reach it, one does not
    per_block, grouped = config("per_block", 0), config("grouped", unit_mb)
    for cfg in (per_block, grouped):
        result = run_cli(cfg, tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
    per_block_dir, grouped_dir = tmp_path / "per_block", tmp_path / "grouped"
    for rank in (0, 1):
        a, b = losses(per_block_dir, rank), losses(grouped_dir, rank)
        assert sorted(b) == list(range(1, STEPS + 1))
        for step in a:
            assert b[step] == pytest.approx(a[step], rel=1e-6), (rank, step)
    comparison = json.loads((grouped_dir / "predicted_vs_measured.json").read_text())
    assert comparison["measured_over_predicted"]["comm_dp"] == pytest.approx(1.0, abs=0.25)

    step3 = grouped_dir / "checkpoints" / "step-3"
    resumed = dict(grouped, logging={"run_dir": str(tmp_path / "resumed"), "progress": False})
    regrouped = dict(config("regrouped", 0), logging={"run_dir": str(tmp_path / "regrouped"), "progress": False})
    for cfg in (resumed, regrouped):
        result = run_cli(cfg, tmp_path, f"checkpoint.resume_from={step3}")
        assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):
        first, again = losses(grouped_dir, rank), losses(tmp_path / "resumed", rank)
        assert sorted(again) == list(range(4, STEPS + 1))
        assert all(again[step] == first[step] for step in again), rank  # bit for bit
        other = losses(tmp_path / "regrouped", rank)
        assert sorted(other) == list(range(4, STEPS + 1))
        for step in other:
            assert other[step] == pytest.approx(first[step], rel=1e-6), (rank, step)


@pytest.mark.slow
@pytest.mark.distributed
def test_a_bad_model_config_in_a_multi_process_run_is_one_line_and_exit_2(corpus, tmp_path):
    """Caught by the pre-flight check before torchrun starts ranks: one line naming the file and the key."""
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text('{"model_type": "llama", "vocab_size": 10}')
    config = base_config(corpus, tmp_path / "err", 4, strategy="ddp", nproc_per_node=2)
    config["model"] = {"kind": "hf", "hf_config": str(tmp_path / "hf" / "config.json")}
    result = run_cli(config, tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "config.json" in lines[0] and "missing key 'hidden_size'" in lines[0], result.stderr


def test_torchrun_command_line_for_one_and_several_nodes(tmp_path):
    from flopwise.train.launch.start import FORWARDED_SIGNALS, torchrun_args

    single = load_config(None, ["parallel.nproc_per_node=4"])
    assert torchrun_args(single, tmp_path / "c.yaml") == [
        "--nproc-per-node=4", "--standalone", "--max-restarts=0", f"--signals-to-handle={FORWARDED_SIGNALS}",
        "-m", "flopwise.train.launch.worker", str(tmp_path / "c.yaml")]
    multi = load_config(Path(__file__).resolve().parents[3] / "configs" / "multi_node.yaml",
                        ["parallel.node_rank=1", "parallel.max_restarts=2"])
    args = torchrun_args(multi, tmp_path / "c.yaml")
    assert args[:6] == ["--nproc-per-node=8", "--nnodes=2", "--node-rank=1", "--rdzv-backend=c10d",
                        "--rdzv-endpoint=node0.cluster.local:29500", "--rdzv-id=flopwise-multi-node"]
    assert "--max-restarts=2" in args and "--standalone" not in args


@pytest.mark.slow
@pytest.mark.distributed
def test_a_dead_rank_brings_the_job_down(corpus, tmp_path):
    """SIGKILL one worker mid-run: torchrun stops the other and the command fails with one line."""
    import signal
    import time

    psutil = pytest.importorskip("psutil")
    run_dir = tmp_path / "dead"
    config = base_config(corpus, run_dir, 4, strategy="fsdp", nproc_per_node=2, timeout_minutes=1)
    config["training"]["max_steps"] = 100000
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID")}
    proc = subprocess.Popen([sys.executable, "-m", "flopwise", "train", str(path)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not (run_dir / "metrics.rank1.jsonl").exists() or not (run_dir / "metrics.rank1.jsonl").read_text():
            assert proc.poll() is None and time.monotonic() < deadline, "the run did not start"
            time.sleep(0.5)
        workers = [p for p in psutil.Process(proc.pid).children(recursive=True) if p.environ().get("RANK") == "1"]
        assert workers, "rank 1 not found"
        killed_at = time.monotonic()
        workers[0].send_signal(signal.SIGKILL)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    assert time.monotonic() - killed_at < 60  # well within parallel.timeout_minutes=1
    assert stderr.strip().splitlines()[-1].startswith("error: rank 1 failed")


@pytest.mark.slow
@pytest.mark.distributed
def test_inside_an_existing_torchrun_it_runs_directly(corpus, tmp_path):
    """`torchrun -m flopwise train CONFIG` must not start a second torchrun."""
    run_dir = tmp_path / "inside"
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(base_config(corpus, run_dir, 4, strategy="ddp", nproc_per_node=2)))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                             "-m", "flopwise", "train", str(path)], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(metrics(run_dir, 0)) == STEPS and len(metrics(run_dir, 1)) == STEPS
    assert not (run_dir / "metrics.rank2.jsonl").exists()
