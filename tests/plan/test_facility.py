"""plan/facility.py: node and rack power at TDP and the air-cooling verdict."""

import pytest

from flopwise.plan import facility
from flopwise.plan.planner import build_runspec


def test_a_dgx_h100_node_draws_its_datasheet_maximum():
    # NVIDIA DGX H100: ~10.2 kW max for 8 x H100 SXM at 700 W.
    assert facility.node_watts(8, 700.0) == pytest.approx(10_200.0)


def test_rack_density_and_air_cooling_verdict():
    f = facility.estimate_facility(build_runspec(gpus=64, zero=3))
    assert (f.nodes, f.racks, f.nodes_per_rack) == (8, 2, 4)
    assert f.rack_kw == pytest.approx(40.8) and f.cluster_watts == pytest.approx(81_600.0)
    assert f.exceeds_air_cooling and f.air_cooling_limit_kw == 30.0 and "Chatsworth" in f.air_cooling_source
    two = facility.estimate_facility(build_runspec(gpus=64, zero=3, nodes_per_rack=2))
    assert two.rack_kw == pytest.approx(20.4) and not two.exceeds_air_cooling


def test_a_single_node_job_fills_one_partial_rack():
    f = facility.estimate_facility(build_runspec(gpus=4, zero=3))
    assert (f.nodes, f.racks) == (1, 1) and f.node_watts == pytest.approx(4 * 700 * (1 + f.host_overhead_fraction))
