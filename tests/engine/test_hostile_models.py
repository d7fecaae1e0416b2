"""Model files made to hang, exhaust or crash the importer: each ends in one
clear line (a ModelLoadError naming the field), within seconds, in a process
under a memory limit; and a property-based fuzz of the GGUF reader and
importer on mutated small valid files.

The hostile files are crafted here: raw headers whose counts and lengths lie,
and tiny valid models (tests.engine.test_gguf_import.write_gguf) with one
metadata value patched in place.
"""

from __future__ import annotations

import json
import re
import resource
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from gguf import GGUFValueType
from gguf.gguf_writer import GGUFValue
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.errors import GGUFFormatError, InvalidModelConfigError, ModelLoadError, TokenizerError
from engine.formats.gguf import reader as gguf_reader
from engine.formats.gguf.importer import import_gguf
from engine.formats.gguf.reader import MAX_ARRAY_DEPTH, MAX_ARRAY_ITEMS, open_gguf, read_gguf_header
from engine.model.config import (
    MAX_LAYERS,
    ModelConfig,
    check_dimensions,
    check_layer_indices,
)
from engine.model.tokenizer import MAX_TOKEN_CHARS
from tests.engine.test_gguf_import import TinyModel, byte_level_vocab, sentencepiece_vocab, write_gguf

REPO = Path(__file__).resolve().parents[2]
# Memory the import may use above what importing it costs (torch included).
HEADROOM = 3 << 29  # 1.5 GiB
# The child imports the importer, then imports the file; a ModelLoadError is
# printed as the one line a user sees, anything else escapes as a traceback.
CHILD = """
import sys, time
from engine.errors import ModelLoadError
from engine.formats.gguf.importer import import_gguf
started = time.perf_counter()
try:
    import_gguf(sys.argv[1], sys.argv[2])
except ModelLoadError as exc:
    print(f"{time.perf_counter() - started:.3f}")
    sys.stderr.write(f"error: {exc}\\n")
    sys.exit(1)
print("imported")
"""


def _header(tensor_count: int, kv_count: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, tensor_count, kv_count)


def _string(text: str, length: int | None = None) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data) if length is None else length) + data


def _patched(path: Path, key: str, value: int) -> None:
    """Set the uint32 metadata `key` of a GGUF file to `value`, in place."""
    data = bytearray(path.read_bytes())
    at = data.index(_string(key)) + len(_string(key))
    assert struct.unpack_from("<I", data, at)[0] == 4, "expected a uint32 value"  # GGUF type 4: uint32
    struct.pack_into("<I", data, at + 4, value)
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def import_baseline() -> int:
    """The address space of a process that has imported the importer (torch included)."""
    probe = "import engine.formats.gguf.importer\nprint(next(l for l in open('/proc/self/status') if l.startswith('VmPeak')))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    return int(out.stdout.split()[1]) * 1024


def run_limited(args: list[str], limit: int, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    def cap_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=timeout, preexec_fn=cap_memory)


