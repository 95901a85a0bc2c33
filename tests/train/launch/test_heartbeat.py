"""heartbeat.py: beats from a rank, and the launcher's watch that names a stalled one.

Real files and real child processes; the two-process run with a SIGSTOPped rank is in
test_launcher_signals.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from flopwise.train.launch import heartbeat
from flopwise.train.launch.heartbeat import StallWatch, heartbeat_file, live_child, read_beats


def _child() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def _beat(folder, rank, pid, age, step=7):
    heartbeat_file(folder, rank).write_text(json.dumps({"rank": rank, "host": "node3", "pid": pid, "step": step,
                                                        "time": time.time() - age}))


def test_an_old_beat_of_a_live_child_names_the_rank_host_and_step(tmp_path):
    quiet, busy = _child(), _child()
    try:
        _beat(tmp_path, 0, busy.pid, age=1)
        _beat(tmp_path, 1, quiet.pid, age=30, step=12)
        watch = StallWatch(tmp_path, stall_seconds=10)
        message = watch.check()
        assert message is not None and "\n" not in message
        assert message.startswith(f"rank 1 on node3 (pid {quiet.pid}) stalled: no heartbeat for 30 s")
        assert "last finished step 12" in message and "exit code 4" in message
        _beat(tmp_path, 1, quiet.pid, age=2)
        assert watch.check() is None
    finally:
        for proc in (quiet, busy):
            proc.kill()
            proc.wait()


def test_a_rank_that_ended_or_is_not_ours_is_never_stalled(tmp_path):
    ended = _child()
    ended.kill()
    ended.wait()
    _beat(tmp_path, 0, ended.pid, age=600)
    _beat(tmp_path, 1, 1, age=600)  # pid 1 is alive but not this process's child
    assert not live_child(ended.pid) and not live_child(1)
    assert StallWatch(tmp_path, stall_seconds=10).check() is None


def test_the_watch_ends_the_ranks_when_one_stalls(tmp_path):
    stalled, other = _child(), _child()
    try:
        _beat(tmp_path, 0, other.pid, age=0)
        _beat(tmp_path, 1, stalled.pid, age=100)
        with StallWatch(tmp_path, stall_seconds=2) as watch:
            assert stalled.wait(timeout=30) == -9 and other.wait(timeout=30) == -9
        assert watch.message.startswith("rank 1 on node3")
    finally:
        for proc in (stalled, other):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_a_rank_beats_its_step_and_takes_its_beat_away_when_it_leaves(tmp_path):
    heartbeat.start_beating(3, str(tmp_path))
    try:
        heartbeat.note_step(41)
        deadline = time.monotonic() + 30
        while not [b for b in read_beats(tmp_path) if b["step"] == 41] and time.monotonic() < deadline:
            time.sleep(0.05)
        (beat,) = read_beats(tmp_path)
        assert beat["rank"] == 3 and beat["step"] == 41
    finally:
        heartbeat.stop_beating(3, str(tmp_path))
    assert read_beats(tmp_path) == []
