"""Error bands (plan/band.py) on real plans."""

from __future__ import annotations

import dataclasses
import math

import pytest

from flopwise.plan import band
from flopwise.plan.planner import build_runspec, plan


def test_the_default_plan_carries_a_validated_band_in_its_json():
    p = plan(build_runspec())
    assert p.band is not None and not p.band.extrapolates
    assert 0.0 < p.band.expected_error < 0.5
    assert p.to_dict()["band"]["regime"] == p.band.regime == "pytorch|16-bit|<=64"


def test_a_device_family_never_validated_is_flagged_as_extrapolating():
    p = plan(build_runspec(model="llama2-7b", hardware="mi300x", gpus=8))
    assert p.band.extrapolates
    assert any("cdna3" in reason for reason in p.band.reasons)
    assert "extrapolates" in p.band.describe()


@pytest.mark.parametrize("hardware", ["b200", "gb200"])
def test_a_blackwell_plan_says_it_extrapolates(hardware):
    """No Blackwell run was validated: the band names the family and takes the extrapolation floor."""
    p = plan(build_runspec(model="llama3-8b", hardware=hardware, gpus=8, tp=2))
    assert p.band.extrapolates
    assert "device family blackwell never validated" in p.band.reasons
    assert p.band.expected_error >= band.load_bands()[band.EXTRAPOLATED_KEY]["expected_error"]


@pytest.mark.parametrize(("hardware", "family"), [("h800", "hopper"), ("h20", "hopper"), ("a800", "ampere")])
def test_cut_down_hopper_and_ampere_parts_take_their_familys_band(hardware, family):
    """H800, H20 and A800 share their family's chip: a validated family, so no extrapolation from it."""
    spec = build_runspec(model="llama3-8b", hardware=hardware, gpus=8, tp=2)
    reference = "h100-sxm" if family == "hopper" else "a100-80gb"
    p, same = plan(spec), plan(dataclasses.replace(spec, cluster=dataclasses.replace(
        spec.cluster, hardware=build_runspec(hardware=reference).cluster.hardware)))
    assert not p.band.extrapolates and p.band == same.band


def test_a_scale_beyond_the_validated_runs_extrapolates():
    largest = band.load_bands()["validated"]["max_devices"]
    b = band.band_for("megatron-core", 1, "bf16", 2 * largest, "hopper")
    assert b.extrapolates and any("beyond" in reason for reason in b.reasons)


def test_the_stack_picks_the_regime():
    spec = build_runspec(model="llama2-70b", hardware="h100-sxm", gpus=2048, tp=8, global_batch=1024, seq_len=4096)
    megatron = plan(dataclasses.replace(spec, stack="megatron-core")).band
    assert megatron.regime.startswith("megatron|16-bit|")
    assert plan(spec).band.regime.startswith("pytorch|")


def test_the_band_is_the_regime_quantile_and_never_below_the_floor():
    assert band.band_quantile([0.0, 0.0, 0.0]) == band.MIN_BAND
    errors = [0.01 * i for i in range(1, 21)]  # 1 % .. 20 %
    assert band.band_quantile(errors) == 0.17  # 17 of 20 rows = 85 %
    built = band.build_bands([{"family": "megatron", "precision": "16-bit", "scale": ">1024", "error": e,
                               "device_family": "hopper", "devices": 2048} for e in errors])
    b = band.band_for("megatron-core", 1, "bf16", 2048, "hopper", built)
    assert b.expected_error == 0.17 and not b.extrapolates
    empty = band.band_for("megatron-core", 1, "bf16", 2048, "hopper", {"regimes": {}, "validated": {}})
    assert empty.extrapolates and math.isnan(empty.expected_error)


def test_a_model_smaller_than_any_validated_run_extrapolates():
    """The smallest validated model (MPT-1b, 1.31B active) bounds where per-step overheads were
    measured harmless: a 124M plan says its band extrapolates and why; a 7B one does not."""
    from flopwise.plan import band as band_mod
    from flopwise.plan.planner import build_runspec, plan

    smallest = band_mod.load_bands()["validated"]["min_active_params"]
    assert 1.2e9 < smallest < 1.4e9
    small = plan(build_runspec(model="gpt2-124m", hardware="a100-80gb", gpus=8, stack="flash-attn")).band
    assert small.extrapolates and any("smaller than any validated run" in r for r in small.reasons)
    large = plan(build_runspec(model="llama2-7b", hardware="a100-80gb", gpus=8, stack="composer")).band
    assert not any("smaller than any validated run" in r for r in large.reasons)
    assert band_mod.model_size_reason(1e8, {"validated": {}}) is None  # nothing validated: no claim either way


