"""Checkpoints you can trust: sharded save, atomic publish, verified resume, retention.

Layout of `run_dir/checkpoints/`:

    step-120/                 one published checkpoint
      .metadata, __0_0.distcp, __1_0.distcp, ...   model + optimizer, torch.distributed.checkpoint (DCP)
      (DeepSpeed: deepspeed/*.pt, the engine's own files, instead)
      trainer.rank00000.json  step, tokens, loader position, RNGs, scheduler, scaler (per rank; JSON)
      manifest.json           config, world size, vocab, and bytes + sha256 of every file above,
                              signed with this user's key (`run_signature.py`)
    .tmp-step-140/            being written; never read
    latest                    "step-120", replaced atomically after step-120 was verified

Save: every rank writes its DCP shard and its trainer file into `.tmp-step-N` (fsynced);
rank 0 then hashes the files into the manifest, renames the folder to `step-N`, fsyncs the
parent, re-verifies, and only then moves `latest` and prunes old checkpoints (the newest
`keep_last` plus `pin` stay). Any failure (disk full, permission) is agreed over ranks, the
temporary folder is removed, and the run stops with one line; published checkpoints are
never touched by a failed save.

Model and optimizer are written by the strategy (`Strategy.save_state`): through DCP with
the plain module names for single, DDP, FSDP2 and pipeline stages (`dcp_state.py`; DCP
reshards on load, a checkpoint written by N processes loads into M), through the engine's
own `save_checkpoint` for DeepSpeed (`deepspeed_state.py`). Everything else here (the
temporary folder, manifest, publish, verification, retention) is the same for all. The data
position is the loader's global sample count, so it maps to any world size too.

Loading never lets a file name code: tensors and non-tensor entries come through
`torch.load(weights_only=True)`, the DCP `.metadata` through an unpickler that resolves only
an exact list of DCP's metadata classes (`safe_read.py`), DeepSpeed's files through
`torch.load(weights_only=True)` with its few data classes allow-listed
(`deepspeed_state.py`); everything else is JSON.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import json
import os
import random
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from flopwise.errors import UserError
from flopwise.runrecord.records import checkpoints_dir
from flopwise.safe_write import fsync_folder, make_entry_folder, write_file, write_new_file
from flopwise.config.signature import sign_manifest
from flopwise.train.checkpoint.hashing import algorithm_of, bytes_digest, file_digest, preferred_algorithm
from flopwise.train.parallel.distributed import DistEnv, barrier

FORMAT_VERSION = 1
LATEST = "latest"
MANIFEST = "manifest.json"
STEP_PREFIX = "step-"
TMP_PREFIX = ".tmp-step-"
HASH_CHUNK = 8 << 20


def trainer_file(rank: int) -> str:
    """Name of rank `rank`'s trainer-state file."""
    return f"trainer.rank{rank:05d}.json"


def published_steps(run_dir: Path) -> list[tuple[int, Path]]:
    """Published checkpoints (step, folder), oldest first; temporary folders are not listed."""
    folder = checkpoints_dir(run_dir)
    if not folder.is_dir():
        return []
    found = []
    for entry in folder.iterdir():
        if entry.is_dir() and entry.name.startswith(STEP_PREFIX) and entry.name[len(STEP_PREFIX):].isdigit():
            found.append((int(entry.name[len(STEP_PREFIX):]), entry))
    return sorted(found)


# --------------------------------------------------------------------------- verification


def verify_checkpoint(path: Path) -> str | None:
    """None when every file in the manifest is there with its size and sha256; else what is wrong, in a few words."""
    path = Path(path)
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        files = manifest["files"]
    except FileNotFoundError:
        return "no manifest.json (incomplete save)"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"unreadable manifest.json ({exc})"
    for name, expected in files.items():
        file = path / name
        if not file.is_file():
            return f"missing file {name}"
        size = file.stat().st_size
        if size != expected["bytes"]:
            return f"{name} has {size} bytes, the manifest says {expected['bytes']} (truncated?)"
        algorithm = algorithm_of(expected)
        if expected.get(algorithm) is None or file_digest(file, algorithm) != expected[algorithm]:
            return f"{name} fails its {algorithm} checksum (corrupted)"
    return None


def read_manifest(path: Path) -> dict:
    """The manifest of a checkpoint folder (JSON)."""
    return json.loads((Path(path) / MANIFEST).read_text())


