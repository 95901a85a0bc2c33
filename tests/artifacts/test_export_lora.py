"""`flopwise export` of a LoRA run: the adapter in PEFT's format (loaded by `PeftModel.from_pretrained`
onto the pretrained base) and the merged model (loaded by transformers) give the same logits, which
differ from the base's; a full run refuses `--adapter` in one line. Offline, a small llama saved by the test."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from flopwise.config.loading import load_config
from tests.hf_fixtures import write_jsonl, write_pretrained
from tests.train.techniques.test_lora import overrides

pytest.importorskip("peft")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from flopwise.train.loop import run_training
    from flopwise.train.parallel.distributed import init_distributed

    root = tmp_path_factory.mktemp("export-lora")
    write_pretrained(root / "pretrained")
    write_jsonl(root / "data.jsonl")
    cfg = load_config(None, overrides(root, root, "lora", "training.max_steps=6"))
    run_training(cfg, init_distributed(cfg.parallel))
    return root


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flopwise", *args], capture_output=True, text=True, timeout=600)


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_adapter_and_merged_exports_load_and_agree(trained):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run = trained / "run"
    done = cli("export", str(run), "--adapter", "--out", str(trained / "adapter-export"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "peft.PeftModel.from_pretrained" in done.stdout
    done = cli("export", str(run), "--out", str(trained / "merged-export"))
    assert done.returncode == 0, done.stderr[-2000:]

    ids = torch.arange(1, 33).view(1, 32)
    base = AutoModelForCausalLM.from_pretrained(str(trained / "pretrained"), dtype=torch.float32).eval()
    base_logits = logits(base, ids)
    adapted = PeftModel.from_pretrained(base, str(trained / "adapter-export" / "adapter")).eval()
    merged = AutoModelForCausalLM.from_pretrained(str(trained / "merged-export" / "hf")).eval()
    torch.testing.assert_close(logits(merged, ids), logits(adapted, ids), atol=1e-4, rtol=1e-4)
    assert not torch.allclose(logits(merged, ids), base_logits, atol=1e-3)  # the adapters were trained
    assert (trained / "merged-export" / "model.safetensors").is_file()  # what `flopwise compress` reads


def test_adapter_export_of_a_full_run_is_one_line(trained, tmp_path):
    from flopwise.artifacts.export import export_checkpoint
    from flopwise.errors import UserError
    from flopwise.train.loop import run_training
    from flopwise.train.parallel.distributed import init_distributed

    cfg = load_config(None, overrides(trained, tmp_path, "full", "training.max_steps=1"))
    run_training(cfg, init_distributed(cfg.parallel))
    with pytest.raises(UserError, match="--adapter: .* trained every weight"):
        export_checkpoint(tmp_path / "run", adapter=True)
