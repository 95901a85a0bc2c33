"""`flopwise train` runs on 2 real processes, as the distributed tests start and check them: run one to the
end, SIGKILL one after it published a checkpoint, rerun the identical command and compare every rank's
losses with an uninterrupted run's. One copy, shared by the checkpoint, chat and LoRA tests."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Callable, TypeVar

from flopwise.train.checkpoint import store as ckpt
from tests.train.checkpoint.test_policy import losses, train_cli

T = TypeVar("T")


def run_to_end(path: Path, timeout: float = 600) -> str:
    """Run `flopwise train path` to its end; it must succeed. Returns its stdout."""
    proc = train_cli(path)
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return out


def rank_mean_losses(run_dir: Path) -> list[float]:
    """Each of 2 ranks logs its share of a step's loss; their mean is the step's loss."""
    return [(a + b) / 2 for a, b in zip(losses(run_dir, 0), losses(run_dir, 1))]


def wait_for_checkpoint_and_step(proc, run_dir, step: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    metrics = run_dir / "metrics.rank1.jsonl"
    while True:
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        if len(lines) >= step and ckpt.published_steps(run_dir):
            return
        assert proc.poll() is None, f"the run ended early: {proc.communicate()[1][-2000:]}"
        assert time.monotonic() < deadline, "the run did not reach the step"
        time.sleep(0.05)


def kill_launcher_and_workers(proc) -> None:
    """SIGKILL the launcher; its workers die with it (parent-death guard); wait until they are gone."""
    import psutil

    workers = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    _, alive = psutil.wait_procs(workers, timeout=20)
    for worker in alive:  # the guard failed: do not leave them running, and fail below
        worker.kill()
    assert not alive, f"workers outlived the launcher: {[w.pid for w in alive]}"


def assert_the_same_command_continues(path, step: int, run_dir, ref_dir) -> None:
    """Rerun the identical command: it resumes from `step` and every rank's losses equal the reference's."""
    rerun = train_cli(path)
    out, err = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, err[-3000:]
    assert f"resumed from checkpoint step-{step}" in " ".join(out.split())
    for rank in (0, 1):
        assert losses(run_dir, rank) == losses(ref_dir, rank)  # bit for bit


def assert_killed_run_continues_bit_for_bit(path: Path, run_dir: Path, ref_dir: Path, steps: int,
                                            kill_after: int) -> None:
    """Start `path`, SIGKILL it once rank 1 logged `kill_after` steps and a checkpoint is published (before
    its last of `steps`), then rerun the identical command: it continues as `ref_dir`'s run did."""
    proc = train_cli(path)
    try:
        wait_for_checkpoint_and_step(proc, run_dir, kill_after)
        kill_launcher_and_workers(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    saved = [step for step, _ in ckpt.published_steps(run_dir)]
    assert saved and max(saved) < steps
    assert_the_same_command_continues(path, max(saved), run_dir, ref_dir)


def preempt_with_sigterm(proc, ready: Callable[[], T]) -> tuple[T, str]:
    """Once `ready()` returns, SIGTERM the launcher: it must save, exit 75 and print exactly one error line.
    Returns what `ready()` returned and that line."""
    try:
        value = ready()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 75, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith("error: preempted by SIGTERM at step"), err[-3000:]
    return value, lines[0]
