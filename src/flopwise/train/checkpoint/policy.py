"""When to checkpoint, and what to do at a step boundary: cadence, retention, preemption
signals and non-finite losses.

Cadence: every `checkpoint.every_steps` steps and/or `every_minutes` minutes, agreed over
ranks; after each save the newest `keep_last` checkpoints plus the `pin`ned steps stay.

Preemption: SIGTERM (torchrun's and Kubernetes' stop signal) or SIGUSR1 (Slurm's
`--signal=USR1@90` warning) only sets a flag here; the loop checks it at the next step
boundary, where all ranks agree through one small all-reduce (a signal delivered to a
single rank stops them all), a checkpoint is written and the process exits with
`PREEMPTED_EXIT_CODE`. A handler that saved from inside the signal would run in the
middle of a collective and deadlock the other ranks.

Non-finite loss: under an fp16 loss scaler a NaN/Inf step is skipped by the scaler and
tolerated `nan_patience` times in a row; without a scaler the first one stops the run,
before any checkpoint of the diverged weights is written.

Skipped steps: the fp16 loss scaler skips a step whose gradients overflow and halves the
scale (Micikevicius et al. 2018, sec. 3.2); a few skips while the scale settles are normal,
but `precision.max_skipped_steps` in a row mean the model overflows in fp16 whatever the
scale, and the run stops with one line instead of finishing with untrained weights.
"""

from __future__ import annotations

import math
import signal
import time
from pathlib import Path

from flopwise.errors import PREEMPTED_EXIT_CODE, Preempted, UserError  # noqa: F401  (re-exported)
from flopwise.train.checkpoint.async_save import AsyncSaver, SaveOutcome, async_supported
from flopwise.train.checkpoint.checks import prune_keeping_valid
from flopwise.train.checkpoint.resume import resume
from flopwise.train.checkpoint.store import (
    SaveContext, checkpoints_dir, save_checkpoint,
)
from flopwise.train.parallel.distributed import agree_max
from flopwise.config.resolve import ResolvedRun

DIVERGED_EXIT_CODE = 3
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)  # SIGINT: Ctrl-C, forwarded by torchrun


class TrainingDiverged(UserError):
    """The loss became NaN/Inf and stayed so; no checkpoint of the diverged weights exists."""

    exit_code = DIVERGED_EXIT_CODE


class StopSignals:
    """Record SIGTERM/SIGUSR1 instead of dying, so the loop can save at a step boundary."""

    def __init__(self) -> None:
        self.received: str | None = None
        self.received_at: float | None = None
        self._previous: dict[int, object] = {}

    def install(self) -> "StopSignals":
        """Take over the stop signals (main thread only; elsewhere signals are left alone)."""
        try:
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        except ValueError:  # not the main thread: the caller's handlers stay
            self._previous.clear()
        return self

    def restore(self) -> None:
        """Give the signals back to whoever had them before."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def note_agreed(self) -> None:
        """A signal reached another rank: this rank's clock for the grace period starts now."""
        if self.received_at is None:
            self.received_at = time.monotonic()

    def seconds_since(self) -> float:
        """Seconds since the first signal arrived (0 when none)."""
        return 0.0 if self.received_at is None else time.monotonic() - self.received_at

    def _handle(self, signum, frame) -> None:
        if self.received is None:
            self.received = signal.Signals(signum).name
            self.received_at = time.monotonic()


class NonFiniteGuard:
    """Counts consecutive non-finite losses and says when the run must stop."""

    def __init__(self, patience: int, scaler_present: bool):
        self.limit = patience if scaler_present else 1
        self.consecutive = 0
        self.first_bad_step: int | None = None

    def observe(self, step: int, any_nonfinite: bool) -> bool:
        """Record this step (agreed over ranks); True when the run must stop now."""
        if not any_nonfinite:
            self.consecutive = 0
            self.first_bad_step = None
            return False
        self.consecutive += 1
        if self.first_bad_step is None:
            self.first_bad_step = step
        return self.consecutive >= self.limit

    @property
    def healthy(self) -> bool:
        """False while non-finite steps are being tolerated (no checkpoint is written then)."""
        return self.consecutive == 0


