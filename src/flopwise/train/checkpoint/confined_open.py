"""Opening a file a checkpoint names: inside its folder, a regular file, never through a link.

A DCP `.metadata` names the file of every tensor chunk (`_StorageInfo.relative_path`), and
DeepSpeed's loader opens the files of its folder by name. A forged checkpoint could name
`../../elsewhere`, `/absolute/path`, a link out of the folder, or a FIFO (the reader would
wait forever for a writer). Every such open goes through `open_in_checkpoint`: the name is
relative, without `..`; each part is opened from the folder with `openat`
(`os.open(..., dir_fd=)`) and `O_NOFOLLOW`, so a link anywhere on the way is refused; the
file is opened `O_NONBLOCK` (a FIFO opens at once instead of waiting) and must be a
regular file. Each refusal is one line carrying `REFUSED`.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path, PurePosixPath
from typing import BinaryIO

REFUSED = "refused by flopwise's checkpoint reader"


class CheckpointPathRefused(ValueError):
    """A checkpoint names a file outside its folder, through a link, or not a regular file."""


def check_relative_name(name: object, what: str) -> PurePosixPath:
    """`name` as a relative path of plain parts (no `..`, not absolute, not empty), or CheckpointPathRefused."""
    if not isinstance(name, (str, os.PathLike)):
        raise CheckpointPathRefused(f"{REFUSED}: {what} names {name!r}, which is not a file name")
    text = os.fspath(name)
    path = PurePosixPath(text)
    if not text or "\x00" in text or path.is_absolute() or any(part in ("..", "") for part in text.split("/")
                                                                if part != "."):
        raise CheckpointPathRefused(f"{REFUSED}: {what} names {text!r}, outside the checkpoint folder "
                                    "(absolute or with ..)")
    return path


def open_in_checkpoint(folder: Path, name: str | os.PathLike, what: str = "the checkpoint") -> BinaryIO:
    """`folder/name` opened for reading, confined as the module docstring says."""
    relative = check_relative_name(name, what)
    parts = [part for part in relative.parts if part != "."]
    if not parts:
        raise CheckpointPathRefused(f"{REFUSED}: {what} names the checkpoint folder itself, not a file")
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as err:
        raise CheckpointPathRefused(f"{REFUSED}: cannot open checkpoint folder {folder} ({err.strerror})") from None
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            flags = os.O_RDONLY | os.O_NOFOLLOW | (os.O_NONBLOCK if last else os.O_DIRECTORY)
            dir_fd, fd = fd, -1  # _step closes dir_fd, also when it fails
            fd = _step(dir_fd, part, flags, folder, relative, what)
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) \
                else "a folder" if stat.S_ISDIR(mode) else "not a regular file"
            raise CheckpointPathRefused(f"{REFUSED}: {what} names {str(relative)!r} in {folder}, which is {kind}")
        os.set_blocking(fd, True)
        handle = os.fdopen(fd, "rb")
        fd = -1
        return handle
    finally:
        if fd >= 0:
            os.close(fd)


def _step(dir_fd: int, part: str, flags: int, folder: Path, relative: PurePosixPath, what: str) -> int:
    """Open `part` relative to `dir_fd`, closing `dir_fd`; a link or a missing part is one line."""
    try:
        return os.open(part, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, "no such file in the checkpoint", str(folder / relative)) from None
    except OSError as err:
        if err.errno == errno.ELOOP or _is_link(part, dir_fd):  # O_NOFOLLOW met a link (ENOTDIR for a folder's)
            reason = "a symbolic link (never followed)"
        elif err.errno == errno.ENOTDIR:
            reason = "not a folder (a file or a link where a folder should be)"
        else:
            reason = f"unreadable ({err.strerror})"
        raise CheckpointPathRefused(f"{REFUSED}: {what} names {str(relative)!r} in {folder}: "
                                    f"{part!r} is {reason}") from None
    finally:
        os.close(dir_fd)


def _is_link(part: str, dir_fd: int) -> bool:
    try:
        os.readlink(part, dir_fd=dir_fd)
        return True
    except OSError:
        return False
