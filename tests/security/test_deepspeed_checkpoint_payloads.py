"""A DeepSpeed checkpoint is data too: forged `.pt` files are refused with one line and run nothing.

DeepSpeed 0.19.8's own reader (`TorchCheckpointEngine.load`) unpickles with
`weights_only=False`; the first test proves a payload runs there. flopwise swaps in
`SafeCheckpointEngine` (`train/checkpoint/deepspeed_state.py`): `torch.load(weights_only=True)`
with only DeepSpeed's data classes allowed. Each forged file is a genuine torch zip whose
`data.pkl` is replaced by the payload (the route an attacker takes), plus `torch.save` of an
object with a malicious `__reduce__`.
"""

from __future__ import annotations

import io
import struct
import subprocess
import zipfile

import pytest
import torch

from flopwise.errors import UserError
from tests.security.forged_runs import rehash, tiny_train_command
from tests.security.test_checkpoint_payloads import _Evil, payloads

deepspeed_state = pytest.importorskip("flopwise.train.checkpoint.deepspeed_state")
pytest.importorskip("deepspeed")


def genuine_states():
    """What DeepSpeed's ZeRO optimizer file holds: tensors, numbers, its loss scaler and stage enum."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    return {"optimizer_state_dict": {"zero_stage": ZeroStageEnum(3), "loss_scaler": LossScaler(1.0),
                                     "fp32_flat_groups": [torch.arange(4.0)], "partition_count": [2]},
            "ds_version": "0.19.8"}


def with_pickle(genuine: bytes, pickle_bytes: bytes) -> bytes:
    """A torch zip file whose `data.pkl` is replaced: everything else stays genuine."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(genuine)) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            dst.writestr(item, pickle_bytes if item.filename.endswith("/data.pkl") else data)
    return out.getvalue()


def _text(text: str) -> bytes:
    data = text.encode()
    return b"X" + struct.pack("<I", len(data)) + data  # BINUNICODE: what torch's weights-only unpickler reads


def _global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"  # GLOBAL, resolved by name


def _call(func: bytes, *args: bytes) -> bytes:
    return func + b"(" + b"".join(args) + b"t" + b"R"  # MARK args TUPLE REDUCE


def ds_payloads(marker) -> dict[str, bytes]:
    """Payloads in the opcodes torch's weights-only unpickler accepts (GLOBAL, REDUCE, BUILD), plus the
    protocol-4 ones of the DCP tests (STACK_GLOBAL, which it refuses as an opcode)."""
    cmd = _text(f"touch {marker}")
    found = {f"protocol 4: {name}": data for name, data in payloads(marker).items()
             if name not in ("nested __reduce__ inside real metadata", "not metadata at all")}
    found.update({
        "GLOBAL os.system": _call(_global("os", "system"), cmd),
        "GLOBAL posix.system": _call(_global("posix", "system"), cmd),
        "builtins eval": _call(_global("builtins", "eval"), _text(f"__import__('os').system('touch {marker}')")),
        "builtins getattr chain": _call(_call(_global("builtins", "getattr"),
                                              _call(_global("builtins", "__import__"), _text("os")),
                                              _text("system")), cmd),
        "dotted name through an allowed DeepSpeed module": _call(
            _global("deepspeed.runtime.fp16.loss_scaler", "torch.os.system"), cmd),
        "dotted attribute of an allowed class": _call(
            _global("deepspeed.runtime.fp16.loss_scaler", "LossScaler.__init__.__globals__"), cmd),
        "a DeepSpeed module function": _call(
            _global("deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine", "torch.load"),
            _text(str(marker))),
        "collections._sys.modules.get": _call(_call(_global("collections", "_sys.modules.get"), _text("os")), cmd),
        "an allowed class whose state calls os.system": (
            _call(_global("deepspeed.runtime.fp16.loss_scaler", "LossScaler"), b"G?\xf0\x00\x00\x00\x00\x00\x00")
            + b"}" + _text("cur_scale") + _call(_global("os", "system"), cmd) + b"s" + b"b"),
    })
    return {name: data if name.startswith("protocol 4") else b"\x80\x02" + data + b"." for name, data in found.items()}


