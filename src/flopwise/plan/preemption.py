"""Spot instances: how often to checkpoint, what preemptions cost, and whether spot pays.

Preemptions are modelled as a Poisson process (exponential times between them) with mean
M = 86,400 / R seconds for R preemptions per day of the whole job (any node lost stops a
synchronous job, so a per-node rate r on n nodes is R = r·n).

- Optimal checkpoint interval (compute time between checkpoints):
  Young 1974, "A first order approximation to the optimum checkpoint interval":
  τ = sqrt(2·C·M);
  Daly 2006, "A higher order estimate of the optimum checkpoint interval for restart
  dumps", eq. 37: τ = sqrt(2·C·M)·[1 + (1/3)·sqrt(C/(2M)) + (1/9)·(C/(2M))] − C for
  C < 2M, else τ = M.
- Expected wall time of a job of T_s seconds of work, checkpoint cost C, restart cost R_s
  (Daly 2006, eq. 13, exponential failures): T_w = M·e^(R_s/M)·(e^((τ+C)/M) − 1)·T_s/τ.
  Of that, T_s/τ·C is writing checkpoints, (T_w/M)·R_s restarting after the T_w/M
  expected preemptions, and the rest is work lost and redone.
- On demand the job runs T_s (no preemptions; its occasional checkpoints are not counted).
- Break-even preemption rate: the R at which spot's expected cost equals on-demand's,
  i.e. T_w(R)/T_s = on-demand price / spot price (found by bisection; T_w grows with R).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from flopwise.errors import UserError

SECONDS_PER_DAY = 86_400.0


def young_interval(checkpoint_seconds: float, mtbf_seconds: float) -> float:
    """Young 1974 first-order optimum: sqrt(2·C·M)."""
    return math.sqrt(2.0 * checkpoint_seconds * mtbf_seconds)


def daly_interval(checkpoint_seconds: float, mtbf_seconds: float) -> float:
    """Daly 2006 higher-order optimum (eq. 37); M itself when C >= 2M."""
    c, m = checkpoint_seconds, mtbf_seconds
    if c >= 2.0 * m:
        return m
    x = c / (2.0 * m)
    return math.sqrt(2.0 * c * m) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - c


def expected_wall_seconds(work_seconds: float, interval: float, checkpoint_seconds: float,
                          restart_seconds: float, mtbf_seconds: float) -> float:
    """Daly 2006 eq. 13: expected wall time with exponential preemptions (T_s when M is infinite)."""
    if math.isinf(mtbf_seconds):
        return work_seconds + work_seconds / interval * checkpoint_seconds
    m = mtbf_seconds
    return m * math.exp(restart_seconds / m) * math.expm1((interval + checkpoint_seconds) / m) * work_seconds / interval


@dataclass(frozen=True)
class SpotEstimate:
    """Expected time and money of one job on spot (with checkpoints) and on demand."""

    preemptions_per_day: float
    mtbf_seconds: float
    checkpoint_seconds: float
    restart_seconds: float
    young_interval_seconds: float
    daly_interval_seconds: float
    work_seconds: float
    spot_wall_seconds: float
    expected_preemptions: float
    checkpoint_overhead_seconds: float
    restart_overhead_seconds: float
    lost_work_seconds: float
    on_demand_wall_seconds: float
    devices: int
    on_demand_usd_per_device_hour: float | None
    spot_usd_per_device_hour: float | None
    on_demand_usd: float | None
    spot_usd: float | None
    break_even_preemptions_per_day: float | None
    recommendation: str
    reason: str

    def to_dict(self) -> dict:
        """JSON-able fields (infinities become None)."""
        out = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            out[name] = None if isinstance(value, float) and math.isinf(value) else value
        return out


def spot_wall_seconds_at(rate_per_day: float, work_seconds: float, checkpoint_seconds: float,
                         restart_seconds: float) -> float:
    """Expected wall time on spot at a preemption rate, checkpointing at Daly's interval."""
    mtbf = SECONDS_PER_DAY / rate_per_day if rate_per_day > 0 else math.inf
    if math.isinf(mtbf):
        return work_seconds
    interval = daly_interval(checkpoint_seconds, mtbf)
    return expected_wall_seconds(work_seconds, interval, checkpoint_seconds, restart_seconds, mtbf)


