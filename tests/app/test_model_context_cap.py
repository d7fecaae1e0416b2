"""A model's context cap in the registry: set, cleared, saved, refused, and
what it does to the memory estimate and the engine's options."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from app.models.memory_estimate import ModelShape, estimate_memory
from app.models.registry import InvalidContextError, ModelError, ModelRegistry, UnknownModelError


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "data"
    monkeypatch.setenv("TANDEM_DATA_DIR", str(folder))
    return folder


@pytest.fixture
def registry(data_dir: Path) -> ModelRegistry:
    return ModelRegistry(data_dir / "models.json")


@pytest.fixture
def model_folder(tiny_model_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_model_dir, tmp_path / "Tiny Llama"))


def test_a_cap_is_set_saved_passed_to_the_engine_and_cleared(
    registry: ModelRegistry, model_folder: Path, data_dir: Path
) -> None:
    entry = registry.add_folder(model_folder)
    assert entry.max_context is None
    assert registry.trained_context(entry.id) == 2048  # the tiny model's config.json
    assert "max_context" not in registry.engine_options(entry.id)

    capped = registry.set_max_context(entry.id, 512)
    assert capped.max_context == 512 and registry.get(entry.id).max_context == 512
    assert registry.engine_options(entry.id) == {"max_context": 512}
    saved = json.loads((data_dir / "models.json").read_text())["models"][0]
    assert saved["max_context"] == 512
    assert ModelRegistry(data_dir / "models.json").get(entry.id).max_context == 512

    registry.set_quantize(entry.id, "int8")
    assert registry.engine_options(entry.id) == {"quantize": "int8", "max_context": 512}

    assert registry.set_max_context(entry.id, None).max_context is None
    assert "max_context" not in json.loads((data_dir / "models.json").read_text())["models"][0]
    assert ModelRegistry(data_dir / "models.json").get(entry.id).max_context is None
    # The whole trained context is a valid cap too.
    assert registry.set_max_context(entry.id, 2048).max_context == 2048


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (0, "choose a context length from 1 to 2048"),
        (-5, "choose a context length from 1 to 2048"),
        (4096, "trained for a context of 2048 tokens"),
        (1.5, "whole number of tokens"),
        ("512", "whole number of tokens"),
        (True, "whole number of tokens"),
    ],
)
def test_a_cap_the_model_cannot_take_is_refused_and_nothing_changes(
    registry: ModelRegistry, model_folder: Path, data_dir: Path, value: object, words: str
) -> None:
    entry = registry.add_folder(model_folder)
    registry.set_max_context(entry.id, 1024)
    with pytest.raises(InvalidContextError, match=words) as caught:
        registry.set_max_context(entry.id, value)  # type: ignore[arg-type]
    assert isinstance(caught.value, ModelError)
    assert registry.get(entry.id).max_context == 1024
    assert ModelRegistry(data_dir / "models.json").get(entry.id).max_context == 1024


def test_a_cap_needs_the_models_files_to_be_checked(registry: ModelRegistry, model_folder: Path) -> None:
    entry = registry.add_folder(model_folder)
    shutil.rmtree(model_folder)
    assert registry.trained_context(entry.id) is None
    with pytest.raises(InvalidContextError, match="cannot be read now"):
        registry.set_max_context(entry.id, 256)
    # Going back to the trained context needs no check.
    assert registry.set_max_context(entry.id, None).max_context is None
    with pytest.raises(UnknownModelError):
        registry.set_max_context("nope", 256)


def test_older_and_odd_models_json_files_still_load(data_dir: Path, model_folder: Path) -> None:
    data_dir.mkdir()
    path = data_dir / "models.json"
    older = {"id": "tiny", "name": "Tiny", "kind": "folder", "path": str(model_folder)}
    odd = {"id": "odd", "name": "Odd", "kind": "folder", "path": str(model_folder), "max_context": "lots"}
    path.write_text(json.dumps({"version": 1, "models": [older, odd], "default": {"max_context": -1}}))
    registry = ModelRegistry(path)
    assert registry.load_warning is None
    assert registry.get("tiny").max_context is None
    assert registry.get("odd").max_context is None  # dropped; the model itself is kept
    assert registry.get("default").max_context is None


def test_the_built_in_models_cap_is_kept_in_the_files_default_section(
    registry: ModelRegistry, data_dir: Path
) -> None:
    trained = registry.trained_context("default")
    assert trained is not None and trained >= 2048
    assert registry.set_max_context("default", 1024).max_context == 1024
    assert registry.engine_options("default") == {"max_context": 1024}
    assert json.loads((data_dir / "models.json").read_text())["default"] == {"max_context": 1024}
    reopened = ModelRegistry(data_dir / "models.json")
    assert reopened.get("default").max_context == 1024 and reopened.models()[0].max_context == 1024
    with pytest.raises(InvalidContextError, match=f"from 1 to {trained}"):
        registry.set_max_context("default", trained + 1)
    registry.set_max_context("default", None)
    assert "default" not in json.loads((data_dir / "models.json").read_text())


def test_a_capped_model_is_estimated_with_a_smaller_kv_pool(registry: ModelRegistry, model_folder: Path) -> None:
    """The CPU pool is capped at 8 sequences at full context, so capping the
    tiny model's 2048 tokens to 256 shrinks it; the weights stay the same."""
    entry = registry.add_folder(model_folder)
    full = registry.estimate_memory(entry.id, device="cpu", dtype="float32")
    registry.set_max_context(entry.id, 256)
    capped = registry.estimate_memory(entry.id, device="cpu", dtype="float32")
    assert capped.kv_bytes < full.kv_bytes and capped.kv_bytes * 8 == full.kv_bytes
    assert capped.weights_bytes == full.weights_bytes
    # An explicit choice overrides the entry's, as for quantize.
    assert registry.estimate_memory(entry.id, device="cpu", dtype="float32", max_context=None) == full


def test_estimate_sizes_the_pool_by_the_capped_context() -> None:
    shape = ModelShape(
        matmul_params=1000, embedding_params=200, lm_head_params=0, norm_params=10, bias_params=6,
        num_layers=2, num_kv_heads=2, head_dim=4, max_context=64,
    )
    per_page = 2 * 2 * 16 * 2 * 4 * 4
    assert estimate_memory(shape, "cpu", "float32").kv_bytes == 8 * 4 * per_page
    assert estimate_memory(shape, "cpu", "float32", max_context=32).kv_bytes == 8 * 2 * per_page
    # A cap above the trained context changes nothing (the engine refuses it anyway).
    assert estimate_memory(shape, "cpu", "float32", max_context=1000).kv_bytes == 8 * 4 * per_page
