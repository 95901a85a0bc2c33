"""plan/cost.py: LLaMA-1's energy method and catalog prices."""

import pytest

from flopwise.catalog.hardware import HardwareSpec, Price
from flopwise.plan.cost import energy_kwh, estimate_cost, estimate_energy


def test_llama_65b_energy_and_carbon():
    # Touvron et al. 2023, Table 15: 1,022,362 GPU-hours x 400 W x PUE 1.1 = 449.8 MWh, 173.2 tCO2e.
    assert energy_kwh(1_022_362, 400, 1.1) / 1000 == pytest.approx(449.8, abs=0.05)
    e = estimate_energy(1_022_362, 400, 1.1)
    assert e.tco2e == pytest.approx(173.2, abs=0.05)


def _device(prices):
    return HardwareSpec(key="x", name="X", vendor="v", peak_tflops={"bf16": 100.0}, sparse_factor=None,
                        memory_gb=80, memory_bandwidth_gbs=None, scale_up_gbs=None, devices_per_node=8,
                        scale_out_gbs=None, tdp_w=None, prices=tuple(prices))


def test_cheapest_dated_price_and_its_source():
    dev = _device([Price("a", "big", 4.0, None, "2026-01-01", "s"), Price("b", "small", 3.0, 1.0, "2026-02-02", "s"),
                   Price("c", "spotty", None, 0.5, "2026-03-03", "s")])
    cost = estimate_cost(100.0, dev, None)
    assert cost.on_demand_usd == pytest.approx(300.0) and cost.spot_usd == pytest.approx(50.0)
    assert "b small" in cost.price_source and "2026-02-02" in cost.price_source and "c spotty" in cost.price_source


def test_no_price_gives_none_with_a_note_and_override_wins():
    cost = estimate_cost(10.0, _device([]), None)
    assert cost.on_demand_usd is None and cost.spot_usd is None and "--price-per-hour" in cost.note
    assert estimate_cost(10.0, _device([]), 2.5).on_demand_usd == pytest.approx(25.0)
    assert estimate_energy(10.0, None, 1.1).kwh is None