def latest_valid(run_dir: Path, report=print) -> Path | None:
    """The newest published checkpoint that verifies; each one skipped is reported in one line.

    The newest verified folder wins even when `latest` still names an older one (a crash
    between the rename and the pointer update leaves exactly that state).
    """
    for step, path in reversed(published_steps(run_dir)):
        problem = verify_checkpoint(path)
        if problem is None:
            return path
        report(f"checkpoint {path}: {problem}; falling back to the previous one")
    return None


def resolve_checkpoint(run_dir: Path, spec: str | int, what: str = "checkpoint.resume_from") -> Path:
    """A named checkpoint (`step-1200`, `1200`, or a folder path) that must exist and verify; `what` names the input."""
    text = str(spec).strip()
    if text.isdigit():
        text = f"{STEP_PREFIX}{int(text)}"
    candidate = Path(text)
    if not candidate.is_dir():
        candidate = checkpoints_dir(run_dir) / text
    if not candidate.is_dir():
        steps = ", ".join(p.name for _, p in published_steps(run_dir)) or "none"
        raise UserError(f"{what}: {spec} not found (available in {checkpoints_dir(run_dir)}: {steps})")
    problem = verify_checkpoint(candidate)
    if problem is not None:
        raise UserError(f"checkpoint {candidate}: {problem}; pick another ({what} step-N)")
    return candidate


# --------------------------------------------------------------------------- saving


@dataclass
class SaveContext:
    """What a checkpoint records besides the TrainState: the run's identity."""

    run_dir: Path
    config: dict
    vocab_size: int
    global_batch: int
    strategy: str


def save_checkpoint(state, ctx: SaveContext, env: DistEnv, verify: bool = True) -> Path:
    """Write, verify and publish `checkpoints/step-N` for `state`; a UserError (all ranks) if it cannot.

    Collective: every rank calls it at the same step. The strategy writes model and
    optimizer (`Strategy.save_state`); this function owns the rest.
    """
    root = checkpoints_dir(ctx.run_dir)
    step = state.step
    tmp = root / f"{TMP_PREFIX}{step}"
    final = root / f"{STEP_PREFIX}{step}"
    previous = _previous_name(ctx.run_dir)
    failure = ""
    if env.is_main:
        failure = _attempt(lambda: (make_entry_folder(root), shutil.rmtree(tmp, ignore_errors=True), tmp.mkdir()))
    failure = _agree_failure(failure, env)
    if not failure:
        failure = _attempt(lambda: state.strategy.save_state(state, tmp))
        if not failure:
            failure = _attempt(lambda: write_new_file(tmp / trainer_file(env.rank), json.dumps(trainer_state(state, env))))
        failure = _agree_failure(failure, env)
    if not failure and env.is_main:
        failure = _attempt(lambda: _publish(tmp, final, step, state, ctx, env, verify))
    failure = _agree_failure(failure, env)
    if failure:
        if env.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        kept = f"the previous checkpoint {previous} is intact" if previous else "no earlier checkpoint exists"
        raise UserError(f"checkpoint step-{step} could not be written to {root}: {failure}; {kept}")
    barrier(env)
    return final


def _publish(tmp: Path, final: Path, step: int, state, ctx: SaveContext, env: DistEnv, verify: bool,
             files: dict | None = None) -> None:
    """Manifest, rename, `latest`. `files`: name -> {bytes, <algorithm>} hashed while writing
    (async saves); without it every file is read and hashed here."""
    if files is None:
        algorithm = preferred_algorithm()
        files = {str(file.relative_to(tmp)): {"bytes": file.stat().st_size, algorithm: file_digest(file, algorithm)}
                 for file in sorted(p for p in tmp.rglob("*") if p.is_file())}
    manifest = {
        "format": FORMAT_VERSION,
        "step": step,
        "tokens_seen": state.tokens_seen,
        "world_size": env.world_size,
        "strategy": ctx.strategy,
        "state_format": state.strategy.checkpoint_format,
        "global_batch": ctx.global_batch,
        "vocab_size": ctx.vocab_size,
        "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "torch": torch.__version__,
        "config": ctx.config,
        "files": files,
    }
    # export reads it back only with this user's signature
    write_new_file(tmp / MANIFEST, json.dumps(sign_manifest(manifest)))
    fsync_folder(tmp)  # every entry of the folder (DCP's files, trainer states, manifest) durable before the rename
    if final.exists():  # an earlier, unverifiable attempt at the same step: replace it
        trash = final.with_name(f".trash-{final.name}")
        shutil.rmtree(trash, ignore_errors=True)
        os.rename(final, trash)
        shutil.rmtree(trash, ignore_errors=True)
    os.rename(tmp, final)
    fsync_folder(final.parent)
    problem = verify_checkpoint(final) if verify else None
    if problem is not None:
        raise OSError(errno.EIO, f"verification after writing failed: {problem}")
    write_text_atomic(final.parent / LATEST, final.name + "\n")