@pytest.fixture()
def engine():
    return deepspeed_state.make_safe_checkpoint_engine(None)


@pytest.fixture()
def genuine(tmp_path):
    path = tmp_path / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    torch.save(genuine_states(), path)
    return path


def test_a_genuine_deepspeed_file_loads(engine, genuine):
    loaded = engine.load(str(genuine))
    assert loaded["optimizer_state_dict"]["zero_stage"] == 3
    assert loaded["optimizer_state_dict"]["loss_scaler"].cur_scale == 1.0
    assert torch.equal(loaded["optimizer_state_dict"]["fp32_flat_groups"][0], torch.arange(4.0))


def test_deepspeeds_own_reader_runs_a_payload(tmp_path):
    """Why the reader is replaced: the stock engine executes what the file says."""
    from deepspeed.runtime.checkpoint_engine import TorchCheckpointEngine

    marker = tmp_path / "owned"
    path = tmp_path / "evil.pt"
    torch.save({"optimizer_state_dict": _Evil(marker)}, path)
    TorchCheckpointEngine().load(str(path))
    assert marker.exists()


def test_a_reduce_payload_saved_by_torch_is_refused(engine, tmp_path):
    marker = tmp_path / "owned"
    path = tmp_path / "evil.pt"
    torch.save({"optimizer_state_dict": _Evil(marker)}, path)
    with pytest.raises(UserError) as err:
        engine.load(str(path))
    assert "refused" in str(err.value) and "\n" not in str(err.value)
    assert not marker.exists()


@pytest.mark.parametrize("name", sorted(ds_payloads("M")))
def test_forged_data_pkl_is_refused_and_runs_nothing(engine, genuine, tmp_path, name):
    marker = tmp_path / "owned"
    genuine.write_bytes(with_pickle(genuine.read_bytes(), ds_payloads(marker)[name]))
    with pytest.raises(UserError) as err:
        engine.load(str(genuine))
    assert "refused" in str(err.value) and "\n" not in str(err.value)
    if "system" in name:
        assert "GLOBAL" in str(err.value) or "operand" in str(err.value), str(err.value)
    assert not marker.exists()


def test_the_payloads_are_real_exploits_under_plain_torch_load(genuine, tmp_path):
    """Guard for the hand-built opcodes: the stock (weights_only=False) load runs them."""
    marker = tmp_path / "owned"
    genuine.write_bytes(with_pickle(genuine.read_bytes(), ds_payloads(marker)["GLOBAL os.system"]))
    torch.load(genuine, weights_only=False)
    assert marker.exists()


def test_a_truncated_file_is_one_line(engine, genuine):
    genuine.write_bytes(genuine.read_bytes()[:100])
    with pytest.raises(UserError, match="unreadable"):
        engine.load(str(genuine))


@pytest.mark.slow
@pytest.mark.distributed
def test_resuming_a_forged_deepspeed_run_refuses_with_one_line(tmp_path):
    """The attack end to end: a forged optimizer file with matching manifest hashes, then `flopwise train` resumes."""
    run_dir = tmp_path / "run"
    train, env = tiny_train_command(tmp_path, run_dir, "parallel.strategy=deepspeed", "parallel.zero_stage=3",
                                    "parallel.nproc_per_node=1")
    done = subprocess.run([*train, "training.max_steps=2"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    step = run_dir / "checkpoints" / "step-2"
    marker = tmp_path / "owned"
    for file in (step / "deepspeed").glob("*.pt"):
        file.write_bytes(with_pickle(file.read_bytes(), ds_payloads(marker)["GLOBAL os.system"]))
    rehash(step)
    out = subprocess.run([*train, "training.max_steps=4"], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 2, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "refused" in errors[0], out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    assert not marker.exists()
    exported = subprocess.run([train[0], "-m", "flopwise", "export", str(run_dir)], capture_output=True, text=True,
                              env=env, timeout=300)
    assert exported.returncode == 2, exported.stderr[-3000:]
    errors = [line for line in exported.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "refused" in errors[0], exported.stderr[-3000:]
    assert "Traceback" not in exported.stderr
    assert not marker.exists()
