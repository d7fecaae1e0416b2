"""Downloading a model from Hugging Face into the data folder, resumably.

`download_choice(registry, listing, choice)` fetches a choice of
app/models/hub.py — one GGUF file, or a safetensors folder's files — with
its own HTTP code (httpx), because huggingface_hub's download can neither
pause nor be cancelled cleanly:

- Every file is written to `models/.downloads/<repo>-<commit>/<name>.part`
  and continued with an HTTP Range request after a pause, a dropped
  connection or a restart of Tandem (the same repository at the same commit
  finds the same part file). A file the user's Hugging Face cache already
  holds at that commit is copied from there instead.
- The Hub is untrusted: the commit and every file name were checked by
  app/models/hub.py, and each path is built as `folder / name` and checked
  to stay inside `folder` (`inside`) before anything is written or deleted
  there. Nothing past a file's listed size is written, and a download must
  keep moving (STALL_BYTES in every STALL_SECONDS) or it stops as a lost
  connection.
- Each file's size and SHA-256 are checked against the repository's
  metadata before it is used; a mismatch deletes it (ChecksumMismatchError).
- Then it is registered like an import: a GGUF file through the GGUF
  importer (kept quantized; the download is deleted afterwards), a
  safetensors folder checked with the engine's rules and moved into
  `models/<id>` as a "download" entry. Nothing is registered before that
  succeeds, and a failure leaves no half model registered.

Pausing keeps the part files (DownloadPausedError), cancelling deletes them
(DownloadCancelledError). Cleaning up deletes the files this download wrote,
then their folder only if that left it empty: never a whole tree. A full
disk deletes them too (to give the space back) and says how much is needed;
401/403 says how to accept a gated licence and set HF_TOKEN; a lost or
stalled connection says that Resume continues.

Blocking: call it off the GUI thread. No Qt and no torch at import.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from app.models.entries import ModelEntry, slug
from app.models.errors import (
    ChecksumMismatchError,
    DownloadCancelledError,
    DownloadPausedError,
    HubAccessError,
    HubError,
    HubOfflineError,
    HubSlowError,
    ModelError,
    ModelStorageError,
)
from app.models.hub import (
    FileChoice,
    RemoteFile,
    RepoFiles,
    access_message,
    auth_headers,
    check_commit,
    check_file_name,
    check_repo_id,
    refuse_offline_mode,
)
from app.models.hub_http import content_length, hub_endpoint, hub_host, hub_read, hub_stream, whole_number
from engine.progress import format_bytes

if TYPE_CHECKING:
    from app.models.registry import ModelRegistry

log = logging.getLogger(__name__)

DOWNLOADS_FOLDER = ".downloads"
_CHUNK = 1 << 20
# A download must keep moving: at least STALL_BYTES in every STALL_SECONDS,
# its first answer included, or it stops as a lost connection (the part is
# kept for Resume). An overall deadline would cut a big model on a slow line;
# this cuts a server that trickles a byte every few seconds, which the
# per-read timeout never does. Module constants: the tests shrink them.
STALL_SECONDS = 60.0
STALL_BYTES = 64 << 10
MAX_SMALL_FILE_BYTES = 4 << 20  # config.json, read whole for the memory estimate


@dataclass(slots=True)
class DownloadControl:
    """Set `pause` or `cancel` from any thread; the download stops within a chunk."""

    pause: threading.Event = field(default_factory=threading.Event)
    cancel: threading.Event = field(default_factory=threading.Event)


@dataclass(slots=True, frozen=True)
class DownloadProgress:
    stage: str  # "download" | "check" | "import"
    file_name: str
    done_bytes: int
    total_bytes: int
    bytes_per_second: float = 0.0

    @property
    def fraction(self) -> float:
        return min(1.0, self.done_bytes / self.total_bytes) if self.total_bytes else 0.0

    @property
    def seconds_left(self) -> float | None:
        if self.bytes_per_second <= 0:
            return None
        return max(0.0, (self.total_bytes - self.done_bytes) / self.bytes_per_second)

    @property
    def detail(self) -> str:
        """'Downloading x.gguf: 12 MB of 80 MB, 4.1 MB/s, about 17 s left'."""
        if self.stage == "check":
            return f"Checking {self.file_name}…"
        if self.stage == "import":
            return f"Importing {self.file_name}…"
        text = f"Downloading {self.file_name}: {format_bytes(self.done_bytes)} of {format_bytes(self.total_bytes)}"
        if self.bytes_per_second > 0:
            text += f", {format_bytes(int(self.bytes_per_second))}/s"
            left = self.seconds_left
            if left is not None:
                text += f", about {format_duration(left)} left"
        return text


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def file_url(repo_id: str, commit: str, name: str) -> str:
    from huggingface_hub import hf_hub_url

    return hf_hub_url(repo_id, name, revision=commit, endpoint=hub_endpoint())


def download_folder(imports_dir: Path, listing: RepoFiles) -> Path:
    """Where the part files of this repository at this commit are kept:
    `.downloads/<repo slug>-<commit[:12]>`, the commit 40 hex digits."""
    repo_id = check_repo_id(listing.repo_id)
    commit = check_commit(listing.commit, repo_id)
    return inside(imports_dir / DOWNLOADS_FOLDER, f"{slug(repo_id)}-{commit[:12]}", repo_id)


def inside(base: Path, name: str, repo_id: str) -> Path:
    """`base / name`, refused unless it stays inside `base` once '..' and
    links are resolved: the last check before anything is written or deleted."""
    path = base / name
    resolved, root = path.resolve(), base.resolve()
    if resolved != root and resolved.is_relative_to(root):
        return path
    raise HubError(f"{path} leads outside {base} (a link?); nothing was written or deleted there. Remove it and "
                   f"download {repo_id} again.")


def _file_path(folder: Path, listing: RepoFiles, name: str) -> Path:
    return inside(folder, check_file_name(name, listing.repo_id), listing.repo_id)


def fetch_range(repo_id: str, commit: str, name: str, start: int, length: int) -> bytes:
    """`length` bytes of a file from `start` (a GGUF header, for the
    estimate), never more: a server that ignores the Range and sends the
    whole file is read only that far."""
    if length <= 0:
        return b""
    status, body = _get_bytes(repo_id, commit, name, {"Range": f"bytes={start}-{start + length - 1}"},
                              limit=length, cut=True)
    if status == 200 and start:
        raise HubError(f"{hub_host()} ignored the range asked of {name}; try again later.")
    return body


def fetch_small(repo_id: str, commit: str, name: str) -> bytes:
    """A whole small file (config.json), at most MAX_SMALL_FILE_BYTES."""
    return _get_bytes(repo_id, commit, name, {}, limit=MAX_SMALL_FILE_BYTES)[1]


def _get_bytes(repo_id: str, commit: str, name: str, extra: dict[str, str], *, limit: int,
               cut: bool = False) -> tuple[int, bytes]:
    refuse_offline_mode()
    status, body = hub_read(file_url(repo_id, commit, name), what=name, limit=limit, cut=cut,
                            headers={**auth_headers(), **extra})
    _raise_for_status(status, repo_id, name)
    return status, body


def _raise_for_status(status: int, repo_id: str, name: str) -> None:
    if status in (401, 403):
        raise HubAccessError(access_message(repo_id))
    if status == 404:
        raise HubError(f"{repo_id} has no file '{name}' at this revision; search again to see its files.")
    if status not in (200, 206):
        raise HubError(f"{hub_host()} answered {status} for {repo_id}/{name}; try again later.")


# ---------------------------------------------------------------------------
# Downloading


def download_choice(
    registry: ModelRegistry,
    listing: RepoFiles,
    choice: FileChoice,
    on_progress: Callable[[DownloadProgress], None] | None = None,
    control: DownloadControl | None = None,
) -> ModelEntry:
    """Download `choice` of `listing` and register it; see the module docstring.

    Raises DownloadPausedError (part files kept), DownloadCancelledError,
    HubAccessError, HubOfflineError (part files kept: Resume continues),
    ChecksumMismatchError, ModelStorageError (disk full), HubError, and the
    registry's errors when the downloaded model cannot be used."""
    control = control or DownloadControl()
    report = on_progress or (lambda progress: None)
    refuse_offline_mode()
    folder = download_folder(registry.imports_dir, listing)
    for remote in choice.files:  # every name checked before anything is written
        _file_path(folder, listing, remote.name + ".part")
    _refuse_duplicate(registry, listing, choice)
    total = choice.size
    try:
        _make_folder(folder)
        _check_space(folder, listing, choice)
        meter = _Meter(total, report)
        for remote in choice.files:
            _fetch_file(listing, remote, folder, meter, control)
        if control.cancel.is_set():
            raise DownloadCancelledError("The download was cancelled; nothing was kept.")
        if choice.kind == "gguf":
            entry = _register_gguf(registry, listing, choice, folder, report, control)
        else:
            entry = _register_folder(registry, listing, choice, folder, report)
    except (DownloadPausedError, HubOfflineError, KeyboardInterrupt):
        raise  # the part files stay: Resume (or the same command, after Ctrl+C) continues from them
    except BaseException:
        _discard(folder, listing, choice.files)
        raise
    _discard(folder, listing, choice.files)
    log.info("downloaded %s (%s) as %s", listing.repo_id, choice.label, entry.id)
    return entry


