"""safe_write.py: a link planted in a run directory never makes flopwise write through it.

The attacker can write into the run directory (a shared scratch, a copied run) but not run
commands. The first test shows a plain write follows such a link; the others plant a link
for every entry a run writes and check that the trainer refuses the directory with one line
(before any process starts), and that each writer, meeting a link planted later, refuses or
replaces the link itself: the file it points to keeps its content.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flopwise.errors import UserError
from flopwise.runrecord.records import Comparison, write_comparison
from flopwise.safe_write import (
    copy_file, make_entry_folder, open_for_append, refuse_links, write_file, write_new_file,
)

ENTRIES = ["config.yaml", "plan.json", "environment.json", "tokenizer.json", "predicted_vs_measured.json",
           "metrics.rank0.jsonl", "library.log", "report.md", "run.lock", "checkpoints"]
TINY = ["model.n_layers=1", "model.hidden=32", "model.n_heads=2", "model.max_seq_len=64", "data.vocab_size=300",
        "data.seq_len=32", "data.prefetch=0", "parallel.strategy=single", "parallel.nproc_per_node=1",
        "training.max_steps=2", "logging.progress=false"]


@pytest.fixture
def victim(tmp_path) -> Path:
    """A file outside the run directory, which the planted links point to."""
    path = tmp_path / "outside" / "precious.txt"
    path.parent.mkdir()
    path.write_text("keep me\n")
    return path


def plant(run_dir: Path, name: str, target: Path) -> Path:
    link = run_dir / name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target.parent if name == "checkpoints" else target)
    return link


def test_a_plain_write_follows_a_planted_link(tmp_path, victim):
    """The attack: what `Path.write_text`, as flopwise used before, does with such a link."""
    link = plant(tmp_path / "run", "config.yaml", victim)
    link.write_text("overwritten")
    assert victim.read_text() == "overwritten"


@pytest.mark.parametrize("name", ENTRIES)
def test_the_trainer_refuses_a_run_directory_with_a_planted_link(tmp_path, victim, name):
    from flopwise.config.loading import load_config
    from flopwise.train.launch.start import launch

    run_dir = tmp_path / "run"
    plant(run_dir, name, victim)
    with pytest.raises(UserError) as err:
        launch(load_config(None, [*TINY, f"logging.run_dir={run_dir}", f"data.cache_dir={tmp_path / 'cache'}"]))
    message = str(err.value)
    assert "\n" not in message and "is a symbolic link" in message and name in message
    assert victim.read_text() == "keep me\n"
    assert sorted(p.name for p in victim.parent.iterdir()) == ["precious.txt"]
    assert not (tmp_path / "cache").exists()  # refused before any work


def test_as_a_user_meets_it_one_line_and_exit_2(tmp_path, victim):
    run_dir = tmp_path / "run"
    plant(run_dir, "config.yaml", victim)
    done = subprocess.run([sys.executable, "-m", "flopwise", "train", *TINY, f"logging.run_dir={run_dir}"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "config.yaml is a symbolic link" in lines[0]
    assert victim.read_text() == "keep me\n"


def test_a_link_inside_checkpoints_is_refused(tmp_path, victim):
    run_dir = tmp_path / "run"
    plant(run_dir, "checkpoints/latest", victim)
    with pytest.raises(UserError, match="latest is a symbolic link"):
        refuse_links(run_dir, [run_dir / "checkpoints"])


def test_the_run_directory_itself_may_be_a_link(tmp_path):
    real = tmp_path / "big-disk" / "run"
    real.mkdir(parents=True)
    (tmp_path / "run").symlink_to(real)
    refuse_links(tmp_path / "run")
    write_file(tmp_path / "run" / "config.yaml", "a: 1\n")
    assert (real / "config.yaml").read_text() == "a: 1\n"


@pytest.mark.parametrize("durable", [False, True])
def test_a_whole_file_write_replaces_the_link_not_its_target(tmp_path, victim, durable):
    link = plant(tmp_path / "run", "plan.json", victim)
    write_file(link, "{}", durable=durable)
    assert victim.read_text() == "keep me\n"
    assert not link.is_symlink() and link.read_text() == "{}"
    assert sorted(p.name for p in link.parent.iterdir()) == ["plan.json"]  # no temporary file left


def test_a_new_file_refuses_a_planted_link_and_an_existing_file(tmp_path, victim):
    """A checkpoint's trainer state and manifest are created in its temporary folder, never written through a link."""
    link = plant(tmp_path / "run", "manifest.json", victim)
    with pytest.raises(UserError, match="manifest.json"):  # O_EXCL: a link is an existing entry, never followed
        write_new_file(link, "{}")
    assert link.is_symlink()
    assert victim.read_text() == "keep me\n"
    fresh = write_new_file(tmp_path / "run" / "trainer.rank00000.json", '{"step": 1}')
    assert fresh.read_text() == '{"step": 1}'
    with pytest.raises(UserError, match="cannot write"):
        write_new_file(fresh, "{}")
    assert fresh.read_text() == '{"step": 1}'


