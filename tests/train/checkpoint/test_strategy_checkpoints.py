"""Every strategy checkpoints with the same guarantees: DeepSpeed ZeRO-3 (the engine's own files)
and the 1F1B pipeline (each stage through DCP), on 2 real CPU processes started by `flopwise train`.

A 2-process run is killed with SIGKILL (the launcher; its workers die with it) after it
published a checkpoint, or stopped with SIGTERM (it saves, exits 75 with one line); the
identical command then resumes, and the losses of every step on every rank equal those of
an uninterrupted run bit for bit. The uninterrupted run also shows that `checkpoint.at_end`
writes a verified, published checkpoint for these strategies.
"""

from __future__ import annotations

import json

import pytest

from flopwise.train.checkpoint import store as ckpt
from tests.torchrun_runs import (
    assert_killed_run_continues_bit_for_bit, assert_the_same_command_continues, preempt_with_sigterm, run_to_end,
)
from tests.train.checkpoint.test_policy import corpus, train_cli, wait_for_step, write  # noqa: F401

pytest.importorskip("psutil")

STEPS = 8
KILL_AFTER = 5  # steps on rank 1's metrics; checkpoints every 2 steps, so step-4 is published by then

STRATEGIES = {
    "deepspeed-zero3": {"strategy": "deepspeed", "zero_stage": 3, "zero3_persistence_threshold": 0},
    "pipeline-1f1b": {"strategy": "pipeline", "pipeline_schedule": "1f1b", "pipeline_microbatches": 2},
}


def config(corpus, run_dir, parallel: dict, **checkpoint) -> dict:  # noqa: F811
    return {
        "model": {"n_layers": 2, "hidden": 32, "n_heads": 2, "max_seq_len": 64},
        "data": {"paths": [str(corpus / "text")], "cache_dir": str(corpus / "cache"), "vocab_size": 320,
                 "seq_len": 32, "prefetch": 2, "tokenizer_train_bytes": 200000},
        "parallel": {"nproc_per_node": 2, **parallel},
        "training": {"max_steps": STEPS, "micro_batch_size": 4, "global_batch_size": 8, "warmup_steps": 2,
                     "lr": 1e-2, "eval_every": STEPS, "eval_batches": 2},
        "checkpoint": {"keep_last": 20, **checkpoint},
        "logging": {"run_dir": str(run_dir), "progress": False},
    }


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):  # noqa: F811
    """The uninterrupted 2-process run of a strategy (computed once per strategy, on first use)."""
    done: dict = {}

    def run(name: str):
        if name not in done:
            ref_dir = tmp_path_factory.mktemp(f"ref-{name}") / "run"
            run_to_end(write(config(corpus, ref_dir, STRATEGIES[name]), ref_dir.parent / "config.yaml"))
            done[name] = ref_dir
        return done[name]

    return run


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("name", list(STRATEGIES))
def test_at_end_publishes_a_verified_checkpoint(reference, name):
    ref_dir = reference(name)
    # checkpoint.at_end (the default) writes a published, verified checkpoint for this strategy too
    assert [step for step, _ in ckpt.published_steps(ref_dir)] == [STEPS]
    final = ref_dir / "checkpoints" / f"step-{STEPS}"
    assert ckpt.verify_checkpoint(final) is None
    assert (ref_dir / "checkpoints" / "latest").read_text().strip() == final.name
    manifest = json.loads((final / "manifest.json").read_text())
    assert manifest["strategy"] == STRATEGIES[name]["strategy"] and manifest["world_size"] == 2
    assert all(len(entry.get("blake3") or entry["sha256"]) == 64 for entry in manifest["files"].values())
    assert not list((ref_dir / "checkpoints").glob(".tmp-step-*"))


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("name", list(STRATEGIES))
def test_kill_9_then_rerun_continues_bit_for_bit(corpus, tmp_path, reference, name):  # noqa: F811
    ref_dir = reference(name)
    run_dir = tmp_path / "run"
    path = write(config(corpus, run_dir, STRATEGIES[name], every_steps=2), tmp_path / "killed" / "config.yaml")
    assert_killed_run_continues_bit_for_bit(path, run_dir, ref_dir, STEPS, KILL_AFTER)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("name", list(STRATEGIES))
def test_sigterm_saves_exits_75_and_the_next_command_continues_bit_for_bit(corpus, tmp_path, reference,
                                                                          name):  # noqa: F811
    ref_dir = reference(name)
    run_dir = tmp_path / "run"
    path = write(config(corpus, run_dir, STRATEGIES[name], every_steps=100, grace_seconds=60),
                 tmp_path / "config.yaml")
    proc = train_cli(path)
    preempt_with_sigterm(proc, lambda: wait_for_step(proc, run_dir / "metrics.rank1.jsonl", 3))
    saved = ckpt.published_steps(run_dir)
    assert saved and ckpt.verify_checkpoint(saved[-1][1]) is None
    assert_the_same_command_continues(path, saved[-1][0], run_dir, ref_dir)
