"""The model registry and the memory estimate, on real folders, GGUF files and engines.

Tiny GGUF files come from tests/engine/test_gguf_import.py's writer (a
2-layer model with a ~270-token vocabulary imports in milliseconds); the
default model's GGUF is only read, truncated, never imported here.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from app.models.memory_estimate import (
    LoadedModel,
    MemoryEstimate,
    ModelShape,
    QuantizedWeights,
    available_memory,
    check_fits,
    cpu_available_memory,
    estimate_memory,
    parse_meminfo,
)
from app.models.registry import (
    CorruptGGUFError,
    CorruptWeightsError,
    DefaultModelError,
    DuplicateModelError,
    ImportCancelledError,
    ModelConfigError,
    ModelEntry,
    ModelError,
    ModelNotSupportedError,
    ModelRegistry,
    ModelTokenizerError,
    ModelUnavailableError,
    NotAModelError,
    PickleOnlyError,
    UnknownModelError,
    read_gguf_summary,
)
from engine.model.config import ModelConfig
from engine.formats.default_model import default_gguf_path
from engine.formats.loader import quantized_copy
from engine.model.quant import ConcatLinear, QuantizedTensor, cpu_kernel_available
from engine.progress import LoadProgress, format_bytes
from tests.engine.test_gguf_import import TinyModel, write_gguf


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private data folder: the default model is not imported there."""
    folder = tmp_path / "data"
    monkeypatch.setenv("TANDEM_DATA_DIR", str(folder))
    return folder


@pytest.fixture
def registry(data_dir: Path) -> ModelRegistry:
    return ModelRegistry(data_dir / "models.json")


@pytest.fixture
def model_folder(tiny_model_dir: Path, tmp_path: Path) -> Path:
    """A copy of the tiny model the test may damage."""
    return Path(shutil.copytree(tiny_model_dir, tmp_path / "Tiny Llama"))


def leftovers(folder: Path) -> list[str]:
    """Everything in a folder, hidden staging folders included."""
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def user_ids(registry: ModelRegistry) -> list[str]:
    return [entry.id for entry in registry.models() if entry.kind != "default"]


# ---------------------------------------------------------------------------
# The default model


def test_the_default_is_listed_first_and_cannot_be_removed(registry: ModelRegistry) -> None:
    default = registry.models()[0]
    assert (default.id, default.kind, default.name) == ("default", "default", "SmolLM2-135M-Instruct")
    assert registry.engine_model("default") == "default"
    assert default.available() and not default.removable
    with pytest.raises(DefaultModelError, match="built in"):
        registry.remove("default")
    with pytest.raises(UnknownModelError, match="no model 'nope'"):
        registry.get("nope")


def test_default_details_before_its_import_come_from_the_gguf_header(registry: ModelRegistry) -> None:
    details = registry.details("default")
    assert details.path is None
    assert "imported on first use" in details.source
    assert details.architecture == "Llama (llama)"
    assert details.parameters == 134_515_008  # SmolLM2-135M
    assert details.context_length == 8192
    assert details.dtype == "Q4_1 (GGUF)"
    assert details.size_on_disk_bytes == default_gguf_path().stat().st_size


