"""What a run continues from, and restoring it: the choice (rank 0 picks, every rank agrees),
the load into a `TrainState`, the random streams, and the metrics written after it.

The choice, in order: `checkpoint.resume_from` (a step, a path, or `latest`) until this run
has continued from it once, then this run's own latest valid checkpoint
(`checkpoint.resume`). Going back to an older step of this run moves the newer ones to
`checkpoints/superseded/`, so an automatic restart cannot jump forward onto them.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import numpy as np
import torch

from flopwise.errors import UserError
from flopwise.train.checkpoint.checks import check_checkpoint_schema, latest_valid_or_stop
from flopwise.train.checkpoint.store import (
    FORMAT_VERSION, LATEST, checkpoints_dir, from_b64, latest_valid, published_steps,
    read_manifest, remove_stale_temporaries, resolve_checkpoint, trainer_file,
    write_text_atomic,
)
from flopwise.config.schema import CheckpointConfig
from flopwise.train.parallel.distributed import DistEnv, agree_max, barrier
from flopwise.runrecord.records import metrics_path
from flopwise.safe_write import make_entry_folder

RESUMED_FROM = "resumed_from.json"
RESHARD_SEED = 1_000_003  # per-rank torch seeds after a world-size change: distinct, reproducible
NO_CHECKPOINT_ERROR = 2**62  # rank 0 failed to pick one; larger than any step, so MAX carries it


def resume(state, cfg: CheckpointConfig, run_dir: Path, env: DistEnv, max_steps: int, report=print) -> list[str]:
    """Load the checkpoint to continue from (named, or the latest valid one) into `state`; notes for the log.

    Collective: every rank calls it. Returns no notes when there is nothing to resume.
    """
    if env.is_main:
        remove_stale_temporaries(run_dir)
    step = agreed_resume_step(cfg, run_dir, env, report)
    barrier(env)
    if step < 0:
        return []
    path = resume_path(cfg, run_dir, step)
    notes = load_checkpoint(state, path, env)
    if env.is_main and cfg.resume_from:
        mark_resume_from_done(run_dir, cfg.resume_from)
    trim_metrics(metrics_path(run_dir, env.rank), state.step)
    where = path if path.parent != checkpoints_dir(run_dir) else path.name
    if state.step >= max_steps:
        notes.append(f"nothing to train: training.max_steps={max_steps} is already reached "
                     "(raise it to continue, or use a fresh logging.run_dir)")
    return [f"resumed from checkpoint {where}: step {state.step}, {state.tokens_seen:,} tokens seen", *notes]


def agreed_resume_step(cfg: CheckpointConfig, run_dir: Path, env: DistEnv, report=print) -> int:
    """Rank 0 picks (and verifies) the checkpoint; every rank learns its step (-1: none), or the error."""
    step, error = -1, None
    if env.is_main:
        try:
            path = None
            spec = cfg.resume_from
            if spec and resume_from_done(run_dir, spec):
                path = latest_valid_or_stop(run_dir, report=report)  # continued here since
            if spec and path is None:
                path = resolve_checkpoint(run_dir, spec)
                supersede_newer(run_dir, path, report=report)
            elif not spec and cfg.resume:
                path = latest_valid_or_stop(run_dir, report=report)  # all invalid: one line, not step 0
            if path is not None:
                check_checkpoint_schema(path)  # a bad trainer state: one line here, not a KeyError on one rank
            step = int(read_manifest(path)["step"]) if path is not None else -1
        except UserError as err:
            error, step = err, NO_CHECKPOINT_ERROR
    agreed = agree_max([step], env)[0]  # rank 0's answer (the others say -1)
    if error is not None:
        raise error
    if agreed == NO_CHECKPOINT_ERROR:
        raise UserError("rank 0 could not pick a checkpoint to resume from (see its message)")
    return agreed


def resume_path(cfg: CheckpointConfig, run_dir: Path, step: int) -> Path:
    """The folder of the agreed step: this run's own, or another run's named by `resume_from`."""
    own = checkpoints_dir(run_dir) / f"step-{step}"
    spec = cfg.resume_from
    if spec and Path(spec).is_dir() and not own.is_dir():
        return Path(spec)  # a checkpoint of another run, not yet continued here
    return own


def resume_from_done(run_dir: Path, spec: str) -> bool:
    """True once this run dir has continued from `spec`: a restart (torchrun, requeue) then takes
    the run's own latest checkpoint instead of going back to `spec` again."""
    try:
        return json.loads((checkpoints_dir(run_dir) / RESUMED_FROM).read_text()).get("spec") == str(spec)
    except (OSError, ValueError, AttributeError):
        return False


