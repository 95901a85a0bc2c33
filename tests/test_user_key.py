"""The signing key: created once, atomically, private; a weak or foreign key signs nothing."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor

import pytest

from flopwise.errors import UserError
from flopwise.user_key import KEY_BYTES, key_path, sign, user_key


@pytest.fixture(autouse=True)
def _own_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def _one_line(call) -> str:
    with pytest.raises(UserError) as err:
        call()
    assert "\n" not in str(err.value)
    return str(err.value)


def test_the_key_is_created_private_and_full_length():
    key = user_key()
    info = os.stat(key_path())
    assert len(key) == KEY_BYTES and stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.getuid()
    assert stat.S_IMODE(os.stat(key_path().parent).st_mode) == 0o700
    assert user_key() == key and os.listdir(key_path().parent) == ["artifact.key"]  # no temporary left


def _key_in_child(home: str) -> str:
    os.environ["XDG_CONFIG_HOME"] = home
    from flopwise.user_key import user_key as child_key

    return child_key().hex()


def test_processes_creating_it_together_share_one_key(tmp_path):
    home = str(tmp_path / "together")
    with ProcessPoolExecutor(4) as pool:
        keys = set(pool.map(_key_in_child, [home] * 8))
    assert len(keys) == 1


@pytest.mark.parametrize("content", [b"", b"x" * (KEY_BYTES - 1)])
def test_a_short_key_is_refused(content):
    key_path().parent.mkdir(parents=True)
    key_path().write_bytes(content)
    os.chmod(key_path(), 0o600)
    message = _one_line(lambda: sign(b"data"))
    assert f"holds {len(content)} bytes" in message and str(key_path()) in message and "remove" in message


def test_a_key_others_can_read_is_refused():
    user_key()
    os.chmod(key_path(), 0o644)
    message = _one_line(lambda: sign(b"data"))
    assert "mode 644" in message and f"chmod 600 {key_path()}" in message


def test_a_link_a_folder_and_a_fifo_are_refused(tmp_path):
    key_path().parent.mkdir(parents=True)
    target = tmp_path / "elsewhere"
    target.write_bytes(os.urandom(KEY_BYTES))
    os.chmod(target, 0o600)
    key_path().symlink_to(target)
    assert "symbolic link" in _one_line(lambda: sign(b"data"))
    key_path().unlink()
    key_path().mkdir()
    assert "not a regular file" in _one_line(lambda: sign(b"data"))
    key_path().rmdir()
    os.mkfifo(key_path(), 0o600)
    assert "not a regular file" in _one_line(lambda: sign(b"data"))  # and no hang on the open


@pytest.mark.skipif(os.getuid() != 0, reason="giving the key to another user needs root")
def test_a_key_owned_by_another_user_is_refused():
    user_key()
    os.chown(key_path(), 65534, 65534)
    assert "belongs to user id 65534" in _one_line(lambda: sign(b"data"))


def forged_with_an_empty_key(manifest: dict) -> dict:
    """What anyone can sign when the key is empty: HMAC-SHA256 under b"" needs no secret."""
    from flopwise.config.signature import _manifest_bytes

    return {**manifest, "signature": hmac.new(b"", _manifest_bytes(manifest), hashlib.sha256).hexdigest()}


def test_an_empty_key_lets_anyone_sign_under_the_stock_reader():
    """A copy of the reader before the checks (`key_path().read_bytes()`): the forgery verifies."""
    from flopwise.config.signature import _manifest_bytes

    key_path().parent.mkdir(parents=True)
    key_path().write_bytes(b"")  # what an interrupted first write left
    forged = forged_with_an_empty_key({"format": 1, "step": 1, "config": {}, "files": {}})
    stock_key = key_path().read_bytes()
    expected = hmac.new(stock_key, _manifest_bytes(forged), hashlib.sha256).hexdigest()
    assert hmac.compare_digest(forged["signature"], expected)


def test_an_empty_key_stops_export_with_one_line(tmp_path):
    """The attack as reported: an empty artifact.key (interrupted first write) let anyone sign."""
    key_path().parent.mkdir(parents=True)
    key_path().write_bytes(b"")
    os.chmod(key_path(), 0o600)
    step = tmp_path / "run" / "checkpoints" / "step-1"
    step.mkdir(parents=True)
    forged = forged_with_an_empty_key({"format": 1, "step": 1, "config": {}, "files": {}})
    (step / "manifest.json").write_text(json.dumps(forged))
    done = subprocess.run([sys.executable, "-m", "flopwise", "export", str(tmp_path / "run")], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.count("error:") == 1 and "holds 0 bytes" in done.stderr
