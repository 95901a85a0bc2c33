"""Signed run records and the remote-code switch: a file never sets it, the command line always can."""

from __future__ import annotations

import json

import pytest

from flopwise.config.loading import dump_config, load_config
from flopwise.config.signature import (
    SIGNATURE_PREFIX, check_manifest, manifest_config, read_run_config, sign_manifest, signed_config_text,
)
from flopwise.errors import UserError


def _one_line(call) -> str:
    with pytest.raises(UserError) as err:
        call()
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_file_never_switches_on_remote_code(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("model:\n  kind: hf\n  hf_config: x.json\n  trust_remote_code: true\n")
    assert load_config(path).model.trust_remote_code is False
    assert load_config(path, ["model.trust_remote_code=true"]).model.trust_remote_code is True


def test_a_signed_config_reads_back_and_an_edited_one_is_refused(tmp_path, capsys):
    cfg = load_config(None, ["training.max_steps=7", "model.trust_remote_code=true"])
    path = tmp_path / "config.yaml"
    path.write_text(signed_config_text(dump_config(cfg)))
    assert path.read_text().splitlines()[-1].startswith(SIGNATURE_PREFIX)
    again = read_run_config(path, accept_run=False, trust_remote_code=False)
    assert again.training.max_steps == 7 and again.model.trust_remote_code is False  # recorded, not honoured
    assert read_run_config(path, accept_run=False, trust_remote_code=True).model.trust_remote_code is True

    path.write_text(path.read_text().replace("max_steps: 7", "max_steps: 8"))
    assert "signed by another key or edited" in _one_line(
        lambda: read_run_config(path, accept_run=False, trust_remote_code=False))
    assert read_run_config(path, accept_run=True, trust_remote_code=False).training.max_steps == 8
    assert "accepted (--accept-run)" in capsys.readouterr().err


def test_an_unsigned_config_or_another_users_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "config.yaml"
    path.write_text(dump_config(load_config(None)))
    assert "unsigned" in _one_line(lambda: read_run_config(path, accept_run=False, trust_remote_code=False))
    path.write_text(signed_config_text(dump_config(load_config(None))))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "someone-else"))
    assert "signed by another key" in _one_line(lambda: read_run_config(path, accept_run=False,
                                                                        trust_remote_code=False))


def test_a_manifest_is_signed_over_everything_in_it(tmp_path):
    config = load_config(None).model_dump(mode="json")
    config["model"]["trust_remote_code"] = True
    manifest = sign_manifest({"step": 3, "config": config, "files": {"a": {"bytes": 1, "sha256": "0" * 64}}})
    check_manifest(tmp_path / "manifest.json", manifest, accept_run=False)
    assert manifest_config(tmp_path, manifest, trust_remote_code=False).model.trust_remote_code is False
    for change in ({"step": 4}, {"files": {}}, {"config": {**config, "training": {"max_steps": 1}}}):
        forged = json.loads(json.dumps({**manifest, **change}))
        assert "edited" in _one_line(lambda: check_manifest(tmp_path, forged, accept_run=False))


def test_the_ranks_get_the_switch_on_their_command_line(tmp_path):
    from flopwise.train.launch.start import torchrun_args

    on = load_config(None, ["model.trust_remote_code=true"])
    assert torchrun_args(on, tmp_path / "c.yaml")[-2:] == [str(tmp_path / "c.yaml"), "model.trust_remote_code=true"]
    assert torchrun_args(load_config(None), tmp_path / "c.yaml")[-1] == str(tmp_path / "c.yaml")
