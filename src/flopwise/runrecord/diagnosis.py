"""What `flopwise diagnose` found in a run: per-rank breakdown, findings, predicted vs measured.

Plain result types, torch-free: `diagnose/analyze.py` fills them, `report` renders them
(handed a diagnosis function by `flopwise.cli`, so report does not import diagnose).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from flopwise.runrecord.run_data import PlanRow


@dataclass(frozen=True)
class Finding:
    """One problem: what was seen, on which rank, and what to try next."""

    kind: str
    severity: str
    message: str
    next_step: str
    rank: int | None = None
    evidence: dict = field(default_factory=dict)


@dataclass(frozen=True)
class RankBreakdown:
    """Median and p90 seconds per step component on one rank (warm-up step excluded)."""

    rank: int
    steps: int
    median: dict[str, float]
    p90: dict[str, float]
    tokens_per_second: float | None
    peak_memory_bytes: dict[str, int]


@dataclass
class Diagnosis:
    """The result of `diagnose`: per-rank breakdown, findings, predicted vs measured."""

    run_dir: str
    ranks: list[int]
    steps: int
    breakdown: list[RankBreakdown]
    findings: list[Finding]
    plan_rows: list[PlanRow]
    skipped_lines: int = 0
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """Plain dict for `--json` and the report."""
        return {
            "run_dir": self.run_dir,
            "ranks": self.ranks,
            "steps": self.steps,
            "breakdown": [asdict(b) for b in self.breakdown],
            "findings": [asdict(f) for f in self.findings],
            "predicted_vs_measured": [
                {"name": r.name, "predicted": r.predicted, "measured": r.measured, "ratio": _finite_or_none(r.ratio)}
                for r in self.plan_rows
            ],
            "skipped_lines": self.skipped_lines,
            "notes": self.notes,
        }


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None
