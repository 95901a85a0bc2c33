"""A run directory read back: step records per rank, predicted vs measured, the config.

Torch-free. `diagnose` finds problems in it and `report` draws it; both read it through
here, so neither depends on the other for the run's data. Missing optional fields are
skipped, never guessed; a line cut short by a crash is counted, not fatal.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from flopwise.errors import UserError
from flopwise.runrecord.records import TIME_COMPONENTS, config_path, metrics_files, read_comparison

# Components of a step as `flopwise train` times them; "other" is the rest of step_seconds
# (logging, checkpoint hooks, anything untimed). `sync_wait_seconds` (time blocked waiting
# for other ranks at gradient sync) is optional: when a trainer records it, a straggler
# shows directly as the rank that never waits.
COMPONENTS = TIME_COMPONENTS
COMPONENT_LABELS = {
    "data_seconds": "data wait",
    "compute_seconds": "forward+backward",
    "sync_wait_seconds": "gradient-sync wait",
    "optimizer_seconds": "optimizer",
    "other_seconds": "other",
}

MEMORY_NAMES = ("weights", "parameters", "gradients", "optimizer", "activations", "saved_activations", "cuda_peak_allocated")


def is_memory_figure(name: str) -> bool:
    """Whether a predicted-vs-measured name is a memory figure in bytes (trainer names, or *bytes*/*memory*)."""
    return name.split(".")[-1] in MEMORY_NAMES or "bytes" in name or "memory" in name



@dataclass(frozen=True)
class PlanRow:
    """One predicted-vs-measured figure."""

    name: str
    predicted: float
    measured: float

    @property
    def ratio(self) -> float:
        """measured / predicted (inf when nothing was predicted)."""
        return self.measured / self.predicted if self.predicted else math.inf


@dataclass
class RunData:
    """What a run directory holds, parsed: step records per rank, and the side files."""

    run_dir: Path
    steps_by_rank: dict[int, list[dict]]
    plan_rows: list[PlanRow]
    config: dict
    skipped_lines: int = 0
    hardware_key: str = ""  # the plan's device ("cpu-measured" for a CPU run); "" when no plan was written
    profiled: bool = False  # the prediction used a measured device profile (`flopwise calibrate`)
    profile: dict | None = None  # which profile: path, sha256, cache or measured, the load it was measured under
    machine_load: dict | None = None  # the machine's 1-minute load during the run: start, end, cpu_count, own_threads

    @property
    def on_cpu(self) -> bool:
        """True when the run's plan was made for this machine's CPU (advice about GPUs does not apply)."""
        return self.hardware_key.startswith("cpu")

    @property
    def ranks(self) -> list[int]:
        """Ranks in order."""
        return sorted(self.steps_by_rank)

    def val_losses(self) -> list[tuple[int, float]]:
        """(step, val_loss) from the lowest rank's records."""
        first = self.steps_by_rank[self.ranks[0]]
        return [(r["step"], r["val_loss"]) for r in first if finite_number(r.get("val_loss")) is not None]


def finite_number(value) -> float | None:
    """A finite int/float, else None (JSON null stands for a non-finite value)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _rank_from_name(path: Path) -> int:
    match = re.search(r"rank(\d+)", path.name)
    return int(match.group(1)) if match else 0


def read_step_records(path: Path) -> tuple[list[dict], int]:
    """Training-step records of one file and how many lines could not be read.

    A line cut short by a crash or a kill is skipped, not fatal: the rest is still evidence.
    """
    records, bad = [], 0
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                bad += 1
                continue
            if isinstance(obj, dict) and isinstance(obj.get("step"), int) and finite_number(obj.get("step_seconds")) is not None:
                obj.setdefault("rank", _rank_from_name(path))
                records.append(obj)
    return records, bad


def load_run(run_dir: str | Path) -> RunData:
    """Read a run directory, or raise UserError naming what is missing."""
    root = Path(run_dir)
    if not root.exists():
        raise UserError(f"run directory {root} does not exist; pass the folder `flopwise train` wrote (logging.run_dir)")
    if not root.is_dir():
        raise UserError(f"{root} is a file; pass the run directory that holds metrics.rank<R>.jsonl")
    files = metrics_files(root)
    if not files:
        raise UserError(f"{root} holds no metrics.rank<R>.jsonl or metrics.jsonl; is it a `flopwise train` run directory?")
    by_rank: dict[int, dict[int, dict]] = {}
    skipped = 0
    for path in files:
        records, bad = read_step_records(path)
        skipped += bad
        for record in records:
            # A resumed run rewrites steps after the checkpoint: the last line for a step wins.
            by_rank.setdefault(int(record["rank"]), {})[record["step"]] = record
    if not by_rank:
        names = ", ".join(p.name for p in files)
        raise UserError(f"{root}: {names} hold no step records (lines with 'step' and 'step_seconds'); did the run get past step 1?")
    steps_by_rank = {rank: [steps[s] for s in sorted(steps)] for rank, steps in by_rank.items()}
    return RunData(root, steps_by_rank, read_plan_rows(root), read_config(config_path(root)), skipped,
                   *read_plan_device(root))


def read_plan_device(root: Path) -> tuple[str, bool, dict | None, dict | None]:
    """(the catalog key of the device the plan was made for, "cpu..." on a CPU run, or "" when
    unknown; whether the prediction used a measured device profile; that profile's record; the
    machine's load during the run)."""
    try:
        comparison = read_comparison(root)
    except UserError:
        return "", False, None, None
    if comparison is None:
        return "", False, None, None
    key = (comparison.hardware or {}).get("key")
    load = comparison.measured.get("machine_load")
    return ((key if isinstance(key, str) else ""), comparison.profile is not None, comparison.profile,
            load if isinstance(load, dict) else None)


def read_config(path: Path) -> dict:
    """The resolved config, {} when absent or unreadable (only used for hints)."""
    if not path.is_file():
        return {}
    try:
        import yaml

        data = yaml.safe_load(path.read_text())
    except Exception:
        return {}
    return data if isinstance(data, dict) else {}


def read_plan_rows(run_dir: Path) -> list[PlanRow]:
    """Predicted-vs-measured pairs of the run's `Comparison` (none when the run wrote none)."""
    comparison = read_comparison(run_dir)
    if comparison is None:
        return []
    return [PlanRow(name, predicted, measured) for name, predicted, measured in comparison.rows()]
