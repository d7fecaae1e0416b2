"""Hugging Face model folders made to crash, hang or exhaust the loader and
the app's folder checks: hostile JSON in every file the loader reads, an
index that names files outside the folder, oversized safetensors headers and
tokens, and RoPE or sliding-window values the engine cannot compute with.
Each ends in one clear line (the engine's ModelLoadError, the app's
ModelError), and nothing is registered.

The folders are crafted here: a tiny valid model (a 16-token word-level
tokenizer, one layer) with one file replaced.
"""

from __future__ import annotations

import json
import os
import resource
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer as Backend
from tokenizers import models, pre_tokenizers

from app.models.checks import check_model_folder
from app.models.errors import ModelConfigError, ModelError
from app.models.registry import ModelRegistry
from engine.errors import CorruptSafetensorsError, InvalidModelConfigError, ModelLoadError, TokenizerError
from engine.formats import model_json
from engine.formats.model_json import ModelJSONError
from engine.formats import safetensors as safetensors_format
from engine.formats.safetensors import read_headers, weight_files
from engine.model import tokenizer as tokenizer_module
from engine.model.config import ModelConfig
from engine.model.tokenizer import MAX_TOKEN_CHARS, Tokenizer

REPO = Path(__file__).resolve().parents[2]
WORDS = ["<s>", "</s>", *(f"w{i}" for i in range(14))]
CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": len(WORDS),
    "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
    "num_key_value_heads": 1, "max_position_embeddings": 64, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "tie_word_embeddings": True, "bos_token_id": 0, "eos_token_id": 1,
}


