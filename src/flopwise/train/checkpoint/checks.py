"""What a run may resume from, checked on rank 0 before any rank loads a byte.

- all checkpoints invalid: stop with one line, never a silent restart from step 0 that
  would overwrite the metrics of the run;
- a plain file named like a step folder is reported, not skipped in silence;
- a manifest or trainer state whose keys do not match their schema is one line here,
  instead of a KeyError on one rank and a gloo traceback on the others;
- retention (`keep_last`) counts only checkpoints that are whole, so a corrupt one never
  takes the place of a good one.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from flopwise.errors import UserError
from flopwise.train.checkpoint.store import (
    LATEST, MANIFEST, STEP_PREFIX, checkpoints_dir, latest_valid, published_steps,
)


class _Strict(BaseModel):
    # Keys a newer flopwise adds are tolerated; a missing key or a wrong type is what breaks a resume.
    model_config = ConfigDict(extra="ignore", strict=True)


class RngState(_Strict):
    python: list
    numpy: list
    torch: str
    cuda: Optional[str] = None


class TrainerFile(_Strict):
    """`trainer.rank<R>.json` as `checkpoint.trainer_state` writes it."""

    format: int
    step: int = Field(ge=0)
    tokens_seen: int = Field(ge=0)
    rank: int = Field(ge=0)
    world_size: int = Field(ge=1)
    loader: dict
    scheduler: dict
    scaler: Optional[dict]
    rng: RngState


class ManifestFile(BaseModel):
    """The keys of `manifest.json` that resuming reads (others may be added)."""

    model_config = ConfigDict(strict=True)
    format: int
    step: int = Field(ge=0)
    world_size: int = Field(ge=1)
    files: dict


def _first_problem(err: ValidationError) -> str:
    first = err.errors(include_url=False)[0]
    where = ".".join(str(part) for part in first["loc"]) or "top level"
    return f"{where}: {first['msg'].lower()}"


def check_checkpoint_schema(path: Path) -> None:
    """One UserError line if the manifest or any trainer state in `path` does not match its schema."""
    path = Path(path)
    checks = [(path / MANIFEST, ManifestFile)] + [(f, TrainerFile) for f in sorted(path.glob("trainer.rank*.json"))]
    if len(checks) == 1:
        raise UserError(f"checkpoint {path}: no trainer.rank*.json (not a flopwise checkpoint)")
    for file, schema in checks:
        try:
            schema.model_validate(json.loads(file.read_text()))
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            problem = _first_problem(exc) if isinstance(exc, ValidationError) else f"unreadable ({exc})"
            raise UserError(f"checkpoint {file}: does not match the trainer state schema ({problem}); "
                            "it was not written by this flopwise") from None


def report_stray_files(run_dir: Path, report=print) -> list[Path]:
    """Plain files named like a step folder in checkpoints/: reported once each, never loaded."""
    folder = checkpoints_dir(run_dir)
    strays = sorted(p for p in folder.glob(f"{STEP_PREFIX}*") if not p.is_dir()) if folder.is_dir() else []
    for stray in strays:
        report(f"checkpoint {stray}: a plain file where a checkpoint folder should be; ignored (move it away)")
    return strays


def latest_valid_or_stop(run_dir: Path, report=print) -> Path | None:
    """The newest valid checkpoint, None when there are none, and one UserError line when all are invalid."""
    report_stray_files(run_dir, report)
    path = latest_valid(run_dir, report=report)
    published = published_steps(run_dir)
    if path is None and published:
        raise UserError(
            f"{checkpoints_dir(run_dir)}: none of the {len(published)} checkpoint(s) is valid (reasons above), so "
            "there is nothing to resume from; name one with checkpoint.resume_from, or start over with "
            "checkpoint.resume=false checkpoint.overwrite=true (the old run is moved aside, not deleted)")
    return path


def is_whole(path: Path) -> bool:
    """A cheap completeness test for retention: the manifest reads and every file has its recorded size."""
    try:
        files = json.loads((path / MANIFEST).read_text())["files"]
        return all((path / name).is_file() and (path / name).stat().st_size == entry["bytes"]
                   for name, entry in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def prune_keeping_valid(run_dir: Path, keep_last: int, pin: list[int]) -> list[Path]:
    """Keep the newest `keep_last` whole checkpoints, pinned steps and `latest`; delete the rest, broken ones too."""
    try:
        latest = (checkpoints_dir(run_dir) / LATEST).read_text().strip()
    except OSError:
        latest = None
    kept, deleted = 0, []
    for step, path in reversed(published_steps(run_dir)):
        if path.name == latest:
            kept += is_whole(path)
            continue
        if step in pin:
            continue
        if kept < keep_last and is_whole(path):
            kept += 1
            continue
        shutil.rmtree(path, ignore_errors=True)
        deleted.append(path)
    return deleted
