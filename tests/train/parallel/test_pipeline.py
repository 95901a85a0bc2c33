"""Pipeline parallelism (`parallel.strategy: pipeline`) on real torchrun runs (gloo, 2 CPU processes).

Stated tolerance: with the same global batch and seed, the per-step loss and gradient norm
of a 2-stage pipeline (2 sequences x 4 micro-batches per step) match a 1-process run
(one batch of 8) within 1e-4 relative over 6 AdamW steps in fp32. The stages run the same
arithmetic on the same samples; only the micro-batch split changes the summation order.
"""

from __future__ import annotations

import json

import pytest

from flopwise.errors import UserError
from flopwise.train.parallel.parallelize import stage_layer_ranges
from tests.train.parallel.test_distributed import (  # noqa: F401  (fixtures)
    STEPS,
    TOLERANCE,
    base_config,
    corpus,
    metrics,
    run_cli,
    single_process_reference,
)


def test_blocks_split_into_consecutive_even_stages():
    assert stage_layer_ranges(4, 2) == [(0, 2), (2, 4)]
    assert stage_layer_ranges(5, 3) == [(0, 1), (1, 3), (3, 5)]  # the planner's rule: middle stages first
    assert stage_layer_ranges(6, 2, virtual=2) == [(0, 1), (1, 3), (3, 5), (5, 6)]
    assert stage_layer_ranges(3, 1) == [(0, 3)]
    with pytest.raises(UserError, match="model.n_layers=2 is fewer than the 3 stages"):
        stage_layer_ranges(2, 3)


def assert_matches_reference(reference: list[dict], run_dir) -> None:
    for rank in (0, 1):
        steps = metrics(run_dir, rank)
        assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
        for got, want in zip(steps, reference):
            # the loss lives on the last stage and is broadcast, so both ranks log the same value
            assert got["loss"] == pytest.approx(want["loss"], rel=TOLERANCE), f"rank {rank} step {got['step']}"
            assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-3)


