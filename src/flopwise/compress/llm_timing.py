"""Timing that can be trusted: torch.utils.benchmark medians with their spread.

`blocked_autorange` runs the statement in blocks until `min_run_time` has passed and keeps
one time per block; we report the median and the interquartile range (IQR) of those, at a
pinned, printed intra-op thread count. A speed-up is only stated when the two IQR
intervals do not overlap; otherwise the honest answer is "no measurable difference".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

MIN_BLOCKS = 5


@dataclass(frozen=True)
class Timing:
    """Seconds per call: median and quartiles over `blocks` timed blocks, at `threads` threads."""

    median_s: float
    q1_s: float
    q3_s: float
    blocks: int
    threads: int

    @property
    def iqr_s(self) -> float:
        return self.q3_s - self.q1_s

    def as_dict(self) -> dict:
        return {**asdict(self), "iqr_s": self.iqr_s}


def pin_threads(threads: int | None) -> int:
    """Set torch's intra-op thread count (None: keep torch's) and return the count in force."""
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def time_call(fn: Callable[[], object], threads: int, min_run_time: float = 2.0) -> Timing:
    """Median and quartiles of `fn()`'s run time (torch.utils.benchmark.Timer.blocked_autorange)."""
    import numpy as np
    from torch.utils import benchmark

    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=threads)
    measurement = timer.blocked_autorange(min_run_time=min_run_time)
    times = list(measurement.times)
    while len(times) < MIN_BLOCKS:  # slow calls: blocked_autorange may stop after one or two blocks
        times += list(timer.blocked_autorange(min_run_time=min_run_time).times)
    q1, median, q3 = np.quantile(times, [0.25, 0.5, 0.75])
    return Timing(median_s=float(median), q1_s=float(q1), q3_s=float(q3), blocks=len(times), threads=threads)


def rate(timing: Timing, items: float) -> dict:
    """Items per second: median and the interval the quartiles give (slow quartile first)."""
    return {"median": items / timing.median_s, "low": items / timing.q3_s, "high": items / timing.q1_s}


def speedup_text(before: Timing, after: Timing) -> tuple[float | None, str]:
    """(before/after median ratio or None, words): no ratio is claimed when the IQRs overlap."""
    if after.q1_s <= before.q3_s and before.q1_s <= after.q3_s:
        return None, "no measurable difference (the interquartile ranges overlap)"
    ratio = before.median_s / after.median_s
    words = f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower"
    return ratio, f"{words} (interquartile ranges apart)"
