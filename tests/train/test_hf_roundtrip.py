"""The whole offline round trip, through the command line as a user runs it:

a llama-architecture model saved with `save_pretrained` (+ tokenizer) -> `flopwise train
model.kind=hf model.pretrained=... data.hf_dataset=LOCAL.jsonl` -> `flopwise export` ->
AutoModelForCausalLM / AutoTokenizer -> `flopwise generate` -> `flopwise compress
--method int8-weight-only / int4-weight-only` -> transformers loads and generates.

Stated tolerances: step-1 loss (computed on the pretrained weights before any update) equals
transformers' own loss on the same batch within 1e-5 relative (fp32); INT8 weight-only
perplexity within 2 % of the float model's.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.hf_fixtures import write_jsonl, write_pretrained

pytestmark = pytest.mark.slow

STEPS = 4
SEQ_LEN = 32
BATCH = 4


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID")}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    result = subprocess.run([sys.executable, "-m", "flopwise", *args], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, f"flopwise {' '.join(args)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Train the pretrained tiny llama for a few steps on a local JSONL, then export it."""
    root = tmp_path_factory.mktemp("roundtrip")
    write_pretrained(root / "pretrained", max_shard_size="150KB")  # sharded: index + several files
    write_jsonl(root / "data.jsonl")
    cli("train", "model.kind=hf", f"model.pretrained={root / 'pretrained'}", f"data.hf_dataset={root / 'data.jsonl'}",
        "parallel.strategy=single", "parallel.nproc_per_node=1", f"training.max_steps={STEPS}",
        f"data.seq_len={SEQ_LEN}", f"training.micro_batch_size={BATCH}", "training.eval_every=2",
        "training.eval_batches=2", "data.prefetch=0", f"data.cache_dir={root / 'cache'}",
        f"logging.run_dir={root / 'run'}", "logging.progress=false", cwd=root)
    cli("export", str(root / "run"), cwd=root)
    return root


def test_pretrained_folder_is_sharded(trained):
    assert (trained / "pretrained" / "model.safetensors.index.json").is_file()
    assert len(list((trained / "pretrained").glob("model-*.safetensors"))) > 1


def test_first_step_loss_equals_transformers_loss_on_the_same_batch(trained):
    from transformers import AutoModelForCausalLM

    from flopwise.config.loading import load_config
    from flopwise.train.data.loader import TokenLoader
    from flopwise.train.data.prepare import prepare_data

    cfg = load_config(trained / "run" / "config.yaml", [])
    prepared = prepare_data(cfg.data)
    loader = TokenLoader(prepared, "train", SEQ_LEN, BATCH, seed=cfg.training.seed, prefetch=0)
    inputs, targets = loader.batch_at(0)
    window = torch.cat([inputs, targets[:, -1:]], dim=1)
    model = AutoModelForCausalLM.from_pretrained(str(trained / "pretrained"), dtype=torch.float32).eval()
    with torch.no_grad():
        reference = float(model(input_ids=window, labels=window).loss)
    first = json.loads((trained / "run" / "metrics.rank0.jsonl").read_text().splitlines()[0])
    assert first["step"] == 1
    assert first["loss"] == pytest.approx(reference, rel=1e-5)


def test_export_loads_with_auto_classes_and_keeps_ordinary_permissions(trained):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = trained / "run" / "export" / "hf"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (folder / name).is_file(), name
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o644
    model = AutoModelForCausalLM.from_pretrained(str(folder))
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    assert type(model).__name__ == "LlamaForCausalLM"
    ids = tokenizer("the model learns", return_tensors="pt").input_ids
    assert tokenizer.decode(ids[0]) == "the model learns"
    # The export holds the trained weights, not the pretrained ones.
    pretrained = AutoModelForCausalLM.from_pretrained(str(trained / "pretrained"))
    assert not torch.equal(model.model.embed_tokens.weight, pretrained.model.embed_tokens.weight)


def test_generate_prints_the_prompt_and_new_text(trained):
    out = cli("generate", str(trained / "run"), "--prompt", "the model", "--max-new-tokens", "12", "--seed", "3",
              cwd=trained).stdout
    text = out.splitlines()[0]
    assert text.startswith("the model") and len(text) > len("the model")
    assert "12 new tokens" in out or "new tokens" in out
    again = cli("generate", str(trained / "run" / "export" / "hf"), "--prompt", "the model", "--max-new-tokens", "12",
                "--seed", "3", cwd=trained).stdout
    assert again.splitlines()[0] == text  # same seed, same sample


@pytest.mark.parametrize("method", ["int8-weight-only", "int4-weight-only"])
def test_compressed_llm_loads_in_transformers_and_generates(trained, method):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = cli("compress", str(trained / "run"), "--method", method, "--new-tokens", "4", "--json", cwd=trained)
    result = json.loads(run.stdout)
    folder = trained / "run" / "compressed" / method
    config = json.loads((folder / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "torchao"
    assert list(folder.glob("*.safetensors")) and not list(folder.glob("*.bin"))
    model = AutoModelForCausalLM.from_pretrained(str(folder))
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    ids = tokenizer("the model", return_tensors="pt").input_ids
    output = model.generate(ids, max_new_tokens=5, do_sample=False)
    assert output.shape[1] == ids.shape[1] + 5
    assert result["after"]["disk_bytes"] < result["before"]["disk_bytes"]
    if method == "int8-weight-only":
        assert abs(result["perplexity_change"]) < 0.02
    text = cli("generate", str(folder), "--prompt", "the model", "--max-new-tokens", "5", cwd=trained).stdout
    assert text.startswith("the model")
