"""Writing a user's files so that a crash, a full disk or a kill never leaves half of one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_text_atomically(path: str | os.PathLike[str], text: str) -> Path:
    """Write `text` to `path` through a temporary file beside it, flushed to
    disk before it replaces the old file: the file is the old one or the new
    one, never a part. Raises OSError (nothing is left behind then)."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    return path