def test_an_extrapolating_forecast_takes_at_least_the_extrapolation_band():
    """Outside what was validated (fp8 and context parallelism under Megatron-Core here), the band
    is at least the 95 % quantile of every validation row's error, and says what its regime's was;
    a forecast inside the validated regimes keeps its regime's band."""
    floor = band.load_bands()[band.EXTRAPOLATED_KEY]["expected_error"]
    inside = plan(build_runspec(model="llama2-70b", hardware="h100-sxm", gpus=128, tp=4, pp=4, seq_len=4096,
                                global_batch=128, stack="megatron-core"))
    outside = plan(build_runspec(model="llama2-70b", hardware="h100-sxm", gpus=128, tp=4, pp=4, cp=2, seq_len=4096,
                                 global_batch=128, stack="megatron-core", precision="fp8"))
    assert not inside.band.extrapolates and inside.band.widened_from is None
    assert inside.band.expected_error < floor  # the regime's own band is narrower: widening is visible
    assert outside.band.extrapolates and outside.band.expected_error == floor
    assert outside.band.widened_from is not None and outside.band.widened_from < floor
    assert "widened" in outside.band.describe() and outside.to_dict()["band"]["widened_from"] is not None


def test_the_extrapolation_band_is_built_from_every_row_and_spares_borrowed_regimes():
    """bands.json's extrapolation entry is the 95 % quantile of all rows; a regime with too few rows
    borrows a coarser regime's band as it is (validated there), not the extrapolation band."""
    errors = [0.01 * i for i in range(1, 21)]  # 1 % .. 20 %
    rows = [{"family": "megatron", "precision": "16-bit", "scale": ">1024", "error": e,
             "device_family": "hopper", "devices": 2048} for e in errors]
    rows += [{"family": "megatron", "precision": "16-bit", "scale": "<=64", "error": 0.01,
              "device_family": "hopper", "devices": 8}]
    built = band.build_bands(rows)
    assert built[band.EXTRAPOLATED_KEY]["expected_error"] == 0.19  # 20 of 21 rows = 95 %
    borrowed = band.band_for("megatron-core", 1, "bf16", 8, "hopper", built)
    assert borrowed.regime == "megatron|16-bit|*" and borrowed.widened_from is None
    assert borrowed.expected_error == band.band_quantile(errors + [0.01])
    beyond = band.band_for("megatron-core", 1, "bf16", 4096, "hopper", built)
    assert beyond.extrapolates and beyond.expected_error == 0.19 and beyond.widened_from == 0.17


def test_a_precision_never_validated_takes_its_familys_band_at_the_same_scale():
    """fp8 had no validation row: its band is the family's at the same scale (here the wide
    small-scale one), never a narrower band pooled from other scales."""
    rows = [{"family": "megatron", "precision": "16-bit", "scale": "<=64", "error": e,
             "device_family": "hopper", "devices": 8} for e in (0.20, 0.21, 0.22)]
    rows += [{"family": "megatron", "precision": "16-bit", "scale": ">1024", "error": 0.01,
              "device_family": "hopper", "devices": 2048} for _ in range(20)]
    built = band.build_bands(rows)
    fp8_small = band.band_for("megatron-core", 1, "fp8", 8, "hopper", built)
    bf16_small = band.band_for("megatron-core", 1, "bf16", 8, "hopper", built)
    assert fp8_small.regime == "megatron|*|<=64" and fp8_small.extrapolates
    assert fp8_small.expected_error >= bf16_small.expected_error == 0.22
    assert band.band_for("megatron-core", 1, "fp8", 2048, "hopper", built).regime == "megatron|*|>1024"


@pytest.mark.parametrize("stack", ["nemo", "flash-attn"])
def test_a_stack_with_no_run_of_its_own_extrapolates(stack):
    """NeMo's recipes and flash-attention's trainer share a validated family (Megatron, PyTorch-native)
    but no validation run was theirs: the band says so and takes the extrapolation floor; the
    family's validated stacks keep their regime's band."""
    spec = build_runspec(model="llama2-70b", hardware="h100-sxm", gpus=128, tp=4, pp=4, seq_len=4096,
                         global_batch=128)
    floor = band.load_bands()[band.EXTRAPOLATED_KEY]["expected_error"]
    own = plan(dataclasses.replace(spec, stack=stack)).band
    assert own.extrapolates and any(f"stack {stack} never validated" in r for r in own.reasons)
    assert own.expected_error >= floor
    sibling = plan(dataclasses.replace(spec, stack="megatron-core" if stack == "nemo" else "composer")).band
    assert not any("never validated" in r for r in sibling.reasons)
