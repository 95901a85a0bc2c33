"""`load_compressed` checks a folder before `torch.export.load` unpickles anything from it.

A genuine artifact loads in a fresh process (no torchao import first); a changed file,
a re-hashed but unsigned record, or a folder from another user's key is refused with one
line unless the caller passes trust=True."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from flopwise.compress import load_compressed
from flopwise.compress.artifact import MANIFEST, save_compressed
from flopwise.compress.artifact_trust import sha256_of
from flopwise.compress.quantize import quantize_static
from flopwise.errors import UserError


class TinyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


@pytest.fixture(scope="module")
def key_home(tmp_path_factory):
    return tmp_path_factory.mktemp("config-home")


@pytest.fixture(autouse=True)
def _own_key(key_home, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(key_home))


@pytest.fixture(scope="module")
def genuine(tmp_path_factory, key_home):
    """An INT8 PT2E graph written by save_compressed, and its output on a fixed input."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = TinyNet().eval()
    x = torch.randn(8, 16)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CONFIG_HOME", str(key_home))
        graph = quantize_static(model, x[:4], [x])
        out = tmp_path_factory.mktemp("artifact")
        save_compressed(out, graph, manifest={"method": "int8-static", "backend": "pt2e-x86", "format": "pt2",
                                              "rebuild": {}}, example=x[:2])
    with torch.no_grad():
        expected = graph(x)
    return out, x, expected


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _one_line_error(call) -> str:
    with pytest.raises(UserError) as err:
        call()
    message = str(err.value)
    assert "\n" not in message
    return message


def test_genuine_artifact_loads_in_a_fresh_process(genuine, key_home, tmp_path):
    folder, x, expected = genuine
    torch.save(x, tmp_path / "x.pt")
    script = (
        "import sys, torch\n"
        "from flopwise.compress import load_compressed\n"
        "model = load_compressed(sys.argv[1])\n"
        "with torch.no_grad():\n"
        "    torch.save(model(torch.load(sys.argv[2])), sys.argv[3])\n"
    )
    env = {**__import__("os").environ, "XDG_CONFIG_HOME": str(key_home), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", script, str(folder), str(tmp_path / "x.pt"), str(tmp_path / "y.pt")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert torch.allclose(torch.load(tmp_path / "y.pt"), expected, atol=1e-6)


def test_a_changed_weights_file_is_refused_with_one_line(genuine, tmp_path):
    folder = _copy(genuine[0], tmp_path / "changed")
    data = bytearray((folder / "model.pt2").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (folder / "model.pt2").write_bytes(bytes(data))
    message = _one_line_error(lambda: load_compressed(folder))
    assert "SHA-256 does not match" in message
    # trust covers origin, never integrity
    assert "SHA-256 does not match" in _one_line_error(lambda: load_compressed(folder, trust=True))


def test_a_rehashed_record_without_our_signature_is_refused_unless_trusted(genuine, tmp_path):
    folder = _copy(genuine[0], tmp_path / "rehashed")
    (folder / "model.pt2").write_bytes((folder / "model.pt2").read_bytes() + b"\0")  # still a valid zip
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"]["model.pt2"] = sha256_of(folder / "model.pt2")
    (folder / MANIFEST).write_text(json.dumps(manifest))
    assert "not signed by this user's flopwise key" in _one_line_error(lambda: load_compressed(folder))


def test_a_folder_signed_by_another_key_needs_trust(genuine, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "someone-else"))
    assert "pass trust=True" in _one_line_error(lambda: load_compressed(genuine[0]))
    model = load_compressed(genuine[0], trust=True)
    with torch.no_grad():
        assert torch.allclose(model(genuine[1]), genuine[2], atol=1e-6)


def test_a_folder_without_hashes_is_refused(genuine, tmp_path):
    folder = _copy(genuine[0], tmp_path / "old")
    manifest = json.loads((folder / MANIFEST).read_text())
    del manifest["files"], manifest["signature"]
    (folder / MANIFEST).write_text(json.dumps(manifest))
    assert "records no file hashes" in _one_line_error(lambda: load_compressed(folder))


def test_a_listed_path_outside_the_folder_is_refused(genuine, tmp_path):
    folder = _copy(genuine[0], tmp_path / "escape")
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"]["../../etc/passwd"] = "0" * 64
    (folder / MANIFEST).write_text(json.dumps(manifest))
    assert "not a plain file name" in _one_line_error(lambda: load_compressed(folder, trust=True))


@pytest.fixture(scope="module")
def other_program(tmp_path_factory, key_home):
    """Another valid INT8 program (different weights): what an attacker swaps in."""
    torch.manual_seed(1)
    model = TinyNet().eval()
    x = torch.randn(8, 16)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CONFIG_HOME", str(key_home))
        graph = quantize_static(model, x[:4], [x])
        out = tmp_path_factory.mktemp("other")
        save_compressed(out, graph, manifest={"method": "int8-static", "backend": "pt2e-x86", "format": "pt2",
                                              "rebuild": {}}, example=x[:2])
    return out / "model.pt2"


def test_swapping_the_file_after_the_check_wins_under_the_stock_order(genuine, other_program, tmp_path):
    """The stock order (hash the file by name, close it, `torch.export.load` by name) loads the swapped program."""
    from flopwise.compress.artifact import register_quantized_ops

    folder = _copy(genuine[0], tmp_path / "stock")
    manifest = json.loads((folder / MANIFEST).read_text())
    assert sha256_of(folder / "model.pt2") == manifest["files"]["model.pt2"]  # the check passes...
    shutil.copyfile(other_program, folder / "model.pt2")  # ...then the file changes
    register_quantized_ops()
    model = torch.export.load(str(folder / "model.pt2")).module()
    with torch.no_grad():
        assert not torch.allclose(model(genuine[1]), genuine[2], atol=1e-3)


def test_a_file_swapped_after_the_check_is_never_loaded(genuine, other_program, tmp_path, monkeypatch):
    """load_compressed loads the bytes it verified: a swap between the check and the load changes nothing."""
    import flopwise.compress.artifact as artifact

    folder = _copy(genuine[0], tmp_path / "swapped")
    real_register = artifact.register_quantized_ops
    swapped = []

    def swap_then_register():  # runs after the hash check, before torch.export.load
        shutil.copyfile(other_program, folder / "model.pt2")
        swapped.append(True)
        real_register()

    monkeypatch.setattr(artifact, "register_quantized_ops", swap_then_register)
    model = load_compressed(folder)
    assert swapped and (folder / "model.pt2").read_bytes() == other_program.read_bytes()
    with torch.no_grad():
        assert torch.allclose(model(genuine[1]), genuine[2], atol=1e-6)


def test_a_listed_file_that_is_a_link_or_a_fifo_is_refused(genuine, tmp_path):
    import os

    folder = _copy(genuine[0], tmp_path / "link")
    (folder / "model.pt2").rename(tmp_path / "real.pt2")
    (folder / "model.pt2").symlink_to(tmp_path / "real.pt2")
    assert "not a plain file name" in _one_line_error(lambda: load_compressed(folder))
    (folder / "model.pt2").unlink()
    os.mkfifo(folder / "model.pt2")
    assert "not a regular file" in _one_line_error(lambda: load_compressed(folder))
