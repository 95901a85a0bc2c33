"""One run directory, one run: the lock, reuse of a used directory, the config it belongs to,
and what a resume refuses (all checkpoints invalid, stray files, a trainer state off its
schema). Real files, real processes, real (tiny) training runs on one process."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from flopwise.errors import UserError
from flopwise.train.checkpoint import store as ckpt
from flopwise.train.checkpoint.checks import latest_valid_or_stop, prune_keeping_valid
from flopwise.config.loading import load_config
from flopwise.train.launch.start import launch
from flopwise.train.launch.run_directory import LOCK_FILE, acquire_lock, claim_run_directory, release_lock
from tests.train.launch import lock_takers

TINY = [
    "model.n_layers=1", "model.hidden=32", "model.n_heads=2", "model.max_seq_len=64",
    "data.vocab_size=300", "data.seq_len=32", "data.prefetch=0", "data.tokenizer_train_bytes=100000",
    "parallel.strategy=single", "parallel.nproc_per_node=1",
    "training.micro_batch_size=4", "training.warmup_steps=1", "training.max_steps=4", "training.eval_every=4",
    "training.eval_batches=1", "logging.progress=false", "checkpoint.every_steps=1", "checkpoint.keep_last=10",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("rundir-corpus")
    (root / "text").mkdir()
    (root / "text" / "code.py").write_text("".join(f"def g_{i % 37}(y):\n    return y + {i % 7}\n" for i in range(1500)))
    return root


def overrides(corpus: Path, run_dir: Path, *extra: str) -> list[str]:
    return [*TINY, f"data.paths=[{corpus / 'text'}]", f"data.cache_dir={corpus / 'cache'}",
            f"logging.run_dir={run_dir}", *extra]


def train(corpus, run_dir, *extra):
    launch(load_config(None, overrides(corpus, run_dir, *extra)))


def one_line(call) -> str:
    with pytest.raises(UserError) as err:
        call()
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    """A finished 4-step run with a checkpoint at every step."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    train(corpus, run_dir)
    assert [s for s, _ in ckpt.published_steps(run_dir)] == [1, 2, 3, 4]
    return run_dir


# ------------------------------------------------------------------------------ the lock


