"""One run directory, one run: a lock, the config it belongs to, and no silent reuse.

Before any process starts, `claim_run_directory(cfg)`:

1. takes `run.lock` (pid, host, start time of the launching process). A lock whose pid is
   dead on this host is stale and taken over; a live one, or one from another host, stops
   the second trainer with one line. The launcher holds it until it exits.
2. refuses to start over in a used directory (`checkpoint.resume=false` where checkpoints
   or metrics exist) unless `checkpoint.overwrite=true`, which moves the old run aside to
   `<run_dir>.old-<time>`;
3. refuses to resume with a config that differs from the one the directory was trained
   with, naming the keys (keys that may change on a resume are ignored).

No torch here: every check runs before torchrun starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Iterator

import yaml

from flopwise.errors import UserError

LOCK_FILE = "run.lock"
# Keys a resumed run may change: lengths, logging, checkpoint policy, process layout (DCP reshards).
RESUMABLE_PREFIXES = ("logging.", "checkpoint.", "parallel.", "compress")
RESUMABLE_KEYS = {"training.max_steps", "training.eval_every", "training.eval_batches",
                  "training.measure_sync_wait", "data.prefetch", "data.cache_dir"}


# --------------------------------------------------------------------------- the lock


def _process_start_ticks(pid: int) -> int | None:
    """The kernel's start time of `pid` (clock ticks since boot), to tell a reused pid apart; None off Linux."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _alive(pid: int, start_ticks: int | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if start_ticks is not None:
        now = _process_start_ticks(pid)
        return now is None or now == start_ticks
    return True


def _read_lock(path: Path) -> dict | None:
    try:
        holder = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def acquire_lock(run_dir: Path, report=print) -> Path:
    """Create `run_dir/run.lock` for this process; take over a stale one; refuse a live one in one line."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    mine = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "start_ticks": _process_start_ticks(os.getpid())}
    for _ in range(50):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            holder = _read_lock(path)
            if holder is None:
                continue  # released between our two calls
            if not holder:  # being written right now by another trainer, or garbage
                time.sleep(0.1)
                holder = _read_lock(path)
                if holder is None:
                    continue
                if not holder:
                    raise UserError(f"{path}: unreadable run lock; if no trainer uses {run_dir}, delete it")
            pid, host = holder.get("pid"), holder.get("host")
            if host == mine["host"] and isinstance(pid, int) and not _alive(pid, holder.get("start_ticks")):
                report(f"note: {path}: stale lock of pid {pid} (no longer running), taken over")
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                continue
            if pid == mine["pid"] and host == mine["host"]:
                return path  # this process already holds it (a restart inside the same launcher)
            raise UserError(f"{run_dir} is in use by another trainer (pid {pid} on {host}, since "
                            f"{holder.get('started')}); wait for it to end or set another logging.run_dir")
        with os.fdopen(fd, "w") as handle:
            json.dump(mine, handle)
        return path
    raise UserError(f"{path}: could not take the run lock (another trainer keeps taking it)")


def release_lock(path: Path) -> None:
    """Remove the lock if it is still ours."""
    holder = _read_lock(path)
    if holder and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


# --------------------------------------------------------------------------- reuse and config


def is_used(run_dir: Path) -> bool:
    """True when a run already wrote checkpoints or metrics here."""
    checkpoints = run_dir / "checkpoints"
    has_steps = checkpoints.is_dir() and any(p.name.startswith("step-") for p in checkpoints.iterdir())
    return has_steps or any(run_dir.glob("metrics.rank*.jsonl"))


def move_aside(run_dir: Path, keep: str = LOCK_FILE) -> Path:
    """Move everything in `run_dir` (but the lock) to `<run_dir>.old-<time>`; returns that folder."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = run_dir.with_name(f"{run_dir.name}.old-{stamp}")
    n = 1
    while aside.exists():
        aside = run_dir.with_name(f"{run_dir.name}.old-{stamp}-{n}")
        n += 1
    aside.mkdir(parents=True)
    for entry in run_dir.iterdir():
        if entry.name != keep:
            entry.rename(aside / entry.name)
    return aside


def _flatten(data, prefix: str = "") -> dict[str, object]:
    if isinstance(data, dict):
        flat: dict[str, object] = {}
        for key, value in data.items():
            flat.update(_flatten(value, f"{prefix}{key}."))
        return flat
    return {prefix[:-1]: data}


def config_differences(saved: dict, current: dict) -> list[str]:
    """`key (old -> new)` for every key that differs and must not change on a resume."""
    old, new = _flatten(saved), _flatten(current)
    changed = []
    for key in sorted(set(old) & set(new)):  # a key one side lacks is a schema change between versions, not the user's
        if key in RESUMABLE_KEYS or key.startswith(RESUMABLE_PREFIXES):
            continue
        if old.get(key) != new.get(key):
            changed.append(f"{key} ({old.get(key)!r} -> {new.get(key)!r})")
    return changed


def check_same_config(run_dir: Path, current: dict) -> None:
    """Refuse to resume `run_dir` with a config whose training-relevant keys differ from its config.yaml."""
    saved_path = run_dir / "config.yaml"
    try:
        saved = yaml.safe_load(saved_path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return  # nothing to compare with
    if not isinstance(saved, dict):
        return
    changed = config_differences(saved, current)
    if changed:
        shown = ", ".join(changed[:6]) + (f" and {len(changed) - 6} more" if len(changed) > 6 else "")
        raise UserError(f"{run_dir} was trained with a different config: {shown}; resume it with its own "
                        f"config ({saved_path}), set another logging.run_dir, or start it over with "
                        "checkpoint.resume=false checkpoint.overwrite=true")


def check_reuse(cfg, report=print) -> None:
    """Starting over in a used directory needs `checkpoint.overwrite`; resuming needs the same config."""
    run_dir = Path(cfg.logging.run_dir)
    if not is_used(run_dir):
        return
    ckpt = cfg.checkpoint
    if not ckpt.resume and not ckpt.resume_from:
        if not ckpt.overwrite:
            raise UserError(f"{run_dir} already holds a run and checkpoint.resume=false would mix a new run into "
                            "it; set another logging.run_dir, or checkpoint.overwrite=true to move the old run "
                            f"aside to {run_dir.name}.old-<time>")
        report(f"note: the old run in {run_dir} moved to {move_aside(run_dir)} (checkpoint.overwrite=true)")
        return
    check_same_config(run_dir, cfg.model_dump(mode="json"))


@contextlib.contextmanager
def claim_run_directory(cfg, holds_lock: bool = True, report=print) -> Iterator[None]:
    """Lock the run directory for this launcher (when `holds_lock`), check its reuse, release at exit."""
    run_dir = Path(cfg.logging.run_dir)
    lock = acquire_lock(run_dir, report) if holds_lock else None
    try:
        check_reuse(cfg, report)
        yield
    finally:
        if lock is not None:
            release_lock(lock)