def assert_one_clear_line(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    """Exit 1 with one `error:` line naming `needles`: no traceback, no MemoryError, within seconds."""
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr and "MemoryError" not in result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert float(result.stdout.strip()) < 5.0  # the import itself, after the child's imports


# --------------------------------------------------------------------------
# Raw headers whose counts and lengths lie


RAW_HEADERS = {
    # The 84-byte file: an array claiming 2^61 elements.
    "array of 2^61": (_header(0, 1) + _string("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 1 << 61), "claims"),
    "array of 2^61 floats": (_header(0, 1) + _string("scores") + struct.pack("<IIQ", 9, 6, 1 << 61), "claims"),
    "string of 2^60": (_header(0, 1) + _string("general.name", 1 << 60), "runs past the end"),
    "value string of 2^60": (_header(0, 1) + _string("k") + struct.pack("<I", 8) + struct.pack("<Q", 1 << 60), "runs past"),
    "2^40 tensors": (_header(1 << 40, 0), "the tensor table claims"),
    "2^40 metadata": (_header(0, 1 << 40), "the metadata claims"),
    "2^31 dimensions": (_header(1, 0) + _string("t") + struct.pack("<I", 1 << 31), "has 2147483648 dimensions"),
    "dimensions of 2^62": (
        _header(1, 0) + _string("t") + struct.pack("<I", 2) + struct.pack("<QQIQ", 1 << 62, 1 << 62, 0, 0),
        "is truncated",
    ),
}


@pytest.mark.parametrize("case", list(RAW_HEADERS), ids=list(RAW_HEADERS))
def test_lying_headers_end_in_one_line_under_a_memory_limit(
    tmp_path: Path, import_baseline: int, case: str
) -> None:
    body, needle = RAW_HEADERS[case]
    path = tmp_path / "hostile.gguf"
    path.write_bytes(body + bytes(4096))
    result = run_limited([sys.executable, "-c", CHILD, str(path), str(tmp_path / "out")], import_baseline + HEADROOM)
    assert_one_clear_line(result, "hostile.gguf", needle)
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------
# Valid files with an impossible model configuration


# (patched key, value, words the one line must hold)
IMPOSSIBLE_CONFIGS = {
    "block_count 10^9": ("llama.block_count", 10**9, ["llama.block_count (num_hidden_layers) is 1000000000"]),
    "head_count 0": ("llama.attention.head_count", 0, ["llama.attention.head_count (num_attention_heads) is 0"]),
    "heads not dividing hidden": (
        "llama.attention.head_count", 3, ["llama.attention.head_count (num_attention_heads) (3) does not divide"],
    ),
    "kv heads not dividing heads": (
        "llama.attention.head_count_kv", 3, ["llama.attention.head_count_kv (num_key_value_heads) (3) does not divide"],
    ),
    "kv heads 0": ("llama.attention.head_count_kv", 0, ["head_count_kv (num_key_value_heads) is 0"]),
    "hidden 2^32-1": ("llama.embedding_length", 2**32 - 1, ["llama.embedding_length (hidden_size) is 4294967295"]),
    "ffn 0": ("llama.feed_forward_length", 0, ["llama.feed_forward_length (intermediate_size) is 0"]),
    "context 0": ("llama.context_length", 0, ["llama.context_length (max_position_embeddings) is 0"]),
    "more layers than tensors": ("llama.block_count", 3, ["block_count (num_hidden_layers) says 3 layers", "layer 2 is missing"]),
    "fewer layers than tensors": ("llama.block_count", 1, ["block_count (num_hidden_layers) says 1 layers", "have layer 1"]),
}


@pytest.mark.parametrize("case", list(IMPOSSIBLE_CONFIGS), ids=list(IMPOSSIBLE_CONFIGS))
def test_impossible_configs_end_in_one_line_naming_the_field(
    tmp_path: Path, import_baseline: int, case: str
) -> None:
    key, value, needles = IMPOSSIBLE_CONFIGS[case]
    path = tmp_path / "hostile.gguf"
    write_gguf(path, TinyModel(hidden=64, heads=4, kv_heads=2, layers=2))
    _patched(path, key, value)
    result = run_limited([sys.executable, "-c", CHILD, str(path), str(tmp_path / "out")], import_baseline + HEADROOM)
    assert_one_clear_line(result, "hostile.gguf", *needles)
    assert not (tmp_path / "out").exists()


def test_the_same_checks_guard_hugging_face_folders() -> None:
    base = {
        "model_type": "llama", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    }
    assert ModelConfig.from_dict(base).head_dim == 16
    for change, message in [
        ({"num_attention_heads": 0}, "num_attention_heads is 0, outside 1..4096"),
        ({"num_attention_heads": 3}, r"num_attention_heads \(3\) does not divide hidden_size \(64\)"),
        ({"num_key_value_heads": 3}, r"num_key_value_heads \(3\) does not divide num_attention_heads \(4\)"),
        ({"num_hidden_layers": 10**9}, f"num_hidden_layers is 1000000000, outside 1..{MAX_LAYERS}"),
        ({"head_dim": 0}, "head_dim is 0"),
        ({"hidden_size": "64"}, "hidden_size is '64', not a whole number"),
        ({"hidden_size": float("inf")}, "hidden_size is inf, not a whole number"),
        ({"vocab_size": None}, "vocab_size is missing"),
    ]:
        with pytest.raises(InvalidModelConfigError, match=message):
            ModelConfig.from_dict(base | change, source="config.json")
    # An explicit head_dim need not divide the hidden size (Qwen3, Gemma do this).
    assert ModelConfig.from_dict(base | {"num_attention_heads": 3, "num_key_value_heads": 1, "head_dim": 32}).head_dim == 32
    check_dimensions(base, "x")


def test_layer_indices_are_checked_without_sizing_anything_by_the_count() -> None:
    check_layer_indices(3, [0, 1, 2, 2, 1], "m")
    with pytest.raises(InvalidModelConfigError, match="says 3 layers, but the tensors have 2 .layer 1 is missing"):
        check_layer_indices(3, [0, 2], "m")
    with pytest.raises(InvalidModelConfigError, match="says 2 layers, but the tensors have layer 7"):
        check_layer_indices(2, [0, 1, 7], "m")
    started = time.perf_counter()
    with pytest.raises(InvalidModelConfigError, match="says 1000000000000 layers"):
        check_layer_indices(10**12, [0, 1], "m")
    assert time.perf_counter() - started < 0.5


def test_a_hugging_face_folder_with_layers_its_weights_lack_is_refused(tmp_path: Path) -> None:
    from engine.formats.loader import load_model
    from tests.engine.random_llama import write_random_llama

    folder = write_random_llama(tmp_path / "m", heads=4, kv_heads=2, head_dim=16, window=None, seed=0)
    config = json.loads((folder / "config.json").read_text())
    config["num_hidden_layers"] += 1
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(InvalidModelConfigError, match=r"num_hidden_layers says \d+ layers, but the tensors have"):
        load_model(folder, device="cpu")


# --------------------------------------------------------------------------
# Metadata arrays: nesting and item counts


def test_deeply_nested_arrays_are_refused_not_recursed(tmp_path: Path) -> None:
    # An array (type 9) of arrays of arrays ... 100,000 deep, each claiming one item.
    nesting = struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 100_000
    path = tmp_path / "deep.gguf"
    path.write_bytes(_header(0, 1) + _string("deep") + nesting + bytes(64))
    with pytest.raises(GGUFFormatError, match=f"nests arrays more than {MAX_ARRAY_DEPTH} deep"):
        read_gguf_header(path)


def test_more_array_items_than_any_vocabulary_are_refused(tmp_path: Path) -> None:
    count = MAX_ARRAY_ITEMS + 1
    path = tmp_path / "long.gguf"
    path.write_bytes(_header(0, 1) + _string("bytes") + struct.pack("<IIQ", 9, 0, count) + bytes(count))
    with pytest.raises(GGUFFormatError, match="claims 4194305 items, more than any model has"):
        read_gguf_header(path)


def test_metadata_of_the_wrong_type_names_the_key(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    write_gguf(path)
    raw = bytearray(path.read_bytes())
    key = _string("llama.attention.layer_norm_rms_epsilon")
    at = raw.index(key) + len(key)
    assert struct.unpack_from("<I", raw, at)[0] == 6  # GGUF type 6: float32
    struct.pack_into("<f", raw, at + 4, float("nan"))
    path.write_bytes(bytes(raw))
    with pytest.raises(GGUFFormatError, match="'llama.attention.layer_norm_rms_epsilon' is nan, not a finite number"):
        import_gguf(path, tmp_path / "out")


# --------------------------------------------------------------------------
# Fuzz: mutated and truncated small valid files only ever raise the reader's errors


def _small_valid_gguf() -> bytes:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "small.gguf"
        write_gguf(path, TinyModel(hidden=32, heads=2, kv_heads=1, ffn=32, layers=1))
        return path.read_bytes()


SMALL = _small_valid_gguf()


def _header_size(data: bytes) -> int:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "small.gguf"
        path.write_bytes(data)
        return read_gguf_header(path).data_start


SMALL_HEADER = _header_size(SMALL)

# A mutation: overwrite bytes at a position of the header with random bytes,
# or with a little-endian count (small, near a boundary, or absurd).
_mutations = st.one_of(
    st.tuples(st.integers(0, SMALL_HEADER - 1), st.binary(min_size=1, max_size=8)),
    st.tuples(
        st.integers(0, SMALL_HEADER - 8),
        st.sampled_from([0, 1, 2, 3, 255, 1 << 16, 1 << 31, (1 << 32) - 1, 1 << 40, 1 << 61, (1 << 64) - 1]).map(
            lambda number: struct.pack("<Q", number)
        ),
    ),
)


def _mutated(mutations: list[tuple[int, bytes]], cut: int | None) -> bytes:
    data = bytearray(SMALL)
    for at, patch in mutations:
        data[at : at + len(patch)] = patch
    return bytes(data[:cut] if cut is not None else data)


HANG_S = 20.0


def _write(data: bytes) -> Path:
    handle = tempfile.NamedTemporaryFile(suffix=".gguf", delete=False)
    handle.write(data)
    handle.close()
    return Path(handle.name)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_mutations, min_size=1, max_size=4), st.one_of(st.none(), st.integers(0, len(SMALL))))
def test_fuzzed_files_only_raise_the_readers_own_errors(mutations: list[tuple[int, bytes]], cut: int | None) -> None:
    path = _write(_mutated(mutations, cut))
    started = time.perf_counter()
    try:
        gguf = open_gguf(path)
        for tensor in gguf.header.tensors.values():
            data = gguf.tensor_data(tensor)
            assert data.nbytes == tensor.nbytes
        read_gguf_header(path, long_arrays=False)
    except ModelLoadError:
        pass  # GGUFFormatError, UnsupportedModelError: the reader's own errors
    finally:
        path.unlink()
    # A hang guard, not a speed check (a reader looping by a count the file
    # claims takes minutes): far above any machine's time under load.
    assert time.perf_counter() - started < HANG_S


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_mutations, min_size=1, max_size=3))
def test_fuzzed_files_only_raise_the_importers_own_errors(mutations: list[tuple[int, bytes]]) -> None:
    path = _write(_mutated(mutations, None))
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        try:
            import_gguf(path, Path(folder) / "out")
        except ModelLoadError:
            pass  # every refusal is the engine's own error, with its one line
        finally:
            path.unlink()
        assert time.perf_counter() - started < 3 * HANG_S


