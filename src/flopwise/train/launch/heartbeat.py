"""A stalled rank is found within `parallel.stall_seconds`, named, and the job ends with one line.

A rank that stops (SIGSTOP, a frozen process, a call that holds the interpreter) leaves the
others waiting inside a collective; the process-group timeout (`parallel.timeout_minutes`)
ends them only after minutes, with a traceback on another rank. Instead:

- every rank started by `flopwise train`'s torchrun beats: a daemon thread rewrites
  `heartbeat.rank<R>` (rank, host, pid, last finished step, time) in the launcher's
  node-local folder every `BEAT_SECONDS`, and at once when a step finishes. The thread beats while the process lives, so a
  long step, a save or an evaluation never counts as a stall; a stopped process stops beating;
- the launcher watches those files (`StallWatch`, a thread beside torchrun). A beat older
  than `stall_seconds` ends the job: the watch records the one-line message, kills this
  node's ranks (a stalled rank cannot save, and the others are blocked on it), and the
  launcher exits with `STALLED_EXIT_CODE`.

No collective is involved: a collective is exactly what a stalled rank blocks. Detection
takes at most `stall_seconds` + one poll (`stall_seconds / 4`, at most 1 s) after the last
beat. Under an outside launcher (your own torchrun, `srun` per process) nobody watches,
and `parallel.timeout_minutes` applies.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

from flopwise.safe_write import write_file

HEARTBEAT_DIR_ENV = "FLOPWISE_HEARTBEAT_DIR"
BEAT_SECONDS = 1.0
STALLED_EXIT_CODE = 4
_step = 0  # the last step this rank finished, read by its beating thread
_stopped = threading.Event()
_wake = threading.Event()  # a finished step is told at once, so a stall names the step it stopped after
_writing = threading.Lock()


def note_step(step: int) -> None:
    """The loop's progress, carried in this rank's next beat."""
    global _step
    _step = step
    _wake.set()


def heartbeat_file(folder: Path, rank: int) -> Path:
    """`heartbeat.rank<R>` in the launcher's node-local folder."""
    return Path(folder) / f"heartbeat.rank{rank:05d}"


def start_beating(rank: int, folder: str | None = None) -> threading.Thread | None:
    """In a rank: beat into the folder the launcher named (None when no launcher watches)."""
    folder = folder or os.environ.get(HEARTBEAT_DIR_ENV)
    if not folder:
        return None
    _stopped.clear()
    path, host, pid = heartbeat_file(Path(folder), rank), socket.gethostname(), os.getpid()

    def beat() -> None:
        while not _stopped.is_set():
            with _writing:
                if _stopped.is_set():
                    return
                try:
                    write_file(path, json.dumps({"rank": rank, "host": host, "pid": pid, "step": _step,
                                                 "time": time.time()}))
                except Exception:  # noqa: BLE001  (the launcher's folder is gone: the job is ending)
                    return
            _wake.wait(BEAT_SECONDS)
            _wake.clear()

    thread = threading.Thread(target=beat, name="flopwise-heartbeat", daemon=True)
    thread.start()
    return thread


def stop_beating(rank: int, folder: str | None = None) -> None:
    """In a rank that is leaving: remove its beat, so a rank that ended is never taken for a stalled one."""
    folder = folder or os.environ.get(HEARTBEAT_DIR_ENV)
    with _writing:
        _stopped.set()
        _wake.set()
        if folder:
            try:
                heartbeat_file(Path(folder), rank).unlink()
            except OSError:
                pass


def read_beats(folder: Path) -> list[dict]:
    """Every rank's latest beat in `folder` (a beat being replaced right now is skipped)."""
    beats = []
    for path in sorted(Path(folder).glob("heartbeat.rank*")):
        try:
            beat = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(beat, dict) and isinstance(beat.get("time"), (int, float)):
            beats.append(beat)
    return beats


def stall_message(beat: dict, age: float, stall_seconds: float) -> str:
    """The one line that names the stalled rank."""
    return (f"rank {beat.get('rank')} on {beat.get('host')} (pid {beat.get('pid')}) stalled: no heartbeat for "
            f"{age:.0f} s (parallel.stall_seconds={stall_seconds:g}), last finished step {beat.get('step')}; "
            f"its process is stopped or hung, so the job was ended; the latest checkpoint is intact "
            f"(exit code {STALLED_EXIT_CODE})")


class StallWatch:
    """In the launcher: watch this node's beats; on a stall, record the message and end the ranks."""

    def __init__(self, folder: Path, stall_seconds: float):
        self.folder = Path(folder)
        self.stall_seconds = stall_seconds
        self.poll = min(1.0, stall_seconds / 4)
        self.message: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="flopwise-stall-watch", daemon=True)

    def __enter__(self) -> "StallWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def check(self, now: float | None = None) -> str | None:
        """The message for the rank whose beat is the oldest beyond `stall_seconds`, if any.

        Only ranks that are still this launcher's live children count: a rank that finished
        (or died, which torchrun reports itself) stops beating without being stalled.
        """
        now = time.time() if now is None else now
        beats = [beat for beat in read_beats(self.folder) if live_child(beat.get("pid"))]
        late = [(now - beat["time"], beat) for beat in beats if now - beat["time"] > self.stall_seconds]
        if not late:
            return None
        age, beat = max(late, key=lambda pair: pair[0])
        return stall_message(beat, age, self.stall_seconds)

    def _watch(self) -> None:
        while not self._stop.wait(self.poll):
            message = self.check()
            if message is not None:
                self.message = message
                self._end_ranks()
                return

    def _end_ranks(self) -> None:
        """SIGKILL every rank that beat here: torchrun then sees them fail and returns."""
        for beat in read_beats(self.folder):
            if live_child(beat.get("pid")):
                try:
                    os.kill(beat["pid"], signal.SIGKILL)  # works on a stopped process too
                except (ProcessLookupError, PermissionError):
                    continue


def live_child(pid: object, parent: int | None = None) -> bool:
    """Whether `pid` is a running (or stopped) child of `parent` (default: this process), not a zombie."""
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return False
    parent = os.getpid() if parent is None else parent
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        try:  # no /proc: alive is the best this can tell
            os.kill(pid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False
    state, ppid = fields[0], int(fields[1])
    return state not in ("Z", "X") and ppid == parent