def break_even_rate(work_seconds: float, checkpoint_seconds: float, restart_seconds: float,
                    price_ratio: float, max_rate: float = 1e6) -> float | None:
    """Preemptions per day at which spot's expected cost equals on-demand's (None if spot never breaks even)."""
    if price_ratio <= 1.0:
        return 0.0  # spot is not cheaper per hour: any preemption makes it lose
    lo, hi = 0.0, 1.0
    while spot_wall_seconds_at(hi, work_seconds, checkpoint_seconds, restart_seconds) / work_seconds < price_ratio:
        hi *= 2.0
        if hi > max_rate:
            return None
    for _ in range(100):
        mid = (lo + hi) / 2.0
        if spot_wall_seconds_at(mid, work_seconds, checkpoint_seconds, restart_seconds) / work_seconds < price_ratio:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


def estimate_spot(
    work_seconds: float,
    devices: int,
    preemptions_per_day: float,
    checkpoint_seconds: float,
    restart_seconds: float,
    on_demand_usd_per_device_hour: float | None,
    spot_usd_per_device_hour: float | None,
) -> SpotEstimate:
    """Young/Daly checkpoint interval, expected overheads, time and cost on spot vs on demand, and a verdict."""
    for name, value in (("--preemptions-per-day", preemptions_per_day), ("--checkpoint-seconds", checkpoint_seconds),
                        ("--restart-seconds", restart_seconds)):
        if not math.isfinite(value) or value < 0:
            raise UserError(f"{name} must be a finite number >= 0, got {value}")
    if checkpoint_seconds == 0:
        raise UserError("--checkpoint-seconds must be > 0 (the time to write one checkpoint)")
    if work_seconds <= 0:
        raise UserError("spot planning needs the job's length: pass --tokens")
    mtbf = SECONDS_PER_DAY / preemptions_per_day if preemptions_per_day > 0 else math.inf
    young = young_interval(checkpoint_seconds, mtbf)
    daly = daly_interval(checkpoint_seconds, mtbf) if math.isfinite(mtbf) else math.inf
    if math.isfinite(mtbf):
        wall = expected_wall_seconds(work_seconds, daly, checkpoint_seconds, restart_seconds, mtbf)
        failures = wall / mtbf
        checkpointing = work_seconds / daly * checkpoint_seconds
    else:
        wall, failures, checkpointing = work_seconds, 0.0, 0.0
    restarting = failures * restart_seconds
    lost = max(0.0, wall - work_seconds - checkpointing - restarting)
    device_hours = devices / 3600.0
    od_usd = None if on_demand_usd_per_device_hour is None else work_seconds * device_hours * on_demand_usd_per_device_hour
    sp_usd = None if spot_usd_per_device_hour is None else wall * device_hours * spot_usd_per_device_hour
    break_even = None
    if on_demand_usd_per_device_hour is not None and spot_usd_per_device_hour:
        break_even = break_even_rate(work_seconds, checkpoint_seconds, restart_seconds,
                                     on_demand_usd_per_device_hour / spot_usd_per_device_hour)
    if od_usd is None or sp_usd is None:
        recommendation = "unknown"
        reason = "needs both an on-demand and a spot price (catalog or --price-per-hour / --spot-price-per-hour)"
    elif sp_usd < od_usd:
        recommendation = "spot"
        reason = (f"expected ${sp_usd:,.0f} on spot vs ${od_usd:,.0f} on demand "
                  f"({1 - sp_usd / od_usd:.0%} less), taking {wall / work_seconds - 1:.1%} longer")
    else:
        recommendation = "on-demand"
        reason = (f"expected ${sp_usd:,.0f} on spot vs ${od_usd:,.0f} on demand: preemptions cost more "
                  "than the spot discount saves")
    return SpotEstimate(
        preemptions_per_day, mtbf, checkpoint_seconds, restart_seconds, young, daly, work_seconds, wall, failures,
        checkpointing, restarting, lost, work_seconds, devices, on_demand_usd_per_device_hour,
        spot_usd_per_device_hour, od_usd, sp_usd, break_even, recommendation, reason,
    )