def write_tokenizer(path: Path, extra_vocab: tuple[str, ...] = (), special: tuple[str, ...] = ()) -> None:
    backend = Backend(models.WordLevel({word: i for i, word in enumerate([*WORDS, *extra_vocab])}, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.add_special_tokens([AddedToken(text, special=True, normalized=False) for text in ("<s>", "</s>", *special)])
    backend.save(str(path))


def write_folder(folder: Path) -> Path:
    """A tiny model folder that loads: config, weights, tokenizer and its configs."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(CONFIG))
    d, kv, ffn = 16, 8, 32
    shapes = {
        "model.embed_tokens.weight": (len(WORDS), d), "model.norm.weight": (d,),
        "model.layers.0.input_layernorm.weight": (d,), "model.layers.0.post_attention_layernorm.weight": (d,),
        "model.layers.0.self_attn.q_proj.weight": (d, d), "model.layers.0.self_attn.k_proj.weight": (kv, d),
        "model.layers.0.self_attn.v_proj.weight": (kv, d), "model.layers.0.self_attn.o_proj.weight": (d, d),
        "model.layers.0.mlp.gate_proj.weight": (ffn, d), "model.layers.0.mlp.up_proj.weight": (ffn, d),
        "model.layers.0.mlp.down_proj.weight": (d, ffn),
    }
    save_file({name: torch.zeros(shape) for name, shape in shapes.items()}, str(folder / "model.safetensors"))
    write_tokenizer(folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 1}))
    return folder


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    folder = write_folder(tmp_path / "model")
    check_model_folder(folder)  # the base is a model the app accepts
    return folder


def engine_load_checks(folder: Path) -> None:
    """What the engine reads of a folder before the weights, in its order."""
    ModelConfig.from_folder(folder)
    Tokenizer.from_folder(folder)
    read_headers(weight_files(folder))


def assert_refused(folder: Path, *words: str) -> None:
    """The engine and the app each refuse the folder with one line holding `words`."""
    with pytest.raises(ModelLoadError) as engine_error:  # anything else is a traceback
        engine_load_checks(folder)
    with pytest.raises(ModelError) as app_error:
        check_model_folder(folder)
    for message in (str(engine_error.value), str(app_error.value)):
        assert "\n" not in message and len(message) < 600, message
        for word in words:
            assert word in message, message


# --------------------------------------------------------------------------
# Hostile JSON in every file the loader reads


BOMBS: dict[str, tuple[bytes, str]] = {
    "5,000-digit integer": (b'{"x": ' + b"9" * 5000 + b"}", "an integer of more than"),
    "100k-deep nesting": (b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "more than 64 deep"),
    "65-deep nesting": (b'{"x": ' + b"[" * 64 + b"]" * 64 + b"}", "more than 64 deep"),
    "an array at the top": (b"[1, 2]", "holds a JSON array, not an object"),
    "a lone surrogate": (b'{"x": "\\ud800"}', "unpaired UTF-16 surrogate"),
    "not UTF-8": (b'{"x": "\xff"}', "is not UTF-8 text"),
}


def _safetensors_with_header(path: Path, header: bytes) -> None:
    header += b" " * (-len(header) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header)


PLANTS: dict[str, Callable[[Path, bytes], None]] = {
    "config.json": lambda folder, data: (folder / "config.json").write_bytes(data),
    "tokenizer_config.json": lambda folder, data: (folder / "tokenizer_config.json").write_bytes(data),
    "generation_config.json": lambda folder, data: (folder / "generation_config.json").write_bytes(data),
    "special_tokens_map.json": lambda folder, data: (folder / "special_tokens_map.json").write_bytes(data),
    "chat_template.json": lambda folder, data: (folder / "chat_template.json").write_bytes(data),
    "model.safetensors.index.json": lambda folder, data: (folder / "model.safetensors.index.json").write_bytes(data),
    "model.safetensors": lambda folder, data: _safetensors_with_header(folder / "model.safetensors", data),
}


@pytest.mark.parametrize("bomb", list(BOMBS), ids=list(BOMBS))
@pytest.mark.parametrize("file", list(PLANTS), ids=list(PLANTS))
def test_hostile_json_in_any_file_is_one_line_naming_it(folder: Path, file: str, bomb: str) -> None:
    data, words = BOMBS[bomb]
    PLANTS[file](folder, data)
    assert_refused(folder, file, words)


def test_a_named_chat_template_whose_name_is_not_text_is_skipped(folder: Path) -> None:
    templates = [
        {"name": ["default"], "template": "{{ 'wrong' }}"},
        {"name": {"a": 1}, "template": "{{ 'wrong' }}"},
        {"name": "default", "template": "{{ messages[0]['content'] }}"},
    ]
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": templates}))
    tokenizer = Tokenizer.from_folder(folder)
    assert tokenizer.render_chat([{"role": "user", "content": "Hi"}]) == "Hi"
    check_model_folder(folder)


def test_json_files_larger_than_a_models_are_not_read(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_json, "MAX_JSON_BYTES", 4096)
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "pad": "x" * 5000}))
    assert_refused(folder, "tokenizer_config.json is 5.0 KB, more than a model's file of its kind can be (4.1 KB)")


def test_a_fifo_or_a_device_in_place_of_a_json_file_is_never_read(folder: Path) -> None:
    os.mkfifo(folder / "generation_config.json.fifo")
    (folder / "generation_config.json").unlink()
    (folder / "generation_config.json").symlink_to(folder / "generation_config.json.fifo")
    (folder / "special_tokens_map.json").symlink_to("/dev/zero")
    started = time.perf_counter()
    check_model_folder(folder)  # neither is a regular file: both are absent, nothing waits
    engine_load_checks(folder)
    assert time.perf_counter() - started < 5
    for path in (folder / "special_tokens_map.json", folder / "generation_config.json.fifo"):
        with pytest.raises(ModelJSONError, match="is not a regular file"):
            model_json.read_json_object(path)



# --------------------------------------------------------------------------
# The index names only files of the folder


SECRET = b"TOPSECRET-" * 20


@pytest.mark.parametrize(
    "shard",
    ["/etc/passwd", "{secret}", "../secret.safetensors", "..\\secret.safetensors", "sub/model.safetensors",
     "..", "", "model.safetensors\u0000x", "C:secret.safetensors", 5, None],
    ids=["etc-passwd", "absolute", "dot-dot", "backslash", "subfolder", "parent", "empty", "nul", "drive", "number", "null"],
)
def test_an_index_naming_a_file_outside_the_folder_is_refused_unread(folder: Path, shard: Any) -> None:
    secret = folder.parent / "secret.safetensors"
    secret.write_bytes(SECRET)
    if shard == "{secret}":
        shard = str(secret)
    index = {"weight_map": {"model.embed_tokens.weight": shard, "model.norm.weight": "model.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert_refused(folder, "model.safetensors.index.json is not a valid safetensors index")
    with pytest.raises(CorruptSafetensorsError) as caught:
        weight_files(folder)
    message = str(caught.value)
    assert "TOPSECRET" not in message and str(int.from_bytes(SECRET[:8], "little")) not in message
    assert "root:" not in message


def test_an_index_of_plain_names_still_works(folder: Path) -> None:
    index = {"weight_map": {"model.embed_tokens.weight": "model.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert weight_files(folder) == [folder / "model.safetensors"]
    check_model_folder(folder)


def test_a_header_length_is_never_shown(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(SECRET)
    with pytest.raises(CorruptSafetensorsError) as caught:
        safetensors_format.read_header(path)
    assert "TOPSECRET" not in str(caught.value) and str(int.from_bytes(SECRET[:8], "little")) not in str(caught.value)


# --------------------------------------------------------------------------
# Safetensors headers bounded by what a model can have


def _zero_size_header(count: int) -> bytes:
    entries = ",".join(f'"t{i:07d}":{{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}' for i in range(count))
    return ("{" + entries + "}").encode()


def test_more_tensors_than_a_model_has_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "many.safetensors"
    _safetensors_with_header(path, _zero_size_header(101))
    assert len(safetensors_format.read_header(path)) == 101
    monkeypatch.setattr(safetensors_format, "MAX_TENSORS_PER_FILE", 100)
    with pytest.raises(CorruptSafetensorsError, match="holds more than 100 tensors, more than a model's"):
        safetensors_format.read_header(path)


def test_a_header_bigger_than_a_models_is_refused_unparsed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "big.safetensors"
    _safetensors_with_header(path, _zero_size_header(3))
    monkeypatch.setattr(safetensors_format, "MAX_HEADER_BYTES", 64)
    with pytest.raises(CorruptSafetensorsError, match="its header is more than"):
        safetensors_format.read_header(path)


def test_a_tensor_of_more_dimensions_than_any_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "dims.safetensors"
    _safetensors_with_header(path, b'{"t":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,0],"data_offsets":[0,0]}}')
    with pytest.raises(CorruptSafetensorsError, match="'t' has a bad shape"):
        safetensors_format.read_header(path)


HEADER_CHILD = """
import sys, time
from engine.errors import ModelLoadError
from engine.formats.safetensors import read_header
from pathlib import Path
started = time.perf_counter()
try:
    read_header(Path(sys.argv[1]))
except ModelLoadError as exc:
    print(f"{time.perf_counter() - started:.3f}")
    sys.stderr.write(f"error: {exc}\\n")
    sys.exit(1)
print("read")
"""


def test_a_header_of_200k_zero_size_tensors_ends_in_one_line_under_a_memory_limit(tmp_path: Path) -> None:
    # 13 MB of header, under MAX_HEADER_BYTES: as json's objects it took ~150 MB.
    path = tmp_path / "zeros.safetensors"
    _safetensors_with_header(path, _zero_size_header(200_000))
    probe = "import engine.formats.safetensors\nprint(next(l for l in open('/proc/self/status') if l.startswith('VmPeak')))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    limit = int(out.stdout.split()[1]) * 1024 + path.stat().st_size + (48 << 20)

    def cap_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    result = subprocess.run([sys.executable, "-c", HEADER_CHILD, str(path)], cwd=REPO, capture_output=True,
                            text=True, timeout=60, preexec_fn=cap_memory)
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr, result.stderr
    assert "zeros.safetensors" in lines[0] and "more than 65,536 tensors" in lines[0]
    assert float(result.stdout) < 5.0


# --------------------------------------------------------------------------
# Tokens longer than any model's


def test_an_added_token_longer_than_any_models_is_refused(folder: Path) -> None:
    write_tokenizer(folder / "tokenizer.json", special=("x" * (MAX_TOKEN_CHARS + 1),))
    assert_refused(folder, "tokenizer.json has a token of 1,025 characters")


def test_a_vocabulary_token_longer_than_any_models_is_refused(folder: Path) -> None:
    write_tokenizer(folder / "tokenizer.json", extra_vocab=("y" * (MAX_TOKEN_CHARS + 1),))
    with pytest.raises(TokenizerError, match="has a token of 1,025 characters"):
        Tokenizer.from_folder(folder)


def test_special_tokens_beyond_their_total_are_refused(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_tokenizer(folder / "tokenizer.json", special=tuple(f"<|special_{i:04d}|>" for i in range(20)))
    Tokenizer.from_folder(folder)
    monkeypatch.setattr(tokenizer_module, "MAX_SPECIAL_TOKEN_CHARS", 200)
    with pytest.raises(TokenizerError, match="has special tokens of 3[0-9]{2} characters in all"):
        Tokenizer.from_folder(folder)


# --------------------------------------------------------------------------
# RoPE and sliding-window values the engine cannot compute with


UNLOADABLE = {
    "negative rope_theta": ({"rope_theta": -1.0}, "rope_theta is -1.0, less than 1.0"),
    "rope_theta 0": ({"rope_theta": 0}, "rope_theta is 0, less than 1.0"),
    "rope_theta in rope_parameters NaN": ({"rope_parameters": {"rope_theta": float("nan")}}, "rope_parameters.rope_theta is nan"),
    "linear factor 0 (type)": ({"rope_scaling": {"type": "linear", "factor": 0}}, "rope_scaling.factor is 0, less than 1.0"),
    "linear factor 0 (rope_type)": ({"rope_scaling": {"rope_type": "linear", "factor": 0.0}}, "rope_scaling.factor is 0.0"),
    "llama3 low_freq_factor 0": (
        {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 32}},
        "rope_scaling.low_freq_factor (0.0) must be more than 0",
    ),
    "llama3 high equal to low": (
        {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 2.0, "high_freq_factor": 2.0}},
        "less than rope_scaling.high_freq_factor (2.0)",
    ),
    "sliding_window 10^30": ({"sliding_window": 10**30}, "sliding_window is 1000000000000000000000000000000, outside"),
    "sliding_window negative": ({"sliding_window": -4}, "sliding_window is -4, outside"),
    "sliding_window text": ({"sliding_window": "4096"}, "sliding_window is '4096', not a whole number"),
}


@pytest.mark.parametrize("case", list(UNLOADABLE), ids=list(UNLOADABLE))
def test_rope_and_window_values_that_cannot_load_are_refused_before_registering(
    folder: Path, tmp_path: Path, case: str
) -> None:
    change, words = UNLOADABLE[case]
    (folder / "config.json").write_text(json.dumps(CONFIG | change))
    with pytest.raises(InvalidModelConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        ModelConfig.from_folder(folder)
    registry = ModelRegistry(tmp_path / "data" / "models.json")
    before = [entry.id for entry in registry.models()]
    with pytest.raises(ModelConfigError) as caught:
        registry.add_folder(folder)
    assert words in str(caught.value) and "\n" not in str(caught.value)
    assert [entry.id for entry in ModelRegistry(tmp_path / "data" / "models.json").models()] == before


def test_sane_rope_and_window_values_still_load(folder: Path) -> None:
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 32}
    for change in ({"rope_scaling": llama3, "rope_theta": 500000.0}, {"rope_scaling": {"type": "linear", "factor": 2.0}},
                   {"sliding_window": 32}):
        (folder / "config.json").write_text(json.dumps(CONFIG | change))
        check_model_folder(folder)
    # Qwen2 configs name a window they do not use: it is not checked.
    assert ModelConfig.from_dict(CONFIG | {"model_type": "qwen2", "sliding_window": 10**30}).sliding_window is None
