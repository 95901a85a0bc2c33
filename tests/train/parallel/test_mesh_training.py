"""`flopwise train` over 2-D meshes on 4 gloo processes: TP 2 x FSDP 2, HSDP 2 x 2, PP 2 x FSDP 2, PP 2 x TP 2.

Stated tolerance (as in test_distributed.py): with the same seed and global batch (8
sequences), the mean of the ranks' losses matches a one-process run within 1e-4
relative for 10 AdamW steps in fp32 with dropout 0; the differences are float summation
order (tensor-parallel partial sums, sharded reductions). A run resumed from its own
step-5 checkpoint repeats steps 6-10 bit for bit; a TP 2 x FSDP 2 checkpoint resumed
on FSDP 4 (DCP reshards the DTensors), and a PP 2 x FSDP 2 one on a 2-process pipeline,
continue within the same tolerance.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from flopwise.errors import UserError
from flopwise.config.loading import load_config
from flopwise.train.parallel.distributed import init_distributed
from flopwise.train.loop import run_training
from flopwise.train.parallel.parallelize import check_strategy
from tests.train.parallel.test_distributed import corpus, run_cli  # noqa: F401  (corpus is a fixture)

STEPS = 10
TOLERANCE = 1e-4


def mesh_config(corpus: Path, run_dir: Path, micro_batch: int, **parallel) -> dict:
    """Tiny llama: 2 heads and an even vocabulary, so tp 2 splits heads, MLP and vocabulary exactly."""
    return {
        "model": {"n_layers": 2, "hidden": 32, "n_heads": 2, "max_seq_len": 64, "dropout": 0.0},
        "data": {"paths": [str(corpus / "text")], "cache_dir": str(corpus / "cache"), "vocab_size": 320,
                 "seq_len": 32, "prefetch": 2, "tokenizer_train_bytes": 200000},
        "parallel": parallel,
        "training": {"max_steps": STEPS, "micro_batch_size": micro_batch, "warmup_steps": 2, "lr": 1e-2,
                     "eval_every": STEPS, "eval_batches": 2},
        "checkpoint": {"every_steps": 5, "keep_last": 2},
        "logging": {"run_dir": str(run_dir), "progress": False},
    }


def metrics(run_dir: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (run_dir / f"metrics.rank{rank}.jsonl").read_text().splitlines()]


def mean_losses(run_dir: Path, ranks: int = 4) -> dict[int, float]:
    per_rank = [metrics(run_dir, rank) for rank in range(ranks)]
    return {rec["step"]: sum(r[i]["loss"] for r in per_rank) / ranks for i, rec in enumerate(per_rank[0])}


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    """One process, micro-batch 8: the global batch of every 4-process layout below."""
    run_dir = tmp_path_factory.mktemp("single") / "run"
    config = mesh_config(corpus, run_dir, 8, strategy="single", nproc_per_node=1)
    path = run_dir.parent / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    cfg = load_config(path)
    run_training(cfg, init_distributed(cfg.parallel))
    return {rec["step"]: rec["loss"] for rec in metrics(run_dir, 0)}


def train(config: dict, tmp_path: Path, *overrides: str) -> Path:
    result = run_cli(config, tmp_path, *overrides)
    assert result.returncode == 0, result.stderr[-3000:]
    return Path(config["logging"]["run_dir"])


def assert_matches(reference: dict[int, float], losses: dict[int, float], steps) -> None:
    for step in steps:
        assert losses[step] == pytest.approx(reference[step], rel=TOLERANCE), f"step {step}"


def assert_planner_holds(run_dir: Path) -> None:
    """The planner's per-rank memory and bytes sent per step for this very run, against the exact CPU counts."""
    ratios = json.loads((run_dir / "predicted_vs_measured.json").read_text())["measured_over_predicted"]
    for part in ("weights", "gradients", "optimizer", "activations", "total"):
        assert 0.9 <= ratios[f"memory_{part}"] <= 1.1, (part, ratios)
    comm = {key: value for key, value in ratios.items() if key.startswith("comm_") and value is not None}
    assert comm, ratios  # a multi-process run meters one step's collectives
    for key, value in comm.items():
        assert 0.9 <= value <= 1.1, (key, ratios)


def assert_resumes_exactly(config: dict, saved: Path, tmp_path: Path) -> None:
    """A fresh run directory resumed from `saved`'s step 5 repeats its steps 6-10 bit for bit."""
    resumed_dir = tmp_path / "resumed"
    config = dict(config, logging={"run_dir": str(resumed_dir), "progress": False})
    train(config, tmp_path, f"checkpoint.resume_from={saved / 'checkpoints' / 'step-5'}")
    for rank in range(4):
        first = {r["step"]: r["loss"] for r in metrics(saved, rank)}
        again = {r["step"]: r["loss"] for r in metrics(resumed_dir, rank)}
        assert sorted(again) == list(range(6, STEPS + 1))
        assert all(again[step] == first[step] for step in again), f"rank {rank}"