def test_fuzz_base_is_valid(tmp_path: Path) -> None:
    path = tmp_path / "small.gguf"
    path.write_bytes(SMALL)
    folder = import_gguf(path, tmp_path / "out")
    assert (folder / "config.json").is_file()
    assert np.frombuffer(SMALL[:4], dtype=np.uint8).tobytes() == b"GGUF"


# --------------------------------------------------------------------------
# Metadata of the wrong type, and configurations that import but cannot load


def write_with_metadata(
    path: Path, overrides: dict[str, tuple[Any, GGUFValueType, GGUFValueType | None] | None], **kwargs: Any
) -> None:
    """A tiny valid model whose metadata `overrides` set (value, type, array
    item type) or drop (None), keys of any type the gguf writer can write."""

    class Overriding(gguf.GGUFWriter):
        def write_header_to_file(self, path: Path | None = None) -> None:
            for key, value in overrides.items():
                if value is None:
                    self.kv_data[0].pop(key, None)
                else:
                    self.kv_data[0][key] = GGUFValue(value=value[0], type=value[1], sub_type=value[2])
            super().write_header_to_file(path)

    original = gguf.GGUFWriter
    gguf.GGUFWriter = Overriding  # write_gguf looks it up on the module when called
    try:
        write_gguf(path, **kwargs)
    finally:
        gguf.GGUFWriter = original


