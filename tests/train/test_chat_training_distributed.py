"""Chat data (`data.mix`) on 2 real CPU processes started by `flopwise train`: two ranks under FSDP2
with 2 micro-steps each give the losses of one process taking the whole batch at once (the loss is
token-weighted over the step and the ranks), LoRA under DDP on packed, answer-only rows lowers the loss, and a run killed with SIGKILL after a published checkpoint
continues, when the identical command is rerun, with every rank's losses equal to an uninterrupted
run's bit for bit (the chat loader's position is part of the checkpoint)."""

from __future__ import annotations

import pytest

from tests.hf_fixtures import pretrained_root
from tests.torchrun_runs import assert_killed_run_continues_bit_for_bit, rank_mean_losses, run_to_end
from tests.train.checkpoint.test_policy import losses, write
from tests.train.test_chat_training import conversations, write_chat

pytest.importorskip("peft")
pytest.importorskip("psutil")

STEPS = 8


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = pretrained_root(tmp_path_factory, "chat-dist")
    write_chat(root / "alpha.jsonl", conversations("alpha", 60, seed=1))
    write_chat(root / "beta.jsonl", conversations("beta", 30, seed=2))
    return root


def config(folders, run_dir, **checkpoint) -> dict:
    return {
        "model": {"kind": "hf", "pretrained": str(folders / "pretrained")},
        "data": {"mix": [{"path": str(folders / "alpha.jsonl"), "weight": 2},
                         {"path": str(folders / "beta.jsonl"), "weight": 1}],
                 "seq_len": 128, "val_fraction": 0.1},
        "parallel": {"nproc_per_node": 2, "strategy": "ddp"},
        "precision": {"mode": "fp32"},
        "finetune": {"method": "lora", "rank": 4, "alpha": 8},
        "training": {"max_steps": STEPS, "micro_batch_size": 2, "global_batch_size": 8, "warmup_steps": 1,
                     "lr": 2e-2, "min_lr": 2e-3, "eval_every": STEPS, "eval_batches": 1},
        "checkpoint": {"keep_last": 20, **checkpoint},
        "logging": {"run_dir": str(run_dir), "progress": False},
    }


@pytest.mark.slow
@pytest.mark.distributed
def test_lora_on_chat_rows_under_ddp_learns_and_resumes_bit_for_bit(folders, tmp_path):
    ref_dir = tmp_path / "ref" / "run"
    out = run_to_end(write(config(folders, ref_dir), ref_dir.parent / "config.yaml"))
    assert "LoRA (PEFT): rank 4" in out
    assert "data: chat mix of 2 file(s)" in out and "(loss_on assistant)" in out
    # each rank logs its share (summed token losses x W / the step's tokens); their mean is the step's loss
    steps = rank_mean_losses(ref_dir)
    assert len(steps) == STEPS and max(steps[-2:]) < min(steps[:2]), steps

    run_dir = tmp_path / "killed" / "run"
    path = write(config(folders, run_dir, every_steps=2), run_dir.parent / "config.yaml")
    assert_killed_run_continues_bit_for_bit(path, run_dir, ref_dir, STEPS, kill_after=5)


@pytest.mark.slow
@pytest.mark.distributed
def test_two_fsdp_ranks_with_accumulation_equal_one_process_with_the_whole_batch(folders, tmp_path):
    def run(name: str, nproc: int, strategy: str, micro: int) -> list[list[float]]:
        cfg = config(folders, tmp_path / name / "run")
        cfg["parallel"] = {"nproc_per_node": nproc, "strategy": strategy, "fsdp_min_params": 0}
        cfg["finetune"]["dropout"] = 0.0  # no per-rank randomness
        cfg["training"].update(max_steps=4, micro_batch_size=micro, optimizer="sgd", lr=0.5, min_lr=0.5,
                               warmup_steps=0, grad_clip=None)
        run_to_end(write(cfg, tmp_path / name / "config.yaml"))
        return [losses(tmp_path / name / "run", rank) for rank in range(nproc)]

    (whole,) = run("one", 1, "single", 8)
    first, second = run("two", 2, "fsdp", 2)  # 2 ranks x 2 micro-steps x 2 rows
    shared = [(a + b) / 2 for a, b in zip(first, second)]
    assert shared == pytest.approx(whole, rel=1e-4, abs=1e-6), (shared, whole)
    assert whole[-1] < whole[0]  # the steps moved the weights, so later losses compare the gradients
