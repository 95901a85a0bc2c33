"""DeepSpeed ZeRO (`parallel.strategy: deepspeed`): the generated config, and real torchrun runs
(gloo, 2 CPU processes, `DS_ACCELERATOR=cpu`).

Stated tolerance: with the same global batch and seed, the per-step loss (mean over ranks)
of ZeRO-3 on 2 processes matches a 1-process run within 1e-4 relative over 6 AdamW steps
in fp32, and the gradient norm within 1e-3 (the reduce-scatter sums in another order).
"""

from __future__ import annotations

import pytest
import torch

from flopwise.errors import UserError
from flopwise.config.loading import load_config
from flopwise.config.precision import precision_of
from flopwise.train.parallel.parallelize import check_strategy
from flopwise.train.parallel.strategy_deepspeed import deepspeed_config
from tests.train.parallel.test_distributed import (  # noqa: F401  (fixtures)
    STEPS,
    TOLERANCE,
    base_config,
    corpus,
    metrics,
    run_cli,
    single_process_reference,
)


def test_config_carries_zero_offload_precision_accumulation_and_clipping():
    cfg = load_config(None, ["parallel.strategy=deepspeed", "parallel.zero_stage=3", "parallel.offload=params",
                             "precision.mode=fp16", "training.micro_batch_size=4", "training.grad_clip=0.5"])
    ds = deepspeed_config(cfg, precision_of("fp16"), grad_accum=3, device_type="cuda")
    assert ds["train_micro_batch_size_per_gpu"] == 4 and ds["gradient_accumulation_steps"] == 3
    assert ds["gradient_clipping"] == 0.5
    assert ds["zero_optimization"]["stage"] == 3
    assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert ds["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert ds["fp16"] == {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 2000}
    assert "bf16" not in ds and ds["zero_force_ds_cpu_optimizer"] is False

    plain = deepspeed_config(load_config(None, ["parallel.zero_stage=1", "precision.mode=bf16",
                                                "training.grad_clip=null"]), precision_of("bf16"), 1, "cpu")
    assert plain["zero_optimization"] == {"stage": 1} and plain["bf16"] == {"enabled": True}
    assert plain["gradient_clipping"] == 0.0 and "fp16" not in plain


@pytest.mark.parametrize("overrides, message", [
    (["parallel.zero_stage=2", "parallel.offload=params"], "params offloads ZeRO-3 parameter shards"),
    (["parallel.zero_stage=0", "parallel.offload=optimizer"], "optimizer offload needs parallel.zero_stage >= 1"),
])
def test_offload_without_the_zero_stage_it_needs_is_refused(overrides, message):
    cfg = load_config(None, ["parallel.strategy=deepspeed", *overrides])
    with pytest.raises(UserError, match=message):
        check_strategy(cfg.parallel)


def assert_mean_loss_matches(reference: list[dict], run_dir) -> None:
    ranks = [metrics(run_dir, 0), metrics(run_dir, 1)]
    assert [r["step"] for r in ranks[0]] == list(range(1, STEPS + 1))
    for step in range(STEPS):
        mean_loss = (ranks[0][step]["loss"] + ranks[1][step]["loss"]) / 2
        assert mean_loss == pytest.approx(reference[step]["loss"], rel=TOLERANCE), f"step {step + 1}"
        assert ranks[0][step]["grad_norm"] == pytest.approx(reference[step]["grad_norm"], rel=1e-3)
        assert ranks[0][step]["lr"] == pytest.approx(reference[step]["lr"], rel=1e-9)  # the same schedule


@pytest.mark.distributed
def test_zero3_on_two_processes_matches_one_process_and_partitions_parameters(corpus, tmp_path,
                                                                            single_process_reference):
    run_dir = tmp_path / "zero3"
    config = base_config(corpus, run_dir, 4, strategy="deepspeed", nproc_per_node=2, zero_stage=3,
                         zero3_persistence_threshold=0)
    result = run_cli(config, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "DeepSpeed ZeRO-3" in result.stdout and "predicted vs measured" in result.stdout
    assert_mean_loss_matches(single_process_reference, run_dir)

    assert_export_matches_single_process(run_dir, tmp_path)

    full = single_process_reference[-1]
    for rank in (0, 1):
        last = metrics(run_dir, rank)[-1]
        # each rank holds its partition (DeepSpeed pads each parameter to a multiple of the ranks)
        assert last["memory_parameters_bytes"] == pytest.approx(full["memory_parameters_bytes"] / 2, rel=0.02)
        assert last["memory_gradients_bytes"] == pytest.approx(full["memory_gradients_bytes"] / 2, rel=0.02)
        # Adam's two moments for the partition, plus DeepSpeed's fp32 master copy of it
        assert last["memory_optimizer_bytes"] == pytest.approx(1.5 * full["memory_optimizer_bytes"] / 2, rel=0.02)
        assert last["sync_wait_seconds"] >= 0


@pytest.mark.slow
@pytest.mark.distributed
def test_zero2_with_optimizer_offload_and_accumulation_matches_one_process(corpus, tmp_path,
                                                                          single_process_reference):
    """2 ranks x 2 micro-steps x 2 sequences; DeepSpeed reduces on the accumulation boundary."""
    run_dir = tmp_path / "zero2"
    config = base_config(corpus, run_dir, 2, strategy="deepspeed", nproc_per_node=2, zero_stage=2,
                         offload="optimizer")
    config["training"]["global_batch_size"] = 8
    result = run_cli(config, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_mean_loss_matches(single_process_reference, run_dir)
    full = single_process_reference[-1]
    last = metrics(run_dir, 1)[-1]
    assert last["memory_parameters_bytes"] == full["memory_parameters_bytes"]  # stage 2 keeps whole parameters
    assert last["memory_gradients_bytes"] == pytest.approx(full["memory_gradients_bytes"] / 2, rel=0.05)


@pytest.mark.slow
@pytest.mark.distributed
def test_zero3_in_bf16_trains(corpus, tmp_path):
    run_dir = tmp_path / "bf16"
    config = base_config(corpus, run_dir, 4, strategy="deepspeed", nproc_per_node=2, zero_stage=3)
    config["precision"] = {"mode": "bf16"}
    result = run_cli(config, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    losses = [r["loss"] for r in metrics(run_dir, 0)]
    assert losses[-1] < losses[0]


def assert_export_matches_single_process(run_dir, tmp_path) -> None:
    """`flopwise export` merges the ZeRO-3 partitions into the weights a 1-process run reaches.

    Same seed, same global batch: after 6 AdamW steps the merged fp32 weights equal the
    single-process run's within the summation-order tolerance stated above.
    """
    from safetensors.torch import load_file

    from flopwise.artifacts.export import export_checkpoint

    single_run = next(tmp_path.parent.glob("single*/run"))  # the module fixture's run directory
    merged = load_file(export_checkpoint(run_dir, out=tmp_path / "export-zero3").out / "model.safetensors")
    plain = load_file(export_checkpoint(single_run, out=tmp_path / "export-single").out / "model.safetensors")
    assert merged.keys() == plain.keys()
    for name, tensor in plain.items():
        assert torch.allclose(merged[name], tensor, rtol=1e-3, atol=1e-4), name
    assert (tmp_path / "export-zero3" / "hf" / "config.json").is_file()