V = GGUFValueType
# (metadata set, words the one error must hold)
WRONG_TYPES = {
    "split.count a string": ({"split.count": ("2", V.STRING, None)}, "'split.count' is '2', not a whole number"),
    "split.count an array": ({"split.count": ([2, 2], V.ARRAY, V.UINT16)}, "'split.count' is [2, 2], not a whole number"),
    "split.count NaN": ({"split.count": (float("nan"), V.FLOAT32, None)}, "'split.count' is nan, not a whole number"),
    "architecture an array": (
        {"general.architecture": (["llama"], V.ARRAY, V.STRING)}, "'general.architecture' is ['llama'], not a string",
    ),
    "eos_token_id a string": (
        {"tokenizer.ggml.eos_token_id": ("2", V.STRING, None)}, "'tokenizer.ggml.eos_token_id' is '2', not a whole number",
    ),
    "tokens a number": ({"tokenizer.ggml.tokens": (7, V.UINT32, None)}, "'tokenizer.ggml.tokens' is 7, not an array of strings"),
    "token types strings": (
        {"tokenizer.ggml.token_type": (["1"] * 8, V.ARRAY, V.STRING)}, "'tokenizer.ggml.token_type' is an array of 8 items, not an array of whole numbers",
    ),
    "add_bos_token a long array": (
        {"tokenizer.ggml.add_bos_token": ([1] * 2000, V.ARRAY, V.UINT8)}, "'tokenizer.ggml.add_bos_token' is an array of 2,000 items, not true or false",
    ),
    "chat template an array": (
        {"tokenizer.chat_template": (["{{ x }}"], V.ARRAY, V.STRING)}, "'tokenizer.chat_template' is ['{{ x }}'], not a string",
    ),
    "KV heads per layer as arrays": (
        {"llama.attention.head_count_kv": ([[2], [2]], V.ARRAY, V.ARRAY)}, "'llama.attention.head_count_kv' is [[2], [2]], not an array of whole numbers",
    ),
    "expert_count a long array": (
        {"llama.expert_count": ([0] * 2000, V.ARRAY, V.UINT32)}, "'llama.expert_count' is an array of 2,000 items, not a whole number",
    ),
    "scaling type an array": (
        {"llama.rope.scaling.type": (["linear"], V.ARRAY, V.STRING)}, "'llama.rope.scaling.type' is ['linear'], not a string",
    ),
    "merge of unknown tokens": (
        {"tokenizer.ggml.merges": (["zz qq"], V.ARRAY, V.STRING)}, "merges number 0 ('zz qq') names 'zz', which is not in tokenizer.ggml.tokens",
    ),
    "merge into an unknown token": (
        {"tokenizer.ggml.merges": (["x y"], V.ARRAY, V.STRING)}, "names 'xy', which is not in tokenizer.ggml.tokens",
    ),
    "unknown_token_id past the vocabulary": (
        {"tokenizer.ggml.unknown_token_id": (10**6, V.UINT32, None)},
        "tokenizer.ggml.unknown_token_id is 1000000, but the vocabulary has",
        sentencepiece_vocab,
    ),
    "scores of text": (
        {"tokenizer.ggml.scores": (["0"] * 8, V.ARRAY, V.STRING)},
        "'tokenizer.ggml.scores' is an array of 8 items, not an array of finite numbers",
        sentencepiece_vocab,
    ),
}


