"""LoRA under DDP and QLoRA under FSDP2 on 2 real CPU processes started by `flopwise train`, with
activation checkpointing; a QLoRA run killed with SIGKILL after a published checkpoint continues,
when the identical command is rerun, with every rank's losses equal to an uninterrupted run's bit for bit,
and its merged export (transformers) and adapter export (PEFT) load and agree."""

from __future__ import annotations

import pytest
import torch

from flopwise.train.checkpoint import store as ckpt
from tests.hf_fixtures import write_jsonl, write_pretrained
from tests.train.checkpoint.test_policy import losses, train_cli, write
from tests.train.checkpoint.test_strategy_checkpoints import (
    assert_the_same_command_continues, kill_launcher_and_workers, wait_for_checkpoint_and_step,
)

pytest.importorskip("peft")
pytest.importorskip("torchao")
psutil = pytest.importorskip("psutil")

STEPS = 8


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-dist")
    write_pretrained(root / "pretrained")
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


def run_to_end(folders, tmp_path, strategy: str, method: str):
    run_dir = tmp_path / "run"
    proc = train_cli(write(config(folders, run_dir, strategy, method), tmp_path / "config.yaml"))
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return run_dir, out


@pytest.mark.slow
@pytest.mark.distributed
def test_lora_under_ddp_lowers_the_loss_on_both_ranks(folders, tmp_path):
    run_dir, out = run_to_end(folders, tmp_path, "ddp", "lora")
    assert "LoRA (PEFT): rank 4" in out
    first, second = losses(run_dir, 0), losses(run_dir, 1)
    assert second[-1] < second[0] and first[-1] < first[0], (first, second)


@pytest.mark.slow
@pytest.mark.distributed
def test_qlora_under_fsdp2_killed_then_rerun_continues_bit_for_bit(folders, tmp_path):
    ref_dir, out = run_to_end(folders, tmp_path / "ref", "fsdp", "qlora")
    assert "QLoRA: 14 block linears stored in NF4" in out
    assert losses(ref_dir, 0)[-1] < losses(ref_dir, 0)[0]

    run_dir = tmp_path / "killed" / "run"
    path = write(config(folders, run_dir, "fsdp", "qlora", every_steps=2), run_dir.parent / "config.yaml")
    proc = train_cli(path)
    try:
        wait_for_checkpoint_and_step(proc, run_dir, 5)
        kill_launcher_and_workers(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    saved = [step for step, _ in ckpt.published_steps(run_dir)]
    assert saved and max(saved) < STEPS
    assert_the_same_command_continues(path, max(saved), run_dir, ref_dir)

    # the resumed run's adapters out: merged (transformers) and alone (PEFT) agree on the logits
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from tests.artifacts.test_export_lora import cli, logits

    for extra, out in (([], "merged"), (["--adapter"], "adapter-only")):
        done = cli("export", str(run_dir), "--out", str(tmp_path / out), *extra)
        assert done.returncode == 0, done.stderr[-2000:]
    ids = torch.arange(1, 33).view(1, 32)
    base = AutoModelForCausalLM.from_pretrained(str(folders / "pretrained"), dtype=torch.float32).eval()
    adapted = PeftModel.from_pretrained(base, str(tmp_path / "adapter-only" / "adapter")).eval()
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged" / "hf")).eval()
    torch.testing.assert_close(logits(merged, ids), logits(adapted, ids), atol=1e-4, rtol=1e-4)