def partial_bytes(imports_dir: Path, listing: RepoFiles, choice: FileChoice) -> int:
    """How much of `choice` a paused or interrupted download has kept."""
    try:
        folder = download_folder(imports_dir, listing)
        candidates = [(_file_path(folder, listing, f.name), _file_path(folder, listing, f.name + ".part"))
                      for f in choice.files]
    except HubError:
        return 0  # a listing no download can use kept nothing
    done = 0
    for paths in candidates:
        for candidate in paths:
            if candidate.is_file():
                done += candidate.stat().st_size
                break
    return done


def discard_download(imports_dir: Path, listing: RepoFiles, choice: FileChoice | None = None) -> None:
    """Delete what a paused download of `choice` (None: of any choice of
    `listing`) kept; see `_discard`."""
    chosen = (choice,) if choice is not None else listing.choices
    files = {f.name: f for c in chosen for f in c.files}
    _discard(download_folder(imports_dir, listing), listing, files.values())


def _discard(folder: Path, listing: RepoFiles, files: Iterable[RemoteFile]) -> None:
    """Delete each of `files` and its part from `folder`, then `folder` (and
    the downloads folder) if that left it empty. Never a whole tree: what
    else is there, another choice's paused parts, stays."""
    for remote in files:
        for name in (remote.name, remote.name + ".part"):
            path = _file_path(folder, listing, name)
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:  # a folder by that name, say: not ours to remove
                log.warning("could not delete %s: %s", path, exc)
        parent = path.parent
        while parent != folder and parent.is_relative_to(folder):  # a name with folders in it
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent
    for empty in (folder, folder.parent):
        try:
            empty.rmdir()
        except FileNotFoundError:
            continue
        except OSError:
            return  # not empty: kept


