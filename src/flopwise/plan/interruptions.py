"""Hardware interruptions of an on-demand job: what they add to its length at scale (torch-free).

A synchronous job stops when any one device, host or link fails, so its interruptions per day
grow with the device count: R = r · N. The default r is the one published record of a full-scale
run: 419 unexpected interruptions in a 54-day snapshot of Llama 3 405B pre-training on 16,384
H100 (Llama Team 2024, "The Llama 3 Herd of Models", sec. 3.3.4 and Table 5; 78 % of them
hardware, 58.7 % GPU-related): r = 419 / 54 / 16,384 = 4.74e-4 per device-day, one every 3.1 h
at that scale and about one a day at 2,048 devices. It is one operator's H100 fleet in 2024: a
stated default, not a fit; `--interruptions-per-device-day` sets yours (0 turns this off).

Each interruption costs a restart (`--restart-seconds`; default RESTART_SECONDS, an
assumption: requeue, process-group start, checkpoint load) and the work since the last
checkpoint. Checkpoints are written at Daly's interval with the two-phase save's blocking time
(device state / host-copy bandwidth, checkpoint_cost.py) as their cost, and the expected wall
time is Daly 2006 eq. 13 (preemption.expected_wall_seconds), the model `--spot` uses for
preemptions. The same paper reports "higher than 90 %" effective training time at 16K GPUs; the
defaults give 94 % for its layout, a consistency check, not a fit (tests/plan/test_interruptions.py).

The plan's `time` stays the uninterrupted job (what throughput figures measure); this adds the
expected job, device-hours and on-demand cost beside it. Published GPU-hours of whole
pre-training runs include restarts, so the validation compares them with these.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from flopwise.plan.checkpoint_cost import PCIE5_X16_GBPS, blocking_seconds, checkpoint_bytes
from flopwise.plan.preemption import SECONDS_PER_DAY, daly_interval, expected_wall_seconds

LLAMA3_INTERRUPTIONS = 419
LLAMA3_DAYS = 54
LLAMA3_DEVICES = 16_384
INTERRUPTIONS_PER_DEVICE_DAY = LLAMA3_INTERRUPTIONS / LLAMA3_DAYS / LLAMA3_DEVICES
"""Unexpected interruptions per device per day: Llama 3 405B's 54-day snapshot (Llama Team 2024, sec. 3.3.4)."""
RESTART_SECONDS = 600.0
"""Seconds from an interruption to training again (assumption: requeue, start, checkpoint load)."""
SOURCE = "Llama Team 2024 sec. 3.3.4: 419 unexpected interruptions in 54 days on 16,384 H100"


@dataclass(frozen=True)
class InterruptionEstimate:
    """Expected interruptions of one job and the time, device-hours and cost they add."""

    per_device_day: float
    devices: int
    per_day: float
    mtbf_seconds: float
    restart_seconds: float
    checkpoint_blocking_seconds: float
    interval_seconds: float
    work_seconds: float
    expected_seconds: float
    expected_interruptions: float
    restart_overhead_seconds: float
    checkpoint_overhead_seconds: float
    lost_work_seconds: float
    expected_device_hours: float
    expected_on_demand_usd: float | None
    source: str

    @property
    def default_rate(self) -> bool:
        """Whether the rate is the published Llama 3 one (not the user's)."""
        return self.per_device_day == INTERRUPTIONS_PER_DEVICE_DAY

    @property
    def overhead(self) -> float:
        """Expected job over the uninterrupted one, minus 1."""
        return self.expected_seconds / self.work_seconds - 1.0 if self.work_seconds > 0 else 0.0

    @property
    def effective_training_time(self) -> float:
        """Share of the wall time spent on training that is kept (the paper's 'effective training time')."""
        return self.work_seconds / self.expected_seconds if self.expected_seconds > 0 else 1.0

    def to_dict(self) -> dict:
        out = {k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in asdict(self).items()}
        out.update(overhead=self.overhead, effective_training_time=self.effective_training_time)
        return out


def estimate_interruptions(work_seconds: float, devices: int, checkpoint_blocking_seconds: float,
                           per_device_day: float = INTERRUPTIONS_PER_DEVICE_DAY,
                           restart_seconds: float = RESTART_SECONDS,
                           on_demand_usd_per_device_hour: float | None = None) -> InterruptionEstimate:
    """Daly's checkpoint interval and expected wall time for `devices` failing at `per_device_day`."""
    per_day = per_device_day * devices
    mtbf = SECONDS_PER_DAY / per_day if per_day > 0 else math.inf
    cost = max(checkpoint_blocking_seconds, 1e-9)
    if math.isinf(mtbf) or work_seconds <= 0:
        interval, wall = math.inf, work_seconds
    else:
        interval = daly_interval(cost, mtbf)
        wall = expected_wall_seconds(work_seconds, interval, cost, restart_seconds, mtbf)
    count = wall / mtbf if math.isfinite(mtbf) else 0.0
    checkpointing = work_seconds / interval * cost if math.isfinite(interval) else 0.0
    # on average an interruption loses half an interval of work and checkpoint (first order); the
    # rest of Daly's overhead is restarting, interrupted restarts included
    lost = count * (interval + cost) / 2.0 if math.isfinite(interval) else 0.0
    restarting = max(0.0, wall - work_seconds - checkpointing - lost)
    device_hours = wall * devices / 3600.0
    usd = None if on_demand_usd_per_device_hour is None else device_hours * on_demand_usd_per_device_hour
    return InterruptionEstimate(per_device_day, devices, per_day, mtbf, restart_seconds, cost, interval,
                                work_seconds, wall, count, restarting, checkpointing, lost, device_hours, usd,
                                SOURCE if per_device_day == INTERRUPTIONS_PER_DEVICE_DAY else "--interruptions-per-device-day")


def for_plan(result, per_device_day: float | None = None, restart_seconds: float | None = None,
             host_copy_gbps: float | None = None) -> InterruptionEstimate:
    """The interruptions of a Plan's job: its devices, uninterrupted length, checkpoint blocking time and price."""
    device_bytes, _ = checkpoint_bytes(result.memory, result.spec.layout)
    blocking = blocking_seconds(device_bytes, host_copy_gbps or PCIE5_X16_GBPS)
    return estimate_interruptions(
        result.time.total_seconds, result.spec.layout.devices, blocking,
        INTERRUPTIONS_PER_DEVICE_DAY if per_device_day is None else per_device_day,
        RESTART_SECONDS if restart_seconds is None else restart_seconds,
        result.cost.on_demand_usd_per_device_hour)
