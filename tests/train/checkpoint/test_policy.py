"""Faults with real processes and real files: kill -9 then rerun, SIGTERM on one of two ranks
(agreed stop, checkpoint, torchrun relaunch, exact continuation), a checkpoint saved by 2
processes resumed by 1 (and 1 -> 2), and a save that fails on a full disk.

Disk full is simulated with the kernel's per-process file-size limit (`RLIMIT_FSIZE`, with
SIGXFSZ ignored): every write past the limit fails with a real `OSError(EFBIG)` from the
file system call, the same path a full disk (ENOSPC) takes through DCP and our writer; no
code of ours is patched. A tmpfs or a quota would need root mounts.
"""

from __future__ import annotations

import json
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from flopwise.train.checkpoint import store as ckpt
from flopwise.config.loading import load_config
from flopwise.train.loop import run_training
from flopwise.train.parallel.distributed import init_distributed

STEPS = 10


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    (root / "text").mkdir()
    text = "".join(f"class Node{i % 29}:\n    depth = {i % 13}\n    label = 'node {i}'\n" for i in range(3000))
    (root / "text" / "nodes.py").write_text(text)
    return root


def config(corpus: Path, run_dir: Path, nproc: int = 1, micro: int = 8, **sections) -> dict:
    cfg = {
        "model": {"n_layers": 2, "hidden": 32, "n_heads": 2, "max_seq_len": 64},
        "data": {"paths": [str(corpus / "text")], "cache_dir": str(corpus / "cache"), "vocab_size": 320,
                 "seq_len": 32, "prefetch": 2, "tokenizer_train_bytes": 200000},
        "parallel": {"strategy": "single" if nproc == 1 else "fsdp", "nproc_per_node": nproc},
        "training": {"max_steps": STEPS, "micro_batch_size": micro, "global_batch_size": 8, "warmup_steps": 2,
                     "lr": 1e-2, "eval_every": STEPS, "eval_batches": 2},
        "checkpoint": {"every_steps": 2, "keep_last": 20},
        "logging": {"run_dir": str(run_dir), "progress": False},
    }
    for section, values in sections.items():
        cfg[section].update(values)
    return cfg


def write(cfg: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg))
    return path


def clean_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID")}
    env["OMP_NUM_THREADS"] = "1"
    return env


def train_cli(config_path: Path, *args: str, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "flopwise", "train", str(config_path), *args],
                            cwd=config_path.parent, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **popen)


def losses(run_dir: Path, rank: int = 0) -> list[float]:
    records = [json.loads(line) for line in (run_dir / f"metrics.rank{rank}.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, len(records) + 1)), "steps repeated or missing"
    return [r["loss"] for r in records]


def wait_for_step(proc: subprocess.Popen, metrics: Path, step: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while True:
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        if len(lines) >= step:
            return
        assert proc.poll() is None, f"the run ended early: {proc.communicate()[1][-2000:]}"
        assert time.monotonic() < deadline, "the run did not reach the step"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def single_reference(corpus, tmp_path_factory):
    """One process, no interruption, in this process: the losses every resumed one-process run repeats."""
    run_dir = tmp_path_factory.mktemp("ref1") / "run"
    cfg = load_config(write(config(corpus, run_dir), run_dir.parent / "config.yaml"))
    run_training(cfg, init_distributed(cfg.parallel))
    return losses(run_dir)


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow),
                                  pytest.param(3, marks=pytest.mark.slow)])
def test_kill_9_at_a_random_step_then_rerun_gives_the_same_losses(corpus, tmp_path, single_reference, seed):
    kill_after = random.Random(seed).randint(2, STEPS - 2)
    run_dir = tmp_path / "run"
    path = write(config(corpus, run_dir), tmp_path / "config.yaml")
    proc = train_cli(path)
    try:
        wait_for_step(proc, run_dir / "metrics.rank0.jsonl", kill_after)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    # checkpoints are written in the background: a kill soon after the first save can land before
    # it is published (it stays a .tmp- folder), and then the rerun rightly starts from step 0
    published = [p for p in (run_dir / "checkpoints").glob("step-*") if p.is_dir()]
    rerun = train_cli(path)
    out, err = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, err[-3000:]
    assert ("resumed from checkpoint step-" in out) == bool(published), (published, out[-2000:])
    assert losses(run_dir) == single_reference  # bit for bit