class _Meter:
    """Bytes done over the whole choice, and the speed since this run started."""

    def __init__(self, total: int, report: Callable[[DownloadProgress], None]) -> None:
        self.total, self.report = total, report
        self.done = 0
        self.started = time.monotonic()
        self.fetched = 0  # bytes that came over the network in this run
        self._last = 0.0

    def add_existing(self, size: int) -> None:
        self.done += size

    def add(self, name: str, size: int) -> None:
        self.done += size
        self.fetched += size
        now = time.monotonic()
        if now - self._last >= 0.1 or self.done >= self.total:
            self._last = now
            elapsed = max(1e-3, now - self.started)
            self.report(DownloadProgress("download", name, self.done, self.total, self.fetched / elapsed))


def _fetch_file(listing: RepoFiles, remote: RemoteFile, folder: Path, meter: _Meter, control: DownloadControl) -> None:
    final = _file_path(folder, listing, remote.name)
    if final.is_file() and final.stat().st_size == remote.size:
        meter.add_existing(remote.size)  # checked in an earlier run
        return
    part = _file_path(folder, listing, remote.name + ".part")
    part.parent.mkdir(parents=True, exist_ok=True)
    cached = _from_hf_cache(listing, remote)
    if cached is not None:
        _copy(cached, part)
        meter.add_existing(remote.size)
    else:
        _stream(listing, remote, part, meter, control)
    meter.report(DownloadProgress("check", remote.name, meter.done, meter.total))
    _verify(part, remote)
    os.replace(part, final)