@pytest.mark.parametrize("case", list(WRONG_TYPES), ids=list(WRONG_TYPES))
def test_metadata_of_any_wrong_type_is_the_importers_error_naming_the_key(tmp_path: Path, case: str) -> None:
    overrides, words, *vocab = WRONG_TYPES[case]
    path = tmp_path / "m.gguf"
    write_with_metadata(path, overrides, model=TinyModel(vocab=vocab[0]()) if vocab else None)
    with pytest.raises(ModelLoadError) as caught:  # anything else escapes as a traceback
        import_gguf(path, tmp_path / "out")
    message = str(caught.value)
    assert words in message and "\n" not in message and len(message) < 400, message
    assert not (tmp_path / "out").exists()


# (metadata set, words the one line must hold): each imported before, then failed at load.
UNLOADABLE = {
    "negative freq_base": ({"llama.rope.freq_base": (-1.0, V.FLOAT32, None)}, "llama.rope.freq_base (rope_theta) is -1.0"),
    "linear factor 0": (
        {"llama.rope.scaling.type": ("linear", V.STRING, None), "llama.rope.scaling.factor": (0.0, V.FLOAT32, None)},
        "llama.rope.scaling.factor (rope_scaling.factor) is 0.0",
    ),
    "old linear key 0": ({"llama.rope.scale_linear": (0.0, V.FLOAT32, None)}, "llama.rope.scale_linear (rope_scaling.factor) is 0.0"),
}


