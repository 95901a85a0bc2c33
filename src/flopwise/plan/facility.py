"""Facility figures beside energy and cost: power per node and per rack, the rack density the
cluster implies, and whether air cooling can take it.

Sources:
- Host overhead (CPUs, memory, NICs, fans, power conversion) as a fraction of the devices'
  TDP: NVIDIA DGX H100 datasheet, "System power usage ~10.2 kW max" for 8 × H100 SXM at
  700 W = 5.6 kW of GPUs, so the rest of the node draws 4.6 kW ≈ 0.82 × the GPU TDP.
- Nodes per rack: 4, as NVIDIA's DGX SuperPOD (H100) reference architecture racks them
  (`--nodes-per-rack` changes it).
- Air-cooling limit: 30 kW per rack, the density at which operators begin to plan liquid
  cooling (Chatsworth Products, "When do you need liquid cooling for AI infrastructure",
  2026; optimised air with containment serves about 20–40 kW per rack).
All figures are at TDP: an upper bound of what the racks draw, as energy is in `cost.py`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from flopwise.plan.spec import RunSpec

HOST_OVERHEAD_FRACTION = (10_200 - 8 * 700) / (8 * 700)  # DGX H100: 10.2 kW max, 8 × 700 W GPUs
NODES_PER_RACK = 4  # DGX SuperPOD (H100) reference architecture
AIR_COOLING_LIMIT_W_PER_RACK = 30_000.0  # Chatsworth Products 2026: liquid considered from ~30 kW
AIR_COOLING_SOURCE = "30 kW/rack: Chatsworth Products 2026, 'When do you need liquid cooling for AI infrastructure'"


@dataclass(frozen=True)
class FacilityEstimate:
    """Power of the cluster at TDP: per node, per rack and in all; None where TDP is unknown."""

    devices_per_node: int
    nodes: int
    nodes_per_rack: int
    racks: int
    node_watts: float | None
    rack_watts: float | None
    cluster_watts: float | None
    rack_kw: float | None
    air_cooling_limit_kw: float
    exceeds_air_cooling: bool | None
    air_cooling_source: str
    host_overhead_fraction: float

    def to_dict(self) -> dict:
        """JSON-able fields."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def node_watts(devices_per_node: int, device_tdp_w: float, host_overhead: float = HOST_OVERHEAD_FRACTION) -> float:
    """One node at TDP: devices × TDP × (1 + host overhead)."""
    return devices_per_node * device_tdp_w * (1.0 + host_overhead)


def estimate_facility(spec: RunSpec) -> FacilityEstimate:
    """Node, rack and cluster power at TDP, and the air-cooling verdict for the rack density."""
    cluster, hw = spec.cluster, spec.cluster.hardware
    per_node = cluster.devices_per_node or hw.devices_per_node or 8
    devices = spec.layout.devices
    nodes = math.ceil(devices / per_node)
    per_rack = cluster.nodes_per_rack
    racks = math.ceil(nodes / per_rack)
    if hw.tdp_w is None:
        return FacilityEstimate(per_node, nodes, per_rack, racks, None, None, None, None,
                                AIR_COOLING_LIMIT_W_PER_RACK / 1000, None, AIR_COOLING_SOURCE, HOST_OVERHEAD_FRACTION)
    node = node_watts(min(per_node, devices), hw.tdp_w)
    rack = node * min(per_rack, nodes)
    total = node_watts(devices, hw.tdp_w)
    return FacilityEstimate(
        per_node, nodes, per_rack, racks, node, rack, total, rack / 1000, AIR_COOLING_LIMIT_W_PER_RACK / 1000,
        rack > AIR_COOLING_LIMIT_W_PER_RACK, AIR_COOLING_SOURCE, HOST_OVERHEAD_FRACTION,
    )
