"""Every file a checkpoint names stays inside its folder and is a regular file.

A DCP `.metadata` names the file of each tensor chunk. Pointed at a FIFO outside the folder,
stock DCP opens it and waits forever for a writer (the first test shows it with a timeout);
flopwise's reader refuses it, and every other escape (`..`, absolute paths, links, FIFOs
inside), with one line and without waiting.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from flopwise.errors import UserError
from flopwise.train.checkpoint.confined_open import CheckpointPathRefused, open_in_checkpoint
from flopwise.train.checkpoint.safe_read import safe_dcp_load
from flopwise.train.checkpoint.store import quiet_single_process_notice
from tests.security.forged_runs import rehash

STOCK_LOAD = """
import sys, torch, torch.distributed.checkpoint as dcp
import warnings; warnings.filterwarnings("ignore")
dcp.load({"model": {"w": torch.zeros(4)}}, checkpoint_id=sys.argv[1])
"""


def saved(folder: Path, state: dict | None = None) -> Path:
    with quiet_single_process_notice():
        dcp.save({"model": state or {"w": torch.arange(4.0)}}, checkpoint_id=str(folder))
    return folder


def point_storage_at(folder: Path, target: str) -> None:
    """Rewrite `.metadata` so every chunk is read from `target` (what a forger writes)."""
    meta = pickle.loads((folder / ".metadata").read_bytes())
    for info in meta.storage_data.values():
        info.relative_path = target
    (folder / ".metadata").write_bytes(pickle.dumps(meta))


def load(folder: Path) -> None:
    with quiet_single_process_notice():
        safe_dcp_load({"model": {"w": torch.zeros(4)}}, folder)


@pytest.fixture()
def outside_fifo(tmp_path):
    fifo = tmp_path / "outside" / "pipe"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    return fifo


def test_stock_dcp_hangs_on_a_fifo_outside(tmp_path, outside_fifo):
    folder = saved(tmp_path / "ckpt")
    point_storage_at(folder, os.path.relpath(outside_fifo, folder))
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run([sys.executable, "-c", STOCK_LOAD, str(folder)], capture_output=True, timeout=20,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_a_genuine_checkpoint_still_loads(tmp_path):
    folder = saved(tmp_path / "ckpt")
    state = {"model": {"w": torch.zeros(4)}}
    with quiet_single_process_notice():
        safe_dcp_load(state, folder)
    assert torch.equal(state["model"]["w"], torch.arange(4.0))


@pytest.mark.parametrize("how", ["relative", "absolute"])
def test_a_storage_entry_outside_the_folder_is_refused(tmp_path, outside_fifo, how):
    folder = saved(tmp_path / "ckpt")
    point_storage_at(folder, os.path.relpath(outside_fifo, folder) if how == "relative" else str(outside_fifo))
    with pytest.raises(UserError, match="outside the checkpoint folder") as err:
        load(folder)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("plant", ["fifo", "link to a fifo", "link to a file", "linked folder"])
def test_links_and_fifos_inside_the_folder_are_refused(tmp_path, outside_fifo, plant):
    folder = saved(tmp_path / "ckpt")
    data = folder / "__0_0.distcp"
    if plant == "fifo":
        data.unlink()
        os.mkfifo(data)
        words = "FIFO"
    elif plant == "link to a fifo":
        data.unlink()
        data.symlink_to(outside_fifo)
        words = "symbolic link"
    elif plant == "link to a file":
        real = tmp_path / "real.distcp"
        data.rename(real)
        data.symlink_to(real)
        words = "symbolic link"
    else:
        (folder / "sub").symlink_to(tmp_path / "outside")
        point_storage_at(folder, "sub/pipe")
        words = "symbolic link"
    with pytest.raises(UserError, match=words) as err:
        load(folder)
    assert "\n" not in str(err.value) and "refused by flopwise's checkpoint reader" in str(err.value)


def test_metadata_itself_as_a_fifo_or_link_is_refused(tmp_path, outside_fifo):
    folder = saved(tmp_path / "ckpt")
    (folder / ".metadata").unlink()
    os.mkfifo(folder / ".metadata")
    with pytest.raises(UserError, match="FIFO"):
        load(folder)
    (folder / ".metadata").unlink()
    (folder / ".metadata").symlink_to(outside_fifo)
    with pytest.raises(UserError, match="symbolic link"):
        load(folder)


def test_open_in_checkpoint_refuses_each_escape(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f").write_bytes(b"x")
    assert open_in_checkpoint(tmp_path, "a/f").read() == b"x"
    assert open_in_checkpoint(tmp_path, "./a/./f").read() == b"x"
    for name in ["../x", "a/../../x", "/etc/passwd", "", "a", 3]:
        with pytest.raises((CheckpointPathRefused, FileNotFoundError)):
            open_in_checkpoint(tmp_path, name)


def test_flopwise_export_of_a_run_naming_a_fifo_is_one_line(tmp_path, outside_fifo):
    """The attack as reported, end to end: `flopwise export RUN` used to hang forever."""
    from flopwise.config.loading import load_config
    from flopwise.train.model import build_model

    cfg = load_config(None, ["model.n_layers=1", "model.hidden=32", "model.n_heads=2", "model.max_seq_len=32",
                             "data.seq_len=16", f"logging.run_dir={tmp_path / 'run'}"])
    step = tmp_path / "run" / "checkpoints" / "step-1"
    saved(step, build_model(cfg.model, 64).state_dict())
    point_storage_at(step, os.path.relpath(outside_fifo, step))
    (step / "manifest.json").write_text(json.dumps({
        "format": 1, "step": 1, "world_size": 1, "strategy": "single", "state_format": "dcp", "vocab_size": 64,
        "config": cfg.model_dump(mode="json"), "files": {name: {} for name in os.listdir(step)}}))
    rehash(step)  # hashes and this user's signature: only the reader stands between the file and a hang
    done = subprocess.run([sys.executable, "-m", "flopwise", "export", str(tmp_path / "run")], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("error:") == 1
    assert "outside the checkpoint folder" in done.stderr


@pytest.mark.parametrize("plant", ["fifo", "link"])
def test_deepspeed_files_that_are_fifos_or_links_are_refused(tmp_path, outside_fifo, plant):
    from flopwise.train.checkpoint.deepspeed_state import safe_weights_only_load

    folder = tmp_path / "step-1" / "deepspeed"
    folder.mkdir(parents=True)
    target = folder / "mp_rank_00_model_states.pt"
    torch.save({"module": {"w": torch.ones(2)}}, tmp_path / "real.pt")
    if plant == "fifo":
        os.mkfifo(target)
    else:
        target.symlink_to(tmp_path / "real.pt")
    with pytest.raises(UserError, match="FIFO" if plant == "fifo" else "symbolic link") as err:
        safe_weights_only_load(str(target))
    assert "\n" not in str(err.value)
    target.unlink()
    torch.save({"module": {"w": torch.ones(2)}}, target)
    assert torch.equal(safe_weights_only_load(str(target))["module"]["w"], torch.ones(2))