class SkippedStepGuard:
    """Counts consecutive optimizer steps the loss scaler skipped and says when the run must stop."""

    def __init__(self, limit: int):
        self.limit = limit
        self.consecutive = 0

    def observe(self, skipped: bool) -> bool:
        """Record this step (skips are already agreed over ranks); True when the run must stop now."""
        self.consecutive = self.consecutive + 1 if skipped else 0
        return self.consecutive >= self.limit


class StepBoundary:
    """Everything the loop does between two steps about checkpoints and faults, in one call.

    `resume(state)` once at the start; `after_step(state, loss, skipped, loss_scale)` after
    every step (agrees over ranks on signals, due saves and non-finite losses with one
    all-reduce, saves, raises `Preempted` / `TrainingDiverged`); `finish(state)` at the
    end; `close()` always. Every strategy checkpoints: what differs is the strategy's
    `save_state` / `load_state`, nothing here.
    """

    def __init__(self, cfg, env, vocab_size: int, run: ResolvedRun, report=print):
        self.cfg = cfg.checkpoint
        self.env = env
        self.report = report
        self.run_dir = Path(cfg.logging.run_dir)
        self.ctx = SaveContext(self.run_dir, cfg.model_dump(mode="json"), vocab_size, run.global_batch,
                               cfg.parallel.strategy)
        self.max_steps = cfg.training.max_steps
        self.guard = NonFiniteGuard(self.cfg.nan_patience, scaler_present=run.precision.loss_scaling)
        self.skips = SkippedStepGuard(cfg.precision.max_skipped_steps)
        self.signals = StopSignals().install()
        self.last_save_time = time.monotonic()
        self.last_saved_step: int | None = None
        self.saver: AsyncSaver | None = None  # checkpoint.async: set up by `resume`, once the strategy is known

    def resume(self, state) -> list[str]:
        """Load the checkpoint to continue from (named, or the latest valid one); notes for the log."""
        try:
            return self._resume(state)
        except BaseException:
            self.close()
            raise

    def _resume(self, state) -> list[str]:
        notes = resume(state, self.cfg, self.run_dir, self.env, self.max_steps, report=self.report)
        if notes:
            self.last_saved_step = state.step
        return notes + self._choose_saving(state)

    def _choose_saving(self, state) -> list[str]:
        """Background saves when `checkpoint.async` asks for them and the strategy allows it; the reason, once."""
        if not self.cfg.async_:
            return ["checkpoints: saved while the run waits (checkpoint.async=false)"]
        supported, why_not = async_supported(state.strategy)
        if not supported:
            return [f"checkpoints: saved while the run waits: {why_not}"]
        self.saver = AsyncSaver(self.ctx, self.env, self.cfg.keep_last, self.cfg.pin, verify=self.cfg.verify_on_save)
        return ["checkpoints: staged to host memory, then written, hashed and published in the background "
                "(checkpoint.async=true; the next save, a stop signal and the end of the run wait for it)"]

    def after_step(self, state, loss: float, skipped: bool = False, loss_scale: float | None = None) -> None:
        """Agree over ranks, then stop on divergence or endless skipped steps, save when due, or save and stop on a signal."""
        due = (
            (self.cfg.every_steps is not None and state.step % self.cfg.every_steps == 0)
            or (self.cfg.every_minutes is not None
                and time.monotonic() - self.last_save_time >= self.cfg.every_minutes * 60)
        )
        nonfinite = not math.isfinite(loss)
        save_failed = self.saver is not None and self.saver.failed()
        signal_any, due_any, bad_rank, failed_any = self._agree(self.signals.received is not None, due,
                                                                self.env.rank if nonfinite else -1, save_failed)
        if failed_any:  # a background save failed: every rank stops here, at the same step
            self.saver.wait()
            raise UserError("a background checkpoint save failed on another rank (see its message)")
        self._report_finished()
        if self.guard.observe(state.step, bad_rank >= 0):
            raise TrainingDiverged(self._divergence_message(state.step, bad_rank))
        if self.skips.observe(skipped):
            raise TrainingDiverged(self._overflow_message(state.step, loss_scale))
        if not self.guard.healthy:
            return  # never checkpoint weights that may already be damaged
        if signal_any:
            self.signals.note_agreed()
            path = self._save(state, wait=True)
            message = self._preemption_message(state.step, path)
            if self.env.is_main:
                self.report(message)
            raise Preempted(message)
        if due_any:
            self._save(state)

    def finish(self, state) -> None:
        """The final checkpoint (`checkpoint.at_end`), unless this step is already saved."""
        if self.cfg.at_end and self.guard.healthy and self.last_saved_step != state.step:
            self._save(state)
        if self.saver is not None:  # the run ends only when its last checkpoint is published
            self._report(self.saver.wait())

    def close(self) -> None:
        """Wait for a background save still in flight, then give the signal handlers back."""
        if self.saver is not None:
            self.saver.close()
        self.signals.restore()

    # ----------------------------------------------------------------------------------

    def _save(self, state, wait: bool = False):
        """Save `state` (in the background when `checkpoint.async`; `wait`: until it is published)."""
        if self.last_saved_step == state.step:
            if wait and self.saver is not None:
                self._report(self.saver.wait())
            return checkpoints_dir(self.run_dir) / f"step-{state.step}"
        if self.saver is not None:
            self.saver.start(state)
            self.last_save_time = time.monotonic()
            self.last_saved_step = state.step
            if wait:
                self._report(self.saver.wait())
            return checkpoints_dir(self.run_dir) / f"step-{state.step}"
        started = time.monotonic()
        path = save_checkpoint(state, self.ctx, self.env, verify=self.cfg.verify_on_save)
        if self.env.is_main:
            prune_keeping_valid(self.run_dir, self.cfg.keep_last, self.cfg.pin)  # corrupt ones hold no slot
            size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            self.report(f"checkpoint {path.name}: {size / 2**20:.1f} MiB in {time.monotonic() - started:.2f} s")
        self.last_save_time = time.monotonic()
        self.last_saved_step = state.step
        return path

    def _report_finished(self) -> None:
        """The log line of a background save that finished since the last step."""
        if self.saver is not None:
            self._report(self.saver.take())

    def _report(self, outcome: SaveOutcome | None) -> None:
        if outcome is not None and outcome.path is not None and self.env.is_main:
            self.report(f"checkpoint {outcome.path.name}: {outcome.mebibytes:.1f} MiB; the run waited "
                        f"{outcome.blocking_seconds:.2f} s, written in the background in {outcome.write_seconds:.2f} s")

    def _agree(self, signal_seen: bool, due: bool, bad_rank: int, save_failed: bool) -> tuple[bool, bool, int, bool]:
        flags = agree_max([int(signal_seen), int(due), bad_rank, int(save_failed)], self.env)
        return bool(flags[0]), bool(flags[1]), flags[2], bool(flags[3])

    def _latest_name(self) -> str:
        try:
            name = (checkpoints_dir(self.run_dir) / "latest").read_text().strip()
            return str(checkpoints_dir(self.run_dir) / name)
        except OSError:
            return "none"

    def _divergence_message(self, step: int, bad_rank: int) -> str:
        first = self.guard.first_bad_step
        scaler = " under the fp16 loss scaler" if self.guard.limit > 1 else ""
        return (
            f"training stopped: the loss is NaN/Inf at step {step} on rank {bad_rank} "
            f"({self.guard.consecutive} non-finite step(s) in a row{scaler}, first at step {first}); "
            f"last good checkpoint: {self._latest_name()} (nothing was saved after the loss went bad); "
            "lower training.lr, keep training.grad_clip on, or use precision.mode=bf16"
        )

    def _overflow_message(self, step: int, loss_scale: float | None) -> str:
        scale = f"the loss scale fell to {loss_scale:g}" if loss_scale is not None else "the loss scale kept falling"
        return (
            f"training stopped at step {step}: {self.skips.consecutive} optimizer steps in a row were skipped "
            f"by the fp16 loss scaler (inf/nan gradients, precision.max_skipped_steps={self.skips.limit}) and "
            f"{scale}: the model overflows in fp16; use precision.mode=bf16 or lower training.lr "
            f"(last good checkpoint: {self._latest_name()})"
        )

    def _preemption_message(self, step: int, path) -> str:
        took = self.signals.seconds_since()
        late = (f"; it took {took:.1f} s, more than checkpoint.grace_seconds={self.cfg.grace_seconds:g}"
                if took > self.cfg.grace_seconds else "")
        saved = f"checkpoint {path} written {took:.1f} s after the signal (as seen by this rank){late}"
        return (f"preempted by {self.signals.received or 'a signal on another rank'} at step {step}: {saved}; "
                f"run the same command again to continue (exit code {PREEMPTED_EXIT_CODE})")
