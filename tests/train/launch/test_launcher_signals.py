"""Signals to the launcher of a 2-process run (`flopwise train` running torchrun in-process).

- SIGTERM, SIGINT, SIGUSR1: torchrun forwards the signal, the ranks agree, save and stop;
  the command exits 75 with one line on stderr and no traceback, and the next identical
  command continues bit for bit;
- three quick Ctrl-Cs: the same, once: the first is forwarded, the others change nothing;
- SIGKILL: nobody can forward anything; the workers' parent-death guard ends them within 10 s;
- a rank stopped with SIGSTOP: the launcher's heartbeat watch names it and ends the job (exit 4)
  long before the process-group timeout.
"""

from __future__ import annotations

import signal
import socket
import time

import pytest

from flopwise.train.checkpoint import store as ckpt
from tests.train.checkpoint.test_policy import config, corpus, losses, train_cli, wait_for_step, write  # noqa: F401

psutil = pytest.importorskip("psutil")


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):  # noqa: F811
    """Two FSDP2 processes, uninterrupted."""
    root = tmp_path_factory.mktemp("signals-ref")
    proc = train_cli(write(config(corpus, root / "run", nproc=2, micro=4), root / "config.yaml"))
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return root / "run"


@pytest.mark.distributed
@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow),
                                 pytest.param(signal.SIGUSR1, marks=pytest.mark.slow)])
def test_a_stop_signal_to_the_launcher_saves_exits_75_with_one_line_and_continues_exactly(
        corpus, tmp_path, reference, sig):  # noqa: F811
    run_dir = tmp_path / "run"
    path = write(config(corpus, run_dir, nproc=2, micro=4, checkpoint={"every_steps": 100, "grace_seconds": 60},
                        parallel={"max_restarts": 2}), tmp_path / "config.yaml")
    proc = train_cli(path)
    try:
        wait_for_step(proc, run_dir / "metrics.rank1.jsonl", 3)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 75, err[-3000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err[-3000:]  # no SignalException traceback, no restart
    assert lines[0].startswith(f"error: preempted by {sig.name} at step"), lines[0]
    assert ckpt.published_steps(run_dir), "no checkpoint written"
    rerun = train_cli(path)
    out, err = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, err[-3000:]
    assert "resumed from checkpoint step-" in out
    for rank in (0, 1):
        assert losses(run_dir, rank) == losses(reference, rank)  # bit for bit


@pytest.mark.distributed
def test_killing_the_launcher_leaves_no_worker_alive_within_10_seconds(corpus, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    path = write(config(corpus, run_dir, nproc=2, micro=4, training={"max_steps": 10_000}), tmp_path / "config.yaml")
    proc = train_cli(path)
    workers = []
    try:
        wait_for_step(proc, run_dir / "metrics.rank1.jsonl", 1)
        workers = [p for p in psutil.Process(proc.pid).children(recursive=True) if "RANK" in p.environ()]
        assert len(workers) == 2
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        alive = workers
        while alive and time.monotonic() < deadline:
            time.sleep(0.2)
            alive = [w for w in alive if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]
        assert not alive, f"workers still running 10 s after the launcher died: {[w.pid for w in alive]}"
    finally:
        for worker in workers:
            if worker.is_running():
                worker.kill()
        if proc.poll() is None:
            proc.kill()


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("gap", [0.02, 0.3])
def test_three_quick_ctrl_cs_save_once_exit_75_with_one_line_and_continue_exactly(
        corpus, tmp_path, reference, gap):  # noqa: F811
    """They once cut torchrun's shutdown short: exit 130, "before the ranks saved", rank tracebacks."""
    run_dir = tmp_path / "run"
    path = write(config(corpus, run_dir, nproc=2, micro=4, checkpoint={"every_steps": 100, "grace_seconds": 60}),
                 tmp_path / "config.yaml")
    proc = train_cli(path)
    try:
        wait_for_step(proc, run_dir / "metrics.rank1.jsonl", 3)
        for _ in range(3):
            proc.send_signal(signal.SIGINT)
            time.sleep(gap)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 75, err[-3000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: preempted by SIGINT at step"), err[-3000:]
    step = int(lines[0].split(" at step ")[1].split(":")[0])
    assert f"checkpoint {run_dir / 'checkpoints' / f'step-{step}'} written" in lines[0]
    assert [s for s, _ in ckpt.published_steps(run_dir)][-1] == step
    rerun = train_cli(path)
    out, err = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, err[-3000:]
    assert f"resumed from checkpoint step-{step}" in out
    for rank in (0, 1):
        assert losses(run_dir, rank) == losses(reference, rank)  # bit for bit


@pytest.mark.distributed
@pytest.mark.slow
def test_a_stopped_rank_is_named_and_the_job_ends_with_exit_4(corpus, tmp_path):  # noqa: F811
    """SIGSTOP on rank 1: without the heartbeat the other rank waits for the process-group timeout
    (an hour here); the communicate() timeout below is the hang guard."""
    run_dir = tmp_path / "run"
    path = write(config(corpus, run_dir, nproc=2, micro=4, training={"max_steps": 10_000},
                        parallel={"stall_seconds": 10, "timeout_minutes": 60}), tmp_path / "config.yaml")
    proc = train_cli(path)
    workers = {}
    try:
        wait_for_step(proc, run_dir / "metrics.rank1.jsonl", 3)
        workers = {int(p.environ()["RANK"]): p for p in psutil.Process(proc.pid).children(recursive=True)
                   if "RANK" in p.environ()}
        workers[1].send_signal(signal.SIGSTOP)
        stopped_after = len((run_dir / "metrics.rank1.jsonl").read_text().splitlines())
        _, err = proc.communicate(timeout=300)
    finally:
        for worker in workers.values():
            if worker.is_running():
                worker.kill()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 4, err[-3000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err[-3000:]
    assert lines[0].startswith(f"error: rank 1 on {socket.gethostname()} (pid {workers[1].pid}) stalled: "
                               "no heartbeat for "), lines[0]
    step = int(lines[0].split("last finished step ")[1].split(";")[0])
    assert step in (stopped_after - 1, stopped_after)  # its beat follows its metrics line by a moment
    assert "parallel.stall_seconds=10" in lines[0]
    assert not [w for w in workers.values() if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]
