"""plan/fsdp_units.py: the one rule that groups consecutive blocks into FSDP2 units, and the planner following it."""

from __future__ import annotations

from pathlib import Path

import pytest

from flopwise.catalog.hardware import get_hardware
from flopwise.config.loading import load_config
from flopwise.config.resolve import resolve_run
from flopwise.errors import UserError
from flopwise.plan.fsdp_units import MIB, blocks_per_unit, group_blocks, parameter_bytes, planned_blocks_per_unit, unit_count
from flopwise.plan.from_config import runspec_from_config
from flopwise.plan.params import count_params
from flopwise.plan.planner import build_runspec, plan
from flopwise.plan.timing import fsdp_units

DEFAULT = Path(__file__).resolve().parents[2] / "configs" / "default.yaml"
BLOCK_MIB = 442_752 * 4 / MIB  # one block of the default decoder (hidden 192), fp32: 1.69 MiB


def _spec(*overrides: str):
    cfg = load_config(DEFAULT, list(overrides))
    return runspec_from_config(cfg, resolve_run(cfg), get_hardware("h100-sxm"))


def test_zero_is_one_unit_per_block():
    assert group_blocks([5.0, 5.0, 5.0], 0) == ((0,), (1,), (2,))
    assert group_blocks([], 10) == ()


def test_a_group_closes_when_it_reaches_the_target_and_the_last_may_be_smaller():
    assert group_blocks([4, 4, 4, 4, 4], 8) == ((0, 1), (2, 3), (4,))
    assert group_blocks([4, 4, 4, 4], 9) == ((0, 1, 2), (3,))
    assert group_blocks([10, 1, 1, 10, 1], 5) == ((0,), (1, 2, 3), (4,))  # a block over the target stays alone
    assert group_blocks([1, 1, 1], 1e9) == ((0, 1, 2),)


def test_equal_blocks_count_as_the_listed_groups():
    for block in (0.3, 1.0, 3.38):
        for target in (0.0, 0.2, 1.0, 2.0, 3.38, 6.76, 7.0, 50.0):
            for n in (1, 3, 4, 7):
                groups = group_blocks([block] * n, target)
                per_unit = blocks_per_unit(block, target, n)
                assert len(groups[0]) == per_unit, (block, target, n)
                assert unit_count(n, per_unit) == len(groups), (block, target, n)


def test_bytes_per_parameter_are_what_the_trainer_holds():
    assert parameter_bytes("fp32") == parameter_bytes("bf16") == 4.0  # FSDP2 shards fp32 parameters
    assert parameter_bytes("bf16-true") == 2.0
    assert parameter_bytes("bf16", "qlora") == 2.0 and parameter_bytes("fp32", "lora") == 4.0


def test_a_config_plans_the_units_the_trainer_builds():
    assert _spec().layout.fsdp_unit_mb == 4.0  # the trainer's default
    assert _spec("parallel.fsdp_unit_mb=0").layout.fsdp_unit_mb == 0.0
    spec = _spec("parallel.fsdp_unit_mb=4")
    assert spec.layout.fsdp_unit_mb == 4.0
    pc = count_params(spec.model)
    assert pc.per_layer * 4 / MIB == pytest.approx(BLOCK_MIB)
    assert planned_blocks_per_unit(spec.layout, spec.workload, pc.per_layer, 4) == 3
    assert planned_blocks_per_unit(_spec("parallel.fsdp_unit_mb=3").layout, spec.workload, pc.per_layer, 4) == 2
    assert planned_blocks_per_unit(_spec("parallel.fsdp_unit_mb=8").layout, spec.workload, pc.per_layer, 4) == 4
    ddp = _spec("parallel.strategy=ddp", "parallel.fsdp_unit_mb=4")
    assert ddp.layout.fsdp_unit_mb == 0.0
    deepspeed = _spec("parallel.strategy=deepspeed", "parallel.fsdp_unit_mb=4")
    assert planned_blocks_per_unit(deepspeed.layout, deepspeed.workload, pc.per_layer, 4) == 1


def test_grouped_units_are_fewer_gathers_of_larger_shares():
    spec = _spec()
    pc = count_params(spec.model)
    per_block = fsdp_units(spec.model, 4, 0, 1, 1, pc.total, 1)
    grouped = fsdp_units(spec.model, 4, 0, 1, 1, pc.total, 3)
    assert len(per_block) == 2 + 4 and len(grouped) == 2 + 2  # embedding and head, then the block units
    assert sum(grouped) == pytest.approx(1.0) and sum(per_block) == pytest.approx(1.0)
    assert grouped[2] == pytest.approx(3 * per_block[2]) and grouped[3] == pytest.approx(per_block[2])


def test_memory_holds_two_gathered_groups():
    buffers = {mb: plan(_spec(f"parallel.fsdp_unit_mb={mb}")).memory.comm_buffers for mb in (0, 3, 16)}
    pc = count_params(_spec().model)
    assert buffers[0] == pytest.approx(2 * pc.embedding * 4)  # current + prefetched unit, fp32: the embedding
    assert buffers[3] == pytest.approx(2 * 2 * pc.per_layer * 4)  # two blocks per unit now outweigh it
    assert buffers[16] == pytest.approx(2 * 4 * pc.per_layer * 4)  # the whole stack in one unit


def test_the_plan_option_sets_the_units_and_a_bad_value_is_refused():
    big = build_runspec(model="llama2-7b", gpus=8, zero=3, fsdp_unit_mb=4000)
    assert big.layout.fsdp_unit_mb == 4000
    assert plan(big).memory.comm_buffers > plan(build_runspec(model="llama2-7b", gpus=8, zero=3)).memory.comm_buffers
    with pytest.raises(UserError, match="--fsdp-unit-mb must be a finite number >= 0"):
        build_runspec(model="llama2-7b", gpus=8, zero=3, fsdp_unit_mb=-1)
