"""A file never switches on remote code; a run's record is read back only with this user's signature.

The payload: an HF config folder whose `auto_map` names a module that writes a marker file
when imported. The first test proves it runs under the stock behaviour (a config that says
`trust_remote_code: true`, validated as it is, built as export and compress built it). The
others give it to `flopwise export`, `compress`, `generate` and `train` in real processes and
check each refuses with one line and the marker never appears.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from flopwise.config.signature import SIGNATURE_PREFIX, signed_config_text, sign_manifest
from tests.hf_fixtures import write_pretrained

EVIL_MODULE = '''
import pathlib
pathlib.Path({marker!r}).write_text("remote code ran")
from transformers import LlamaConfig, LlamaForCausalLM


class EvilConfig(LlamaConfig):
    model_type = "evil-llama"


class EvilModel(LlamaForCausalLM):
    config_class = EvilConfig
'''


def plant_remote_code(folder: Path, marker: Path) -> Path:
    """A save_pretrained llama folder whose config.json asks for `evil_code.py` (which writes `marker`)."""
    write_pretrained(folder, vocab=300, model_vocab=320)
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="evil-llama", architectures=["EvilModel"],
                  auto_map={"AutoConfig": "evil_code.EvilConfig", "AutoModelForCausalLM": "evil_code.EvilModel"})
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "evil_code.py").write_text(EVIL_MODULE.format(marker=str(marker)))
    return folder


def forged_run_config(tmp_path: Path, evil: Path) -> dict:
    """A run config asking for the planted folder with remote code on, as an attacker writes it."""
    from flopwise.config.loading import load_config

    corpus = tmp_path / "text"
    corpus.mkdir(exist_ok=True)
    (corpus / "a.py").write_text("".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(400)))
    cfg = load_config(None, [f"data.paths=[{corpus}]", f"data.cache_dir={tmp_path / 'cache'}", "data.vocab_size=300",
                             "data.seq_len=16", "data.tokenizer_train_bytes=20000",
                             f"logging.run_dir={tmp_path / 'run'}"])
    data = cfg.model_dump(mode="json")
    data["model"].update(kind="hf", hf_config=str(evil / "config.json"), trust_remote_code=True)
    return data


def forged_run(tmp_path: Path, evil: Path, signed: bool) -> Path:
    """A run directory whose checkpoint manifest and config.yaml carry the forged config.

    `signed=True` signs them with this test session's key: the files the run itself would
    have written had the config said so; only the remote-code switch is then refused.
    """
    data = forged_run_config(tmp_path, evil)
    run = tmp_path / "run"
    step = run / "checkpoints" / "step-1"
    step.mkdir(parents=True)
    manifest = {"format": 1, "step": 1, "world_size": 1, "strategy": "single", "state_format": "dcp",
                "vocab_size": 300, "config": data, "files": {}}
    (step / "manifest.json").write_text(json.dumps(sign_manifest(manifest) if signed else manifest))
    text = yaml.safe_dump(data, sort_keys=False)
    (run / "config.yaml").write_text(signed_config_text(text) if signed else text)
    (run / "export").mkdir()
    (run / "export" / "model.safetensors").write_bytes(b"")  # never read: the config is refused first
    return run


def flopwise(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "flopwise", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)


def one_line_refusal(result: subprocess.CompletedProcess) -> str:
    assert result.returncode != 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


@pytest.fixture()
def evil(tmp_path):
    marker = tmp_path / "MARKER"
    return plant_remote_code(tmp_path / "evil", marker), marker


def test_the_payload_runs_under_the_stock_behaviour(evil, tmp_path):
    """A copy of what export did: the manifest's config validated as it is, then built."""
    from flopwise.config.schema import RunConfig
    from flopwise.train.model import build_model

    folder, marker = evil
    cfg = RunConfig.model_validate(forged_run_config(tmp_path, folder))
    build_model(cfg.model, 300)
    assert marker.read_text() == "remote code ran"


@pytest.mark.parametrize("command", [["export"], ["compress", "--method", "int8-dynamic"],
                                     ["compress", "--method", "int8-weight-only"], ["generate", "--prompt", "x"]])
def test_an_unsigned_run_is_refused_in_one_line(evil, tmp_path, command):
    folder, marker = evil
    run = forged_run(tmp_path, folder, signed=False)
    line = one_line_refusal(flopwise(command[0], str(run), *command[1:], cwd=tmp_path))
    assert "unsigned" in line and "--accept-run" in line
    assert not marker.exists()


@pytest.mark.parametrize("command", [["export"], ["compress", "--method", "int8-dynamic"],
                                     ["generate", "--prompt", "x"]])
@pytest.mark.parametrize("signed", [True, False])
def test_the_files_never_switch_on_remote_code(evil, tmp_path, command, signed):
    """Signed by the run itself, or accepted with --accept-run: the file's trust_remote_code is still ignored."""
    folder, marker = evil
    run = forged_run(tmp_path, folder, signed=signed)
    accept = [] if signed else ["--accept-run"]
    result = flopwise(command[0], str(run), *command[1:], *accept, cwd=tmp_path)
    line = one_line_refusal(result)
    assert "needs its own code" in line and "--trust-remote-code" in line, line
    assert ("accepted (--accept-run)" in result.stderr) == (not signed)
    assert not marker.exists()


def test_a_config_file_never_switches_on_remote_code_for_train(evil, tmp_path):
    """`flopwise train` on a config file that says `trust_remote_code: true` (a downloaded run's config.yaml).

    The planted config.json names a family transformers knows (llama) besides its auto_map, so the
    planner reads it and the model is built: without the switch transformers builds its own llama
    class and never imports the planted module (with the file's switch honoured, it would).
    """
    folder, marker = evil
    hf_config = json.loads((folder / "config.json").read_text())
    hf_config["model_type"] = "llama"
    (folder / "config.json").write_text(json.dumps(hf_config))
    data = forged_run_config(tmp_path, folder)
    data["parallel"].update(strategy="single", nproc_per_node=1)
    data["training"].update(max_steps=1, eval_every=1, eval_batches=1)
    data["logging"].update(progress=False)
    path = tmp_path / "forged.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    result = flopwise("train", str(path), cwd=tmp_path)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert not marker.exists()


def test_an_hf_folder_with_auto_map_is_refused_by_generate(evil, tmp_path):
    folder, marker = evil
    line = one_line_refusal(flopwise("generate", str(folder), "--prompt", "x", cwd=tmp_path))
    assert str(folder) in line
    assert not marker.exists()


def test_trust_remote_code_on_the_command_line_runs_it(evil, tmp_path):
    """The flag is the one switch: with it the planted module does run (so the refusals above are the flag's)."""
    folder, marker = evil
    flopwise("generate", str(folder), "--prompt", "x", "--max-new-tokens", "1", "--trust-remote-code", cwd=tmp_path)
    assert marker.read_text() == "remote code ran"


def test_a_tampered_config_yaml_is_refused_in_one_line(evil, tmp_path):
    folder, marker = evil
    run = forged_run(tmp_path, folder, signed=True)
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("seq_len: 16", "seq_len: 8"))
    assert SIGNATURE_PREFIX in config.read_text()
    line = one_line_refusal(flopwise("compress", str(run), "--method", "int8-dynamic", cwd=tmp_path))
    assert "signed by another key or edited" in line and str(config) in line