def test_default_details_after_its_import_describe_the_imported_folder(
    default_model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TANDEM_DATA_DIR", str(default_model_dir.parent.parent))
    before_import = ModelRegistry(tmp_path / "models.json")
    details = before_import.details("default")
    assert details.path == default_model_dir
    assert details.parameters == 134_515_008
    # Kept quantized as the GGUF file stores it: the layers' Q4_1 blocks, the
    # embedding's Q8_0 ones.
    assert details.dtype == "q4_1 + q8_0 blocks (from a Q4_1 GGUF)"
    assert details.quantized and details.stored.formats == ("q4_1", "q8_0")
    assert details.architecture == "Llama (llama)"
    # The GGUF header and the imported config describe the same model, and
    # the header predicts what the import keeps quantized.
    summary = read_gguf_summary(default_gguf_path())
    assert details.shape == ModelShape.from_config(ModelConfig.from_folder(default_model_dir))
    assert details.shape == summary.shape()
    assert details.stored == summary.kept_formats()
    assert details.stored.embedding == "q8_0" and details.stored.lm_head is None  # tied
    assert details.stored.matmul == (("q4_1", details.shape.matmul_params),)
    # The size is the folder's own, not the folder plus the built-in GGUF it came from.
    assert details.size_on_disk_bytes == sum(
        p.stat().st_size for p in default_model_dir.rglob("*") if p.is_file()
    )
    assert f"imported once ({format_bytes(details.size_on_disk_bytes)})" in details.source


# ---------------------------------------------------------------------------
# Adding folders


def test_an_added_folder_is_checked_registered_and_kept(
    registry: ModelRegistry, model_folder: Path, data_dir: Path
) -> None:
    entry = registry.add_folder(model_folder)
    assert entry == ModelEntry("tiny-llama", "Tiny Llama", model_folder.resolve(), "folder")
    assert registry.engine_model(entry.id) == str(model_folder.resolve())

    details = registry.details(entry.id)
    tensors = load_file(model_folder / "model.safetensors")
    assert details.parameters == sum(t.numel() for t in tensors.values())
    assert details.architecture == "Llama (llama)"
    assert (details.context_length, details.dtype) == (2048, "float32")
    assert details.size_on_disk_bytes == sum(p.stat().st_size for p in model_folder.iterdir())

    reopened = ModelRegistry(data_dir / "models.json")
    assert reopened.load_warning is None
    assert reopened.models() == registry.models()
    # Written atomically: nothing but the file itself is left in the folder.
    assert leftovers(data_dir) == ["models.json"]


def test_the_same_folder_twice_is_refused(registry: ModelRegistry, model_folder: Path, tmp_path: Path) -> None:
    first = registry.add_folder(model_folder)
    link = tmp_path / "link-to-tiny"
    link.symlink_to(model_folder)
    for again in (model_folder, model_folder / ".", link):
        with pytest.raises(DuplicateModelError, match="already in the list") as caught:
            registry.add_folder(again)
        assert caught.value.existing_id == first.id
    assert user_ids(registry) == [first.id]


def test_folders_with_the_same_name_get_distinct_ids(registry: ModelRegistry, tiny_model_dir: Path, tmp_path: Path) -> None:
    a = shutil.copytree(tiny_model_dir, tmp_path / "a" / "tiny")
    b = shutil.copytree(tiny_model_dir, tmp_path / "b" / "tiny")
    assert [registry.add_folder(a).id, registry.add_folder(b).id] == ["tiny", "tiny-2"]


def _drop_tensor(folder: Path) -> None:
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(folder / "model.safetensors"))


def _reshape_tensor(folder: Path) -> None:
    tensors = load_file(folder / "model.safetensors")
    tensors["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(8, 64)
    save_file(tensors, str(folder / "model.safetensors"))


def _truncate(folder: Path) -> None:
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])


def _garbage_header(folder: Path) -> None:
    path = folder / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[8:64] = b"\xff" * 56  # the JSON header's first bytes
    path.write_bytes(bytes(data))


def _no_tokenizer(folder: Path) -> None:
    (folder / "tokenizer.json").unlink()


def _broken_tokenizer(folder: Path) -> None:
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": 17}')


def _pickle_only(folder: Path) -> None:
    # Never opened: the point is that it is refused unread.
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")