@pytest.mark.parametrize("case", list(UNLOADABLE), ids=list(UNLOADABLE))
def test_rope_values_that_cannot_load_are_refused_at_import(tmp_path: Path, case: str) -> None:
    overrides, words = UNLOADABLE[case]
    path = tmp_path / "m.gguf"
    write_with_metadata(path, overrides)
    with pytest.raises(InvalidModelConfigError, match=re.escape(words)):
        import_gguf(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_app_registers_no_gguf_model_that_cannot_load(tmp_path: Path) -> None:
    from app.models.errors import ModelError
    from app.models.registry import ModelRegistry

    path = tmp_path / "m.gguf"
    write_with_metadata(path, {"llama.rope.freq_base": (-1.0, V.FLOAT32, None)})
    registry = ModelRegistry(tmp_path / "data" / "models.json")
    before = [entry.id for entry in registry.models()]
    with pytest.raises(ModelError, match=re.escape("llama.rope.freq_base (rope_theta) is -1.0")):
        registry.import_gguf(path)
    assert [entry.id for entry in ModelRegistry(tmp_path / "data" / "models.json").models()] == before
    imports = tmp_path / "data" / "models"
    assert not imports.exists() or not any(imports.iterdir())  # no folder left behind


def test_a_vocabulary_token_longer_than_any_models_is_refused_at_import(tmp_path: Path) -> None:
    vocab = byte_level_vocab()
    vocab.tokens[-1] = "x" * (MAX_TOKEN_CHARS + 1)  # "xyz", a normal token no merge makes
    path = tmp_path / "m.gguf"
    write_gguf(path, TinyModel(vocab=vocab))
    with pytest.raises(TokenizerError, match=f"has a token of {MAX_TOKEN_CHARS + 1:,} characters"):
        import_gguf(path, tmp_path / "out")


# --------------------------------------------------------------------------
# What the reader materializes, in total over the whole header


def _kv(key: str, kind: int, payload: bytes) -> bytes:
    return _string(key) + struct.pack("<I", kind) + payload


def _float_arrays(count: int, items: int) -> bytes:
    """`count` metadata keys, each a float32 array of `items`."""
    array = struct.pack("<IQ", 6, items) + np.arange(items, dtype="<f4").tobytes()
    return _header(0, count) + b"".join(_kv(f"a{i}", 9, array) for i in range(count))


def _string_arrays(count: int, items: int, text: bytes = b"ab") -> bytes:
    """`count` metadata keys, each an array of `items` copies of `text`."""
    array = struct.pack("<IQ", 8, items) + (struct.pack("<Q", len(text)) + text) * items
    return _header(0, count) + b"".join(_kv(f"s{i}", 9, array) for i in range(count))


# (file, reader constant lowered to what, words of the error)
BUDGETS = {
    "short float arrays": (lambda: _float_arrays(120, 1000), ("MAX_METADATA_VALUES", 100_000), "more than 100,000 strings and numbers in all"),
    "two-character strings": (lambda: _string_arrays(6, 20_000), ("MAX_METADATA_VALUES", 100_000), "at the metadata 's5'"),
    "text": (lambda: _string_arrays(3, 10, b"x" * 30_000), ("MAX_METADATA_BYTES", 500_000), "hold more than 500 KB of text in all"),
    "keys": (lambda: _header(0, 101) + b"".join(_kv(f"k{i}", 4, bytes(4)) for i in range(101)), ("MAX_METADATA_KEYS", 100), "it has 101 metadata keys"),
    "tensors": (
        # 101 one-row F32 tensors, all at offset 0 of the data
        lambda: _header(101, 0) + b"".join(_string(f"t{i}") + struct.pack("<IQIQ", 1, 32, 0, 0) for i in range(101)) + bytes(4096),
        ("MAX_TENSORS", 100), "it has 101 tensors",
    ),
}


@pytest.mark.parametrize("case", list(BUDGETS), ids=list(BUDGETS))
def test_metadata_beyond_the_total_budget_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    make, (constant, value), words = BUDGETS[case]
    path = tmp_path / "many.gguf"
    path.write_bytes(make() + bytes(64))
    read_gguf_header(path)  # within the real budgets: read
    monkeypatch.setattr(gguf_reader, constant, value)
    for long_arrays in (True, False):  # the summary refuses what the import refuses
        with pytest.raises(GGUFFormatError, match=re.escape(words)) as caught:
            read_gguf_header(path, long_arrays=long_arrays)
        assert "many.gguf is refused" in str(caught.value)


def test_long_numeric_arrays_are_read_only_views_of_the_file(tmp_path: Path) -> None:
    path = tmp_path / "floats.gguf"
    path.write_bytes(_float_arrays(2, 5000) + bytes(64))
    metadata = read_gguf_header(path).metadata
    assert isinstance(metadata["a0"], np.ndarray) and not metadata["a0"].flags.writeable
    np.testing.assert_array_equal(metadata["a1"], np.arange(5000, dtype=np.float32))
    assert read_gguf_header(path, long_arrays=False).metadata == {}


READER_CHILD = """
import json, sys, time
from engine.errors import ModelLoadError
from engine.formats.gguf import reader
for name, value in json.loads(sys.argv[2]).items():
    setattr(reader, name, value)  # a budget lowered, so that a small file is past it
started = time.perf_counter()
try:
    header = reader.read_gguf_header(sys.argv[1])
except ModelLoadError as exc:
    print(f"{time.perf_counter() - started:.3f}")
    sys.stderr.write(f"error: {exc}\\n")
    sys.exit(1)
print(len(header.metadata))
"""


@pytest.fixture(scope="module")
def reader_baseline() -> int:
    """The address space of a process that has imported the reader (numpy, gguf)."""
    probe = "import engine.formats.gguf.reader\nprint(next(l for l in open('/proc/self/status') if l.startswith('VmPeak')))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    return int(out.stdout.split()[1]) * 1024


def test_float_metadata_arrays_cost_their_mapping_not_ten_times_the_file(tmp_path: Path, reader_baseline: int) -> None:
    # 8M float32 values (32 MB): as Python floats in lists, 256 MB.
    path = tmp_path / "floats.gguf"
    path.write_bytes(_float_arrays(4, 2_000_000) + bytes(64))
    limit = reader_baseline + path.stat().st_size + (64 << 20)
    result = run_limited([sys.executable, "-c", READER_CHILD, str(path), "{}"], limit, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "4", (result.stdout, result.stderr)


def test_a_file_of_short_strings_ends_in_one_line_under_a_memory_limit(tmp_path: Path, reader_baseline: int) -> None:
    path = tmp_path / "strings.gguf"
    path.write_bytes(_string_arrays(8, 40_000) + bytes(64))  # 320,000 two-character strings, in 8 arrays
    budget = json.dumps({"MAX_METADATA_VALUES": 200_000})
    result = run_limited([sys.executable, "-c", READER_CHILD, str(path), budget], reader_baseline + (64 << 20), timeout=60)
    assert_one_clear_line(result, "strings.gguf is refused", "more than 200,000 strings and numbers in all")


def test_the_apps_summary_of_metadata_of_the_wrong_type_is_a_model_error(tmp_path: Path) -> None:
    from app.models.checks import gguf_shape, read_gguf_summary
    from app.models.errors import CorruptGGUFError

    path = tmp_path / "m.gguf"
    write_with_metadata(path, {"llama.attention.head_count": ("four", V.STRING, None)})
    with pytest.raises(CorruptGGUFError, match="'llama.attention.head_count' is 'four', not a whole number"):
        gguf_shape(read_gguf_summary(path))
    write_with_metadata(path, {"general.architecture": (["llama"], V.ARRAY, V.STRING)})
    assert read_gguf_summary(path).architecture == "unknown"


def test_an_import_the_loader_would_refuse_as_too_big_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.formats import model_json

    path = tmp_path / "m.gguf"
    write_gguf(path, chat_template="{{ messages[0]['content'] }}" + " " * 3000)
    monkeypatch.setattr(model_json, "MAX_JSON_BYTES", 2000)  # the loader's cap, lowered past the template
    with pytest.raises(TokenizerError, match=r"its tokenizer_config.json would be 3.\d KB, more than the loader reads \(2.0 KB\)"):
        import_gguf(path, tmp_path / "out")
    assert not (tmp_path / "out").exists() and [p.name for p in tmp_path.iterdir()] == ["m.gguf"]