def mark_resume_from_done(run_dir: Path, spec: str) -> None:
    """Record that `checkpoint.resume_from` was honoured (see `resume_from_done`)."""
    make_entry_folder(checkpoints_dir(run_dir))
    write_text_atomic(checkpoints_dir(run_dir) / RESUMED_FROM, json.dumps({"spec": str(spec)}))


def supersede_newer(run_dir: Path, chosen: Path, report=print) -> None:
    """Going back to an older checkpoint of this run: move the newer ones to `checkpoints/superseded/`
    (kept, not deleted) so that a later automatic resume cannot jump forward onto the abandoned branch."""
    if Path(chosen).parent.resolve() != checkpoints_dir(run_dir).resolve():
        return
    step = int(read_manifest(chosen)["step"])
    newer = [path for s, path in published_steps(run_dir) if s > step]
    if not newer:
        return
    folder = checkpoints_dir(run_dir) / "superseded" / time.strftime("%Y%m%dT%H%M%S")
    folder.mkdir(parents=True, exist_ok=True)
    for path in newer:
        os.rename(path, folder / path.name)
    write_text_atomic(checkpoints_dir(run_dir) / LATEST, Path(chosen).name + "\n")
    report(f"checkpoints after step {step} moved to {folder} (resuming from an earlier step)")





def load_checkpoint(state, path: Path, env: DistEnv) -> list[str]:
    """Restore `state` (model, optimizer, schedule, scaler, loader, RNGs) from `path`; returns notes for the log.

    Collective: every rank calls it. The strategy loads model and optimizer
    (`Strategy.load_state`); DCP reshards them when the world size or the torch strategy
    differs from the saving run. A checkpoint of another layout (DeepSpeed's files vs DCP)
    is refused in one line.
    """
    path = Path(path)
    manifest = read_manifest(path)
    if manifest.get("format") != FORMAT_VERSION:
        raise UserError(f"checkpoint {path}: format {manifest.get('format')} is not supported (allowed: {FORMAT_VERSION})")
    check_state_format(path, manifest, state.strategy)
    state.strategy.load_state(state, path)

    notes = []
    saved_world = int(manifest["world_size"])
    own = path / trainer_file(env.rank)
    exact_rng = saved_world == env.world_size and own.is_file()
    trainer = json.loads((own if exact_rng else path / trainer_file(0)).read_text())
    state.step = int(trainer["step"])
    state.tokens_seen = int(trainer["tokens_seen"])
    state.train_loader.load_state_dict(trainer["loader"])
    state.scheduler.load_state_dict(trainer["scheduler"])
    if state.scaler is not None and trainer.get("scaler"):
        state.scaler.load_state_dict(trainer["scaler"])
    if exact_rng:
        restore_rng(trainer["rng"])
    else:
        restore_rng(trainer["rng"])  # rank 0's streams, then torch's made distinct per rank
        torch.manual_seed(RESHARD_SEED * (state.step + 1) + env.rank)
        notes.append(
            f"resharded: saved by {saved_world} process(es), resumed on {env.world_size}; model and optimizer "
            "were resharded by DCP and the data position (global samples consumed) maps exactly, but "
            "per-rank random streams (dropout) restart from a fresh seed"
        )
    return notes



def check_state_format(path: Path, manifest: dict, strategy) -> None:
    """One line when the checkpoint's model/optimizer layout is not the one this strategy reads."""
    saved = manifest.get("state_format", "dcp")  # checkpoints from before DeepSpeed could save were DCP
    if saved != strategy.checkpoint_format:
        raise UserError(
            f"checkpoint {path} holds {saved} files (written with parallel.strategy={manifest.get('strategy')}), "
            f"which this run's strategy cannot read ({strategy.checkpoint_format}); resume with "
            f"parallel.strategy={manifest.get('strategy')} or start a fresh logging.run_dir")


def restore_rng(rng: dict) -> None:
    """Put every random stream back where `capture_rng` found it."""
    version, internal, gauss = rng["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = rng["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(from_b64(rng["torch"]))
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(from_b64(rng["cuda"]))


def trim_metrics(metrics_file: Path, step: int) -> None:
    """Drop metric lines after `step` (written by the interrupted run after its last checkpoint)."""
    if not metrics_file.is_file():
        return
    kept = []
    for line in metrics_file.read_text().splitlines():
        try:
            if json.loads(line).get("step", 0) <= step:
                kept.append(line)
        except ValueError:
            continue  # a line cut by the kill
    write_text_atomic(metrics_file, "".join(f"{line}\n" for line in kept))
