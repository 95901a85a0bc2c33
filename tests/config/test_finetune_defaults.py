"""Fine-tuning defaults: set on the fields a pretrained run left unset, each with its reason; never
over a value the config or an override gave; not at all without `model.pretrained`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from flopwise.config.loading import load_config
from flopwise.config.schema import RunConfig


@pytest.fixture
def pretrained(tmp_path):
    """A save_pretrained-shaped folder: config.json is all the defaults read."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": 4096}))
    return folder


def base(folder, *extra):
    return load_config(None, ["model.kind=hf", f"model.pretrained={folder}", "training.max_steps=1000", *extra])


@pytest.mark.parametrize("method, lr", [("full", 2e-5), ("lora", 2e-4), ("qlora", 2e-4)])
def test_each_method_gets_its_learning_rate_and_the_rest(pretrained, method, lr):
    cfg = base(pretrained, f"finetune.method={method}")
    assert cfg.training.lr == lr and cfg.training.min_lr == pytest.approx(lr / 10)
    assert cfg.training.warmup_steps == 30 and cfg.training.weight_decay == 0.0
    assert cfg.data.seq_len == 2048  # the model's 4096, capped
    notes = " | ".join(cfg.default_notes)
    assert f"training.lr={lr:g}" in notes and "QLoRA" in notes and "capped at 2048" in notes


def test_given_values_win(pretrained, tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("training:\n  lr: 0.001\n  weight_decay: 0.05\n")
    cfg = load_config(path, ["model.kind=hf", f"model.pretrained={pretrained}", "data.seq_len=512",
                             "training.warmup_steps=0"])
    assert (cfg.training.lr, cfg.training.weight_decay, cfg.data.seq_len, cfg.training.warmup_steps) == (
        0.001, 0.05, 512, 0)
    assert cfg.default_notes == []


def test_no_pretrained_model_keeps_the_pretraining_defaults():
    cfg = load_config(None, [])
    assert cfg == RunConfig() and cfg.default_notes == [] and cfg.training.lr == 3e-3


RECIPES = sorted((Path(__file__).parents[2] / "configs" / "finetune").glob("*.yaml"))


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_every_recipe_loads_with_a_model_folder(path, pretrained):
    cfg = load_config(path, [f"model.pretrained={pretrained}"])
    assert cfg.finetune is not None and cfg.default_notes
    assert cfg.training.lr == {"full": 2e-5, "lora": 2e-4, "qlora": 2e-4}[cfg.finetune.method]


def test_there_are_recipes_for_full_lora_and_qlora():
    assert len(RECIPES) >= 3
    methods = {yaml.safe_load(p.read_text())["finetune"]["method"] for p in RECIPES}
    assert methods == {"full", "lora", "qlora"}
