"""Where a file dialog opens: the folder of the last file or folder the user
chose in one (in this run), else the home folder. Shared by every dialog that
uses it, so an export opens where the last import came from."""

from __future__ import annotations

from pathlib import Path

_last_folder: Path | None = None


def start_folder() -> Path:
    """The last folder used, while it still exists; else the home folder."""
    if _last_folder is not None and _last_folder.is_dir():
        return _last_folder
    return Path.home()


def start_path(name: str) -> str:
    """A save dialog's suggestion: `name` in the folder to start in."""
    return str(start_folder() / name)


def remember(chosen: str | Path) -> None:
    """The user chose `chosen` in a dialog: the next one opens beside it (in it, for a folder)."""
    global _last_folder
    if not str(chosen):
        return
    path = Path(chosen)
    _last_folder = path if path.is_dir() else path.parent
