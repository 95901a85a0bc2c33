"""The planner's few free constants: what each means, its bounds, and how they are fitted.

Everything else in the time model comes from datasheets, kernel micro-benchmarks and the
stacks' code. These four numbers have a physical meaning but no micro-benchmark pins them
down, so they are fitted on published training runs, within bounds that the measurement
behind each sets. None is keyed to a model, a row or a source: a constant applies to a
device family or to every run. `benchmarks/validate_planner.py` fits them leave-one-source-out
(on all sources but one, predicting the one left out) to measure how well the planner
generalises, and once on every source for the values the planner ships (the defaults below
are those values).

The fit is a grid search: every published row is planned once per grid point of the
constants it depends on, then the search picks the point with the lowest mean over sources
of each source's median |log(predicted / published)| (every source weighs the same, however
many rows it has).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class FreeConstant:
    """One fitted number of the time model."""

    name: str
    meaning: str
    lower: float
    upper: float
    default: float  # the value fitted on every source (what the planner uses)
    points: int = 6

    def grid(self) -> tuple[float, ...]:
        """Evenly spaced values from lower to upper bound, the default among them."""
        step = (self.upper - self.lower) / (self.points - 1)
        values = {round(self.lower + i * step, 9) for i in range(self.points)}
        values.add(self.default)
        return tuple(sorted(values))


FREE_CONSTANTS = (
    FreeConstant(
        "sustained_ampere",
        "share of the A100 GEMM micro-benchmark (MAMF) that training kernels sustain: clocks under "
        "sustained power, framework overhead between kernels (bounds: 0.70-0.95 of MAMF)",
        0.70, 0.95, 0.81),
    FreeConstant(
        "sustained_hopper",
        "the same for H100 / H200, whose 700 W limit throttles clocks more (bounds: 0.55-0.95)",
        0.55, 0.95, 0.68),
    FreeConstant(
        "overlap_slowdown",
        "compute time lost per second of communication hidden behind it (NCCL's thread blocks take "
        "SMs; measured 0.19 on average and up to 0.40, arXiv 2507.03114; bounds 0-0.40)",
        0.0, 0.40, 0.40, points=5),
    FreeConstant(
        "ring_hop_latency_s",
        "seconds of one ring step of a latency-bound collective, launch and the framework's wait "
        "included (NCCL's tuning model: 5.7 us over NVLink, 6.6 us over the network, Ring/Simple; "
        "bounds 5.7-20 us)",
        5.7e-6, 20e-6, 14e-6, points=5),
)
"""The constants in the order a grid point lists them."""

FAMILY_CONSTANT = {"ampere": "sustained_ampere", "hopper": "sustained_hopper"}
"""The sustained constant each device family reads (other families keep their own)."""


def defaults() -> dict[str, float]:
    """The values the planner ships (fitted on every source)."""
    return {c.name: c.default for c in FREE_CONSTANTS}


def apply(values: dict[str, float]) -> None:
    """Set the planner's constants to `values` (name -> value) and drop the caches built on them.
    For the fit only: the planner itself runs on `defaults()`."""
    from flopwise.plan import comm, gemm, ops, timing

    for family, name in FAMILY_CONSTANT.items():
        if name not in values:
            continue
        for attr in ("_AMPERE", "_AMPERE_PCIE", "_HOPPER"):
            curve = getattr(gemm, attr)
            if curve.family.startswith(family):
                setattr(gemm, attr, dataclasses.replace(curve, sustained=values[name]))
    if "overlap_slowdown" in values:
        timing.OVERLAP_SLOWDOWN = values["overlap_slowdown"]
    if "ring_hop_latency_s" in values:
        latency = values["ring_hop_latency_s"]
        comm.RING_HOP_LATENCY_S.update(node=latency, net=latency)
    gemm._FRACTIONS.clear()
    gemm._CEILINGS.clear()
    gemm._RATES.clear()
    ops._LAYER_CACHE.clear()
    ops._END_CACHE.clear()


def relevant(family: str) -> tuple[str, ...]:
    """The constants a row on a device of this family depends on."""
    names = ["overlap_slowdown", "ring_hop_latency_s"]
    if family in FAMILY_CONSTANT:
        names.insert(0, FAMILY_CONSTANT[family])
    return tuple(names)


def grid_points(names: tuple[str, ...]) -> list[dict[str, float]]:
    """Every combination of the named constants' grids."""
    by_name = {c.name: c for c in FREE_CONSTANTS}
    grids = [by_name[name].grid() for name in names]
    return [dict(zip(names, combo)) for combo in itertools.product(*grids)]


def key_of(values: dict[str, float], names: tuple[str, ...]) -> tuple[float, ...]:
    """A row's table key: the values of the constants it depends on."""
    return tuple(values[name] for name in names)


@dataclass(frozen=True)
class TabledRow:
    """A published figure's predictions over the grid of the constants it depends on."""

    source: str
    names: tuple[str, ...]
    ratios: dict  # key_of(values, names) -> predicted / published
    fitted: bool = True  # False: validated only (whole-job figures with restarts in them)

    def log_error(self, values: dict[str, float]) -> float:
        return abs(math.log(self.ratios[key_of(values, self.names)]))


PULL_TO_DEFAULT = 0.002
"""Objective added per bound-width a constant moves from its shipped value: where the
training sources barely constrain a constant (a flat objective), the fit keeps the shipped
value instead of drifting to a bound on noise."""


def objective(rows: list[TabledRow], values: dict[str, float]) -> float:
    """Mean over sources of the source's median |log(predicted / published)|, plus the pull
    towards the shipped values."""
    by_source: dict[str, list[float]] = {}
    for row in rows:
        if row.fitted:
            by_source.setdefault(row.source, []).append(row.log_error(values))
    score = statistics.fmean(statistics.median(errors) for errors in by_source.values())
    return score + PULL_TO_DEFAULT * sum(abs(values[c.name] - c.default) / (c.upper - c.lower) for c in FREE_CONSTANTS)


def fit(rows: list[TabledRow]) -> dict[str, float]:
    """The grid point with the lowest objective on `rows`; constants no row depends on keep
    their default (a left-out source that alone constrained one gets the default, not its fit)."""
    rows = [row for row in rows if row.fitted]
    used = sorted({name for row in rows for name in row.names}, key=[c.name for c in FREE_CONSTANTS].index)
    best, best_score = defaults(), math.inf
    for point in grid_points(tuple(used)):
        values = dict(defaults(), **point)
        score = objective(rows, values)
        if score < best_score - 1e-12:
            best, best_score = values, score
    return best
