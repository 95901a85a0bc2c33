"""The per-node forecast written into job files: the trainer's own plan of the config, on the job's GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest

from flopwise.catalog.hardware import get_hardware
from flopwise.errors import UserError
from flopwise.config.loading import load_config
from flopwise.train.launch.forecast import forecast_lines, forecast_node

MULTI_NODE = Path(__file__).resolve().parents[3] / "configs" / "multi_node.yaml"


def test_the_forecast_plans_the_configs_global_batch_on_every_gpu_of_every_node():
    cfg = load_config(MULTI_NODE)  # 2 nodes x 8 GPUs, global batch 512 sequences of 2048 tokens
    two = forecast_node(cfg, "h100-sxm")
    assert two.tokens_per_second * two.step_seconds == pytest.approx(512 * 2048)
    assert two.tokens_per_second_per_node * 2 == pytest.approx(two.tokens_per_second)
    assert two.watts_per_node == 8 * get_hardware("h100-sxm").tdp_w
    assert two.fits and 0 < two.memory_gib < two.usable_gib
    four = forecast_node(load_config(MULTI_NODE, ["parallel.nnodes=4"]), "h100-sxm")
    assert four.optimizer_gib == pytest.approx(two.optimizer_gib / 2)  # FSDP shards the states over 32 GPUs
    assert four.step_seconds < two.step_seconds


def test_the_forecast_lines_name_their_sources():
    lines = forecast_lines(forecast_node(load_config(MULTI_NODE), "a100-80gb"))
    assert lines[0].startswith("Planner forecast (`flopwise plan`, docs/planner.md) for 2 node(s) x 8 NVIDIA A100")
    assert any("efficiency: " in line for line in lines) and any("TDP from `flopwise hardware a100-80gb`" in line
                                                                  for line in lines)


def test_a_batch_that_does_not_split_over_the_gpus_is_one_clear_error():
    with pytest.raises(UserError, match="training.global_batch_size: 512 is not a multiple"):
        forecast_node(load_config(MULTI_NODE, ["parallel.nproc_per_node=3"]), "h100-sxm")


def test_a_one_node_job_with_the_strategy_unset_is_forecast_as_the_job_will_choose_it():
    def one_node(strategy):
        overrides = ["parallel.nnodes=1", "precision.mode=bf16", f"parallel.strategy={strategy}"]
        return forecast_node(load_config(MULTI_NODE, overrides), "h100-sxm")

    unset, ddp, fsdp = one_node("null"), one_node("ddp"), one_node("fsdp")
    assert ddp.optimizer_gib > fsdp.optimizer_gib  # the two strategies plan differently, so the check can fail
    assert unset.optimizer_gib == pytest.approx(ddp.optimizer_gib)  # a replica fits on an H100: the job picks DDP
