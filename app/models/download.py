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
- Each file's SHA-256 is checked against the repository's metadata before
  it is used; a mismatch deletes it (ChecksumMismatchError).
- Then it is registered like an import: a GGUF file through the GGUF
  importer (kept quantized; the download is deleted afterwards), a
  safetensors folder checked with the engine's rules and moved into
  `models/<id>` as a "download" entry. Nothing is registered before that
  succeeds, and a failure leaves no half model registered.

Pausing keeps the part files (DownloadPausedError), cancelling deletes them
(DownloadCancelledError). A full disk deletes them too (to give the space
back) and says how much is needed; 401/403 says how to accept a gated
licence and set HF_TOKEN; a lost connection says that Resume continues.

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
from typing import TYPE_CHECKING, BinaryIO

from app.models.entries import ModelEntry, slug
from app.models.errors import (
    ChecksumMismatchError,
    DownloadCancelledError,
    DownloadPausedError,
    HubAccessError,
    HubError,
    HubOfflineError,
    ModelError,
    ModelStorageError,
)
from app.models.hub import (
    FileChoice,
    RemoteFile,
    RepoFiles,
    access_message,
    auth_headers,
    hub_endpoint,
    refuse_offline_mode,
)
from engine.progress import format_bytes

if TYPE_CHECKING:
    from app.models.registry import ModelRegistry

log = logging.getLogger(__name__)

DOWNLOADS_FOLDER = ".downloads"
_CHUNK = 1 << 20
_TIMEOUT = 30.0


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
    """Where the part files of this repository at this commit are kept."""
    return imports_dir / DOWNLOADS_FOLDER / f"{slug(listing.repo_id)}-{listing.commit[:12]}"


def fetch_range(repo_id: str, commit: str, name: str, start: int, length: int) -> bytes:
    """`length` bytes of a file from `start` (a GGUF header, for the estimate)."""
    return _get_bytes(repo_id, commit, name, {"Range": f"bytes={start}-{start + max(0, length) - 1}"})


def fetch_small(repo_id: str, commit: str, name: str) -> bytes:
    """A whole small file (config.json)."""
    return _get_bytes(repo_id, commit, name, {})


def _get_bytes(repo_id: str, commit: str, name: str, extra: dict[str, str]) -> bytes:
    import httpx

    refuse_offline_mode()
    try:
        response = httpx.get(file_url(repo_id, commit, name), headers={**auth_headers(), **extra},
                             timeout=_TIMEOUT, follow_redirects=True)
    except httpx.HTTPError as exc:
        raise HubOfflineError(f"Hugging Face cannot be reached ({type(exc).__name__}); check the network.") from exc
    _raise_for_status(response.status_code, repo_id, name)
    return response.content


def _raise_for_status(status: int, repo_id: str, name: str) -> None:
    if status in (401, 403):
        raise HubAccessError(access_message(repo_id))
    if status == 404:
        raise HubError(f"{repo_id} has no file '{name}' at this revision; search again to see its files.")
    if status >= 400:
        raise HubError(f"Hugging Face answered {status} for {repo_id}/{name}; try again later.")


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
    _refuse_duplicate(registry, listing, choice)
    folder = download_folder(registry.imports_dir, listing)
    total = choice.size
    try:
        _make_folder(folder)
        _check_space(folder, choice)
        meter = _Meter(total, report)
        for remote in choice.files:
            _fetch_file(listing, remote, folder, meter, control)
        if control.cancel.is_set():
            raise DownloadCancelledError("The download was cancelled; nothing was kept.")
        if choice.kind == "gguf":
            entry = _register_gguf(registry, listing, choice, folder, report, control)
        else:
            entry = _register_folder(registry, listing, choice, folder, report)
    except DownloadPausedError:
        raise
    except HubOfflineError:
        raise  # the part files stay: Resume continues from them
    except DownloadCancelledError:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    shutil.rmtree(folder, ignore_errors=True)
    log.info("downloaded %s (%s) as %s", listing.repo_id, choice.label, entry.id)
    return entry