@pytest.mark.distributed
def test_1f1b_on_two_stages_matches_one_process(corpus, tmp_path, single_process_reference):
    run_dir = tmp_path / "pipe"
    config = base_config(corpus, run_dir, 2, strategy="pipeline", nproc_per_node=2, pipeline_microbatches=4)
    result = run_cli(config, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "pipeline 1f1b: rank 0 of 2: stage 0 holds blocks 0..0 + embedding" in result.stdout
    assert_matches_reference(single_process_reference, run_dir)
    # each stage holds its own part of the model: together exactly the whole
    full = single_process_reference[-1]["memory_parameters_bytes"]
    per_stage = [metrics(run_dir, rank)[-1]["memory_parameters_bytes"] for rank in (0, 1)]
    assert sum(per_stage) == full and all(0.3 * full < b < 0.7 * full for b in per_stage)
    # the peak of saved activations in flight under 1F1B, not the sum over the pass's micro-batches
    comparison = json.loads((run_dir / "predicted_vs_measured.json").read_text())
    assert comparison["measured_over_predicted"]["memory_activations"] == pytest.approx(1.0, abs=0.10)
    # the idle share of a pass, measured per rank, beside the planner's bubble (2 stages, 4 micro-batches)
    assert 0.0 < comparison["measured"]["bubble_fraction"] < 1.0
    # (p-1)/m = 0.25 of the compute for balanced stages; the planner's stages carry the
    # embedding and the head, so its figure sits a little off 0.2 = (p-1)/(m+p-1) of the step
    assert 0.0 < comparison["predicted"]["bubble_fraction"] <= 0.25
    # one step's sends, counted from the collectives the run issued: each stage sends one activation
    # (forward) or one gradient (backward) of 2 sequences x 32 tokens x hidden 32 in fp32 per micro-batch
    assert comparison["measured"]["comm_bytes_by_kind"]["pp"]["send"] == 4 * 2 * 32 * 32 * 4
    # the planner's figure is the device that sends most, as the trainer reports it (+ a few bytes: the
    # norm, the logged loss): with 2 stages each sends one way, 2v - 1 = 1 message per micro-batch
    assert comparison["measured_over_predicted"]["comm_pp"] == pytest.approx(1.0, rel=1e-3)


@pytest.mark.slow
@pytest.mark.distributed
def test_gpipe_with_accumulation_matches_one_process(corpus, tmp_path, single_process_reference):
    """2 passes of 2 micro-batches of 2 sequences = the reference's batch of 8."""
    run_dir = tmp_path / "gpipe"
    config = base_config(corpus, run_dir, 2, strategy="pipeline", nproc_per_node=2, pipeline_microbatches=2,
                         pipeline_schedule="gpipe")
    config["training"]["global_batch_size"] = 8
    result = run_cli(config, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_matches_reference(single_process_reference, run_dir)


@pytest.mark.distributed
def test_more_stages_than_layers_is_one_line_and_exit_2(corpus, tmp_path):
    config = base_config(corpus, tmp_path / "bad", 2, strategy="pipeline", nproc_per_node=2)
    config["model"]["n_layers"] = 1
    result = run_cli(config, tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: parallel.strategy: pipeline"), result.stderr
    assert "model.n_layers=1 is fewer than the 2 stages" in lines[0]


def test_global_batch_must_be_whole_pipeline_passes():
    from flopwise.config.loading import load_config
    from flopwise.config.resolve import batch_layout

    cfg = load_config(None, ["training.micro_batch_size=2", "training.global_batch_size=12"]).training
    assert batch_layout(cfg, 1, 3) == (12, 2)
    with pytest.raises(UserError, match="micro_batch_size x parallel.pipeline_microbatches = 2 x 4"):
        batch_layout(cfg, 1, 4)


@pytest.mark.slow
@pytest.mark.distributed
def test_fp16_loss_scaling_is_the_same_on_every_stage(corpus, tmp_path):
    """The scaled loss lives on the last stage; every stage unscales and clips with the same scale and norm."""
    run_dir = tmp_path / "fp16"
    config = base_config(corpus, run_dir, 2, strategy="pipeline", nproc_per_node=2)
    config["precision"] = {"mode": "fp16"}
    result = run_cli(config, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    first, last = metrics(run_dir, 0), metrics(run_dir, 1)
    assert [r["loss_scale"] for r in first] == [r["loss_scale"] for r in last] == [2.0**16] * STEPS
    assert [r["grad_norm"] for r in first] == [r["grad_norm"] for r in last]
    assert first[-1]["loss"] < first[0]["loss"]


@pytest.fixture(scope="module")
def four_layer_reference(corpus, tmp_path_factory):
    """One process, 4 blocks, one batch of 8: the reference for 2 processes x 2 stages each."""
    import yaml

    from flopwise.config.loading import load_config
    from flopwise.train.parallel.distributed import init_distributed
    from flopwise.train.loop import run_training

    run_dir = tmp_path_factory.mktemp("single4") / "run"
    config = base_config(corpus, run_dir, 8, strategy="single", nproc_per_node=1)
    config["model"]["n_layers"] = 4
    path = run_dir.parent / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    cfg = load_config(path)
    run_training(cfg, init_distributed(cfg.parallel))
    return metrics(run_dir, 0)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("schedule", ["interleaved-1f1b", "looped-bfs", "interleaved-zero-bubble"])
def test_two_stages_per_process_match_one_process(corpus, tmp_path, four_layer_reference, schedule):
    run_dir = tmp_path / schedule
    config = base_config(corpus, run_dir, 2, strategy="pipeline", nproc_per_node=2, pipeline_microbatches=4,
                         pipeline_schedule=schedule, pipeline_virtual_stages=2)
    config["model"]["n_layers"] = 4
    result = run_cli(config, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"pipeline {schedule}: rank 0 of 2: stage 0 holds blocks 0..0 + embedding; stage 2 holds blocks 2..2" \
        in result.stdout
    assert_matches_reference(four_layer_reference, run_dir)


def test_virtual_stages_need_a_multi_stage_schedule():
    from flopwise.config.loading import load_config
    from flopwise.train.parallel.parallelize import check_strategy

    cfg = load_config(None, ["parallel.strategy=pipeline", "parallel.pipeline_virtual_stages=2"])
    with pytest.raises(UserError, match="parallel.pipeline_virtual_stages=2 needs a schedule with several"):
        check_strategy(cfg.parallel)
