"""Collective and point-to-point times on a node's links and the network between nodes.

Ring bandwidth model (Patarasuk & Yuan 2009; nccl-tests doc/PERFORMANCE.md): a
reduce-scatter or all-gather of S bytes over n ranks moves (n−1)/n × S through each rank,
an all-reduce twice that. Collectives are hierarchical (NCCL's rings/trees over a
rail-optimised cluster): the ranks of a group that share a node first reduce-scatter over
the scale-up link (NVLink), then each rank exchanges its 1/l share with its peers in the
other nodes over its own NIC, then the node all-gathers again:

    RS(S) = (l−1)/l · S / B_node + (N−1)/N · (S/l) / B_net + latency
    AR(S) = 2 · RS(S)        (NVLink SHARP: the node part at the NVLS bus bandwidth instead)

for l ranks of the group per node and N nodes. B are *bus* bandwidths, i.e. line rate ×
the efficiency nccl-tests reaches on large messages: NVLink busBw ≈ 370 of 450 GB/s per
direction on H100 (~20 % protocol overhead, NCCL maintainers in NVIDIA/nccl-tests#212),
the same 0.82 applied to other NVLink/NIC rates; NVLink SHARP (NVLS) all-reduce ≈ 480 GB/s
busBw on 8 H100 (same thread; GTC S62129). Latency: a few microseconds per hop.

Placement: ranks are laid out TP innermost, then DP, then PP (Megatron order); a group
with stride `stride` has min(n, devices_per_node // stride) members in each node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from flopwise.catalog.hardware import HardwareSpec

LINK_EFFICIENCY = 0.82
"""nccl-tests bus bandwidth / line rate for large messages (370 / 450 GB/s on H100 NVLink;
NVIDIA/nccl-tests#212). Applied to every scale-up link and NIC."""
NVLS_BUS_GBS = {"hopper": 480.0}
"""NVLink SHARP all-reduce bus bandwidth on 8 GPUs of an NVSwitch node (NVIDIA/nccl-tests#212)."""
INTRA_LATENCY_S = 8e-6
"""Per collective inside a node (NCCL small-message latency on NVLink, order of magnitude)."""
INTER_LATENCY_S = 12e-6
"""Per ring/tree step across nodes (InfiniBand / RoCE, order of magnitude)."""
RING_BASE_LATENCY_S = 8.4e-6
"""Fixed cost of one ring collective (NCCL's tuning model, `src/graph/tuning.cc` `baseLat`,
Ring/Simple: 8.4 us)."""
RING_HOP_LATENCY_S = {"node": 14e-6, "net": 14e-6}
"""Latency of one ring step, the framework's launch and wait included: the fitted
`ring_hop_latency_s` of `flopwise.plan.fit` (bounded below by NCCL's own tuning model,
`src/graph/tuning.cc` `hwLat`, Ring/Simple protocol, the one large messages use: 5.7 us a hop
over NVLink, 6.6 us over the network). A ring all-gather or
reduce-scatter of n ranks takes n − 1 steps, so its latency grows linearly with the ranks: the
alpha of the alpha-beta model (Hockney 1994) whose beta is the bus bandwidth above. nccl-tests
shows the same: at small messages a ring collective's time is flat in the size and
proportional to the ranks (NVIDIA/nccl-tests doc/PERFORMANCE.md)."""
CPU_LINK_GBS = 4.0
"""A CPU 'device' (one process) talks to the others through shared memory / loopback (gloo):
an assumption for runs without a measured profile."""


@dataclass(frozen=True)
class Links:
    """Achievable bus bandwidths (bytes/s) of one device's links, and how nodes are built."""

    node_bps: float | None  # scale-up (NVLink etc.), None when unknown
    net_bps: float | None  # scale-out, per device (its NIC), None when unknown
    devices_per_node: int
    nvls_bps: float | None = None  # NVLink SHARP all-reduce bus bandwidth, where the switch has it
    node_name: str = "scale-up"
    net_name: str = "scale-out"


@dataclass(frozen=True)
class CommEstimate:
    """Per-device bytes and unhidden seconds per optimizer step, by parallelism kind.

    `*_seconds` are the times the collectives take on the wire (before any overlap);
    the time model decides how much of each is exposed."""

    dp_bytes: float
    tp_bytes: float
    pp_bytes: float
    dp_seconds: float
    tp_seconds: float
    pp_seconds: float
    dp_link: str
    tp_link: str
    pp_link: str
    link_efficiency: float

    def to_dict(self) -> dict:
        """JSON-able fields."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def links_for(hw: HardwareSpec, devices_per_node: int, profile=None) -> Links:
    """The links of a catalog device (a profile's measured `collective_bus_bytes_per_s`, if any, wins)."""
    measured = getattr(profile, "collective_bus_bytes_per_s", None) if profile is not None else None
    if hw.vendor.lower() == "cpu" or hw.key.startswith("cpu"):
        bps = float(measured) if measured else CPU_LINK_GBS * 1e9
        return Links(bps, bps, devices_per_node, None, "shared memory", "network")
    node = hw.scale_up_gbs * 1e9 * LINK_EFFICIENCY if hw.scale_up_gbs else None
    if measured:
        node = float(measured)
    net = hw.scale_out_gbs * 1e9 * LINK_EFFICIENCY if hw.scale_out_gbs else None
    nvls = None
    link = (hw.scale_up_link or "").lower()
    if "nvswitch" in link and ("nvlink 4" in link or "nvlink 5" in link):
        nvls = NVLS_BUS_GBS["hopper"] * 1e9 * (hw.scale_up_gbs / 450.0 if hw.scale_up_gbs else 1.0)
    return Links(node, net, devices_per_node, nvls)


def ring_all_reduce_bytes(n: int, nbytes: float) -> float:
    """Bytes through each device for a ring all-reduce: 2(n−1)/n × size."""
    return 2.0 * (n - 1) / n * nbytes if n > 1 else 0.0


def ring_all_gather_bytes(n: int, nbytes: float) -> float:
    """Bytes through each device for a ring all-gather or reduce-scatter: (n−1)/n × size."""
    return (n - 1) / n * nbytes if n > 1 else 0.0


def group_shape(n: int, stride: int, devices_per_node: int) -> tuple[int, int]:
    """(members per node l, nodes N) of a group of n ranks spaced `stride` apart."""
    if n <= 1:
        return 1, 1
    local = max(1, min(n, devices_per_node // stride)) if stride <= devices_per_node else 1
    return local, -(-n // local)


def link_name(links: Links, n: int, stride: int) -> str:
    """Which link a group's traffic is bound by: the node's link or the network."""
    _, nodes = group_shape(n, stride, links.devices_per_node)
    return links.node_name if nodes == 1 else links.net_name


def reduce_scatter_seconds(links: Links, n: int, stride: int, nbytes: float) -> float:
    """Seconds of a hierarchical reduce-scatter (or all-gather) of `nbytes` (the full buffer)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    local, nodes = group_shape(n, stride, links.devices_per_node)
    seconds = 0.0
    if local > 1:
        if not links.node_bps:
            return math.inf
        seconds += (local - 1) / local * nbytes / links.node_bps + INTRA_LATENCY_S
    if nodes > 1:
        if not links.net_bps:
            return math.inf
        seconds += (nodes - 1) / nodes * (nbytes / local) / links.net_bps
        seconds += INTER_LATENCY_S * math.ceil(math.log2(nodes))
    return seconds


def ring_latency_seconds(links: Links, n: int, stride: int, steps_per_rank: float = 1.0) -> float:
    """Alpha of one ring all-gather or reduce-scatter over n ranks (NCCL's tuning model): the base
    latency plus one hop per step, network hops where the ring leaves a node. `steps_per_rank` is
    2 for an all-reduce (reduce-scatter then all-gather)."""
    if n <= 1:
        return 0.0
    local, nodes = group_shape(n, stride, links.devices_per_node)
    net_hops = nodes - 1 if nodes > 1 else 0
    node_hops = (n - 1) - net_hops
    return RING_BASE_LATENCY_S + steps_per_rank * (node_hops * RING_HOP_LATENCY_S["node"]
                                                   + net_hops * RING_HOP_LATENCY_S["net"])


def all_reduce_seconds(links: Links, n: int, stride: int, nbytes: float) -> float:
    """Seconds of a hierarchical all-reduce: reduce-scatter + all-gather, NVLS inside a node where present."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    local, nodes = group_shape(n, stride, links.devices_per_node)
    if links.nvls_bps and local > 1:
        inside = ring_all_reduce_bytes(local, nbytes) / links.nvls_bps + INTRA_LATENCY_S
        if nodes == 1:
            return inside
        across = 2.0 * (reduce_scatter_seconds(links, n, stride, nbytes)
                        - reduce_scatter_seconds(links, local, stride, nbytes))
        return inside + across
    return 2.0 * reduce_scatter_seconds(links, n, stride, nbytes)


def p2p_seconds(links: Links, crosses_node: bool, nbytes: float) -> float:
    """Seconds to send `nbytes` to the next pipeline stage."""
    if nbytes <= 0:
        return 0.0
    bps = links.net_bps if crosses_node else links.node_bps
    if not bps:
        return math.inf
    return nbytes / bps + (INTER_LATENCY_S if crosses_node else INTRA_LATENCY_S)


def measured_dp_seconds(collective_seconds, dp: int, zero: int, grads: float, weights: float,
                        units: tuple[float, ...], zero3, bucket_bytes: float,
                        fsdp_unit_cost=None) -> float | None:
    """Seconds per step of data-parallel collectives from a profile's measured collective times
    (`DeviceProfile.collective_seconds(op, bytes, world)`), as the framework issues them; None
    when the profile lacks an op this layout needs. Used on CPUs (gloo), where collectives run
    on the cores the compute needs and nothing hides behind it, so all of it is exposed.

    - ZeRO-3 / FSDP: every wrapped unit (`units`: its share of the weights, summing to 1) is
      all-gathered and its gradients reduce-scattered as often as `zero3` (the step's
      `step_comm.DpCollectives`, the one count the planner's bytes and GPU time use too) says.
      With `fsdp_unit_cost` (the profile's measured cost of one unit's two all-gathers and
      one reduce-scatter with FSDP2's own work and waits, by weight bytes) each unit pays
      that cost per three of its collectives; without it, one collective call per unit at
      its size's measured time.
    - ZeRO-0 (DDP): an all-reduce per gradient bucket, once per step.
    - ZeRO-1/2: a reduce-scatter of the gradients and an all-gather of the updated weights.
    """

    def timed(op: str, nbytes: float) -> float | None:
        return collective_seconds(op, nbytes, dp) if nbytes > 0 else 0.0

    if zero >= 3:
        gather_rounds = zero3.forward_gathers + zero3.backward_gathers * zero3.backward_share
        measured_units = [fsdp_unit_cost(share * weights) for share in units] if fsdp_unit_cost else [None]
        if None not in measured_units:
            return (gather_rounds + zero3.reductions) / 3.0 * sum(measured_units)
        gathers = [timed("all_gather", share * weights) for share in units]
        reduces = [timed("reduce_scatter", share * grads) for share in units]
        if None in gathers or None in reduces:
            return None
        return gather_rounds * sum(gathers) + zero3.reductions * sum(reduces)
    if zero == 0:
        buckets = max(1, math.ceil(grads / bucket_bytes))
        each = timed("all_reduce", grads / buckets)
        return None if each is None else buckets * each
    reduce, gather = timed("reduce_scatter", grads), timed("all_gather", weights)
    return None if reduce is None or gather is None else reduce + gather
