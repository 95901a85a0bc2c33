"""The run config: YAML + overrides, ready configs, and one-line errors (in process and via the CLI)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flopwise.errors import UserError
from flopwise.config.schema import RunConfig
from flopwise.config.loading import dump_config, load_config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"


def test_no_config_gives_the_schema_defaults():
    assert load_config() == RunConfig()


def test_embedded_default_yaml_is_identical_to_the_schema_defaults():
    assert load_config(CONFIGS / "default.yaml") == RunConfig()


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_ready_config_loads(path):
    cfg = load_config(path)
    assert isinstance(cfg, RunConfig)


def test_the_seed_snippet_loads_as_is(tmp_path):
    path = tmp_path / "seed.yaml"
    path.write_text("training:\n  gradient_checkpointing: true\n  pruning:\n    method: magnitude\n    sparsity: 0.6\n")
    cfg = load_config(path)
    assert cfg.training.gradient_checkpointing is True
    assert cfg.training.checkpoint_every == 1
    assert cfg.training.pruning.method == "magnitude"
    assert cfg.training.pruning.sparsity == 0.6
    assert load_config(CONFIGS / "seed_example.yaml").training == cfg.training


def test_overrides_are_typed_and_win_over_the_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("training:\n  max_steps: 7\n  lr: 0.01\n")
    cfg = load_config(path, ["training.max_steps=12", "training.betas=[0.8, 0.9]", "precision.mode=bf16",
                             "training.gradient_checkpointing=2", "logging.tensorboard=true"])
    assert cfg.training.max_steps == 12
    assert cfg.training.lr == 0.01
    assert cfg.training.betas == (0.8, 0.9)
    assert cfg.precision.mode == "bf16"
    assert cfg.training.checkpoint_every == 2
    assert cfg.logging.tensorboard is True


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(None, ["model.kind=gpt2", "training.max_steps=3", "data.paths=[a.txt, b.txt]"])
    path = tmp_path / "resolved.yaml"
    path.write_text(dump_config(cfg))
    assert load_config(path) == cfg


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["training.max_stepz=3"], "training.max_stepz: unknown key (allowed: max_steps, seed,"),
        (["training.max_steps=abc"], "training.max_steps: input should be a valid integer"),
        (["precision.mode=fp8"], "precision.mode: input should be 'fp32', 'bf16', 'fp16'"),
        (["training.lr=-1"], "training.lr: input should be greater than 0"),
        (["training.min_lr=1"], "training.min_lr: 1.0 is above lr"),
        (["training.pruning.sparsity=2"], "training.pruning.sparsity: input should be less than 1"),
        (["data.seq_len=1024"], "data.seq_len: 1024 exceeds model.max_seq_len"),
        (["precision.mode=bf16-params", "parallel.strategy=ddp"], "needs parallel.strategy=fsdp"),
        (["nosuchsection.x=1"], "nosuchsection: unknown key (allowed: model, data, parallel"),
        (["training.max_steps"], "expected section.key=value"),
    ],
)
def test_bad_values_give_one_line_naming_the_key(overrides, expected):
    with pytest.raises(UserError) as err:
        load_config(None, overrides)
    message = str(err.value)
    assert expected in message
    assert "\n" not in message
    assert message.startswith("override '")


@pytest.mark.parametrize("text, key", [
    ("training: {max_steps: on}\n", "training.max_steps"),
    ("training: {lr: yes}\n", "training.lr"),
    ("training: {warmup_steps: no}\n", "training.warmup_steps"),
    ("model: {n_heads: true}\n", "model.n_heads"),
    ("parallel: {nproc_per_node: on}\n", "parallel.nproc_per_node"),
    ("compress: {lr: yes}\n", "compress.lr"),
])
def test_a_yaml_boolean_is_not_a_number(tmp_path, text, key):
    from flopwise.compress.config import parse_compress_config
    from flopwise.config.loading import load_train_config

    path = tmp_path / "run.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as err:
        load_train_config(str(path), [], parse_compress_config)
    message = str(err.value)
    assert "\n" not in message and f"{key}: must be a number" in message and "Value error" not in message


def test_numbers_stay_numbers_and_boolean_fields_keep_booleans(tmp_path):
    cfg = load_config(None, ["training.max_steps=200", "training.lr='0.01'", "training.gradient_checkpointing=true",
                             "training.gradient_checkpointing=2"])
    assert cfg.training.max_steps == 200 and cfg.training.lr == 0.01 and cfg.training.checkpoint_every == 2
    assert load_config(None, ["training.gradient_checkpointing=on"]).training.checkpoint_every == 1


def test_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("training:\n  max_steps: [1\n")
    with pytest.raises(UserError, match=r"bad.yaml: invalid YAML at line"):
        load_config(bad)
    typo = tmp_path / "typo.yaml"
    typo.write_text("training:\n  max_stepz: 3\n")
    with pytest.raises(UserError, match=r"^.*typo.yaml: training.max_stepz: unknown key \(allowed: max_steps"):
        load_config(typo)
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(UserError, match="top level must be a mapping"):
        load_config(listy)
    with pytest.raises(UserError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "flopwise", "train", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    "args, expected",
    [
        (["training.max_stepz=3"], "training.max_stepz: unknown key (allowed: max_steps"),
        (["training.max_steps=lots"], "training.max_steps: input should be a valid integer"),
        (["parallel.strategy=magic"], "parallel.strategy: input should be 'single', 'ddp', 'fsdp'"),
        (["missing.yaml"], "missing.yaml: config file not found"),
        (["parallel.strategy=deepspeed", "parallel.zero_stage=2", "parallel.offload=params"],
         "parallel.offload: params offloads ZeRO-3 parameter shards and needs parallel.zero_stage=3"),
    ],
)
def test_cli_bad_config_is_one_line_and_exit_2(tmp_path, args, expected):
    result = _cli(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert expected in lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    assert not (tmp_path / "runs").exists()  # nothing started