def prune_checkpoints(run_dir: Path, keep_last: int, pin: list[int]) -> list[Path]:
    """Delete published checkpoints beyond the newest `keep_last`, except pinned steps and `latest`; returns those deleted."""
    published = published_steps(run_dir)
    keep = {step for step, _ in published[-keep_last:]} | set(pin)
    latest = _previous_name(run_dir)
    deleted = []
    for step, path in published:
        if step in keep or path.name == latest:
            continue
        shutil.rmtree(path, ignore_errors=True)
        deleted.append(path)
    return deleted


def remove_stale_temporaries(run_dir: Path) -> None:
    """Drop `.tmp-step-*` folders left by a save that was killed (they were never published)."""
    folder = checkpoints_dir(run_dir)
    if folder.is_dir():
        for entry in folder.iterdir():
            if entry.name.startswith((TMP_PREFIX, ".trash-")):
                shutil.rmtree(entry, ignore_errors=True)


# --------------------------------------------------------------------------- trainer state


def trainer_state(state, env: DistEnv) -> dict:
    """This rank's non-tensor state as JSON-able data."""
    return {
        "format": FORMAT_VERSION,
        "step": state.step,
        "tokens_seen": state.tokens_seen,
        "rank": env.rank,
        "world_size": env.world_size,
        "loader": state.train_loader.state_dict(),
        "scheduler": _jsonable(state.scheduler.state_dict()),
        "scaler": _jsonable(state.scaler.state_dict()) if state.scaler is not None else None,
        "rng": capture_rng(env),
    }


def capture_rng(env: DistEnv) -> dict:
    """Every random stream this rank uses: python, numpy, torch CPU (and CUDA on GPUs)."""
    version, internal, gauss = random.getstate()
    np_state = np.random.get_state()
    rng = {
        "python": [version, list(internal), gauss],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch": _b64(torch.get_rng_state()),
    }
    if env.device.type == "cuda":
        rng["cuda"] = _b64(torch.cuda.get_rng_state(env.device))
    return rng


# --------------------------------------------------------------------------- small pieces


def describe_failure(exc: BaseException) -> str:
    """The root cause of a save failure in a few words (DCP wraps each rank's error in a CheckpointException).

    An OSError anywhere in the chain wins (its strerror and file name); torch's zip writer
    sometimes turns a failed write into "unexpected pos", which is reported as a failed write.
    """
    seen: set[int] = set()
    found: list[BaseException] = []
    stack: list = [exc]
    while stack:
        current = stack.pop()
        if not isinstance(current, BaseException) or id(current) in seen:
            continue
        seen.add(id(current))
        found.append(current)
        if isinstance(current, OSError):
            where = f" ({current.filename})" if current.filename else ""
            return f"{current.strerror or current}{where}"
        failures = getattr(current, "failures", None)
        if isinstance(failures, dict):
            stack += [value[0] if isinstance(value, tuple) else value for value in failures.values()]
        stack += [current.__cause__, current.__context__]
    innermost = first_line(found[-1])
    if "unexpected pos" in innermost:
        return f"a write failed part-way ({innermost}); is the disk full or the folder not writable?"
    return innermost


@contextlib.contextmanager
def quiet_single_process_notice():
    """DCP warns that it assumes one process when no process group exists; that is the intent here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _attempt(action) -> str:
    """Run `action`; '' on success, else the reason (DCP's CheckpointException is a BaseException)."""
    try:
        action()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        return describe_failure(exc)
    return ""


def _agree_failure(failure: str, env: DistEnv) -> str:
    """All ranks learn whether any rank failed (a one-int all-reduce); the local text, or a generic one."""
    if not env.distributed or env.world_size == 1:
        return failure
    flag = torch.tensor([1 if failure else 0], dtype=torch.int64, device=env.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item() and not failure:
        return "another rank failed to write its part (see its message)"
    return failure


def _previous_name(run_dir: Path) -> str | None:
    pointer = checkpoints_dir(run_dir) / LATEST
    try:
        return pointer.read_text().strip() or None
    except OSError:
        return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write_text_atomic(path: Path, text: str) -> None:
    """Replace `path` durably (fsynced file and folder), never through a link."""
    write_file(path, text, durable=True)


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return None  # e.g. a lambda in LambdaLR's state: rebuilt from the config, not stored


def _b64(tensor: torch.Tensor) -> str:
    return base64.b64encode(tensor.numpy().tobytes()).decode("ascii")


def from_b64(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