def _from_hf_cache(listing: RepoFiles, remote: RemoteFile) -> Path | None:
    """The file in the user's Hugging Face cache at this commit, if it is there."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(listing.repo_id, remote.name, revision=listing.commit)
    except Exception:  # a damaged cache is not a reason to fail: download instead
        return None
    return Path(found) if isinstance(found, str) and Path(found).is_file() else None


def _copy(source: Path, part: Path) -> None:
    try:
        shutil.copyfile(source, part)
    except OSError as exc:
        raise _storage_error(exc, part) from exc


def _stream(listing: RepoFiles, remote: RemoteFile, part: Path, meter: _Meter, control: DownloadControl) -> None:
    offset = part.stat().st_size if part.is_file() else 0
    if offset > remote.size:
        part.unlink()
        offset = 0
    meter.add_existing(offset)
    headers = auth_headers()
    if offset:
        headers["Range"] = f"bytes={offset}-"
    url = file_url(listing.repo_id, listing.commit, remote.name)
    try:
        with hub_stream(url, what=remote.name, seconds=STALL_SECONDS, headers=headers) as (response, deadline):
            if response.status_code == 416 and offset == remote.size:
                return  # complete already
            _raise_for_status(response.status_code, listing.repo_id, remote.name)
            if offset and response.status_code != 206:
                # The server sent the whole file: start over.
                meter.done -= offset
                offset = 0
            elif offset and _range_start(response) != offset:
                raise HubError(f"{hub_host()} answered the rest of {remote.name} with another part of it; it was "
                               "deleted. Download it again.")
            declared = content_length(response)
            if declared is not None and declared > remote.size - offset:
                raise _too_long(remote)
            try:
                with part.open("r+b" if offset else "wb") as out:
                    out.seek(offset)
                    moved = 0
                    # What the network delivers, as it arrives (a fixed chunk
                    # size would lose a half-filled chunk when the connection
                    # drops), written in pieces of at most _CHUNK so that a
                    # pause or a cancel is seen promptly.
                    for chunk in _pieces(response.iter_raw()):
                        if control.cancel.is_set():
                            raise DownloadCancelledError(
                                f"The download of {listing.repo_id} was cancelled; nothing was kept.")
                        if control.pause.is_set():
                            raise DownloadPausedError(
                                f"Paused after {format_bytes(meter.done)} of {format_bytes(meter.total)}; "
                                "Resume continues from there.")
                        if offset + len(chunk) > remote.size:
                            raise _too_long(remote)  # not a byte past the listed size reaches the disk
                        _write(out, chunk)
                        offset += len(chunk)
                        meter.add(remote.name, len(chunk))
                        moved += len(chunk)
                        if moved >= STALL_BYTES:
                            deadline.extend()
                            moved = 0
            except OSError as exc:
                raise _storage_error(exc, part) from exc
    except HubSlowError as exc:
        raise HubSlowError(
            f"{hub_host()} sent less than {format_bytes(STALL_BYTES)} of {remote.name} in {STALL_SECONDS:g} s, "
            f"after {format_bytes(meter.done)} of {format_bytes(meter.total)}. What was downloaded is kept: press "
            f"Resume (or run `tandem models download {listing.repo_id}` again) to continue from there."
        ) from exc
    except HubOfflineError as exc:
        raise HubOfflineError(
            f"The connection to Hugging Face was lost after {format_bytes(meter.done)} of "
            f"{format_bytes(meter.total)} ({type(exc.__cause__ or exc).__name__}). What was downloaded is kept: "
            f"press Resume (or run `tandem models download {listing.repo_id}` again) to continue from there."
        ) from exc


def _range_start(response: Any) -> int | None:
    """Where a 206's Content-Range ('bytes 100-999/1000') starts."""
    unit, _, rest = response.headers.get("Content-Range", "").partition(" ")
    return whole_number(rest.partition("-")[0]) if unit == "bytes" else None


def _too_long(remote: RemoteFile) -> ChecksumMismatchError:
    return ChecksumMismatchError(
        f"{hub_host()} sent more of {remote.name} than the {remote.size:,} bytes the repository lists; the download "
        "was stopped there and deleted. Download it again."
    )


def _pieces(chunks: Iterable[bytes]) -> Iterator[bytes]:
    for chunk in chunks:
        for start in range(0, len(chunk), _CHUNK):
            yield chunk[start:start + _CHUNK]


def _write(out: BinaryIO, chunk: bytes) -> None:
    """One chunk to the part file (its own function: the tests fill the disk here)."""
    out.write(chunk)


