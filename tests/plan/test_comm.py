"""plan/comm.py: ring volumes, hierarchical collectives over node links and the network, NVLink SHARP."""

import math

import pytest

from flopwise.catalog.hardware import load_hardware
from flopwise.plan.comm import (
    LINK_EFFICIENCY, Links, all_reduce_seconds, group_shape, link_name, links_for, p2p_seconds,
    reduce_scatter_seconds, ring_all_gather_bytes, ring_all_reduce_bytes,
)


def test_ring_volumes():
    assert ring_all_reduce_bytes(8, 1e9) == pytest.approx(2 * 7 / 8 * 1e9)
    assert ring_all_gather_bytes(8, 1e9) == pytest.approx(7 / 8 * 1e9)
    assert ring_all_reduce_bytes(1, 1e9) == 0


def test_group_placement_follows_megatron_rank_order():
    # dp groups are strided by tp: with tp 8 each node holds one member of a dp group
    assert group_shape(16, 1, 8) == (8, 2)
    assert group_shape(16, 8, 8) == (1, 16)
    assert group_shape(4, 2, 8) == (4, 1)


def test_hierarchical_reduce_scatter_uses_every_nic_of_a_node():
    links = Links(node_bps=400e9, net_bps=40e9, devices_per_node=8)
    size = 8e9
    inside = reduce_scatter_seconds(links, 8, 1, size)
    assert inside == pytest.approx(7 / 8 * size / 400e9, rel=1e-3)
    across = reduce_scatter_seconds(links, 16, 1, size)
    # node part, then each rank's 1/8 share across 2 nodes on its own NIC
    assert across == pytest.approx(7 / 8 * size / 400e9 + 1 / 2 * size / 8 / 40e9, rel=1e-3)
    # one member per node (dp strided by tp = 8): the whole buffer crosses the network
    strided = reduce_scatter_seconds(links, 16, 8, size)
    assert strided == pytest.approx(15 / 16 * size / 40e9, rel=1e-3)
    assert link_name(links, 8, 1) == "scale-up" and link_name(links, 16, 1) == "scale-out"


def test_all_reduce_is_two_phases_and_nvls_is_faster_inside_a_node():
    plain = Links(node_bps=369e9, net_bps=41e9, devices_per_node=8)
    sharp = Links(node_bps=369e9, net_bps=41e9, devices_per_node=8, nvls_bps=480e9)
    assert all_reduce_seconds(plain, 8, 1, 1e9) == pytest.approx(2 * reduce_scatter_seconds(plain, 8, 1, 1e9))
    assert all_reduce_seconds(sharp, 8, 1, 1e9) < all_reduce_seconds(plain, 8, 1, 1e9)


def test_catalog_links_and_unknown_bandwidth():
    hw = load_hardware()
    h100 = links_for(hw["h100-sxm"], 8)
    assert h100.node_bps == pytest.approx(450e9 * LINK_EFFICIENCY)
    assert h100.nvls_bps is not None  # NVLink 4 through NVSwitch
    assert links_for(hw["a100-80gb"], 8).nvls_bps is None
    assert math.isinf(p2p_seconds(Links(None, None, 8), True, 1e6))


def test_ring_latency_grows_with_the_ranks_and_crosses_the_network_once_per_node():
    """NCCL's tuning model: base latency + one hop per ring step (n - 1 steps for an all-gather),
    network hops where the ring leaves a node."""
    from flopwise.plan import comm as cm

    links = cm.Links(200e9, 20e9, 8)
    one_node = cm.ring_latency_seconds(links, 8, 1)
    assert one_node == pytest.approx(cm.RING_BASE_LATENCY_S + 7 * cm.RING_HOP_LATENCY_S["node"])
    assert cm.ring_latency_seconds(links, 1, 1) == 0.0
    small, large = cm.ring_latency_seconds(links, 384, 1), cm.ring_latency_seconds(links, 1536, 1)
    assert large - cm.RING_BASE_LATENCY_S == pytest.approx(4 * (small - cm.RING_BASE_LATENCY_S), rel=0.01)
    assert cm.ring_latency_seconds(links, 8, 1, steps_per_rank=2) > one_node
