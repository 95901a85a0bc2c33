"""A checkpoint is data: forged DCP files must be refused with one line and run nothing.

Each payload would run `touch MARKER` under a plain `pickle.load` / stock `dcp.load`
(the first tests prove that for the two entry points), so a test here fails if the
safe reader ever lets one through."""

from __future__ import annotations

import os
import pickle
import shutil
import struct
import subprocess
import sys
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp

from flopwise.errors import UserError
from flopwise.train.checkpoint.safe_read import MetadataUnpickler, safe_dcp_load
from tests.security.forged_runs import rehash, tiny_train_command


def _unicode(text: str) -> bytes:
    data = text.encode()
    return b"\x8c" + bytes([len(data)]) + data  # SHORT_BINUNICODE


def stack_global(module: str, name: str) -> bytes:
    return _unicode(module) + _unicode(name) + b"\x93"  # STACK_GLOBAL


def call(func: bytes, *args: bytes) -> bytes:
    """Push func, a tuple of args, REDUCE."""
    return func + b"(" + b"".join(args) + b"t" + b"R"


def proto4(body: bytes) -> bytes:
    return b"\x80\x04" + body + b"."


def payloads(marker) -> dict[str, bytes]:
    cmd = _unicode(f"touch {marker}")

    class Nested:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    from torch.distributed.checkpoint.metadata import Metadata

    return {
        "dotted name through an allowed module": proto4(
            call(stack_global("torch.distributed.checkpoint.filesystem", "os.system"), cmd)),
        "collections._sys.modules.get": proto4(call(
            call(stack_global("builtins", "getattr"),
                 call(stack_global("collections", "_sys.modules.get"), _unicode("os")), _unicode("system")), cmd)),
        "protocol-0 GLOBAL os.system": b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR.",
        "posix.system": proto4(call(stack_global("posix", "system"), cmd)),
        "builtins getattr chain": proto4(call(call(stack_global("builtins", "getattr"),
                                                   call(stack_global("builtins", "__import__"), _unicode("os")),
                                                   _unicode("system")), cmd)),
        "builtins eval": proto4(call(stack_global("builtins", "eval"),
                                     _unicode(f"__import__('os').system('touch {marker}')"))),
        "REDUCE on a function of an allowed module": proto4(
            call(stack_global("torch.serialization", "load"), _unicode(str(marker)))),
        "torch attribute that is not a dtype": proto4(call(stack_global("torch", "load"), _unicode(str(marker)))),
        "dotted torch dtype attribute": proto4(call(stack_global("torch", "float32.__class__"), cmd)),
        "nested __reduce__ inside real metadata": pickle.dumps(Metadata(state_dict_metadata={"x": Nested()})),
        "not metadata at all": pickle.dumps({"state_dict_metadata": {}}),
    }


@pytest.fixture()
def genuine(tmp_path):
    """A real DCP checkpoint (tensors plus a non-tensor entry, as optimizer states have)."""
    folder = tmp_path / "ckpt"
    state = {"model": {"w": torch.arange(6.0).reshape(2, 3)}, "hyper": {"lr": 0.1, "betas": (0.9, 0.95)}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=str(folder))
    return folder


def empty_state():
    return {"model": {"w": torch.zeros(2, 3)}, "hyper": {"lr": 0.0, "betas": (0.0, 0.0)}}


def quiet_load(state, folder):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        safe_dcp_load(state, folder)


def test_a_genuine_checkpoint_loads(genuine):
    state = empty_state()
    quiet_load(state, genuine)
    assert torch.equal(state["model"]["w"], torch.arange(6.0).reshape(2, 3))
    assert state["hyper"] == {"lr": 0.1, "betas": (0.9, 0.95)}


def test_the_payloads_are_real_exploits_under_plain_pickle(tmp_path):
    marker = tmp_path / "owned"
    pickle.loads(payloads(marker)["dotted name through an allowed module"])
    assert marker.exists()


@pytest.mark.parametrize("name", sorted(payloads("M")))
def test_forged_metadata_is_refused_and_runs_nothing(genuine, tmp_path, name):
    marker = tmp_path / "owned"
    (genuine / ".metadata").write_bytes(payloads(marker)[name])
    with pytest.raises(UserError) as err:
        quiet_load(empty_state(), genuine)
    assert "refused" in str(err.value) and "\n" not in str(err.value)
    assert not marker.exists()


@pytest.mark.parametrize("name", sorted(payloads("M")))
def test_the_unpickler_alone_refuses_each_payload(tmp_path, name):
    marker = tmp_path / "owned"
    with pytest.raises(pickle.UnpicklingError):
        obj = MetadataUnpickler(__import__("io").BytesIO(payloads(marker)[name])).load()
        if name == "not metadata at all":  # plain data is fine for the unpickler; the reader refuses it
            assert isinstance(obj, dict)
            raise pickle.UnpicklingError("not metadata")
    assert not marker.exists()


class _Evil:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_forged_non_tensor_entry_in_a_shard_is_refused(tmp_path):
    """DCP stores non-tensor values with torch.save and stock DCP reads them with weights_only=False."""
    folder = tmp_path / "ckpt"
    marker = tmp_path / "owned"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": {"w": torch.ones(2)}, "extra": _Evil(marker)}, checkpoint_id=str(folder))
        stock = tmp_path / "stock"
        shutil.copytree(folder, stock)
        dcp.load({"model": {"w": torch.zeros(2)}, "extra": 0}, checkpoint_id=str(stock))  # the stock reader runs it
    assert marker.exists()
    marker.unlink()
    with pytest.raises(UserError, match="refused.*extra"):
        quiet_load({"model": {"w": torch.zeros(2)}, "extra": 0}, folder)
    assert not marker.exists()


@pytest.mark.distributed
def test_flopwise_export_of_a_forged_run_refuses_with_one_line(tmp_path):
    """The attack as reported: a forged .metadata with matching manifest hashes, then `flopwise export RUN`."""
    run_dir = tmp_path / "run"
    train, env = tiny_train_command(tmp_path, run_dir, "parallel.strategy=single", "parallel.nproc_per_node=1",
                                    "training.max_steps=2")
    done = subprocess.run(train, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    step = sorted((run_dir / "checkpoints").glob("step-*"))[-1]
    marker = tmp_path / "owned"
    (step / ".metadata").write_bytes(payloads(marker)["dotted name through an allowed module"])
    rehash(step)
    out = subprocess.run([sys.executable, "-m", "flopwise", "export", str(run_dir)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode != 0
    assert "refused" in out.stderr + out.stdout and "Traceback" not in out.stderr
    assert not marker.exists()


def test_struct_helpers_are_what_pickle_writes():
    """Guard for the hand-built opcodes above: they round-trip a harmless global."""
    data = proto4(call(stack_global("builtins", "len"), _unicode("abc")))
    assert pickle.loads(data) == 3
    assert struct.calcsize("B") == 1