def _verify(path: Path, remote: RemoteFile) -> None:
    size = path.stat().st_size
    if size != remote.size:
        path.unlink(missing_ok=True)
        raise ChecksumMismatchError(
            f"{remote.name} arrived with {size} bytes instead of {remote.size}; it was deleted. Download it again."
        )
    if remote.sha256 is None:
        return  # a small file kept in git: the Hub lists no SHA-256 for it
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(_CHUNK), b""):
            digest.update(block)
    if digest.hexdigest() != remote.sha256.lower():
        path.unlink(missing_ok=True)
        raise ChecksumMismatchError(
            f"{remote.name} does not match the SHA-256 the repository lists (it may have been damaged on the "
            "way); it was deleted and nothing was registered. Download it again."
        )


def _storage_error(exc: OSError, where: Path) -> ModelStorageError:
    if exc.errno == errno.ENOSPC:
        return ModelStorageError(
            f"The disk holding {where.parent} is full; the partial download was deleted. Free some space "
            "(the model's size, twice for a GGUF file) and download again."
        )
    return ModelStorageError(f"Could not write {where}: {exc.strerror or exc}.")


def _make_folder(folder: Path) -> None:
    from engine import model_files as default_model

    try:
        default_model.make_private_folder(folder.parent.parent)
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _storage_error(exc, folder / "x") from exc


def _check_space(folder: Path, listing: RepoFiles, choice: FileChoice) -> None:
    parts = [_file_path(folder, listing, f.name + ".part") for f in choice.files]
    needed = choice.size - sum(part.stat().st_size for part in parts if part.is_file())
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise ModelStorageError(
            f"{choice.label} needs {format_bytes(needed)} more on disk and {format_bytes(free)} is free; "
            "free some space or choose a smaller file."
        )


# ---------------------------------------------------------------------------
# Registering


def hub_source(listing: RepoFiles, choice: FileChoice) -> Path:
    """What an entry's `source` records: 'owner/repo/file.gguf' or 'owner/repo'."""
    return Path(listing.repo_id) / choice.main_file.name if choice.kind == "gguf" else Path(listing.repo_id)


def _refuse_duplicate(registry: ModelRegistry, listing: RepoFiles, choice: FileChoice) -> None:
    from app.models.errors import DuplicateModelError

    source = hub_source(listing, choice)
    registry.reload()
    for entry in registry.models():
        if entry.source == source and entry.kind in ("gguf", "download"):
            raise DuplicateModelError(f"{source} is downloaded already as “{entry.name}”.", entry.id)


def _register_gguf(registry: ModelRegistry, listing: RepoFiles, choice: FileChoice, folder: Path,
                   report: Callable[[DownloadProgress], None], control: DownloadControl) -> ModelEntry:
    from app.models.errors import ImportCancelledError
    from app.models.importer import import_gguf_file

    remote = choice.main_file
    report(DownloadProgress("import", remote.name, choice.size, choice.size))
    try:
        return import_gguf_file(registry, _file_path(folder, listing, remote.name), cancel=control.cancel,
                                source=hub_source(listing, choice))
    except ImportCancelledError as exc:
        raise DownloadCancelledError(f"The download of {listing.repo_id} was cancelled; nothing was kept.") from exc


def _register_folder(registry: ModelRegistry, listing: RepoFiles, choice: FileChoice, folder: Path,
                     report: Callable[[DownloadProgress], None]) -> ModelEntry:
    from app.models.checks import check_model_folder
    from engine.model_files import discard_folder, fsync_dir, staging_path

    name = listing.repo_id.rsplit("/", 1)[-1]
    report(DownloadProgress("import", name, choice.size, choice.size))
    source = hub_source(listing, choice)
    model_id = registry.reserve_import(source)
    made = False
    try:
        dest = registry.imports_dir / model_id
        staging = staging_path(dest)
        try:
            try:
                staging.mkdir()
                made = True
                # Only this choice's files move: the download folder may hold another choice's paused parts.
                for remote in choice.files:
                    target = staging / remote.name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(_file_path(folder, listing, remote.name), target)
                fsync_dir(staging)
                fsync_dir(staging.parent)
            except OSError as exc:
                raise _storage_error(exc, dest) from exc
            try:
                check_model_folder(staging)
            except ModelError as exc:
                raise type(exc)(f"{listing.repo_id} was downloaded, but it cannot be used: {exc}") from exc
            os.rename(staging, dest)
            try:
                return registry.register(ModelEntry(model_id, name, dest, "download", source))
            except BaseException:
                discard_folder(dest)
                raise
        except BaseException:
            if made:  # the staging folder made just above (a fresh random name), never another
                shutil.rmtree(staging, ignore_errors=True)
            raise
    finally:
        registry.release_import(model_id)
