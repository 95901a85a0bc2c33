"""One run directory, one run: a lock, the config it belongs to, and no silent reuse.

Before any process starts, `claim_run_directory(cfg)`:

1. takes `run.lock` with a kernel lock (`flock`, exclusive) held on an open descriptor
   for the run's life by the process that leads the run: the launcher that starts
   torchrun (node 0's on several nodes), or global rank 0 when an outside launcher
   started each rank. Exactly one process holds it at a time by construction, and a
   holder that dies (kill -9, OOM killer, a preempted Slurm job) releases it with its
   descriptors, so there is no stale lock to detect or take over. The file also says who
   holds it (pid, host, start time) for the one-line refusal a second trainer gets; the
   file itself is never removed (removing a locked file lets a newcomer lock a fresh one
   beside the old holder);
2. refuses a run directory whose entries are symbolic links (`safe_write.refuse_links`);
3. refuses to start over in a used directory (`checkpoint.resume=false` where checkpoints
   or metrics exist) unless `checkpoint.overwrite=true`, which moves the old run aside to
   `<run_dir>.old-<time>`, all of it or none;
4. refuses to resume with a config that differs from the one the directory was trained
   with, naming the keys (keys that may change on a resume are ignored).

No torch here: every check runs before torchrun starts.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Iterator

import yaml

from flopwise.errors import UserError
from flopwise.runrecord.run_dir import LOCK_FILE, RunDir
from flopwise.safe_write import make_folder, refuse_links, write_through_descriptor

# Keys a resumed run may change: lengths, logging, checkpoint policy, process layout (DCP reshards).
RESUMABLE_PREFIXES = ("logging.", "checkpoint.", "parallel.", "compress")
RESUMABLE_KEYS = {"training.max_steps", "training.eval_every", "training.eval_batches",
                  "training.measure_sync_wait", "training.measure_every", "data.prefetch", "data.cache_dir",
                  "model.trust_remote_code"}  # never read from a file: the command line says it each time


# --------------------------------------------------------------------------- the lock


class RunLock:
    """An exclusive `flock` on `run_dir/run.lock`, held while the descriptor is open."""

    def __init__(self, path: Path, fd: int):
        self.path = path
        self.fd = fd
        self.holds = 1  # nested acquisitions by this process (a restart inside the same launcher)

    def release(self) -> None:
        """Let go once; the last release empties the holder record and closes the descriptor (unlocking)."""
        self.holds -= 1
        if self.holds > 0 or self.fd < 0:
            return
        _HELD.pop(self.path, None)
        with contextlib.suppress(OSError):
            os.ftruncate(self.fd, 0)  # still locked here: nobody reads a half-cleared record
        os.close(self.fd)
        self.fd = -1


_HELD: dict[Path, RunLock] = {}


def _holder_record() -> bytes:
    return json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                       "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}).encode()


def prepare_run_directory(run_dir: Path) -> Path:
    """Create `run_dir` (and parents) or say in one line why it cannot be a run directory."""
    try:
        return make_folder(run_dir)
    except UserError as err:
        raise UserError(f"logging.run_dir: {err}") from None


def acquire_lock(run_dir: Path) -> RunLock:
    """Lock `run_dir/run.lock` for this process, or refuse in one line naming the live holder."""
    run_dir = prepare_run_directory(Path(run_dir))
    path = RunDir(run_dir).lock.absolute()
    held = _HELD.get(path)
    if held is not None:
        held.holds += 1
        return held
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise UserError(f"{path} is a symbolic link; a run lock is never written through a link "
                            "(remove it, or set another logging.run_dir)") from None
        raise UserError(f"{path}: cannot open the run lock ({err.strerror or err})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_holder(fd)
        os.close(fd)
        raise UserError(f"{run_dir} is in use by another trainer (pid {holder.get('pid', '?')} on "
                        f"{holder.get('host', '?')}, since {holder.get('started', '?')}); wait for it to end "
                        "or set another logging.run_dir") from None
    except OSError as err:  # a file system without locks (e.g. Lustre mounted without -o flock)
        os.close(fd)
        raise UserError(f"{path}: this file system does not support file locks ({err.strerror or err}); "
                        "put logging.run_dir on one that does (a local disk, NFSv4, Lustre with -o flock)") from None
    try:
        os.ftruncate(fd, 0)
        write_through_descriptor(fd, _holder_record())
    except OSError as err:
        os.close(fd)
        raise UserError(f"{path}: cannot write the run lock ({err.strerror or err})") from None
    lock = _HELD[path] = RunLock(path, fd)
    return lock


def _read_holder(fd: int) -> dict:
    """The holder record another process wrote (a moment's wait if it is being written right now)."""
    for _ in range(5):
        try:
            os.lseek(fd, 0, os.SEEK_SET)
            holder = json.loads(os.read(fd, 4096) or b"null")
        except (OSError, ValueError):
            holder = None
        if isinstance(holder, dict):
            return holder
        time.sleep(0.05)
    return {}


def release_lock(lock: RunLock) -> None:
    """Release the lock taken by `acquire_lock`."""
    lock.release()


# --------------------------------------------------------------------------- reuse and config


def is_used(run_dir: Path) -> bool:
    """True when a run already wrote checkpoints or metrics here."""
    checkpoints = RunDir(run_dir).checkpoints
    has_steps = checkpoints.is_dir() and any(p.name.startswith("step-") for p in checkpoints.iterdir())
    return has_steps or RunDir(run_dir).has_metrics()


def move_aside(run_dir: Path, keep: str = LOCK_FILE) -> Path:
    """Move everything in `run_dir` (but the lock) to `<run_dir>.old-<time>`, all or nothing; returns that folder.

    The folder is named after the resolved path, so `used/sub/..` moves `used` beside itself,
    not into a hidden folder inside the tree being moved. When one entry cannot be moved,
    the ones already moved go back and the error is one line.
    """
    run_dir = Path(run_dir).resolve()
    if run_dir.parent == run_dir:
        raise UserError(f"logging.run_dir: {run_dir} is a file system root; a run needs a folder of its own")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = run_dir.with_name(f"{run_dir.name}.old-{stamp}")
    n = 1
    while aside.exists():
        aside = run_dir.with_name(f"{run_dir.name}.old-{stamp}-{n}")
        n += 1
    moved: list[str] = []
    try:
        aside.mkdir()
        for entry in sorted(run_dir.iterdir()):
            if entry.name != keep:
                os.rename(entry, aside / entry.name)
                moved.append(entry.name)
    except OSError as err:
        for name in reversed(moved):
            with contextlib.suppress(OSError):
                os.rename(aside / name, run_dir / name)
        with contextlib.suppress(OSError):
            aside.rmdir()
        raise UserError(f"checkpoint.overwrite: could not move the old run in {run_dir} aside to {aside} "
                        f"({err.strerror or err}); nothing was moved") from None
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
    saved_path = RunDir(run_dir).config
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
    """Lock the run directory for this launcher (when `holds_lock`), check its entries and reuse, release at exit."""
    run_dir = Path(cfg.logging.run_dir)
    lock = acquire_lock(run_dir) if holds_lock else None
    try:
        refuse_links(run_dir, [RunDir(run_dir).checkpoints])
        check_reuse(cfg, report)
        yield
    finally:
        if lock is not None:
            release_lock(lock)
