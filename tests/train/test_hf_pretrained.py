"""`model.pretrained`: weights of a save_pretrained folder, loaded without a random full copy first.

Single process in this process; FSDP2 on 2 ranks through torchrun (each rank fills only its
own shards), checked against transformers' loss on the same batches.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from flopwise.errors import UserError
from flopwise.config.resolve import resolve_run
from flopwise.train.build import build_training_model
from flopwise.config.loading import load_config
from flopwise.train.hf_pretrained import parameters_on_meta, weight_files
from flopwise.train.parallel.distributed import init_distributed
from tests.hf_fixtures import write_jsonl, write_pretrained


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("pretrained")
    write_pretrained(root / "sharded", max_shard_size="150KB")
    write_pretrained(root / "tied", tie=True, seed=1)
    write_jsonl(root / "data.jsonl")
    return root


def build(folder, *extra):
    cfg = load_config(None, ["model.kind=hf", f"model.pretrained={folder}", "parallel.strategy=single",
                             "parallel.nproc_per_node=1", "data.seq_len=32", *extra])
    env = init_distributed(cfg.parallel)
    return build_training_model(cfg, 384, env, resolve_run(cfg, processes=env.world_size))


def test_sharded_weights_load_exactly(folders):
    from transformers import AutoModelForCausalLM

    assert len(weight_files(folders / "sharded")) > 1
    built = build(folders / "sharded")
    reference = AutoModelForCausalLM.from_pretrained(str(folders / "sharded"), dtype=torch.float32)
    ours = built.module.hf.state_dict()
    for name, tensor in reference.state_dict().items():
        assert torch.equal(ours[name], tensor), name
    assert not any(p.is_meta for p in built.module.parameters())
    # Non-persistent buffers (rotary frequencies) survive: computed at build, not loaded.
    torch.testing.assert_close(built.module.hf.model.rotary_emb.inv_freq, reference.model.rotary_emb.inv_freq)


def test_tied_embeddings_stay_tied(folders):
    built = build(folders / "tied")
    hf = built.module.hf
    assert hf.lm_head.weight is hf.model.embed_tokens.weight
    assert hf.lm_head.weight.abs().sum() > 0


def test_parameters_on_meta_keeps_buffers_real():
    with parameters_on_meta():
        layer = torch.nn.BatchNorm1d(4)
    assert layer.weight.is_meta and not layer.running_mean.is_meta
    assert not torch.nn.Linear(2, 2).weight.is_meta  # the patch is gone afterwards


def test_folder_without_weights_is_one_line_error(folders, tmp_path):
    (tmp_path / "config.json").write_text((folders / "sharded" / "config.json").read_text())
    with pytest.raises(UserError, match="has no model.safetensors or model.safetensors.index.json"):
        build(tmp_path)


def test_pretrained_needs_the_hf_kind(folders):
    with pytest.raises(UserError, match="model.pretrained: needs model.kind=hf"):
        load_config(None, [f"model.pretrained={folders / 'sharded'}"])


def test_the_model_tokenizer_is_used_unless_data_tokenizer_overrides(folders, tmp_path):
    cfg = load_config(None, ["model.kind=hf", f"model.pretrained={folders / 'sharded'}"])
    assert cfg.data.tokenizer == folders / "sharded" / "tokenizer.json"
    assert cfg.model.hf_config == folders / "sharded" / "config.json"
    other = tmp_path / "tokenizer.json"
    other.write_text((folders / "tied" / "tokenizer.json").read_text())
    cfg = load_config(None, ["model.kind=hf", f"model.pretrained={folders / 'sharded'}", f"data.tokenizer={other}"])
    assert cfg.data.tokenizer == other


def model_folder_without_tokenizer_json(source, folder):
    """`source`'s weights and config with its tokenizer as GPT-2's slow files (vocab.json, merges.txt),
    as older save_pretrained folders hold it: no tokenizer.json."""
    import shutil

    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(source / name, folder / name)
    model = json.loads((source / "tokenizer.json").read_text())["model"]
    (folder / "vocab.json").write_text(json.dumps(model["vocab"]))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "GPT2Tokenizer", "eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>"}))
    return folder


def test_a_folder_without_tokenizer_json_trains_with_the_tokenizer_transformers_loads(folders, tmp_path):
    from tokenizers import Tokenizer

    from flopwise.train.data.prepare import prepare_data

    folder = model_folder_without_tokenizer_json(folders / "tied", tmp_path / "slow")
    cfg = load_config(None, ["model.kind=hf", f"model.pretrained={folder}", f"data.hf_dataset={folders / 'data.jsonl'}",
                             f"data.cache_dir={tmp_path / 'cache'}", "data.seq_len=32"])
    assert cfg.data.tokenizer == folder
    prepared = prepare_data(cfg.data)
    assert prepared.vocab_size == 384  # the model's tokenizer, not a 4096-id BPE trained on the data
    own = Tokenizer.from_file(str(folders / "tied" / "tokenizer.json"))
    text = "the model learns to count apples"
    assert prepared.tokenizer.encode(text, add_special_tokens=False).ids == own.encode(text, add_special_tokens=False).ids


def test_a_folder_without_a_tokenizer_is_refused_not_given_a_new_one(folders, tmp_path):
    import shutil

    folder = tmp_path / "no-tokenizer"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(folders / "tied" / name, folder / name)
    done = subprocess.run(
        [sys.executable, "-m", "flopwise", "train", "model.kind=hf", f"model.pretrained={folder}",
         f"data.hf_dataset={folders / 'data.jsonl'}", f"data.cache_dir={tmp_path / 'cache'}", "data.seq_len=32",
         "parallel.strategy=single", "parallel.nproc_per_node=1", "finetune.method=lora", "training.max_steps=1",
         f"logging.run_dir={tmp_path / 'run'}", "logging.progress=false"],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert f"{folder} has no tokenizer" in line and f"tokenizer.save_pretrained('{folder}')" in line
    assert not list((tmp_path / "cache").glob("*/tokenizer.json"))  # no BPE was trained


def test_pretrained_path_mistakes_say_what_is_wrong(folders, tmp_path):
    with pytest.raises(UserError, match=rf"model.pretrained: {tmp_path / 'absent'} does not exist"):
        load_config(None, ["model.kind=hf", f"model.pretrained={tmp_path / 'absent'}"])
    config = folders / "tied" / "config.json"
    with pytest.raises(UserError, match=rf"model.pretrained: {config} is a file, not a folder.*"
                                        rf"model.pretrained={folders / 'tied'}\?"):
        load_config(None, ["model.kind=hf", f"model.pretrained={config}"])
    with pytest.raises(UserError, match=rf"model.pretrained: {tmp_path} has no config.json"):
        load_config(None, ["model.kind=hf", f"model.pretrained={tmp_path}"])


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("strategy,name", [("fsdp", "sharded"), ("fsdp", "tied"), ("ddp", "sharded")])
def test_two_ranks_start_from_the_pretrained_weights(folders, tmp_path, strategy, name):
    """2 ranks (FSDP2: sharded on the meta model, each rank fills its own shards; DDP: filled before
    wrapping): each rank's first loss equals transformers' on that rank's batch."""
    from transformers import AutoModelForCausalLM

    from flopwise.train.data.loader import TokenLoader
    from flopwise.train.data.prepare import prepare_data

    run_dir = tmp_path / "run"
    overrides = ["model.kind=hf", f"model.pretrained={folders / name}", f"data.hf_dataset={folders / 'data.jsonl'}",
                 f"parallel.strategy={strategy}", "parallel.nproc_per_node=2", "parallel.fsdp_min_params=0",
                 "training.max_steps=2", "data.seq_len=32", "training.micro_batch_size=2", "training.eval_batches=1",
                 f"data.cache_dir={folders / 'cache'}", f"logging.run_dir={run_dir}", "logging.progress=false"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID")}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    result = subprocess.run([sys.executable, "-m", "flopwise", "train", *overrides], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    cfg = load_config(run_dir / "config.yaml", [])
    prepared = prepare_data(cfg.data)
    model = AutoModelForCausalLM.from_pretrained(str(folders / name), dtype=torch.float32).eval()
    for rank in range(2):
        loader = TokenLoader(prepared, "train", 32, 2, rank=rank, world_size=2, seed=cfg.training.seed, prefetch=0)
        inputs, targets = loader.batch_at(0)
        window = torch.cat([inputs, targets[:, -1:]], dim=1)
        with torch.no_grad():
            reference = float(model(input_ids=window, labels=window).loss)
        first = json.loads((run_dir / f"metrics.rank{rank}.jsonl").read_text().splitlines()[0])
        assert first["loss"] == pytest.approx(reference, rel=1e-5), rank
