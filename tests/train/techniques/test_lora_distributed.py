"""LoRA under DDP and QLoRA under FSDP2 on 2 real CPU processes started by `flopwise train`, with
activation checkpointing; a QLoRA run killed with SIGKILL after a published checkpoint continues,
when the identical command is rerun, with every rank's losses equal to an uninterrupted run's bit for bit,
and its merged export (transformers) and adapter export (PEFT) load and agree."""

from __future__ import annotations

import pytest
import torch

from tests.hf_fixtures import export_logits, pretrained_root, write_jsonl
from tests.torchrun_runs import assert_killed_run_continues_bit_for_bit, run_to_end
from tests.train.checkpoint.test_policy import losses, write

pytest.importorskip("peft")
pytest.importorskip("torchao")
pytest.importorskip("psutil")

STEPS = 8


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = pretrained_root(tmp_path_factory, "lora-dist")
    write_jsonl(root / "data.jsonl")
    return root


def config(folders, run_dir, strategy: str, method: str, **checkpoint) -> dict:
    return {
        "model": {"kind": "hf", "pretrained": str(folders / "pretrained")},
        "data": {"hf_dataset": str(folders / "data.jsonl"), "cache_dir": str(folders / "cache"), "seq_len": 32,
                 "prefetch": 2},
        "parallel": {"nproc_per_node": 2, "strategy": strategy, "fsdp_min_params": 0},
        "finetune": {"method": method, "rank": 4, "alpha": 8},
        "training": {"max_steps": STEPS, "micro_batch_size": 4, "global_batch_size": 8, "warmup_steps": 2,
                     "lr": 1e-2, "min_lr": 1e-3, "eval_every": STEPS, "eval_batches": 1,
                     "gradient_checkpointing": True},
        "checkpoint": {"keep_last": 20, **checkpoint},
        "logging": {"run_dir": str(run_dir), "progress": False},
    }


def run_config_to_end(folders, tmp_path, strategy: str, method: str):
    run_dir = tmp_path / "run"
    return run_dir, run_to_end(write(config(folders, run_dir, strategy, method), tmp_path / "config.yaml"))


@pytest.mark.slow
@pytest.mark.distributed
def test_lora_under_ddp_lowers_the_loss_on_both_ranks(folders, tmp_path):
    run_dir, out = run_config_to_end(folders, tmp_path, "ddp", "lora")
    assert "LoRA (PEFT): rank 4" in out
    first, second = losses(run_dir, 0), losses(run_dir, 1)
    assert second[-1] < second[0] and first[-1] < first[0], (first, second)


@pytest.mark.slow
@pytest.mark.distributed
def test_qlora_under_fsdp2_killed_then_rerun_continues_bit_for_bit(folders, tmp_path):
    ref_dir, out = run_config_to_end(folders, tmp_path / "ref", "fsdp", "qlora")
    assert "QLoRA: 14 block linears stored in NF4" in out
    assert losses(ref_dir, 0)[-1] < losses(ref_dir, 0)[0]

    run_dir = tmp_path / "killed" / "run"
    path = write(config(folders, run_dir, "fsdp", "qlora", every_steps=2), run_dir.parent / "config.yaml")
    assert_killed_run_continues_bit_for_bit(path, run_dir, ref_dir, STEPS, kill_after=5)

    # the resumed run's adapters out: merged (transformers) and alone (PEFT) agree on the logits
    _, merged, adapted = export_logits(run_dir, tmp_path, folders / "pretrained", torch.arange(1, 33).view(1, 32))
    torch.testing.assert_close(merged, adapted, atol=1e-4, rtol=1e-4)
