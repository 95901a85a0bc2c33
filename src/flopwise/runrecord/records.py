"""The run record: what a `flopwise train` run directory holds, and the one shape of each file.

Torch-free plain data. `train` writes through it; `diagnose`, `report` and
`plan --calibrate` read through it, so the record types are declared once. The entries'
names and paths are `RunDir`'s (`run_dir.py`).

`SCHEMA_VERSION` is written into `predicted_vs_measured.json`; a reader meeting a newer
version says so instead of guessing at the shape.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from flopwise.errors import UserError
from flopwise.runrecord.run_dir import RunDir
from flopwise.safe_write import make_folder, write_file

SCHEMA_VERSION = 1

# The parts of a step's time, in seconds, as a `StepRecord` holds them; what is left of
# `step_seconds` is "other".
TIME_COMPONENTS = ("data_seconds", "compute_seconds", "sync_wait_seconds", "optimizer_seconds")
# Memory components compared with the plan, in `Comparison.predicted/measured["memory_bytes"]`.
MEMORY_COMPONENTS = ("weights", "gradients", "optimizer", "activations", "total")


def config_path(run_dir: str | Path) -> Path:
    """`runs/<name>/config.yaml`."""
    return RunDir(run_dir).config


def plan_path(run_dir: str | Path) -> Path:
    """`runs/<name>/plan.json`."""
    return RunDir(run_dir).plan


def comparison_path(run_dir: str | Path) -> Path:
    """`runs/<name>/predicted_vs_measured.json`."""
    return RunDir(run_dir).comparison


def checkpoints_dir(run_dir: str | Path) -> Path:
    """`runs/<name>/checkpoints/`."""
    return RunDir(run_dir).checkpoints


def metrics_path(run_dir: str | Path, rank: int) -> Path:
    """`runs/<name>/metrics.rank<R>.jsonl`."""
    return RunDir(run_dir).metrics(rank)


def metrics_files(run_dir: str | Path) -> list[Path]:
    """Every rank's metrics file (and a shared `metrics.jsonl`, if another tool wrote one)."""
    return RunDir(run_dir).metrics_files()


@dataclass
class MemoryBytes:
    """This rank's memory, by component (bytes). `cuda_peak_allocated` is None on CPU."""

    parameters: int = 0
    gradients: int = 0
    optimizer: int = 0
    saved_activations: int = 0
    cuda_peak_allocated: int | None = None


@dataclass(frozen=True)
class StepRecord:
    """One metrics line. Names are stable: `diagnose` and the report read them.

    Times are this rank's, in seconds: `step_seconds` = `data_seconds` (waiting for the
    batch) + `compute_seconds` (forward + backward, gradient reduction included) +
    `optimizer_seconds` (unscale, clip, step, zero_grad, schedule). `tokens_per_second` is
    the whole job's tokens per step over this rank's step time; `mfu` divides it by all
    devices' peak. Memory is `memory_<component>_bytes` for this rank, on the steps the
    meters ran (`training.measure_every`). `sync_wait_seconds` (when measured, on the same
    steps) is the time this rank waited for the others before the gradient sync; it is
    taken out of `compute_seconds`.
    """

    step: int
    rank: int
    loss: float
    lr: float
    grad_norm: float
    tokens_per_second: float
    step_seconds: float
    data_seconds: float
    compute_seconds: float
    optimizer_seconds: float
    tokens_seen: int
    memory: MemoryBytes | None  # None: not measured on this step (the line then has no memory figures)
    mfu: float | None = None
    skipped: bool = False
    loss_scale: float | None = None
    val_loss: float | None = None
    sync_wait_seconds: float | None = None

    def to_dict(self) -> dict:
        """The JSON line; optional figures appear only when present, non-finite floats become null."""
        record = {
            "step": self.step,
            "rank": self.rank,
            "loss": self.loss,
            "lr": self.lr,
            "grad_norm": self.grad_norm,
            "tokens_per_second": self.tokens_per_second,
            "step_seconds": self.step_seconds,
            "data_seconds": self.data_seconds,
            "compute_seconds": self.compute_seconds,
            "optimizer_seconds": self.optimizer_seconds,
            "tokens_seen": self.tokens_seen,
            "mfu": self.mfu,
            "skipped_step": self.skipped,
        }
        if self.loss_scale is not None:
            record["loss_scale"] = self.loss_scale
        if self.val_loss is not None:
            record["val_loss"] = self.val_loss
        if self.sync_wait_seconds is not None:
            record["sync_wait_seconds"] = self.sync_wait_seconds
        if self.memory is not None:
            record.update({f"memory_{k}_bytes": v for k, v in asdict(self.memory).items() if v is not None})
        return record


