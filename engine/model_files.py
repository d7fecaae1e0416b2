"""Where model folders live and how they are written: the user's private
data folder, the built-in default model, importing a GGUF file into a
folder, and the staging rules that keep an interrupted write from ever
being taken for a model.

The app's model registry, downloads and chat store use these, never the
modules under engine/formats directly. Light at import (no torch, numpy or
gguf): `import_gguf` loads the importer on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from engine.formats.default_model import (
    DEFAULT_MODEL_NAME,
    PRIVATE_FOLDER_MODE,
    data_dir,
    default_gguf_path,
    make_private_folder,
    models_dir,
)
from engine.formats.staged_folder import discard_folder, fsync_dir, staging_path

__all__ = [
    "DEFAULT_MODEL_NAME", "PRIVATE_FOLDER_MODE", "data_dir", "default_gguf_path", "discard_folder", "fsync_dir",
    "import_gguf", "make_private_folder", "models_dir", "staging_path",
]


def __getattr__(name: str) -> Any:
    if name == "import_gguf":  # numpy and gguf: only when a file is imported
        return importlib.import_module("engine.formats.gguf.importer").import_gguf
    raise AttributeError(f"module 'engine.model_files' has no attribute {name!r}")
