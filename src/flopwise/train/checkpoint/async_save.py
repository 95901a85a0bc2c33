"""Durable checkpoints written in the background while training goes on.

What blocks the step loop: copying model + optimizer into host memory (pinned on CUDA,
DCP's own `DefaultStager`, buffers reused from save to save) and capturing the trainer
state (step, data position, RNGs, schedule) as JSON. Everything else runs in one
background thread per rank: DCP writes the staged copy into `.tmp-step-N` (files fsynced,
each hashed while it is written: `hashing.py`), the trainer JSON is written and fsynced,
the ranks agree that every part was written, rank 0 writes the manifest from the digests
the writers computed (nothing is read back), renames the folder, moves `latest` and prunes.

The guarantees of the blocking save stay:

- one save at a time: the next save, the end of the run and a preemption wait for the
  one in flight (`wait`);
- a process killed during the background write leaves a `.tmp-step-N` folder that is never
  read; the run resumes from the previous published checkpoint, bit for bit;
- a failed write (disk full) removes the temporary folder, leaves `latest` and every
  published checkpoint untouched, and stops the run on every rank at the same step
  (`failed` is part of the step loop's one all-reduce);
- retention runs only after a publish, and never deletes the checkpoint `latest` names.

The background thread's collectives (DCP's plan exchange, the agreement) run on a
process group of their own (gloo, created once), so they never interleave with the
training step's collectives on the default group: the layout torchtitan uses for
`async_mode="async"`. DCP's `async_save` runs `save` in an executor thread the same way;
flopwise runs its own thread because the publish (manifest, rename, `latest`) must follow
the write in the same thread, on the same group.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from flopwise.errors import UserError
from flopwise.runrecord.records import checkpoints_dir
from flopwise.safe_write import make_entry_folder, write_new_file
from flopwise.train.checkpoint import store
from flopwise.train.checkpoint.hashing import bytes_digest, hashing_writer, preferred_algorithm

# One process without a process group: DCP says it assumes one process on every save; that is the intent.
# (A filter, not `catch_warnings`: the latter is not thread-safe and this runs in a background thread.)
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")

# Tests slow the background write down with this (seconds to sleep after the model files are
# written, before the trainer state and the manifest), so that a kill can land while a save is in flight.
SLOW_WRITE_ENV = "FLOPWISE_TEST_SLOW_CHECKPOINT_WRITE"


@dataclass(frozen=True)
class SavedState:
    """What the manifest records of the TrainState, frozen at the step the save was taken."""

    step: int
    tokens_seen: int
    strategy: object


@dataclass
class SaveOutcome:
    """A finished background save: where it went (None when it failed) and how long it took."""

    step: int
    path: Path | None
    failure: str
    write_seconds: float  # from the start of the background write until published (or failed)
    mebibytes: float
    blocking_seconds: float
    published_at: float  # time.monotonic() when every rank knew the checkpoint was published
    prune_seconds: float = 0.0  # retention, after the publish (rank 0)


def async_supported(strategy) -> tuple[bool, str]:
    """Whether this strategy's state can be staged and written in the background, and why not."""
    if getattr(strategy, "checkpoint_state_dict", None) is None:
        return False, (f"the {strategy.checkpoint_format} engine writes its checkpoint itself "
                       "(engine.save_checkpoint), so it cannot be staged; saves block the run")
    return True, ""


