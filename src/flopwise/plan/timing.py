"""Step time, throughput, MFU and job length from FLOPs, efficiency and communication.

compute = hardware FLOPs of one step on one device / (dense peak × efficiency)
bubble  = (p−1)/m of the compute for 1F1B and GPipe, (p−1)/(m·v) interleaved
          (Narayanan et al. 2021, §2.2); m micro-batches per step, v virtual stages
DP comm is overlapped with compute up to DP_OVERLAP of the backward pass (≈ 2/3 of
compute; bucketed all-reduce / FSDP prefetch, Li et al. 2020 "PyTorch Distributed");
TP and PP comm are not overlapped.
step    = compute·(1 + bubble) + TP + PP + max(0, DP − DP_OVERLAP · backward)
MFU     = model FLOPs per second / (devices × peak)   (Chowdhery et al. 2022, App. B)
"""

from __future__ import annotations

from dataclasses import dataclass

from flopwise.plan.comm import CommEstimate

DP_OVERLAP = 0.8
"""Fraction of the backward pass that can hide data-parallel traffic (assumption)."""
BACKWARD_SHARE = 2.0 / 3.0  # backward is 2 of the 3 forward-equivalents of a step


@dataclass(frozen=True)
class TimeEstimate:
    """Seconds per step and for the whole job; throughput and utilisation."""

    peak_flops: float
    efficiency: float
    efficiency_source: str
    efficiency_confidence: str
    compute_seconds: float
    bubble_fraction: float
    exposed_comm_seconds: float
    step_seconds: float
    tokens_per_step: float
    tokens_per_second: float
    tokens_per_second_per_device: float
    mfu: float
    hfu: float
    steps: float
    total_seconds: float
    device_hours: float

    def to_dict(self) -> dict:
        """JSON-able fields (infinities become None)."""
        out = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            out[name] = None if isinstance(value, float) and value in (float("inf"), float("-inf")) else value
        return out


def bubble_fraction(pp: int, micro_batches: int, schedule: str, virtual: int) -> float:
    """Pipeline idle time as a fraction of compute: (p−1)/m, divided by v when interleaved."""
    if pp == 1:
        return 0.0
    bubble = (pp - 1) / micro_batches
    return bubble / virtual if schedule == "interleaved" else bubble


def estimate_time(
    *,
    model_flops_per_unit: float,
    hardware_flops_per_unit: float,
    units_per_step: float,
    total_units: float,
    devices: int,
    peak_flops: float,
    efficiency: float,
    efficiency_source: str,
    efficiency_confidence: str,
    bubble: float,
    comm: CommEstimate,
    dp_overlap: float = DP_OVERLAP,
) -> TimeEstimate:
    """Combine compute, pipeline bubble and exposed communication into step and job time."""
    compute = hardware_flops_per_unit * units_per_step / devices / (peak_flops * efficiency)
    hidden = min(comm.dp_seconds, dp_overlap * BACKWARD_SHARE * compute)
    exposed = comm.tp_seconds + comm.pp_seconds + (comm.dp_seconds - hidden)
    step = compute * (1.0 + bubble) + exposed
    per_second = units_per_step / step
    mfu = model_flops_per_unit * per_second / (devices * peak_flops)
    hfu = hardware_flops_per_unit * per_second / (devices * peak_flops)
    steps = total_units / units_per_step if units_per_step else 0.0
    total = total_units / per_second if per_second else float("inf")
    return TimeEstimate(
        peak_flops, efficiency, efficiency_source, efficiency_confidence,
        compute, bubble, exposed, step, units_per_step, per_second, per_second / devices,
        mfu, hfu, steps, total, total * devices / 3600.0,
    )