@pytest.mark.slow
@pytest.mark.distributed
def test_tp2_x_fsdp2_matches_one_process_resumes_exactly_and_onto_fsdp4(corpus, tmp_path, reference):
    config = mesh_config(corpus, tmp_path / "tp", 4, strategy="fsdp", nproc_per_node=4, tp=2,
                         sequence_parallel=True)
    run_dir = train(config, tmp_path)
    assert_matches(reference, mean_losses(run_dir), range(1, STEPS + 1))
    ranks = [metrics(run_dir, rank)[-1] for rank in range(4)]
    assert len({r["loss"] for r in ranks[:2]}) == 1  # tp peers see the same batch and loss
    assert_planner_holds(run_dir)
    assert_resumes_exactly(config, run_dir, tmp_path)

    fsdp4 = mesh_config(corpus, tmp_path / "fsdp4", 2, strategy="fsdp", nproc_per_node=4)
    other = train(fsdp4, tmp_path, f"checkpoint.resume_from={run_dir / 'checkpoints' / 'step-5'}")
    assert_matches(reference, mean_losses(other), range(6, STEPS + 1))


@pytest.mark.slow
@pytest.mark.distributed
def test_hsdp_2x2_matches_one_process_and_resumes_exactly(corpus, tmp_path, reference):
    config = mesh_config(corpus, tmp_path / "hsdp", 2, strategy="fsdp", nproc_per_node=4, dp_replicate=2)
    run_dir = train(config, tmp_path)
    assert_matches(reference, mean_losses(run_dir), range(1, STEPS + 1))
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["inputs"]["layout"]["dp"] == 4
    assert_planner_holds(run_dir)
    assert_resumes_exactly(config, run_dir, tmp_path)


@pytest.mark.parametrize("overrides, message", [
    (["parallel.strategy=fsdp", "parallel.tp=3", "parallel.nproc_per_node=4"], "parallel.pp x parallel.dp_replicate x parallel.tp = 3 must divide"),
    (["parallel.strategy=ddp", "parallel.tp=2"], "parallel.tp=2 composes with FSDP2 only"),
    (["parallel.strategy=fsdp", "parallel.dp_shard=4", "parallel.tp=2", "parallel.nproc_per_node=4"], "= 8, but there are 4 processes"),
    (["parallel.strategy=fsdp", "parallel.sequence_parallel=true"], "parallel.sequence_parallel=true needs parallel.tp > 1"),
    (["parallel.strategy=fsdp", "parallel.pp=2"], "parallel.pp=2 needs parallel.strategy=pipeline"),
    (["parallel.strategy=ddp", "parallel.offload=optimizer"], "parallel.offload: optimizer needs parallel.strategy fsdp"),
])
def test_a_mesh_that_does_not_fit_is_one_line_naming_the_keys(overrides, message):
    """The checks of a named strategy (an unset one is chosen to fit the mesh: test_strategy_choice)."""
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_strategy(load_config(None, overrides).parallel)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("layout, micro_batch", [({"pp": 2}, 1), ({"tp": 2}, 2)], ids=["pp2-fsdp2", "pp2-tp2"])
def test_pipeline_composed_with_fsdp2_or_tp_matches_one_process_and_resumes_exactly(corpus, tmp_path, reference,
                                                                                    layout, micro_batch):
    """2 stages x (2 FSDP2 shards or 2 tensor-parallel ranks), 4 micro-batches per pass, 8 sequences per step;
    resumed from step 5 on the same mesh bit for bit, and PP 2 x FSDP 2 onto a 2-process pipeline (DCP
    reshards each stage's FSDP2 shards into whole tensors) within the stated tolerance."""
    config = mesh_config(corpus, tmp_path / "pp", micro_batch, strategy="pipeline", nproc_per_node=4,
                         pipeline_microbatches=4, **layout)
    result = run_cli(config, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    shape = "pp 2 x dp_shard 2" if "pp" in layout else "pp 2 x tp 2"
    assert f"(mesh {shape})" in result.stdout
    run_dir = tmp_path / "pp"
    assert_matches(reference, mean_losses(run_dir), range(1, STEPS + 1))
    assert_planner_holds(run_dir)
    assert_resumes_exactly(config, run_dir, tmp_path)
    if "pp" in layout:
        two = mesh_config(corpus, tmp_path / "pp2", 2, strategy="pipeline", nproc_per_node=2, pipeline_microbatches=4)
        other = train(two, tmp_path, f"checkpoint.resume_from={run_dir / 'checkpoints' / 'step-5'}")
        assert_matches(reference, mean_losses(other, ranks=2), range(6, STEPS + 1))
