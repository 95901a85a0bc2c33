"""Writing into a run directory that someone else may also write: never through a symbolic link.

A run directory can sit on a shared scratch or be a colleague's copy. A link planted there
(`config.yaml -> ~/.bashrc`, `checkpoints -> /elsewhere`) must not make a run overwrite
the file it points to. Every entry flopwise writes goes through this module:

- whole files (`write_file`): a fresh temporary file in the same folder, opened with
  `O_CREAT | O_EXCL | O_NOFOLLOW`, then renamed over the name. A rename replaces a link
  itself, never its target, and a reader sees the old file or the new one, never half;
- files that grow (`open_for_append`, metrics lines and logs): `O_NOFOLLOW`, a regular file only;
- folders inside it (`make_entry_folder`) and the run directory as a whole (`refuse_links`): a link is refused
  in one line. `logging.run_dir` itself may be a link (a run directory on a larger disk);
  the entries inside it may not.

Torch-free; imports only errors, so the run record and the trainer share it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path

from flopwise.errors import UserError

class WriteFailed(UserError, OSError):
    """A write that failed (disk full, file too large, permission): one line for the person, and still an
    OSError (errno, strerror, filename) for code that reports root causes, like a failed checkpoint save."""

    def __init__(self, err: OSError, path: Path, message: str):
        OSError.__init__(self, err.errno, err.strerror, str(path))
        self.message = message

    def __str__(self) -> str:
        return self.message


def link_refusal(path: Path) -> UserError:
    """The one line for a link found where a run directory entry should be."""
    try:
        target = f" (to {os.readlink(path)})"
    except OSError:
        target = ""
    return UserError(f"{path} is a symbolic link{target}; flopwise never writes through a link inside a run "
                     "directory: remove it, or set another logging.run_dir")


def refuse_link(path: Path) -> None:
    """One line if `path` is a symbolic link."""
    if os.path.islink(path):
        raise link_refusal(Path(path))


def refuse_links(run_dir: Path, inner_folders: list[Path] = ()) -> None:
    """Refuse a run directory with a symbolic link among its entries (or those of `inner_folders`, its checkpoints)."""
    run_dir = Path(run_dir)
    for folder in [run_dir, *inner_folders]:
        try:
            entries = list(os.scandir(folder))
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as err:
            raise UserError(f"{folder}: cannot list the run directory ({err.strerror or err})") from None
        for entry in entries:
            if entry.is_symlink():
                raise link_refusal(Path(entry.path))


def make_folder(path: Path) -> Path:
    """Create `path` (parents too), or say in one line why it cannot be a folder. A link to a folder is fine:
    this is for folders the user names (`logging.run_dir`, `export --out`); see `make_entry_folder`."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserError(f"{path} is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"{path}: cannot create this folder ({err.strerror or err})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"{path}: this folder is not writable")
    return path


def make_entry_folder(path: Path) -> Path:
    """Create a folder inside a run directory (`checkpoints/`, `plots/`); refuse it when it is a link."""
    path = Path(path)
    refuse_link(path)
    make_folder(path)
    refuse_link(path)  # planted between the check and mkdir: mkdir then found it "existing"
    return path


def write_through_descriptor(fd: int, data: bytes) -> None:
    """Write all of `data` to `fd` (os.write may write less than asked)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def write_file(path: Path, data: bytes | str, durable: bool = False, mode: int = 0o644) -> Path:
    """Replace `path` with `data` atomically, without following a link at `path`; `durable` fsyncs file and folder.

    A failure (disk full, file too large, permission) leaves `path` as it was and no temporary
    file behind, and is one line.
    """
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(6)}")
    try:
        fd = _open_no_follow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        try:
            try:
                write_through_descriptor(fd, payload)
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        if durable:
            fsync_folder(path.parent)
    except OSError as err:
        raise WriteFailed(err, path, f"{path}: cannot write ({err.strerror or err}); "
                                     "the previous file, if any, is unchanged") from None
    return path


def write_new_file(path: Path, data: bytes | str) -> Path:
    """Create `path`, which must not exist yet, with `data`, fsynced, without following a link.

    For files inside a folder that is published later by a rename (a checkpoint's temporary
    folder): nobody reads them before that, so no temporary name and rename are needed, and
    one fsync of the folder before it is renamed makes all its entries durable at once.
    """
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    try:
        fd = _open_no_follow(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            write_through_descriptor(fd, payload)
            os.fsync(fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        finally:
            os.close(fd)
    except OSError as err:
        raise WriteFailed(err, path, f"{path}: cannot write ({err.strerror or err})") from None
    return path


def copy_file(source: Path, target: Path) -> Path:
    """Copy `source` (read as data) to `target` with `write_file`'s guarantees."""
    try:
        data = Path(source).read_bytes()
    except OSError as err:
        raise UserError(f"{source}: cannot read ({err.strerror or err})") from None
    return write_file(target, data)


def open_for_append(path: Path, truncate: bool = False) -> int:
    """A descriptor appending to `path` (created if missing, emptied when `truncate`); refuses a link or a non-file."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | (os.O_TRUNC if truncate else 0)
    try:
        fd = _open_no_follow(Path(path), flags, 0o644)
    except OSError as err:
        raise WriteFailed(err, path, f"{path}: cannot open for writing ({err.strerror or err})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UserError(f"{path} is not a regular file; flopwise appends only to plain files in a run directory")
    return fd


def fsync_folder(path: Path) -> None:
    """Make a rename inside `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _open_no_follow(path: Path, flags: int, mode: int) -> int:
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise link_refusal(path) from None
        raise
