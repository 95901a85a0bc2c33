"""`model.pretrained: org/name` resolves in a Hugging Face cache populated here; not cached -> how to download."""

from __future__ import annotations

import pytest

from flopwise.config.loading import load_config
from flopwise.errors import UserError
from tests.hf_fixtures import write_pretrained


def _cache_snapshot(hf_home, model_id: str, revision: str = "0123abcd"):
    """The layout huggingface_hub writes: hub/models--org--name/snapshots/<rev>/ and refs/main."""
    repo = hf_home / "hub" / ("models--" + model_id.replace("/", "--"))
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    return write_pretrained(snapshot)


def test_hub_id_resolves_to_the_cached_snapshot(tmp_path, monkeypatch):
    hf_home = tmp_path / "hf-home"
    snapshot = _cache_snapshot(hf_home, "tiny-org/tiny-llama")
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, ["model.kind=hf", "model.pretrained=tiny-org/tiny-llama"])
    assert cfg.model.pretrained.resolve() == snapshot.resolve()
    assert cfg.model.hf_config.resolve() == (snapshot / "config.json").resolve()
    assert cfg.data.tokenizer.resolve() == (snapshot / "tokenizer.json").resolve()


def test_uncached_hub_id_says_how_to_download(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-home"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as err:
        load_config(None, ["model.kind=hf", "model.pretrained=some-org/not-cached"])
    message = str(err.value)
    assert "hf download some-org/not-cached" in message and "\n" not in message.strip()


def test_missing_folders_are_named_as_folders(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=r"models/llama does not exist"):
        load_config(None, ["model.kind=hf", f"model.pretrained={tmp_path / 'models' / 'llama'}"])
    # a relative path that exists nowhere may be either: the line names both
    with pytest.raises(UserError, match=r"model.pretrained: models/llama is not a folder and not in the Hugging Face cache"):
        load_config(None, ["model.kind=hf", "model.pretrained=models/llama"])
