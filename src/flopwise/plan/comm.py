"""Communication volume and time per optimizer step, per device.

Collective costs use the ring bandwidth model (Patarasuk & Yuan 2009; nccl-tests
PERFORMANCE.md): all-reduce moves 2(n−1)/n × bytes through each device, all-gather and
reduce-scatter (n−1)/n × bytes each. Time = volume / (link bandwidth × link efficiency);
latency is ignored (large messages).

- Data parallel: ZeRO-0/1/2 move 2Ψ per step (all-reduce, or reduce-scatter + all-gather:
  same volume, Rajbhandari et al. 2020 §7); ZeRO-3/FSDP 3Ψ: a forward and a backward
  all-gather of the weights and a reduce-scatter of the gradients. With gradient
  accumulation ZeRO-3 gathers weights on every micro-batch (2·m all-gathers) and reduces
  once (FSDP2 `set_requires_gradient_sync(False)` on the other micro-batches).
- Tensor parallel (Shoeybi et al. 2019; Korthikanti et al. 2022): 2 all-reduces of
  s·b·h activations in the forward and 2 in the backward per layer (full recompute adds
  the forward's 2 again); sequence parallel swaps each for a reduce-scatter + all-gather
  of the same volume.
- Pipeline: one s·b·h send forward and one gradient send backward per micro-batch; the
  interleaved schedule sends v times as often (v model chunks per device; Narayanan et
  al. 2021 §2.2: "the amount of communication also increases by v").

Placement: ranks are laid out TP innermost, then DP, then PP (Megatron order). A group
uses the scale-up link (NVLink etc.) when it fits inside a node, else each device's
scale-out (network) bandwidth. Both are per direction.
"""

from __future__ import annotations

from dataclasses import dataclass

LINK_EFFICIENCY = 0.8
"""Achieved fraction of link bandwidth for large collectives; an assumption in the range
nccl-tests bus bandwidths typically reach on NVLink/InfiniBand (not a published constant)."""


@dataclass(frozen=True)
class CommEstimate:
    """Per-device bytes moved and seconds per optimizer step, by parallelism kind."""

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


def ring_all_reduce_bytes(n: int, nbytes: float) -> float:
    """Bytes through each device for a ring all-reduce: 2(n−1)/n × size."""
    return 2.0 * (n - 1) / n * nbytes if n > 1 else 0.0


def ring_all_gather_bytes(n: int, nbytes: float) -> float:
    """Bytes through each device for a ring all-gather or reduce-scatter: (n−1)/n × size."""
    return (n - 1) / n * nbytes if n > 1 else 0.0


def link_for_group(span: int, devices_per_node: int) -> str:
    """'scale-up' when a group of consecutive ranks spanning `span` devices fits in a node."""
    return "scale-up" if span <= devices_per_node else "scale-out"


def estimate_comm(
    *,
    params_per_device: float,
    grad_bytes: float,
    weight_bytes: float,
    zero_stage: int,
    dp: int,
    tp: int,
    pp: int,
    micro_batches: int,
    layers_per_stage: float,
    activation_message_bytes: float,
    recompute: str,
    devices_per_node: int,
    scale_up_gbs: float | None,
    scale_out_gbs: float | None,
    link_efficiency: float = LINK_EFFICIENCY,
    virtual_stages: int = 1,
) -> CommEstimate:
    """Bytes and seconds of DP, TP and PP traffic for one optimizer step on one device.

    `activation_message_bytes` is s·b·h·e for one micro-batch. Unknown bandwidth on a link
    that is needed gives infinite seconds (the planner turns that into a warning).
    """
    grads = params_per_device * grad_bytes
    weights = params_per_device * weight_bytes
    if zero_stage >= 3:
        dp_bytes = ring_all_gather_bytes(dp, weights) * 2 * micro_batches + ring_all_gather_bytes(dp, grads)
    else:
        dp_bytes = ring_all_reduce_bytes(dp, grads)

    tp_collectives = 4 + (2 if recompute == "full" else 0)
    tp_bytes = tp_collectives * ring_all_reduce_bytes(tp, activation_message_bytes) * layers_per_stage * micro_batches
    pp_bytes = 2.0 * activation_message_bytes * micro_batches * virtual_stages if pp > 1 else 0.0

    dp_link = link_for_group(tp * dp, devices_per_node)
    tp_link = link_for_group(tp, devices_per_node)
    pp_link = link_for_group(tp * dp * pp, devices_per_node)

    def seconds(nbytes: float, link: str) -> float:
        """Transfer time on the link the group uses; inf when its bandwidth is unknown."""
        if nbytes == 0.0:
            return 0.0
        gbs = scale_up_gbs if link == "scale-up" else scale_out_gbs
        if not gbs:
            return float("inf")
        return nbytes / (gbs * 1e9 * link_efficiency)

    return CommEstimate(
        dp_bytes, tp_bytes, pp_bytes,
        seconds(dp_bytes, dp_link), seconds(tp_bytes, tp_link), seconds(pp_bytes, pp_link),
        dp_link, tp_link, pp_link, link_efficiency,
    )
