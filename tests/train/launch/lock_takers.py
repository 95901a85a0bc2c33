"""Processes that race for one run lock, for tests/train/launch/test_run_directory.py.

A separate, light module: `multiprocessing`'s spawn start imports it in each taker
without torch or the test module's fixtures.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from flopwise.errors import UserError
from flopwise.train.launch.run_directory import LOCK_FILE, acquire_lock


def plant_stale_lock(run_dir: Path, dead_pid: int) -> None:
    """The record a trainer killed with -9 leaves behind: its pid, this host."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / LOCK_FILE).write_text(json.dumps({"pid": dead_pid, "host": socket.gethostname(), "started": "x"}))


def race(root: str, trials: int, start, done, results) -> None:
    """For each trial: wait for every taker, try to take the lock, report, hold it until all have reported."""
    for trial in range(trials):
        start.wait()
        try:
            lock = acquire_lock(Path(root) / f"trial-{trial}")
        except UserError:
            lock = None
        results.put((trial, os.getpid(), lock is not None))
        done.wait()  # the owner still holds it while the others try
        if lock is not None:
            lock.release()