def partial_bytes(imports_dir: Path, listing: RepoFiles, choice: FileChoice) -> int:
    """How much of `choice` a paused or interrupted download has kept."""
    folder = download_folder(imports_dir, listing)
    done = 0
    for remote in choice.files:
        for candidate in (folder / remote.name, folder / (remote.name + ".part")):
            if candidate.is_file():
                done += candidate.stat().st_size
                break
    return done


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
    final = folder / remote.name
    if final.is_file() and final.stat().st_size == remote.size:
        meter.add_existing(remote.size)  # checked in an earlier run
        return
    part = folder / (remote.name + ".part")
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
    import httpx

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
        with httpx.stream("GET", url, headers=headers, timeout=_TIMEOUT, follow_redirects=True) as response:
            if response.status_code == 416 and offset == remote.size:
                return  # complete already
            _raise_for_status(response.status_code, listing.repo_id, remote.name)
            if offset and response.status_code != 206:
                # The server sent the whole file: start over.
                meter.done -= offset
                offset = 0
            try:
                with part.open("r+b" if offset else "wb") as out:
                    out.seek(offset)
                    # What the network delivers, as it arrives (a fixed chunk
                    # size would lose a half-filled chunk when the connection
                    # drops), written in pieces of at most _CHUNK so that a
                    # pause or a cancel is seen promptly.
                    for chunk in _pieces(response.iter_bytes()):
                        if control.cancel.is_set():
                            raise DownloadCancelledError(
                                f"The download of {listing.repo_id} was cancelled; nothing was kept.")
                        if control.pause.is_set():
                            raise DownloadPausedError(
                                f"Paused after {format_bytes(meter.done)} of {format_bytes(meter.total)}; "
                                "Resume continues from there.")
                        _write(out, chunk)
                        meter.add(remote.name, len(chunk))
            except OSError as exc:
                raise _storage_error(exc, part) from exc
    except httpx.HTTPError as exc:
        raise HubOfflineError(
            f"The connection to Hugging Face was lost after {format_bytes(meter.done)} of "
            f"{format_bytes(meter.total)} ({type(exc).__name__}). What was downloaded is kept: press Resume "
            f"(or run `tandem models download {listing.repo_id}` again) to continue from there."
        ) from exc


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
    from engine.formats import default_model

    try:
        default_model.make_private_folder(folder.parent.parent)
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _storage_error(exc, folder / "x") from exc


def _check_space(folder: Path, choice: FileChoice) -> None:
    needed = choice.size - sum(
        (folder / (f.name + ".part")).stat().st_size for f in choice.files if (folder / (f.name + ".part")).is_file()
    )
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
        return import_gguf_file(registry, folder / remote.name, cancel=control.cancel,
                                source=hub_source(listing, choice))
    except ImportCancelledError as exc:
        raise DownloadCancelledError(f"The download of {listing.repo_id} was cancelled; nothing was kept.") from exc


def _register_folder(registry: ModelRegistry, listing: RepoFiles, choice: FileChoice, folder: Path,
                     report: Callable[[DownloadProgress], None]) -> ModelEntry:
    from app.models.checks import check_model_folder
    from engine.formats.staged_folder import discard_folder, fsync_dir, staging_path

    name = listing.repo_id.rsplit("/", 1)[-1]
    report(DownloadProgress("import", name, choice.size, choice.size))
    source = hub_source(listing, choice)
    model_id = registry.reserve_import(source)
    try:
        dest = registry.imports_dir / model_id
        staging = staging_path(dest)
        try:
            os.rename(folder, staging)
            fsync_dir(staging.parent)
        except OSError as exc:
            raise _storage_error(exc, dest) from exc
        try:
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
            shutil.rmtree(staging, ignore_errors=True)
            raise
    finally:
        registry.release_import(model_id)
