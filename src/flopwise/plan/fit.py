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
        0.70, 0.95, 0.80, points=11),
    FreeConstant(
        "sustained_hopper",
        "the same for H100 / H200, whose 700 W limit throttles clocks more (bounds: 0.55-0.95)",
        0.55, 0.95, 0.67, points=11),
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
    FreeConstant(
        "stack_speed_megatron",
        "sustained kernel share of Megatron-LM / Megatron-Core relative to PyTorch-native stacks "
        "(fused bias-GeLU, softmax and layer-norm kernels, fewer launches; bounds 0.8-1.3)",
        0.8, 1.3, 1.1, points=11),
    FreeConstant(
        "stack_speed_megatron_deepspeed",
        "the same for Megatron-DeepSpeed and GPT-NeoX (Megatron's kernels under DeepSpeed's pipeline "
        "engine; bounds 0.8-1.3)",
        0.8, 1.3, 0.85, points=11),
    FreeConstant(
        "stack_speed_deepspeed",
        "the same for DeepSpeed's own ZeRO engine (bounds 0.8-1.3)",
        0.8, 1.3, 1.0, points=11),
)
"""The constants in the order a grid point lists them."""

FAMILY_CONSTANT = {"ampere": "sustained_ampere", "hopper": "sustained_hopper"}
"""The sustained constant each device family reads (other families keep their own)."""
STACK_CONSTANT = {"megatron-lm": "stack_speed_megatron", "megatron-core": "stack_speed_megatron",
                  "nemo": "stack_speed_megatron", "megatron-deepspeed": "stack_speed_megatron_deepspeed",
                  "gpt-neox": "stack_speed_megatron_deepspeed", "deepspeed": "stack_speed_deepspeed"}
"""The stack-speed constant each stack reads; PyTorch-native stacks (flopwise, composer,
torchtitan, flash-attn) are the reference, 1."""
_STACK_SPEEDS = {name: c.default for c in FREE_CONSTANTS for name in [c.name] if name.startswith("stack_speed")}


def stack_speed(stack: str) -> float:
    """The sustained-kernel multiplier of a software stack (1 for PyTorch-native stacks)."""
    name = STACK_CONSTANT.get(stack)
    return _STACK_SPEEDS[name] if name else 1.0


_DEFAULTS = {c.name: c.default for c in FREE_CONSTANTS}


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
    _STACK_SPEEDS.update({k: v for k, v in values.items() if k in _STACK_SPEEDS})
    if "overlap_slowdown" in values:
        timing.OVERLAP_SLOWDOWN = values["overlap_slowdown"]
    if "ring_hop_latency_s" in values:
        latency = values["ring_hop_latency_s"]
        comm.RING_HOP_LATENCY_S.update(node=latency, net=latency)
    gemm._FRACTIONS.clear()
    gemm._CEILINGS.clear()
    gemm._RATES.clear()
    gemm._SIXTEEN_BIT.clear()
    ops._LAYER_CACHE.clear()
    ops._END_CACHE.clear()


def with_multiplier(values: dict[str, float], multiplier: float) -> dict[str, float]:
    """`values` with every family's sustained share scaled by `multiplier` and the stack speeds
    at 1 (how a row is tabled over SPEED_GRID)."""
    out = dict(values)
    for name in FAMILY_CONSTANT.values():
        out[name] = _DEFAULTS[name] * multiplier
    for name in set(STACK_CONSTANT.values()):
        out[name] = 1.0
    return out


def grid_points(names: tuple[str, ...]) -> list[dict[str, float]]:
    """Every combination of the named constants' grids."""
    by_name = {c.name: c for c in FREE_CONSTANTS}
    grids = [by_name[name].grid() for name in names]
    return [dict(zip(names, combo)) for combo in itertools.product(*grids)]


SPEED_GRID = tuple(round(0.6 * 1.05**i, 6) for i in range(21))
"""Multipliers of the sustained kernel share a row is planned at (0.6 to 1.59): a row's
prediction depends on its family's `sustained` and its stack's speed only through their
product, so it is tabled once over this grid and read between the points (log-linear)."""


@dataclass(frozen=True)
class TabledRow:
    """A published figure's predicted / published over the grid: for each (overlap_slowdown,
    ring_hop_latency_s) pair, one ratio per SPEED_GRID multiplier of its sustained kernel share."""

    source: str
    family_constant: str | None  # e.g. "sustained_ampere"; None: a family without a fitted constant
    stack_constant: str | None  # e.g. "stack_speed_megatron"; None: a PyTorch-native stack
    table: dict  # (overlap_slowdown, ring_hop_latency_s) -> tuple of ratios over SPEED_GRID
    fitted: bool = True  # False: validated only (whole-job figures with restarts in them)

    def multiplier(self, values: dict[str, float]) -> float:
        m = 1.0
        if self.family_constant:
            m *= values[self.family_constant] / _DEFAULTS[self.family_constant]
        if self.stack_constant:
            m *= values[self.stack_constant]
        return m

    def ratio(self, values: dict[str, float]) -> float:
        ratios = self.table[(values["overlap_slowdown"], values["ring_hop_latency_s"])]
        m = min(max(self.multiplier(values), SPEED_GRID[0]), SPEED_GRID[-1])
        i = min(len(SPEED_GRID) - 2, max(0, int(math.log(m / SPEED_GRID[0]) / math.log(1.05))))
        x0, x1 = SPEED_GRID[i], SPEED_GRID[i + 1]
        t = math.log(m / x0) / math.log(x1 / x0)
        return math.exp((1 - t) * math.log(ratios[i]) + t * math.log(ratios[i + 1]))

    def log_error(self, values: dict[str, float]) -> float:
        return abs(math.log(self.ratio(values)))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n in (self.family_constant, self.stack_constant) if n) + ("overlap_slowdown",
                                                                                      "ring_hop_latency_s")


PULL_TO_DEFAULT = 0.01
"""Objective added per bound-width a constant moves from its shipped value: where the
training sources barely constrain a constant (a flat objective), the fit keeps the shipped
value instead of drifting to a bound on noise."""


def objective(rows: list[TabledRow], values: dict[str, float]) -> float:
    """Mean over sources of the source's median |log(predicted / published)|, plus the pull
    towards the shipped values."""
    import statistics  # the fit's alone: the planner imports this module for `stack_speed`

    by_source: dict[str, list[float]] = {}
    for row in rows:
        if row.fitted:
            by_source.setdefault(row.source, []).append(row.log_error(values))
    score = statistics.fmean(statistics.median(errors) for errors in by_source.values())
    return score + PULL_TO_DEFAULT * sum(abs(values[c.name] - c.default) / (c.upper - c.lower) for c in FREE_CONSTANTS)


def fit(rows: list[TabledRow]) -> dict[str, float]:
    """The grid point with the lowest objective on `rows`, by coordinate descent from the shipped
    values (each constant in turn over its whole grid, until a sweep changes nothing).
    Constants no fitted row depends on keep their shipped value."""
    rows = [row for row in rows if row.fitted]
    used = {name for row in rows for name in row.names}
    values = defaults()
    score = objective(rows, values)
    for _ in range(8):
        changed = False
        for constant in FREE_CONSTANTS:
            if constant.name not in used:
                continue
            for value in constant.grid():
                trial = dict(values, **{constant.name: value})
                trial_score = objective(rows, trial)
                if trial_score < score - 1e-12:
                    values, score, changed = trial, trial_score, True
        if not changed:
            break
    return values
