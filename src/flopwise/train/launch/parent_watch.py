"""A worker dies with the process that launched it.

torchrun starts each rank in a session of its own, so a launcher killed with SIGKILL
(or by the OOM killer) leaves the ranks running, and a relaunch would then train
concurrently on the same run directory. Two guards, both installed by the worker:

- Linux: `prctl(PR_SET_PDEATHSIG, SIGKILL)`: the kernel kills this process when its parent dies;
- everywhere: a daemon thread that polls the parent pid twice a second and leaves with
  `os._exit` once the process has been re-parented.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
ORPHANED_EXIT_CODE = 137  # as if killed by SIGKILL, like the launcher
POLL_SECONDS = 0.5


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask the Linux kernel to send `sig` to this process when its parent exits; False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch(parent: int) -> None:
    while True:
        if os.getppid() != parent:
            os._exit(ORPHANED_EXIT_CODE)
        time.sleep(POLL_SECONDS)


def die_with_parent(parent: int | None = None) -> None:
    """Install both guards for `parent` (default: the current parent); exit now if it is already gone."""
    parent = os.getppid() if parent is None else parent
    set_parent_death_signal()
    if os.getppid() != parent:  # the parent died before the death signal was armed
        os._exit(ORPHANED_EXIT_CODE)
    threading.Thread(target=_watch, args=(parent,), name="flopwise-parent-watch", daemon=True).start()
