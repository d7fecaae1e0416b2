"""Model folders that Tandem writes (a GGUF import, a quantized copy) appear
complete or not at all.

A folder is written under a hidden `.<name>.partial-<random>` sibling and
renamed into place, with a marker file (what it was made from) written
last. A folder at `dest` is therefore always complete, and one whose marker
matches the source is reused instead of being made again.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

from engine.errors import ModelLoadError

MARKER_NAME = "tandem-import.json"
# What a finished folder holds besides the marker.
MODEL_FOLDER_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
PARTIAL_INFIX = ".partial-"
# A partial folder nobody wrote to for this long belongs to a crashed writer.
STALE_PARTIAL_SECONDS = 3600.0


def staging_path(dest: Path) -> Path:
    """A fresh hidden sibling of `dest` to write the folder into."""
    return dest.parent / f".{dest.name}{PARTIAL_INFIX}{secrets.token_hex(6)}"


def write_json(path: Path, value: Any) -> None:
    write_file(path, (json.dumps(value, indent=2, ensure_ascii=False) + "\n").encode())


def write_file(path: Path, data: bytes) -> None:
    with path.open("wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())


def fsync_dir(path: Path) -> None:
    """Make a folder's new entries (a rename, a new file) survive a crash."""
    if os.name != "posix":
        return  # directories cannot be opened for fsync on Windows; NTFS journals renames
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_marker(folder: Path) -> dict[str, Any] | None:
    try:
        marker = json.loads((folder / MARKER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def is_current(folder: Path, stamp: dict[str, Any]) -> bool:
    """Whether `folder` is complete and was made from what `stamp` describes."""
    return read_marker(folder) == stamp and all((folder / name).is_file() for name in MODEL_FOLDER_FILES)


def check_replaceable(dest: Path) -> None:
    """Refuse to replace anything but a folder Tandem wrote or an empty folder."""
    if not dest.exists() and not dest.is_symlink():
        return
    if dest.is_dir() and not dest.is_symlink():
        if read_marker(dest) is not None or not any(dest.iterdir()):
            return
    raise ModelLoadError(
        f"{dest} already exists and is not a model folder Tandem imported; move it away to import there."
    )


def publish(staging: Path, dest: Path, stamp: dict[str, Any]) -> Path:
    """Rename the finished staging folder to `dest`.

    A concurrent writer of the same folder may win the rename; its folder is
    as good as ours. An outdated folder at `dest` is moved aside and deleted.
    """
    for _ in range(3):
        try:
            os.rename(staging, dest)
        except OSError as exc:
            if is_current(dest, stamp):
                return dest
            if not dest.exists():
                raise ModelLoadError(f"Could not create {dest}: {exc}") from exc
            check_replaceable(dest)
            discard_folder(dest)
            continue
        fsync_dir(dest.parent)
        return dest
    raise ModelLoadError(
        f"Could not move the imported model into {dest}; another process keeps replacing it."
    )


def discard_folder(folder: Path) -> None:
    """Delete a folder Tandem wrote. It is renamed to a partial name first,
    so a crash while deleting leaves only what the stale-partial sweep of
    the next import removes."""
    try:
        os.rename(folder, doomed := staging_path(folder))
    except FileNotFoundError:
        return
    shutil.rmtree(doomed, ignore_errors=True)


def remove_stale_partials(parent: Path) -> None:
    """Delete the partial folders under `parent` that crashed writers left."""
    now = time.time()
    for entry in parent.glob(f".*{PARTIAL_INFIX}*"):
        try:
            if not entry.is_dir() or entry.is_symlink():
                continue
            last_write = max([entry.stat().st_mtime] + [child.stat().st_mtime for child in entry.iterdir()])
        except OSError:
            continue  # vanished meanwhile: another process finished or cleaned it
        if now - last_write > STALE_PARTIAL_SECONDS:
            shutil.rmtree(entry, ignore_errors=True)