LONG_STEPS = 400  # a one-process step of this tiny model takes milliseconds: give the signal a run to land in
LONG = {"max_steps": LONG_STEPS, "eval_every": LONG_STEPS}


def long_reference(corpus: Path, tmp_path: Path) -> list[float]:
    """The losses of an uninterrupted one-process run of LONG_STEPS."""
    reference_dir = tmp_path / "reference"
    reference_cfg = load_config(write(config(corpus, reference_dir, training=LONG), tmp_path / "reference.yaml"))
    run_training(reference_cfg, init_distributed(reference_cfg.parallel))
    return losses(reference_dir)


def test_sigterm_on_one_process_saves_and_its_own_retry_loop_continues_exactly(corpus, tmp_path):
    single_reference = long_reference(corpus, tmp_path)
    run_dir = tmp_path / "run"
    cfg = config(corpus, run_dir, checkpoint={"every_steps": 1000, "grace_seconds": 60}, parallel={"max_restarts": 1},
                 training=LONG)
    proc = train_cli(write(cfg, tmp_path / "config.yaml"))
    try:
        wait_for_step(proc, run_dir / "metrics.rank0.jsonl", 3)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    stop = re.search(r"preempted by SIGTERM at step (\d+): checkpoint \S+ written", " ".join(err.split()))
    assert stop and "restart 1 of 1" in err, err[-3000:]
    assert f"resumed from checkpoint step-{stop.group(1)}" in " ".join(out.split())
    assert losses(run_dir) == single_reference


@pytest.mark.slow
def test_without_restarts_a_preempted_run_exits_75_and_the_next_command_continues(corpus, tmp_path):
    # LONG_STEPS, as the test above: at STEPS the run could end before the signal landed
    reference = long_reference(corpus, tmp_path)
    run_dir = tmp_path / "run"
    path = write(config(corpus, run_dir, checkpoint={"every_steps": 1000}, training=LONG), tmp_path / "config.yaml")
    proc = train_cli(path)
    try:
        wait_for_step(proc, run_dir / "metrics.rank0.jsonl", 2)
        proc.send_signal(signal.SIGUSR1)
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 75, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("error: preempted by SIGUSR1 at step")
    rerun = train_cli(path)
    _, err = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, err[-3000:]
    assert losses(run_dir) == reference


def test_a_full_disk_during_a_save_keeps_the_previous_checkpoint(corpus, tmp_path, single_reference):
    run_dir = tmp_path / "run"
    cfg = load_config(write(config(corpus, run_dir), tmp_path / "config.yaml"))
    run_training(cfg, init_distributed(cfg.parallel))
    for step in (6, 8, 10):  # as if the run had been stopped after its step-4 checkpoint
        shutil.rmtree(run_dir / "checkpoints" / f"step-{step}")
    (run_dir / "checkpoints" / "latest").write_text("step-4\n")
    assert [s for s, _ in ckpt.published_steps(run_dir)] == [2, 4]

    limit = 128 * 1024  # above every log file of the run, below the model + optimizer shard

    def small_disk():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = train_cli(tmp_path / "config.yaml", preexec_fn=small_disk)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 2
    line = err.strip().splitlines()[-1]
    assert line.startswith("error: checkpoint step-6 could not be written to")
    assert "File too large" in line and "the previous checkpoint step-4 is intact" in line
    assert [s for s, _ in ckpt.published_steps(run_dir)] == [2, 4]
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step-4"
    assert not [p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".tmp")]
    assert ckpt.verify_checkpoint(run_dir / "checkpoints" / "step-4") is None

    proc = train_cli(tmp_path / "config.yaml")  # disk space back: continues exactly from step-4
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert losses(run_dir) == single_reference


