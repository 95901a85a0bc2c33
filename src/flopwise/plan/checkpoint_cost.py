"""What a checkpoint costs a run, and how often to write one (torch-free).

flopwise saves in two phases (docs/checkpoints.md, "Background saves"): each device's model
and optimizer state is copied into host memory while the run waits (blocking), then written
to storage in the background (total = blocking + write). So the run pays the blocking time
per save, and a preemption loses the work since the last *published* checkpoint.

- State a device stages: its weights, optimizer states and fp32 master weights, as the
  memory plan has them on the busiest device (gradients are not saved).
- State the job writes: each distinct shard once (DCP writes a replicated tensor from one
  rank): weights are replicated over data-parallel ranks below ZeRO-3, optimizer states
  below ZeRO-1.
- Blocking: device bytes / host-copy bandwidth. Default 63 GB/s, PCIe 5.0 x16 per
  direction (32 GT/s x 16 lanes, 128b/130b encoding; PCI-SIG PCIe 5.0 base specification),
  an upper bound; pass what `benchmarks/checkpoint.py` measures for yours.
- Total: blocking + job bytes / storage bandwidth (all writers together, `--storage-gbps`).
- Interval: Daly 2006 eq. 37 (`preemption.daly_interval`, as `--spot` uses) with the
  blocking time as the cost per checkpoint, the cost a two-phase save charges the run
  (CheckFreq, Mohan et al., FAST 2021: snapshot, then persist), and never shorter than the
  total save time (one save is in flight at a time); with no preemption rate it is not computed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from flopwise.errors import UserError
from flopwise.plan.preemption import SECONDS_PER_DAY, daly_interval, young_interval

PCIE5_X16_GBPS = 63.0  # per direction: 32 GT/s x 16 lanes x 128/130 / 8 (PCI-SIG PCIe 5.0 base specification)


@dataclass(frozen=True)
class CheckpointCost:
    """Per save: bytes, the time the run waits, the time until published; the interval to save at."""

    device_bytes: float
    job_bytes: float
    storage_gbps: float
    host_copy_gbps: float
    blocking_seconds: float
    total_seconds: float
    preemptions_per_day: float | None
    young_interval_seconds: float | None
    daly_interval_seconds: float | None
    interval_steps: int | None
    expected_lost_seconds_per_preemption: float | None

    def to_dict(self) -> dict:
        """JSON-able fields."""
        return asdict(self)


def checkpoint_bytes(memory, layout) -> tuple[float, float]:
    """(bytes one device stages, bytes the whole job writes) from a plan's memory estimate and layout."""
    optimizer = memory.optimizer_states + memory.master_weights
    device = memory.weights + optimizer
    model_parallel = layout.tp * layout.pp
    weights_copies = layout.dp if layout.zero_stage >= 3 else 1
    optimizer_copies = layout.dp if layout.zero_stage >= 1 else 1
    job = model_parallel * (memory.weights * weights_copies + optimizer * optimizer_copies)
    return device, job


def blocking_seconds(device_bytes: float, host_copy_gbps: float = PCIE5_X16_GBPS) -> float:
    """Seconds the run waits per save: the device's state copied to the host."""
    return device_bytes / (host_copy_gbps * 1e9)


def checkpoint_cost(device_bytes: float, job_bytes: float, storage_gbps: float, step_seconds: float,
                    preemptions_per_day: float | None = None,
                    host_copy_gbps: float = PCIE5_X16_GBPS) -> CheckpointCost:
    """Blocking and total save time, and (with a preemption rate) the Daly interval in seconds and steps."""
    for name, value in (("--storage-gbps", storage_gbps), ("--host-copy-gbps", host_copy_gbps)):
        if not (math.isfinite(value) and value > 0):
            raise UserError(f"{name} must be a finite number > 0 (GB/s), got {value}")
    blocking = blocking_seconds(device_bytes, host_copy_gbps)
    total = blocking + job_bytes / (storage_gbps * 1e9)
    young = daly = steps = lost = None
    if preemptions_per_day:
        mtbf = SECONDS_PER_DAY / preemptions_per_day
        cost = max(blocking, 1e-9)
        young = young_interval(cost, mtbf)
        daly = max(daly_interval(cost, mtbf), total)  # one save in flight: the next starts after this one is published
        steps = max(1, round(daly / step_seconds)) if step_seconds > 0 else None
        lost = daly / 2 + total  # on average half an interval, plus the save that was not yet published
    return CheckpointCost(device_bytes, job_bytes, storage_gbps, host_copy_gbps, blocking, total,
                          preemptions_per_day, young, daly, steps, lost)


def for_plan(result, options: dict) -> CheckpointCost | None:
    """The checkpoint cost of a Plan for `plan`'s options (`storage_gbps`, `preemptions_per_day`,
    `host_copy_gbps`); None when `--storage-gbps` was not given."""
    if options.get("storage_gbps") is None:
        return None
    device, job = checkpoint_bytes(result.memory, result.spec.layout)
    return checkpoint_cost(device, job, options["storage_gbps"], result.time.step_seconds,
                           options.get("preemptions_per_day"), options.get("host_copy_gbps") or PCIE5_X16_GBPS)


def describe(cost: CheckpointCost) -> list[str]:
    """The lines `plan` prints."""
    lines = [f"checkpoint: {cost.job_bytes / 2**30:,.1f} GiB per save ({cost.device_bytes / 2**30:,.2f} GiB per device); "
             f"the run waits {cost.blocking_seconds:.2f} s (host copy at {cost.host_copy_gbps:g} GB/s), published "
             f"after {cost.total_seconds:.1f} s (storage at {cost.storage_gbps:g} GB/s)"]
    if cost.daly_interval_seconds is not None:
        steps = f" = every {cost.interval_steps:,} steps" if cost.interval_steps else ""
        lines.append(f"checkpoint interval (Daly 2006) at {cost.preemptions_per_day:g} preemptions/day: "
                     f"{cost.daly_interval_seconds:,.0f} s{steps}; a preemption loses "
                     f"{cost.expected_lost_seconds_per_preemption:,.0f} s on average")
    return lines