def _other_architecture(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    config["model_type"], config["architectures"] = "gpt2", ["GPT2LMHeadModel"]
    (folder / "config.json").write_text(json.dumps(config))


def _bad_config(folder: Path) -> None:
    (folder / "config.json").write_text('{"model_type": "llama", "hidden_size": 64')


def _no_config(folder: Path) -> None:
    (folder / "config.json").unlink()


@pytest.mark.parametrize(
    ("damage", "error", "words"),
    [
        (_no_tokenizer, ModelTokenizerError, "no tokenizer.json"),
        (_broken_tokenizer, ModelTokenizerError, "tokenizer.json cannot be read"),
        (_truncate, CorruptWeightsError, "not a readable safetensors file"),
        (_garbage_header, CorruptWeightsError, "download it again"),
        (_drop_tensor, CorruptWeightsError, "model.layers.1.mlp.up_proj.weight"),
        (_reshape_tensor, CorruptWeightsError, "config.json implies"),
        (_pickle_only, PickleOnlyError, "pickle checkpoints \\(pytorch_model.bin\\)"),
        (_other_architecture, ModelNotSupportedError, "Unsupported architecture 'gpt2'"),
        (_bad_config, ModelConfigError, "not valid JSON"),
        (_no_config, NotAModelError, "is not a model folder"),
    ],
)
def test_a_bad_folder_is_refused_with_a_clear_message_and_nothing_registered(
    registry: ModelRegistry, model_folder: Path, data_dir: Path, damage, error, words: str
) -> None:
    damage(model_folder)
    with pytest.raises(error, match=words):
        registry.add_folder(model_folder)
    assert user_ids(registry) == []
    assert not (data_dir / "models.json").exists()


def test_a_missing_path_or_a_file_is_not_a_model_folder(registry: ModelRegistry, tmp_path: Path) -> None:
    with pytest.raises(NotAModelError, match="does not exist"):
        registry.add_folder(tmp_path / "nowhere")
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(NotAModelError, match="is not a folder"):
        registry.add_folder(tmp_path / "notes.txt")


def test_a_folder_that_disappears_is_reported_not_crashed_on(registry: ModelRegistry, model_folder: Path) -> None:
    entry = registry.add_folder(model_folder)
    model_folder.rename(model_folder.with_name("moved"))
    entry = registry.get(entry.id)
    assert not entry.available()
    with pytest.raises(ModelUnavailableError, match="is gone"):
        registry.engine_model(entry.id)
    with pytest.raises(ModelUnavailableError):
        registry.details(entry.id)
    registry.remove(entry.id)  # it can still be removed
    assert user_ids(registry) == []


def test_removing_a_folder_only_unregisters_it(registry: ModelRegistry, model_folder: Path) -> None:
    entry = registry.add_folder(model_folder)
    files = leftovers(model_folder)
    assert registry.remove(entry.id) == entry
    assert user_ids(registry) == []
    assert leftovers(model_folder) == files


# ---------------------------------------------------------------------------
# Quantize at load


def test_the_quantize_choice_is_kept_per_model_in_models_json(
    registry: ModelRegistry, model_folder: Path, tiny_model_dir: Path, tmp_path: Path, data_dir: Path
) -> None:
    entry = registry.add_folder(model_folder)
    other = registry.add_folder(shutil.copytree(tiny_model_dir, tmp_path / "Other"))
    assert entry.quantize is None and registry.engine_options(entry.id) == {}

    assert registry.set_quantize(entry.id, "int4").quantize == "int4"
    reopened = ModelRegistry(data_dir / "models.json")
    assert reopened.load_warning is None
    assert reopened.get(entry.id).quantize == "int4" and reopened.get(other.id).quantize is None
    assert reopened.engine_options(entry.id) == {"quantize": "int4"}
    assert reopened.engine_options(other.id) == {}
    # Ids the registry does not know (a folder given with --model) add nothing.
    assert reopened.engine_options("/some/folder") == {} == reopened.engine_options("default")
    saved = json.loads((data_dir / "models.json").read_text())["models"]
    assert [m.get("quantize") for m in saved] == ["int4", None]

    reopened.set_quantize(entry.id, None)
    assert ModelRegistry(data_dir / "models.json").get(entry.id).quantize is None
    assert "quantize" not in json.loads((data_dir / "models.json").read_text())["models"][0]


def test_quantize_choices_that_cannot_apply_are_refused(registry: ModelRegistry, model_folder: Path, data_dir: Path) -> None:
    entry = registry.add_folder(model_folder)
    with pytest.raises(ModelError, match="Unknown quantization 'int2'"):
        registry.set_quantize(entry.id, "int2")
    with pytest.raises(DefaultModelError, match="stored quantized already"):
        registry.set_quantize("default", "int8")
    assert ModelRegistry(data_dir / "models.json").get(entry.id).quantize is None


def test_an_unknown_quantize_choice_in_models_json_keeps_the_model(data_dir: Path, model_folder: Path) -> None:
    data_dir.mkdir()
    path = data_dir / "models.json"
    item = {"id": "tiny", "name": "Tiny", "kind": "folder", "path": str(model_folder), "quantize": "int2"}
    path.write_text(json.dumps({"version": 1, "models": [item]}))
    registry = ModelRegistry(path)
    assert registry.load_warning is None
    assert registry.get("tiny").quantize is None  # run as stored


# ---------------------------------------------------------------------------
# Importing GGUF files


@pytest.fixture
def tiny_gguf(tmp_path: Path) -> Path:
    path = tmp_path / "Tiny-Chat.Q8_0.gguf"
    write_gguf(path, TinyModel(layers=3))
    return path


def test_a_gguf_import_reports_progress_registers_and_removes_cleanly(
    registry: ModelRegistry, tiny_gguf: Path, data_dir: Path
) -> None:
    reports: list[LoadProgress] = []
    entry = registry.import_gguf(tiny_gguf, on_progress=reports.append)
    assert (entry.id, entry.kind, entry.name, entry.source) == ("tiny-chat-q8-0", "gguf", "Tiny-Chat.Q8_0", tiny_gguf)
    assert entry.path == data_dir / "models" / "tiny-chat-q8-0"
    assert registry.engine_model(entry.id) == str(entry.path)

    assert {r.stage for r in reports} == {"import"} and len(reports) > 3
    assert [r.done for r in reports] == sorted(r.done for r in reports)
    assert reports[-1].done == reports[-1].total > 0

    details = registry.details(entry.id)
    assert details.source == f"Imported from {tiny_gguf}"
    assert details.dtype == "float32"
    assert details.parameters == read_gguf_summary(tiny_gguf).parameters

    with pytest.raises(DuplicateModelError, match="already imported"):
        registry.import_gguf(tiny_gguf)
    assert ModelRegistry(data_dir / "models.json").get(entry.id) == entry

    registry.remove(entry.id)
    assert leftovers(data_dir / "models") == []  # the imported copy is deleted
    assert tiny_gguf.is_file()  # the user's file is not


def test_a_cancelled_import_leaves_nothing(registry: ModelRegistry, tiny_gguf: Path, data_dir: Path) -> None:
    cancel = threading.Event()
    reports: list[LoadProgress] = []

    def progress(report: LoadProgress) -> None:
        reports.append(report)
        if report.done > 0:
            cancel.set()

    with pytest.raises(ImportCancelledError, match="cancelled; nothing was kept"):
        registry.import_gguf(tiny_gguf, on_progress=progress, cancel=cancel)
    assert 0 < reports[-1].done < reports[-1].total  # stopped half way
    assert user_ids(registry) == []
    assert leftovers(data_dir / "models") == []
    assert not (data_dir / "models.json").exists()


def test_one_file_is_not_imported_twice_at_once(registry: ModelRegistry, tiny_gguf: Path) -> None:
    started, release = threading.Event(), threading.Event()
    outcome: list[object] = []

    def hold(report: LoadProgress) -> None:
        started.set()
        release.wait(30)

    worker = threading.Thread(
        target=lambda: outcome.append(registry.import_gguf(tiny_gguf, on_progress=hold)), daemon=True
    )
    worker.start()
    try:
        assert started.wait(30)
        with pytest.raises(DuplicateModelError, match="is being imported already"):
            registry.import_gguf(tiny_gguf)
    finally:
        release.set()
        worker.join(30)
    assert [entry.id for entry in outcome] == ["tiny-chat-q8-0"] == user_ids(registry)


def test_a_yarn_gguf_imports_and_its_scaling_is_kept(
    registry: ModelRegistry, tmp_path: Path, data_dir: Path
) -> None:
    # YaRN (Qwen2.5 / Qwen3 long-context files) was converted but refused by
    # the engine until it ran it: the import now registers a usable model.
    path = tmp_path / "yarn.gguf"
    write_gguf(path, kv={
        "llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0,
        "llama.rope.scaling.original_context_length": 64,
    })
    entry = registry.import_gguf(path)
    assert user_ids(registry) == [entry.id]
    config = ModelConfig.from_folder(entry.path)
    assert (config.rope_scaling.rope_type, config.rope_scaling.factor) == ("yarn", 4.0)
    assert config.rope_scaling.original_max_position_embeddings == 64


def test_garbage_is_not_a_gguf_file(registry: ModelRegistry, tmp_path: Path, data_dir: Path) -> None:
    plain = tmp_path / "model.gguf"
    plain.write_bytes(b"PK\x03\x04" + bytes(range(256)) * 40)
    with pytest.raises(CorruptGGUFError, match="not a GGUF file"):
        registry.import_gguf(plain)
    signed = tmp_path / "signed.gguf"
    signed.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 5000)
    with pytest.raises(CorruptGGUFError, match="ends too early or is damaged.*Download it again"):
        registry.import_gguf(signed)
    big_endian = tmp_path / "big-endian.gguf"
    big_endian.write_bytes(b"GGUF" + (3).to_bytes(4, "big") + bytes(64))
    with pytest.raises(ModelNotSupportedError, match="big-endian"):
        registry.import_gguf(big_endian)
    incomplete = tmp_path / "incomplete.gguf"
    write_gguf(incomplete, drop=("blk.1.ffn_up.weight",))
    with pytest.raises(CorruptGGUFError, match="lacks tensors the model needs \\(blk.1.ffn_up.weight"):
        registry.import_gguf(incomplete)
    assert user_ids(registry) == []
    assert leftovers(data_dir / "models") == []