class AsyncSaver:
    """At most one checkpoint in flight; `start` stages and returns, `wait` collects."""

    def __init__(self, ctx: store.SaveContext, env, keep_last: int, pin: list[int], verify: bool = False):
        self.ctx = ctx
        self.verify = verify  # re-read every file after the rename (`checkpoint.verify_on_save`)
        self.env = env
        self.keep_last = keep_last
        self.pin = list(pin)
        self.group = dist.new_group(backend="gloo") if env.distributed and env.world_size > 1 else None
        self._stager = None
        self._thread: threading.Thread | None = None
        self._outcome: SaveOutcome | None = None

    # ------------------------------------------------------------------ main thread

    def start(self, state) -> float:
        """Wait for the save in flight, stage `state` into host memory, start writing it; the seconds it blocked."""
        self.wait()
        started = time.monotonic()
        staged = self._stage(state.strategy.checkpoint_state_dict(state))
        trainer = store.trainer_state(state, self.env)
        saved = SavedState(state.step, state.tokens_seen, state.strategy)
        blocked = time.monotonic() - started
        self._outcome = None
        self._thread = threading.Thread(target=self._write, args=(staged, trainer, saved, blocked),
                                        name=f"checkpoint-step-{state.step}", daemon=True)
        self._thread.start()
        return blocked

    def in_flight(self) -> bool:
        """True while a background save runs."""
        return self._thread is not None and self._thread.is_alive()

    def finished(self) -> SaveOutcome | None:
        """The outcome of the last save if it has finished (without waiting), else None."""
        return None if self.in_flight() else self._outcome

    def failed(self) -> bool:
        """This rank knows that the last background save failed (all ranks learn it together at the next step)."""
        outcome = self.finished()
        return outcome is not None and bool(outcome.failure)

    def wait(self, raise_failure: bool = True) -> SaveOutcome | None:
        """Block until the save in flight is published or failed; a failure is a UserError (once)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        outcome, self._outcome = self._outcome, None
        if outcome is not None and outcome.failure and raise_failure:
            raise UserError(outcome.failure)
        return outcome

    def take(self) -> SaveOutcome | None:
        """The outcome of a finished save, once (for the log line)."""
        outcome = self.finished()
        if outcome is not None and not outcome.failure:
            self._outcome = None
            return outcome
        return None

    def _stage(self, state_dict: dict) -> dict:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        if self._stager is None:  # created once: its host buffers are reused by every later save
            cuda = self.env.device.type == "cuda"
            self._stager = DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=False,
                                                        use_async_staging=False, use_non_blocking_copy=cuda))
        return self._stager.stage(state_dict)

    # ------------------------------------------------------------------ background thread

    def _write(self, staged: dict, trainer: dict, saved: SavedState, blocked: float) -> None:
        started = time.monotonic()
        root = checkpoints_dir(self.ctx.run_dir)
        tmp, final = root / f"{store.TMP_PREFIX}{saved.step}", root / f"{store.STEP_PREFIX}{saved.step}"
        previous = store._previous_name(self.ctx.run_dir)
        algorithm = preferred_algorithm()
        files: dict[str, dict] = {}
        failure = ""
        try:
            if self.env.is_main:
                failure = store._attempt(lambda: (make_entry_folder(root), shutil.rmtree(tmp, ignore_errors=True),
                                                  tmp.mkdir()))
            failure = self._agree(failure)
            if not failure:
                failure = store._attempt(lambda: files.update(self._write_parts(staged, trainer, tmp, algorithm)))
            failure, files = self._gather(failure, files)
            if not failure and self.env.is_main:
                failure = store._attempt(lambda: self._publish(tmp, final, saved, files))
            failure = self._broadcast(failure)
        except BaseException as exc:  # a broken process group: nothing was published
            failure = failure or store.describe_failure(exc)
        published_at = time.monotonic()
        prune_seconds = 0.0
        if not failure and self.env.is_main:  # retention only after every rank knows the new one is published
            from flopwise.train.checkpoint.checks import prune_keeping_valid

            store._attempt(lambda: prune_keeping_valid(self.ctx.run_dir, self.keep_last, self.pin))
            prune_seconds = time.monotonic() - published_at
        if failure and self.env.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        if failure:
            kept = f"the previous checkpoint {previous} is intact" if previous else "no earlier checkpoint exists"
            failure = f"checkpoint step-{saved.step} could not be written to {root}: {failure}; {kept}"
        size = sum(entry["bytes"] for entry in files.values()) / 2**20
        self._outcome = SaveOutcome(saved.step, None if failure else final, failure,
                                    published_at - started, size, blocked, published_at, prune_seconds)

    def _write_parts(self, staged: dict, trainer: dict, tmp: Path, algorithm: str) -> dict[str, dict]:
        """This rank's DCP files and trainer JSON, each hashed on its way to disk; name -> {bytes, digest}."""
        writer = hashing_writer(tmp, algorithm, staged)
        crc32 = torch.serialization.get_crc32_options()
        # torch.save's per-record zip CRC32 would be a second checksum pass over the same bytes; the
        # manifest's checksum covers every byte, and torch.load reads records written without it
        torch.serialization.set_crc32_options(False)
        try:
            dcp.save(staged, storage_writer=writer, process_group=self.group, no_dist=self.group is None)
        finally:
            torch.serialization.set_crc32_options(crc32)
        files = {str(path.relative_to(tmp)): {"bytes": size, algorithm: digest}
                 for path, (size, digest) in writer.fs.written.items()}
        _test_slowdown()  # tests: a kill lands between the model files and the trainer state
        payload = json.dumps(trainer).encode("utf-8")
        name = store.trainer_file(self.env.rank)
        write_new_file(tmp / name, payload)
        files[name] = {"bytes": len(payload), algorithm: bytes_digest(payload, algorithm)}
        return files

    def _publish(self, tmp: Path, final: Path, saved: SavedState, files: dict) -> None:
        store._publish(tmp, final, saved.step, saved, self.ctx, self.env, verify=self.verify,
                       files=dict(sorted(files.items())))

    def _agree(self, failure: str) -> str:
        failure, _ = self._gather(failure, {})
        return failure

    def _gather(self, failure: str, files: dict) -> tuple[str, dict]:
        """Every rank's failure text and file digests, merged (on the checkpoint group)."""
        if self.group is None:
            return failure, files
        everyone: list = [None] * self.env.world_size
        dist.all_gather_object(everyone, (failure, files), group=self.group)
        merged: dict = {}
        for _, part in everyone:
            merged.update(part)
        others = [text for text, _ in everyone if text]
        if failure or not others:
            return failure, merged
        return "another rank failed to write its part (see its message)", merged

    def _broadcast(self, failure: str) -> str:
        """Rank 0's publish result to every rank."""
        if self.group is None:
            return failure
        box = [failure]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def close(self) -> None:
        """Wait for the save in flight (its failure is not raised here) and free the host buffers."""
        self.wait(raise_failure=False)
        if self._stager is not None:
            self._stager.close()
            self._stager = None


def _test_slowdown() -> None:
    import os

    seconds = float(os.environ.get(SLOW_WRITE_ENV, "0") or 0)
    if seconds > 0:
        time.sleep(seconds)