def test_a_copy_replaces_the_link_not_its_target(tmp_path, victim):
    source = tmp_path / "tokenizer-source.json"
    source.write_text('{"model": {}}')
    link = plant(tmp_path / "run", "tokenizer.json", victim)
    copy_file(source, link)
    assert victim.read_text() == "keep me\n" and link.read_text() == '{"model": {}}'


def test_the_comparison_replaces_the_link_not_its_target(tmp_path, victim):
    link = plant(tmp_path / "run", "predicted_vs_measured.json", victim)
    write_comparison(link.parent, Comparison(hardware={}, predicted={}, measured={"mfu": 0.1},
                                             measured_over_predicted={}))
    assert victim.read_text() == "keep me\n" and json.loads(link.read_text())["measured"] == {"mfu": 0.1}


def test_appending_refuses_a_link_and_a_non_file(tmp_path, victim):
    link = plant(tmp_path / "run", "metrics.rank0.jsonl", victim)
    with pytest.raises(UserError, match="is a symbolic link"):
        open_for_append(link)
    fifo = tmp_path / "run" / "library.log"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match="not a regular file"):
        _open_fifo_for_append(fifo)
    assert victim.read_text() == "keep me\n"


def _open_fifo_for_append(fifo: Path) -> None:
    """A FIFO with no reader would block a plain open for writing; O_NONBLOCK shows the type check."""
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader, so the writer's open returns
    try:
        open_for_append(fifo)
    finally:
        os.close(fd)


def test_the_metrics_writer_refuses_a_link(tmp_path, victim):
    from flopwise.train.metrics import MetricsWriter

    plant(tmp_path / "run", "metrics.rank0.jsonl", victim)
    for append in (False, True):
        with pytest.raises(UserError, match="is a symbolic link"):
            MetricsWriter(tmp_path / "run", 0, append=append)
    assert victim.read_text() == "keep me\n"


def test_the_library_log_refuses_a_link(tmp_path, victim):
    code = ("import sys, warnings; from flopwise.library_noise import route_library_noise; "
            "route_library_noise(sys.argv[1], verbose=False); warnings.warn('noise')")
    plant(tmp_path / "run", "library.log", victim)
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")], capture_output=True, text=True,
                          timeout=120)
    assert "is a symbolic link" in done.stderr
    assert victim.read_text() == "keep me\n"


def test_a_folder_that_is_a_link_is_refused(tmp_path, victim):
    plant(tmp_path / "run", "checkpoints", victim)
    with pytest.raises(UserError, match="checkpoints is a symbolic link"):
        make_entry_folder(tmp_path / "run" / "checkpoints")


def test_a_checkpoint_pointer_replaces_the_link_not_its_target(tmp_path, victim):
    from flopwise.train.checkpoint.store import write_text_atomic

    link = plant(tmp_path / "run", "checkpoints/latest", victim)
    write_text_atomic(link, "step-2\n")
    assert victim.read_text() == "keep me\n" and link.read_text() == "step-2\n"