# ------------------------------------------------------------------------- two processes


@pytest.fixture(scope="module")
def two_process_reference(corpus, tmp_path_factory):
    """Two FSDP2 processes (micro-batch 4 each, global batch 8), uninterrupted, checkpoint every 2 steps."""
    root = tmp_path_factory.mktemp("ref2")
    run_dir = root / "run"
    proc = train_cli(write(config(corpus, run_dir, nproc=2, micro=4), root / "config.yaml"))
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return run_dir


@pytest.mark.distributed
def test_sigterm_on_one_rank_saves_and_the_relaunched_run_continues_exactly(corpus, tmp_path, two_process_reference):
    psutil = pytest.importorskip("psutil")
    run_dir = tmp_path / "run"
    cfg = config(corpus, run_dir, nproc=2, micro=4, checkpoint={"every_steps": 100, "grace_seconds": 60},
                 parallel={"max_restarts": 1})
    proc = train_cli(write(cfg, tmp_path / "config.yaml"))
    try:
        wait_for_step(proc, run_dir / "metrics.rank1.jsonl", 3)
        workers = [p for p in psutil.Process(proc.pid).children(recursive=True) if p.environ().get("RANK") == "1"]
        assert workers, "rank 1 not found"
        workers[0].send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    text = " ".join(out.split())  # the console may wrap long lines
    stop = re.search(r"preempted by (SIGTERM|a signal on another rank) at step (\d+): checkpoint (\S+) written "
                     r"([\d.]+) s after the signal", text)
    assert stop, out[-3000:]
    assert "more than checkpoint.grace_seconds" not in text  # saved within the 60 s grace period
    assert f"resumed from checkpoint step-{stop.group(2)}" in text
    for rank in (0, 1):
        assert losses(run_dir, rank) == losses(two_process_reference, rank)  # bit for bit


@pytest.mark.distributed
def test_saved_by_two_processes_resumed_by_one(corpus, tmp_path, two_process_reference):
    """The model/optimizer are resharded by DCP, the data position maps through global samples;
    the losses agree with the 2-process run to float-summation tolerance (not bitwise: the
    gradient all-reduce sums in another order)."""
    run_dir = tmp_path / "run"
    source = two_process_reference / "checkpoints" / "step-4"
    cfg = load_config(write(config(corpus, run_dir, checkpoint={"resume_from": str(source)}),
                            tmp_path / "config.yaml"))
    result = run_training(cfg, init_distributed(cfg.parallel))
    reference = [(a + b) / 2 for a, b in zip(losses(two_process_reference, 0), losses(two_process_reference, 1))]
    assert result.train_losses == pytest.approx(reference[4:], rel=1e-4)
    assert json.loads((source / "trainer.rank00001.json").read_text())["loader"]["position"] == 4 * 8


@pytest.mark.slow
@pytest.mark.distributed
def test_saved_by_one_process_resumed_by_two(corpus, tmp_path, single_reference):
    run_dir = tmp_path / "one"
    cfg = load_config(write(config(corpus, run_dir, training={"max_steps": STEPS}), tmp_path / "one.yaml"))
    run_training(cfg, init_distributed(cfg.parallel))
    two = tmp_path / "two"
    source = run_dir / "checkpoints" / "step-4"
    proc = train_cli(write(config(corpus, two, nproc=2, micro=4, checkpoint={"resume_from": str(source)}),
                           tmp_path / "two.yaml"))
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert "resharded: saved by 1 process(es), resumed on 2" in out
    mean = [(a + b) / 2 for a, b in zip(losses_from(two, 0), losses_from(two, 1))]
    assert mean == pytest.approx(single_reference[4:], rel=1e-4)


def losses_from(run_dir: Path, rank: int) -> list[float]:
    return [json.loads(line)["loss"] for line in (run_dir / f"metrics.rank{rank}.jsonl").read_text().splitlines()]