def test_a_second_trainer_on_a_locked_run_directory_is_refused_with_one_line(corpus, tmp_path):
    run_dir = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c",
                               "import sys, time; from pathlib import Path; "
                               "from flopwise.train.launch.run_directory import acquire_lock; "
                               "acquire_lock(Path(sys.argv[1])); print('held', flush=True); time.sleep(120)",
                               str(run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        cfg_file = tmp_path / "c.yaml"
        cfg_file.write_text(yaml.safe_dump({}))
        done = subprocess.run([sys.executable, "-m", "flopwise", "train", str(cfg_file),
                               *overrides(corpus, run_dir)], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert done.returncode == 2
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and f"pid {holder.pid} on {socket.gethostname()}" in lines[0], done.stderr
        assert not (run_dir / "metrics.rank0.jsonl").exists()
    finally:
        holder.kill()
        holder.wait()


def stock_take_over(path: Path, dead_pid: int):
    """A copy of the pid-file lock flopwise used before `flock`, one step per `next()` so a race can be replayed:
    create with O_EXCL; else read the record, and when its pid is dead on this host remove it and try again."""
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            holder = json.loads(path.read_text() or "{}")
            yield  # another taker runs between the read and the removal
            if holder.get("host") == socket.gethostname() and holder.get("pid") == dead_pid:
                path.unlink(missing_ok=True)
                yield
                continue
            return False
        with os.fdopen(fd, "w") as handle:
            json.dump({"pid": os.getpid(), "host": socket.gethostname()}, handle)
        return True


def run_to_end(taker) -> bool:
    try:
        while True:
            next(taker)
    except StopIteration as stop:
        return stop.value


def test_the_stock_pid_file_lock_gives_two_owners_when_takers_interleave(tmp_path):
    """The race the kernel lock removes: both takers read the stale record; the first removes it and takes the
    lock; the second, acting on what it read, removes the first one's fresh lock and takes it too."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock_takers.plant_stale_lock(tmp_path, dead.pid)
    first, second = stock_take_over(tmp_path / LOCK_FILE, dead.pid), stock_take_over(tmp_path / LOCK_FILE, dead.pid)
    next(first), next(second)  # both read the record of the dead trainer
    assert run_to_end(first) is True  # removes it, creates its own
    assert run_to_end(second) is True  # removes the first one's lock, creates its own: two owners


TAKERS = 4
TRIALS = 100


def test_concurrent_takers_of_a_stale_lock_end_with_exactly_one_owner(tmp_path):
    """The race that gave two owners in 3-8 of 40 trials with a pid-file lock: four processes
    start together on the record a killed trainer left; in every trial exactly one owns the lock."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for trial in range(TRIALS):
        lock_takers.plant_stale_lock(tmp_path / f"trial-{trial}", dead.pid)
    context = multiprocessing.get_context("spawn")
    start, done, results = context.Barrier(TAKERS), context.Barrier(TAKERS), context.Queue()
    takers = [context.Process(target=lock_takers.race, args=(str(tmp_path), TRIALS, start, done, results))
              for _ in range(TAKERS)]
    for taker in takers:
        taker.start()
    outcomes = [results.get(timeout=120) for _ in range(TAKERS * TRIALS)]
    for taker in takers:
        taker.join(timeout=60)
        assert taker.exitcode == 0
    owners = {trial: [pid for t, pid, took in outcomes if t == trial and took] for trial in range(TRIALS)}
    assert [t for t, pids in owners.items() if len(pids) != 1] == []
    for trial, (pid,) in owners.items():  # the record names the process that held it
        assert json.loads((tmp_path / f"trial-{trial}" / LOCK_FILE).read_text() or "{}").get("pid") in (pid, None)


def test_a_killed_owner_releases_the_lock_to_the_next_taker(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c",
                               "import sys, time; from pathlib import Path; "
                               "from flopwise.train.launch.run_directory import acquire_lock; "
                               "acquire_lock(Path(sys.argv[1])); print('held', flush=True); time.sleep(120)",
                               str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert f"pid {holder.pid} on {socket.gethostname()}" in one_line(lambda: acquire_lock(tmp_path))
    finally:
        holder.kill()
        holder.wait()
    lock = acquire_lock(tmp_path)  # the kernel released it with the dead holder's descriptors
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    release_lock(lock)


def test_a_record_left_without_a_holder_is_taken_whatever_host_it_names(tmp_path):
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": 1, "host": "elsewhere", "started": "t"}))
    lock = acquire_lock(tmp_path)
    assert json.loads((tmp_path / LOCK_FILE).read_text())["host"] == socket.gethostname()
    release_lock(lock)


def test_a_lock_file_that_is_a_link_is_refused_and_its_target_kept(tmp_path):
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / LOCK_FILE).symlink_to(target)
    assert "is a symbolic link" in one_line(lambda: acquire_lock(run_dir))
    assert target.read_text() == "keep me"


def test_the_lock_is_released_when_the_run_ends(trained):
    lock = acquire_lock(trained)  # the in-process run let it go: taking it again works at once
    release_lock(lock)
    assert (trained / LOCK_FILE).read_text() == ""


# ------------------------------------------------------------------------------ reuse and config


def test_resume_false_in_a_used_directory_is_refused(corpus, trained):
    message = one_line(lambda: train(corpus, trained, "checkpoint.resume=false"))
    assert "already holds a run" in message and "checkpoint.overwrite=true" in message


def test_overwrite_moves_the_old_run_aside(corpus, trained, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    train(corpus, run_dir, "checkpoint.resume=false", "checkpoint.overwrite=true", "training.max_steps=2")
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("run.old-")]
    assert len(aside) == 1 and [s for s, _ in ckpt.published_steps(aside[0])] == [1, 2, 3, 4]
    assert [s for s, _ in ckpt.published_steps(run_dir)] == [1, 2]
    assert len((run_dir / "metrics.rank0.jsonl").read_text().splitlines()) == 2


def test_overwrite_through_dot_dot_moves_the_whole_run_beside_it(corpus, trained, tmp_path):
    """`run_dir=used/sub/..` once named the aside folder `used/sub/...old-<time>`, inside the tree being
    moved, and stopped with a traceback after moving half the run: the path is normalised first."""
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    train(corpus, run_dir / "checkpoints" / "..", "checkpoint.resume=false", "checkpoint.overwrite=true",
          "training.max_steps=2")
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("run.old-")]
    assert len(aside) == 1 and [s for s, _ in ckpt.published_steps(aside[0])] == [1, 2, 3, 4]
    assert [s for s, _ in ckpt.published_steps(run_dir)] == [1, 2]
    assert not [p for p in run_dir.rglob("*") if ".old-" in p.name]


def test_overwrite_puts_back_what_it_moved_when_one_entry_fails(trained, tmp_path, monkeypatch):
    from flopwise.train.launch import run_directory

    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    before = sorted(p.name for p in run_dir.iterdir())
    real_rename, calls = os.rename, []

    def failing_third_rename(src, dst):
        calls.append(src)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real_rename(src, dst)

    monkeypatch.setattr(run_directory.os, "rename", failing_third_rename)
    assert "No space left on device" in one_line(lambda: run_directory.move_aside(run_dir))
    monkeypatch.undo()
    assert sorted(p.name for p in run_dir.iterdir()) == before
    assert not [p for p in tmp_path.iterdir() if ".old-" in p.name]


@pytest.mark.parametrize("run_dir, expected", [
    ("/proc/flopwise-run", "logging.run_dir: /proc/flopwise-run: cannot create this folder"),
    ("{file}", "is a file, not a folder"),
    ("", "logging.run_dir: must name a folder"),
])
def test_a_run_dir_that_cannot_be_one_is_one_line(corpus, tmp_path, run_dir, expected):
    (tmp_path / "a-file").write_text("x")
    run_dir = run_dir.format(file=tmp_path / "a-file")
    assert expected in one_line(lambda: train(corpus, run_dir))


def test_resuming_with_a_different_config_names_the_keys(corpus, trained):
    cfg = load_config(None, overrides(corpus, trained, "model.hidden=64", "training.lr=0.001"))
    with pytest.raises(UserError) as err:
        with claim_run_directory(cfg):
            pass
    message = str(err.value)
    assert "\n" not in message and "model.hidden (32 -> 64)" in message and "training.lr" in message
    # what may change on a resume does not count
    cfg = load_config(None, overrides(corpus, trained, "training.max_steps=9", "logging.log_every=1"))
    with claim_run_directory(cfg):
        pass


def test_different_config_files_get_different_default_run_directories(tmp_path):
    (tmp_path / "small.yaml").write_text("training: {max_steps: 5}\n")
    (tmp_path / "large.yaml").write_text("training: {max_steps: 6}\n")
    assert str(load_config(tmp_path / "small.yaml").logging.run_dir) == "runs/small"
    assert str(load_config(tmp_path / "large.yaml").logging.run_dir) == "runs/large"
    assert str(load_config(None).logging.run_dir) == "runs/default"
    assert str(load_config(tmp_path / "small.yaml", ["logging.run_dir=x"]).logging.run_dir) == "x"


# ------------------------------------------------------------------------------ what a resume refuses


def _corrupt(step_dir: Path) -> None:
    shard = next(step_dir.glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[0] ^= 0xFF
    shard.write_bytes(bytes(data))


def test_all_checkpoints_invalid_stops_with_one_line_and_keeps_the_metrics(corpus, trained, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    for _, step_dir in ckpt.published_steps(run_dir):
        _corrupt(step_dir)
    metrics = (run_dir / "metrics.rank0.jsonl").read_text()
    message = one_line(lambda: train(corpus, run_dir, "training.max_steps=6"))
    assert "none of the 4 checkpoint(s) is valid" in message
    assert (run_dir / "metrics.rank0.jsonl").read_text() == metrics


def test_a_plain_file_named_like_a_step_is_reported(trained, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    (run_dir / "checkpoints" / "step-9").write_text("not a folder")
    notes = []
    assert latest_valid_or_stop(run_dir, report=notes.append).name == "step-4"
    assert any("step-9: a plain file where a checkpoint folder should be" in n for n in notes)


def test_a_trainer_state_off_its_schema_is_one_line(corpus, trained, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    for _, step_dir in ckpt.published_steps(run_dir):
        trainer = step_dir / "trainer.rank00000.json"
        state = json.loads(trainer.read_text())
        state["stepp"] = state.pop("step")
        trainer.write_text(json.dumps(state))
        manifest = json.loads((step_dir / "manifest.json").read_text())  # re-hashed: only the schema is off
        manifest["files"][trainer.name] = {"bytes": trainer.stat().st_size, "sha256": ckpt._sha256(trainer)}
        (step_dir / "manifest.json").write_text(json.dumps(manifest))
    message = one_line(lambda: train(corpus, run_dir, "training.max_steps=6"))
    assert "trainer.rank00000.json: does not match the trainer state schema" in message


def test_corrupt_checkpoints_hold_no_keep_last_slot(trained, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    (run_dir / "checkpoints" / "latest").write_text("step-2\n")
    (next((run_dir / "checkpoints" / "step-4").glob("*.distcp"))).write_bytes(b"short")
    (run_dir / "checkpoints" / "step-3" / "manifest.json").unlink()
    deleted = prune_keeping_valid(run_dir, keep_last=1, pin=[])
    assert sorted(p.name for p in deleted) == ["step-1", "step-3", "step-4"]
    assert [s for s, _ in ckpt.published_steps(run_dir)] == [2]


def test_resuming_on_data_whose_windows_were_reordered_is_refused_with_one_line(tmp_path):
    import numpy as np

    data = tmp_path / "tokens.bin"
    tokens = (np.arange(3201) % 300).astype(np.uint16)
    tokens.tofile(data)
    on_tokens = [f"data.paths=[{data}]", "data.format=tokens", f"data.cache_dir={tmp_path / 'cache'}",
                 f"logging.run_dir={tmp_path / 'run'}"]
    launch(load_config(None, [*TINY, *on_tokens, "training.max_steps=2"]))
    rng = np.random.default_rng(0)
    windows = tokens[:3200].reshape(-1, 32)
    np.concatenate([windows[rng.permutation(len(windows))].ravel(), tokens[3200:]]).tofile(data)  # same size
    metrics = (tmp_path / "run" / "metrics.rank0.jsonl").read_text()
    message = one_line(lambda: launch(load_config(None, [*TINY, *on_tokens, "training.max_steps=4"])))
    assert "the train data changed since the checkpoint" in message
    assert (tmp_path / "run" / "metrics.rank0.jsonl").read_text() == metrics