def test_a_truncated_real_gguf_is_refused_and_leaves_nothing(
    registry: ModelRegistry, tmp_path: Path, data_dir: Path
) -> None:
    source = default_gguf_path()
    truncated = tmp_path / "SmolLM2-truncated.gguf"
    with source.open("rb") as file:
        truncated.write_bytes(file.read(source.stat().st_size * 3 // 5))
    with pytest.raises(CorruptGGUFError, match="is truncated: its header describes 98 MB but the file has 59 MB"):
        registry.import_gguf(truncated)
    # The details reader stops at the end of the metadata just as clearly.
    header_only = tmp_path / "header-only.gguf"
    with source.open("rb") as file:
        header_only.write_bytes(file.read(4096))
    with pytest.raises(CorruptGGUFError, match="ends too early"):
        read_gguf_summary(header_only)
    assert user_ids(registry) == []
    assert leftovers(data_dir / "models") == []


def test_a_gguf_path_that_is_a_folder_or_missing_is_refused(registry: ModelRegistry, tmp_path: Path) -> None:
    with pytest.raises(NotAModelError, match="does not exist"):
        registry.import_gguf(tmp_path / "missing.gguf")
    with pytest.raises(NotAModelError, match="is not a file"):
        registry.import_gguf(tmp_path)


# ---------------------------------------------------------------------------
# models.json


def test_a_corrupt_models_json_is_kept_aside_and_the_defaults_used(data_dir: Path) -> None:
    data_dir.mkdir()
    path = data_dir / "models.json"
    path.write_text('{"version": 1, "models": [')
    registry = ModelRegistry(path)
    assert [e.id for e in registry.models()] == ["default"]
    assert registry.load_warning is not None
    assert "not valid JSON" in registry.load_warning and "models.json.bad" in registry.load_warning
    assert (data_dir / "models.json.bad").read_text() == '{"version": 1, "models": ['


def test_valid_entries_of_a_partly_bad_models_json_are_kept(data_dir: Path, model_folder: Path) -> None:
    data_dir.mkdir()
    path = data_dir / "models.json"
    good = {"id": "tiny", "name": "Tiny", "kind": "folder", "path": str(model_folder)}
    path.write_text(json.dumps({"version": 1, "models": [good, {"id": "x", "kind": "spaceship", "name": "X"}, "junk"]}))
    registry = ModelRegistry(path)
    assert user_ids(registry) == ["tiny"]
    assert "spaceship" in (registry.load_warning or "")
    assert (data_dir / "models.json.bad").exists()
    # The good entry was saved again, so it survives the next start too.
    again = ModelRegistry(path)
    assert again.load_warning is None and user_ids(again) == ["tiny"]


def test_a_registry_that_cannot_be_written_keeps_nothing_half_done(
    tmp_path: Path, model_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.models.registry import ModelStorageError

    # A file where the data folder should be: no write below it can succeed,
    # whoever runs the test (permissions do not stop root).
    blocker = tmp_path / "blocked"
    blocker.write_text("not a folder")
    monkeypatch.setenv("TANDEM_DATA_DIR", str(blocker))
    registry = ModelRegistry(blocker / "models.json")
    with pytest.raises(ModelStorageError, match="Could not save the model list"):
        registry.add_folder(model_folder)
    assert user_ids(registry) == []
    write_gguf(tmp_path / "t.gguf")
    with pytest.raises(ModelStorageError, match="Could not write the imported model"):
        registry.import_gguf(tmp_path / "t.gguf")
    assert user_ids(registry) == []


# ---------------------------------------------------------------------------
# Memory


def _loaded_bytes(engine) -> int:
    """Bytes of every distinct tensor a loaded model holds, oneDNN copies and
    quantized blocks included (a tied head's blocks are the embedding's)."""
    model = engine.model
    tensors = [model.norm]

    def add(weight: torch.Tensor | QuantizedTensor) -> None:
        if isinstance(weight, QuantizedTensor):
            tensors.extend(t for t in (weight.data, weight.scales, weight.mins) if t is not None)
        else:
            tensors.append(weight)

    add(model.embed)
    products = [model.lm_head]
    for layer in model.layers:
        tensors += [layer.input_norm, layer.post_norm]
        products += [layer.qkv, layer.o, layer.gate_up, layer.down]
    total, seen = 0, set()
    while products:
        product = products.pop()
        if isinstance(product, ConcatLinear):
            products += product.parts
            continue
        add(product.weight)
        if product.bias is not None:
            tensors.append(product.bias)
        packed = getattr(product, "_packed", None)
        if packed is not None:  # opaque oneDNN tensor: no storage to dedupe by
            total += packed.numel() * packed.element_size()
    for tensor in tensors:
        pointer = tensor.untyped_storage().data_ptr()
        if pointer not in seen:
            seen.add(pointer)
            total += tensor.untyped_storage().nbytes()
    return total


@pytest.mark.parametrize(("dtype", "kv_cache_mb"), [("float32", None), ("float32", 1), ("bfloat16", 1)])
def test_the_estimate_matches_what_the_engine_allocates(
    registry: ModelRegistry, model_folder: Path, dtype: str, kv_cache_mb: int | None
) -> None:
    """Kept in step with engine/llm.py, engine/model/decoder.py and engine/model/linear.py
    by comparing with a really loaded engine (oneDNN copies included)."""
    from engine import Engine

    entry = registry.add_folder(model_folder)
    estimate = registry.estimate_memory(entry.id, device="cpu", dtype=dtype, kv_cache_mb=kv_cache_mb, page_size=16)
    kwargs = {} if kv_cache_mb is None else {"kv_cache_bytes": kv_cache_mb << 20}
    engine = Engine(registry.engine_model(entry.id), device="cpu", dtype=dtype, page_size=16, threads=1, **kwargs)
    try:
        assert estimate.weights_bytes == _loaded_bytes(engine)
        assert estimate.kv_bytes == engine.pool.num_pages * engine.kv_cache_bytes_per_page(16)
        assert estimate.total_bytes == estimate.weights_bytes + estimate.kv_bytes
        assert (estimate.device, estimate.dtype, estimate.overhead_bytes) == ("cpu", dtype, 0)
    finally:
        engine.close()


needs_kernel = pytest.mark.skipif(
    not cpu_kernel_available(), reason="the native quantized CPU kernel does not run in this installation"
)


@needs_kernel
def test_quantize_at_load_shrinks_the_estimate_to_what_the_engine_holds(
    registry: ModelRegistry, model_folder: Path
) -> None:
    """A float folder with a quantize choice: the engine keeps the layers'
    blocks and a q8_0 embedding (one copy, no oneDNN twin), and the estimate
    counts exactly those bytes."""
    from engine import Engine

    entry = registry.add_folder(model_folder)
    as_stored = registry.estimate_memory(entry.id, device="cpu", dtype="float32", kv_cache_mb=1)
    estimates = {}
    for mode, layers in (("int8", "q8_0"), ("int4", "q4_1")):
        entry = registry.set_quantize(entry.id, mode)
        estimate = registry.estimate_memory(entry.id, device="cpu", dtype="float32", kv_cache_mb=1)
        engine = Engine(
            registry.engine_model(entry.id), device="cpu", dtype="float32", kv_cache_bytes=1 << 20,
            threads=1, **registry.engine_options(entry.id),
        )
        try:
            held = engine.stats().weights
            assert estimate.weights_bytes == _loaded_bytes(engine)
            assert estimate.kv_bytes == engine.pool.num_pages * engine.kv_cache_bytes_per_page(16)
        finally:
            engine.close()
        assert held == estimate.weights == "+".join(sorted({layers, "q8_0"})) + " (kernel)"
        assert held in estimate.describe()
        estimates[mode] = estimate
    shape = registry.details(entry.id).shape
    params = shape.matmul_params + shape.embedding_params
    # ~1.06 bytes a weight in q8_0, ~0.6 in q4_1 (its embedding at q8_0),
    # against 4 in float32 (8 where oneDNN keeps its packed copy).
    assert estimates["int8"].weights_bytes < 1.1 * params + shape.norm_params * 4
    assert estimates["int4"].weights_bytes < estimates["int8"].weights_bytes < as_stored.weights_bytes / 3
    # An explicit None estimates the folder as stored, whatever the entry says.
    assert registry.estimate_memory(entry.id, "cpu", "float32", 1, quantize=None) == as_stored


@needs_kernel
def test_a_quantized_folder_is_estimated_at_its_blocks_or_at_float_size_when_dequantized(
    registry: ModelRegistry, model_folder: Path, tmp_path: Path
) -> None:
    from engine import Engine

    folder = quantized_copy(model_folder, "int4", cache_dir=tmp_path / "copies")
    entry = registry.add_folder(folder)
    details = registry.details(entry.id)
    assert details.quantized and details.dtype == "q4_1 + q8_0 blocks"
    for quantized, held in (("auto", "q4_1+q8_0 (kernel)"), ("dequantize", "float32 (dequantized from q4_1+q8_0)")):
        estimate = registry.estimate_memory(entry.id, "cpu", "float32", 1, quantized=quantized)
        engine = Engine(
            str(folder), device="cpu", dtype="float32", kv_cache_bytes=1 << 20, threads=1, quantized=quantized
        )
        try:
            assert (estimate.weights_bytes, estimate.weights) == (_loaded_bytes(engine), engine.stats().weights)
        finally:
            engine.close()
        assert held == estimate.weights
    # The choice only applies to float checkpoints.
    with pytest.raises(ModelError, match="stored as q4_1 \\+ q8_0 blocks already"):
        registry.set_quantize(entry.id, "int8")


@needs_kernel
def test_the_default_model_is_estimated_as_it_runs(default_engine, default_model_dir: Path, tmp_path: Path) -> None:
    """The built-in model runs its Q4_1 blocks as they are: ~97 MB of
    weights, not the 1.1 GB of float32 it took when it was dequantized."""
    registry = ModelRegistry(tmp_path / "models.json")
    estimate = registry.estimate_memory("default", device="cpu", dtype="auto", kv_cache_mb=256)
    assert estimate.weights == default_engine.stats().weights == "q4_1+q8_0 (kernel)"
    assert estimate.weights_bytes == _loaded_bytes(default_engine)
    assert estimate.kv_bytes == default_engine.stats().kv_bytes_total
    assert estimate.weights_bytes < 1.05 * (default_model_dir / "model.safetensors").stat().st_size
    assert "KV cache up to" in estimate.describe()


def test_estimate_of_quantized_weights_by_format() -> None:
    shape = ModelShape(
        matmul_params=3200, embedding_params=640, lm_head_params=640, norm_params=10, bias_params=0,
        num_layers=2, num_kv_heads=2, head_dim=4, max_context=64,
    )
    int4 = QuantizedWeights.planned(shape, "int4")
    assert int4 == QuantizedWeights((("q4_1", 3200),), "q8_0", "q8_0")
    assert int4.formats == ("q4_1", "q8_0") and not QuantizedWeights()
    dequantized = estimate_memory(shape, "cpu", "float32", stored=int4, quantized="dequantize")
    plain = estimate_memory(shape, "cpu", "float32")
    assert dequantized.weights_bytes == plain.weights_bytes
    assert dequantized.weights == "float32 (dequantized from q4_1+q8_0)" and plain.weights == ""
    if cpu_kernel_available():
        # q4_1: 20 bytes per 32 weights; q8_0: 34.
        kept = estimate_memory(shape, "cpu", "float32", stored=int4)
        assert kept.weights_bytes == 3200 * 20 // 32 + 2 * 640 * 34 // 32 + 10 * 4
        assert kept == estimate_memory(shape, "cpu", "float32", quantize="int4")
        # A folder that is quantized already ignores the choice, as the loader does.
        assert estimate_memory(shape, "cpu", "float32", stored=int4, quantize="int8") == kept
    with pytest.raises(Exception, match="Unknown quantization 'int3'"):
        estimate_memory(shape, "cpu", "float32", quantize="int3")


def test_estimate_arithmetic_by_device_and_dtype() -> None:
    shape = ModelShape(
        matmul_params=1000, embedding_params=200, lm_head_params=0, norm_params=10, bias_params=6,
        num_layers=2, num_kv_heads=2, head_dim=4, max_context=64,
    )
    fp32 = estimate_memory(shape, "cpu", "float32", kv_cache_mb=None, page_size=16)
    from app.models.memory_estimate import cpu_packs_weights

    packed = (1000 + 200) * 4 if cpu_packs_weights(torch.float32) else 0
    assert fp32.weights_bytes == (1000 + 200 + 6) * 4 + 10 * 4 + packed
    # per page 2*2*16*2*4*4 = 2048 bytes; capped at 8 sequences of 64 tokens = 32 pages
    assert fp32.kv_bytes == 32 * 2048
    # A page size that does not divide the context rounds pages up, as the engine does.
    assert estimate_memory(shape, "cpu", "float32", page_size=10).kv_bytes == 7 * 8 * (2048 * 10 // 16)
    tiny_budget = estimate_memory(shape, "cpu", "float32", kv_cache_mb=0)
    assert tiny_budget.kv_bytes == 2048  # at least one page
    with pytest.raises(Exception, match="Unknown dtype"):
        estimate_memory(shape, "cpu", "float8")


def test_available_memory_reads_memavailable(tmp_path: Path) -> None:
    assert parse_meminfo("MemTotal:  16 kB\nMemFree: 2 kB\nMemAvailable:    12 kB\n") == 12 * 1024
    assert parse_meminfo("MemTotal: 16 kB\n") is None
    free = available_memory("cpu")
    assert 0 < free
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 8000 kB\nMemAvailable: 5000 kB\n")
    assert cpu_available_memory(meminfo) == 5000 * 1024
    if torch.cuda.is_available():
        assert 0 < available_memory("cuda") <= torch.cuda.mem_get_info()[1]


def _estimate(total_gb: float) -> MemoryEstimate:
    return MemoryEstimate(int(total_gb * 1e9), 0, 0, "cpu", "float32")


def test_check_fits_when_there_is_room() -> None:
    result = check_fits(_estimate(2), int(3e9), [("a", int(1e9), True)])
    assert result.fits and result.unload == () and result.shortfall_bytes == 0
    assert "3.0 GB is free" in result.message


def test_check_fits_unloads_the_smallest_idle_model_that_is_enough() -> None:
    loaded = [("big", int(6e9), True), ("mid", int(3e9), True), ("small", int(1e9), True), ("busy", int(4e9), False)]
    result = check_fits(_estimate(4), int(1.5e9), loaded, model_name="Qwen", names={"mid": "Mistral"})
    assert not result.fits and result.can_fit_by_unloading
    assert result.unload == ("mid",)  # 3 GB is enough; the busy one is never offered
    assert result.shortfall_bytes == int(2.5e9)
    assert result.message.startswith("Qwen needs about 4.0 GB")
    assert "Unloading the idle Mistral (3.0 GB) makes room" in result.message


def test_check_fits_combines_idle_models_biggest_first() -> None:
    loaded = [LoadedModel("a", int(1e9), True), LoadedModel("b", int(2e9), True), LoadedModel("c", int(1.5e9), True)]
    result = check_fits(_estimate(5), int(1.5e9), loaded)
    assert result.unload == ("b", "c") and result.can_fit_by_unloading
    assert "b (2.0 GB) and c (1.5 GB) makes room" in result.message


def test_check_fits_says_when_nothing_can_make_room() -> None:
    result = check_fits(_estimate(10), int(1e9), [("idle", int(2e9), True), ("busy", int(3e9), False)])
    assert not result.fits and not result.can_fit_by_unloading and result.unload == ()
    assert "even with every idle model unloaded" in result.message
    assert "wait for busy (3.0 GB) to finish its reply" in result.message


def test_the_model_list_is_private_and_an_old_loose_one_is_tightened(data_dir: Path, model_folder: Path) -> None:
    registry = ModelRegistry(data_dir / "models.json")
    registry.add_folder(model_folder)
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((data_dir / "models.json").stat().st_mode) == 0o600
    # A list written before files were kept private.
    os.chmod(data_dir / "models.json", 0o644)
    reopened = ModelRegistry(data_dir / "models.json")
    assert [e.id for e in reopened.models()] == [e.id for e in registry.models()]
    assert stat.S_IMODE((data_dir / "models.json").stat().st_mode) == 0o600
