"""Importing a GGUF file into the model list: a job that checks the file,
converts it with the engine's importer into the registry's imports folder,
checks the result as the engine would load it, and only then registers it.

A failure or a cancel at any point leaves neither an entry nor a folder
behind; two imports of one file at once are refused.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from app.models.checks import check_gguf_file, check_model_folder, gguf_error
from app.models.entries import ModelEntry
from app.models.errors import ImportCancelledError, ModelError, ModelStorageError
from engine.errors import FolderWriteError, LoadCancelled, ModelLoadError
from engine.model_files import import_gguf
from engine.model_files import discard_folder
from engine.progress import LoadProgress

if TYPE_CHECKING:
    from app.models.registry import ModelRegistry

log = logging.getLogger(__name__)


def import_gguf_file(
    registry: ModelRegistry,
    path: Path,
    on_progress: Callable[[LoadProgress], None] | None = None,
    cancel: threading.Event | None = None,
    source: Path | None = None,
) -> ModelEntry:
    """ModelRegistry.import_gguf: see there. `source`: what the entry
    records as its origin when it is not `path` (a download records
    'owner/repo/file.gguf'; its file is deleted after the import)."""
    file = path.expanduser().resolve()
    origin = source or file
    # The header and the file's length first: a truncated download is then
    # refused in a fraction of a second. Read here, so that an OSError from
    # the importer below can only be about writing the copy.
    check_gguf_file(file)
    model_id = registry.reserve_import(origin)
    dest = registry.imports_dir / model_id
    cancelled = f"The import of {file.name} was cancelled; nothing was kept."
    try:
        try:
            import_gguf(file, dest, on_progress=on_progress, cancel=cancel)
        except LoadCancelled as exc:
            raise ImportCancelledError(cancelled) from exc
        except FolderWriteError as exc:  # disk full, read-only
            raise ModelStorageError(str(exc)) from exc
        except ModelLoadError as exc:
            raise gguf_error(exc) from exc
        try:
            if cancel is not None and cancel.is_set():
                raise ImportCancelledError(cancelled)
            # The importer converts faithfully, but the engine may still
            # refuse what it wrote (e.g. a RoPE scaling it does not run).
            try:
                check_model_folder(dest)
            except ModelError as exc:
                raise type(exc)(f"{file.name} was converted, but the result cannot be used: {exc}") from exc
            entry = registry.register(ModelEntry(model_id, origin.stem, dest, "gguf", origin))
        except BaseException:
            discard_folder(dest)
            raise
    finally:
        registry.release_import(model_id)
    log.info("imported %s as %s", origin, model_id)
    return entry
