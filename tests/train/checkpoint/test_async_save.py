"""Background checkpoints keep the guarantees of the blocking save, with real processes and files.

The background write is slowed with `FLOPWISE_TEST_SLOW_CHECKPOINT_WRITE` (a sleep after
DCP wrote the model files, before the trainer state and the manifest), so a kill lands
while a save is in flight:

- kill -9 during the write: the folder stays `.tmp-step-N`, never read; the next command
  resumes from the previous published checkpoint and repeats an uninterrupted run's losses
  bit for bit;
- SIGTERM during the write (2 FSDP2 processes under `flopwise train`): the save in flight
  is published, the signal's own checkpoint is written, exit 75, and the next command
  continues bit for bit.
"""

from __future__ import annotations

import json
import signal
import time

import pytest

from flopwise.train.checkpoint import store as ckpt
from flopwise.train.checkpoint.async_save import SLOW_WRITE_ENV
from tests.torchrun_runs import assert_the_same_command_continues, preempt_with_sigterm
from tests.train.checkpoint.test_policy import (  # noqa: F401  (fixtures)
    config, corpus, losses, single_reference, train_cli, two_process_reference, write,
)


def wait_for_write_in_flight(proc, run_dir, timeout: float = 300) -> int:
    """The step of a save whose model files are written but which is not yet published."""
    deadline = time.monotonic() + timeout
    folder = run_dir / "checkpoints"
    while True:
        for tmp in folder.glob(f"{ckpt.TMP_PREFIX}*") if folder.is_dir() else []:
            if (tmp / ".metadata").is_file() and ckpt.published_steps(run_dir):
                return int(tmp.name[len(ckpt.TMP_PREFIX):])
        assert proc.poll() is None, f"the run ended early: {proc.communicate()[1][-2000:]}"
        assert time.monotonic() < deadline, "no save was in flight"
        time.sleep(0.02)


def test_kill_9_during_the_background_write_resumes_bit_exact_from_the_previous_checkpoint(
        corpus, tmp_path, single_reference, monkeypatch):
    run_dir = tmp_path / "run"
    path = write(config(corpus, run_dir), tmp_path / "config.yaml")
    monkeypatch.setenv(SLOW_WRITE_ENV, "3")
    proc = train_cli(path)
    try:
        in_flight = wait_for_write_in_flight(proc, run_dir)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    published = [step for step, _ in ckpt.published_steps(run_dir)]
    assert in_flight not in published and published and max(published) < in_flight
    previous = max(published)
    assert (run_dir / "checkpoints" / f"{ckpt.TMP_PREFIX}{in_flight}").is_dir()  # killed mid-write

    monkeypatch.delenv(SLOW_WRITE_ENV)
    rerun = train_cli(path)
    out, err = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, err[-3000:]
    assert f"resumed from checkpoint step-{previous}" in " ".join(out.split())
    assert losses(run_dir) == single_reference  # bit for bit
    manifest = json.loads((run_dir / "checkpoints" / "step-10" / "manifest.json").read_text())
    assert manifest["files"] and all(set(entry) & {"blake3", "sha256"} for entry in manifest["files"].values())
    assert ckpt.verify_checkpoint(run_dir / "checkpoints" / "step-10") is None


@pytest.mark.distributed
def test_sigterm_during_the_background_write_publishes_it_exits_75_and_resumes_bit_exact(
        corpus, tmp_path, two_process_reference, monkeypatch):
    run_dir = tmp_path / "run"
    path = write(config(corpus, run_dir, nproc=2, micro=4, checkpoint={"grace_seconds": 60}),
                 tmp_path / "config.yaml")
    monkeypatch.setenv(SLOW_WRITE_ENV, "3")
    proc = train_cli(path)
    in_flight, line = preempt_with_sigterm(proc, lambda: wait_for_write_in_flight(proc, run_dir))
    stopped_at = int(line.split("at step ")[1].split(":")[0])
    published = [step for step, _ in ckpt.published_steps(run_dir)]
    assert in_flight in published and stopped_at in published  # the save in flight finished, then the signal's
    assert not list((run_dir / "checkpoints").glob(f"{ckpt.TMP_PREFIX}*"))
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == f"step-{stopped_at}"

    monkeypatch.delenv(SLOW_WRITE_ENV)
    assert_the_same_command_continues(path, stopped_at, run_dir, two_process_reference)


class _Loader:
    def state_dict(self) -> dict:
        return {"position": 0}


class _Strategy:
    """The checkpoint half of the one-process strategy, on a bare module."""

    checkpoint_format = "dcp"

    def __init__(self, model):
        self.model = model

    def checkpoint_state_dict(self, state) -> dict:
        from flopwise.train.checkpoint.dcp_state import dcp_state_dict

        return dcp_state_dict(self.model, state.optimizer)


def test_the_checkpoint_holds_the_state_at_the_save_step_while_training_changes_it(tmp_path):
    """Staging copies: weights changed in place right after `start` returns are not in the checkpoint;
    the manifest's checksums (computed while writing, `.metadata` after DCP's rename) match the files."""
    import torch

    from flopwise.train.checkpoint.async_save import AsyncSaver
    from flopwise.train.checkpoint.dcp_state import load_dcp
    from flopwise.train.checkpoint.hashing import algorithm_of, file_digest
    from flopwise.train.loop import TrainState
    from flopwise.train.parallel.distributed import DistEnv

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Linear(256, 64))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(8, 64)).square().mean().backward()
    optimizer.step()
    state = TrainState(built=None, optimizer=optimizer, scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0),
                       scaler=None, train_loader=_Loader(), step=5, strategy=_Strategy(model))
    env = DistEnv(rank=0, world_size=1, local_rank=0, backend=None, device=torch.device("cpu"), distributed=False)
    saver = AsyncSaver(ckpt.SaveContext(tmp_path, {}, 1, 1, "single"), env, keep_last=2, pin=[])
    at_save = [p.detach().clone() for p in model.parameters()]
    saver.start(state)
    with torch.no_grad():  # the next steps, while the save is written
        for p in model.parameters():
            p.mul_(-3.0).add_(1.0)
    outcome = saver.wait()
    saver.close()
    assert outcome.path == tmp_path / "checkpoints" / "step-5" and not outcome.failure
    assert ckpt.verify_checkpoint(outcome.path) is None
    manifest = ckpt.read_manifest(outcome.path)
    assert ".metadata" in manifest["files"]
    for name, entry in manifest["files"].items():
        assert entry[algorithm_of(entry)] == file_digest(outcome.path / name, algorithm_of(entry))

    fresh = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Linear(256, 64))
    load_dcp(fresh, torch.optim.AdamW(fresh.parameters()), outcome.path)
    assert all(torch.equal(a, b) for a, b in zip(fresh.parameters(), at_save))
