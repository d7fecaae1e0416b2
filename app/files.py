"""Writing a user's files so that a crash, a full disk, a kill or a planted link never does harm.

The rules, in one place for every file Tandem writes (exports, settings,
models.json, the secrets file):

- A file is written through a temporary file beside it and renamed over the
  old one: it is the old file or the new one, never a part.
- Only a regular file (or nothing) is ever replaced. A symbolic link, a FIFO,
  a device or a folder at the path is refused with `UnsafeOutputError`: a
  rename over a link would silently break it, and one over `/dev/full` (as
  root) replaces the device node.
- What Tandem writes is private to the user (0600): chats, keys and settings
  are nobody else's business. Tandem's own folders are 0700
  (`make_private_folder`, which the engine's data folder uses too).
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from app.errors import AppError
from engine.formats.default_model import PRIVATE_FOLDER_MODE, make_private_folder

# Files only their owner may read or write.
PRIVATE_FILE_MODE = 0o600

__all__ = [
    "PRIVATE_FILE_MODE",
    "PRIVATE_FOLDER_MODE",
    "UnsafeOutputError",
    "check_writable_target",
    "create_private_file",
    "make_private_file",
    "make_private_folder",
    "write_text_atomically",
]


class UnsafeOutputError(AppError):
    """The path to write names something that is not a regular file; nothing was written."""

    def __init__(self, path: Path, what: str) -> None:
        self.path = path
        self.what = what
        super().__init__(
            f"{path} is {what}, not a regular file; Tandem writes only regular files and left it untouched. "
            "Choose another file name."
        )


def _kind(mode: int) -> str | None:
    """What a non-regular file is, in words; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a special file"


def check_writable_target(path: str | os.PathLike[str]) -> Path:
    """`path` when nothing or a regular file is there; UnsafeOutputError otherwise.

    Looks at the path itself, not where a link points (lstat)."""
    path = Path(path)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return path
    what = _kind(info.st_mode)
    if what is not None:
        raise UnsafeOutputError(path, what)
    return path


def write_text_atomically(path: str | os.PathLike[str], text: str) -> Path:
    """Write `text` to `path` through a temporary file beside it, flushed to
    disk before it replaces the old file: the file is the old one or the new
    one, never a part. The file is private (0600).

    Raises UnsafeOutputError, writing nothing, when `path` is a symbolic
    link, a FIFO, a device or anything else that is not a regular file;
    OSError when writing fails (nothing is left behind then).
    """
    path = check_writable_target(path)
    folder = path.parent if str(path.parent) else Path(".")
    # mkstemp opens with O_EXCL (never through a planted link) and mode 0600.
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        # Looked at again just before the rename: the check above and the
        # rename are not one step, so keep the window between them small.
        check_writable_target(path)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    return path


def make_private_file(path: str | os.PathLike[str]) -> bool:
    """Tighten one of Tandem's own files to 0600 when it is looser; whether it is private now.

    Opened with O_NOFOLLOW (and without blocking, for a FIFO) so a link or a
    special file planted at the path is never followed or changed; a file
    that is missing, not ours or not regular is left as it is (False).
    """
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):  # not even opened: a device may act on open
            return False
    except OSError:
        return False
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return False
    try:
        info = os.fstat(fd)
        getuid = getattr(os, "getuid", None)
        if not stat.S_ISREG(info.st_mode) or getuid is None or info.st_uid != getuid():
            return False
        if stat.S_IMODE(info.st_mode) != PRIVATE_FILE_MODE:
            os.fchmod(fd, PRIVATE_FILE_MODE)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def create_private_file(path: str | os.PathLike[str]) -> None:
    """Create an empty file at `path` with mode 0600 unless something is there already.

    For files another library fills (SQLite creates its store with 0644
    otherwise). O_EXCL and O_NOFOLLOW: never through a planted link.
    Raises OSError (other than for an existing path)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, PRIVATE_FILE_MODE)
    except FileExistsError:
        return
    os.close(fd)