def json_line(record: dict) -> str:
    """One valid JSON line: non-finite floats (a NaN loss) become null."""
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
    return json.dumps(clean) + "\n"


@dataclass
class Comparison:
    """`predicted_vs_measured.json`: the plan's figures beside the measured ones, and their ratios.

    `predicted` and `measured` share keys (`memory_bytes.<component>`, `tokens_per_second`,
    `step_seconds`, `mfu`); `measured` also names the `hardware` the run measured on, which
    `plan --calibrate` pairs with `measured.mfu`.
    """

    hardware: dict
    predicted: dict
    measured: dict
    measured_over_predicted: dict
    notes: list[str] = field(default_factory=list)
    schema_version: int = SCHEMA_VERSION
    profile: dict | None = None  # the device profile the prediction used (`flopwise calibrate`), if any

    def rows(self) -> list[tuple[str, float, float]]:
        """(name, predicted, measured) for every figure both sides have as a finite number."""
        predicted, measured = _flatten(self.predicted), _flatten(self.measured)
        return [(name, predicted[name], measured[name]) for name in predicted if name in measured]

    @property
    def measured_mfu(self) -> float | None:
        """The run's measured MFU (a finite number), or None."""
        return _finite(self.measured.get("mfu"))


def write_plan(run_dir: str | Path, plan, error: str | None = None) -> Path:
    """Write `plan.json`: the planner's `Plan` as its JSON contract (`Plan.to_dict()`, docs/planner.md),
    or `{"error": ...}` when the run could not be planned. The one place a plan becomes a dict."""
    payload = plan.to_dict() if plan is not None else {"error": error}
    path = plan_path(run_dir)
    make_folder(path.parent)
    return write_file(path, json.dumps(payload, indent=2, default=str))


def write_comparison(run_dir: str | Path, comparison: Comparison) -> Path:
    """Write `predicted_vs_measured.json` atomically (tmp + rename, never through a link)."""
    return write_file(comparison_path(run_dir), json.dumps(asdict(comparison), indent=2))


def read_comparison(run_dir: str | Path) -> Comparison | None:
    """The run's comparison; None when the run wrote none (it stopped early). One-line error when it is not one."""
    path = comparison_path(run_dir)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise UserError(f"{path}: not readable as JSON ({err.__class__.__name__})") from None
    if not isinstance(data, dict) or not isinstance(data.get("measured"), dict) \
            or not isinstance(data.get("predicted", {}), dict):
        raise UserError(f"{path}: not a flopwise predicted-vs-measured record (it needs a 'measured' object)")
    version = data.get("schema_version", SCHEMA_VERSION)
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise UserError(f"{path}: schema_version {version!r} is newer than this flopwise reads "
                        f"(up to {SCHEMA_VERSION}); upgrade flopwise")
    return Comparison(
        hardware=data.get("hardware") or {}, predicted=data.get("predicted") or {}, measured=data["measured"],
        measured_over_predicted=data.get("measured_over_predicted") or {}, notes=list(data.get("notes") or []),
        schema_version=version, profile=data.get("profile") if isinstance(data.get("profile"), dict) else None,
    )


def _finite(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _flatten(obj: dict, prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "."))
        elif _finite(value) is not None:
            out[name] = float(value)
    return out
