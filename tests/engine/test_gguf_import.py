"""GGUF import: tensors, config, tokenizer, atomic publishing and errors.

Tiny GGUF files are written here with gguf.GGUFWriter; the real default model
is checked against transformers' own GGUF loading.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import TokenType
from tokenizers import Tokenizer

from engine.formats.gguf import importer as gguf_import
from engine.formats.default_model import default_gguf_path
from engine.errors import ModelLoadError, TokenizerError, UnsupportedModelError
from engine.formats.gguf.importer import MARKER_NAME, import_gguf
from engine.model.linear import Linear
from engine.formats.loader import load_model, quantized_formats, read_weights, resolve_quantized_compute
from engine.model.quant import QuantLinear, cpu_kernel_available, error_bound, quantize
from engine.params import read_recommended_sampling

# --------------------------------------------------------------------------
# Writing tiny GGUF files


def byte_alphabet() -> list[str]:
    """GPT-2's printable stand-in for each byte value, indexed by byte."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
    spelled = {byte: chr(byte) for byte in kept}
    shifted = iter(range(256, 512))
    return [spelled.get(byte) or chr(next(shifted)) for byte in range(256)]


def byte_level(text: str) -> str:
    alphabet = byte_alphabet()
    return "".join(alphabet[byte] for byte in text.encode())


@dataclass
class Vocab:
    model: str
    tokens: list[str]
    types: list[int]
    merges: list[str] = field(default_factory=list)
    scores: list[float] | None = None
    pre: str | None = None
    bos: int | None = None
    eos: int | None = None
    unk: int | None = None
    add_bos: bool | None = None

    def id(self, token: str) -> int:
        return self.tokens.index(token)


def byte_level_vocab(pre: str = "smollm", extra_merges: tuple[tuple[str, str], ...] = ()) -> Vocab:
    space = byte_level(" ")
    merges = [(space, "t"), ("h", "e"), (f"{space}t", "he"), ("i", "n"), (space, "w"), ("o", "r")]
    merges += extra_merges
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    normal = [*byte_alphabet(), *(left + right for left, right in merges)]
    # "<think>" is user-defined (matched whole, not special); "xyz" has no merges.
    tokens = [*specials, *normal, "<think>", "xyz"]
    types = [TokenType.CONTROL] * 3 + [TokenType.NORMAL] * len(normal)
    types += [TokenType.USER_DEFINED, TokenType.NORMAL]
    return Vocab(
        "gpt2",
        tokens,
        [int(t) for t in types],
        merges=[f"{left} {right}" for left, right in merges],
        pre=pre,
        bos=1,
        eos=2,
        unk=0,
        add_bos=False,
    )


def sentencepiece_vocab() -> Vocab:
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{byte:02X}>" for byte in range(256))]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    pieces = ["▁t", "he", "▁the", "▁c", "at", "▁cat", "in", "▁in", "on", "▁on", "er", "▁a", "▁"]
    pieces += "abcdefghijklmnopqrstuvwxyz"
    scores = [0.0] * len(tokens) + [-float(rank) for rank in range(len(pieces))]
    tokens += pieces
    types += [TokenType.NORMAL] * len(pieces)
    return Vocab("llama", tokens, [int(t) for t in types], scores=scores, bos=1, eos=2, unk=0)


@dataclass
class TinyModel:
    arch: str = "llama"
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 96
    layers: int = 2
    tied: bool = True
    qkv_bias: bool = False
    rope_theta: float = 10000.0
    vocab: Vocab = field(default_factory=byte_level_vocab)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def hf_weights(self) -> dict[str, np.ndarray]:
        d, ffn, n_vocab = self.hidden, self.ffn, len(self.vocab.tokens)
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        shapes: dict[str, tuple[int, ...]] = {
            "model.embed_tokens.weight": (n_vocab, d),
            "model.norm.weight": (d,),
        }
        if not self.tied:
            shapes["lm_head.weight"] = (n_vocab, d)
        for i in range(self.layers):
            layer = {
                "input_layernorm.weight": (d,),
                "post_attention_layernorm.weight": (d,),
                "self_attn.q_proj.weight": (q, d),
                "self_attn.k_proj.weight": (kv, d),
                "self_attn.v_proj.weight": (kv, d),
                "self_attn.o_proj.weight": (d, q),
                "mlp.gate_proj.weight": (ffn, d),
                "mlp.up_proj.weight": (ffn, d),
                "mlp.down_proj.weight": (d, ffn),
            }
            if self.qkv_bias:
                layer |= {
                    "self_attn.q_proj.bias": (q,),
                    "self_attn.k_proj.bias": (kv,),
                    "self_attn.v_proj.bias": (kv,),
                }
            shapes |= {f"model.layers.{i}.{name}": shape for name, shape in layer.items()}
        rng = np.random.default_rng(0)
        return {name: (rng.standard_normal(shape) * 0.1).astype(np.float32) for name, shape in shapes.items()}


GGUF_GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
GGUF_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_name(hf_name: str) -> str:
    if hf_name in GGUF_GLOBAL_NAMES:
        return GGUF_GLOBAL_NAMES[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    module, suffix = rest.rsplit(".", 1)
    return f"blk.{layer}.{GGUF_LAYER_NAMES[module]}.{suffix}"


def llama_cpp_permute(weight: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute."""
    head_half = weight.shape[0] // n_head // 2
    return weight.reshape(n_head, 2, head_half, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


# Where K-quant blocks keep their fp16 scales; random bytes there could be NaN.
K_QUANT_SCALE_OFFSETS = {Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}


def encode_tensor(array: np.ndarray, qtype: Q, rng: np.random.Generator) -> np.ndarray:
    """`array` quantized to `qtype`, or random `qtype` blocks where gguf cannot quantize."""
    if qtype in K_QUANT_SCALE_OFFSETS:
        block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
        blocks = rng.integers(0, 256, (array.size // block_size, type_size), dtype=np.uint8)
        for offset in K_QUANT_SCALE_OFFSETS[qtype]:
            scales = rng.uniform(1e-3, 1e-2, len(blocks)).astype(np.float16)
            blocks[:, offset : offset + 2] = scales.view(np.uint8).reshape(-1, 2)
        return blocks.reshape(array.shape[0], -1)
    return gguf.quants.quantize(array, qtype)


def write_gguf(
    path: Path,
    model: TinyModel | None = None,
    *,
    qtype: Q = Q.F32,
    qtypes: dict[str, Q] | None = None,
    kv: dict[str, Any] | None = None,
    extra_tensors: dict[str, np.ndarray | tuple[np.ndarray, Q]] | None = None,
    drop: tuple[str, ...] = (),
    chat_template: str | None = "{{ messages[0]['content'] }}",
) -> dict[str, np.ndarray]:
    """Write a tiny model; return the HF tensors the import must produce.

    Matrices are stored as `qtype` (`qtypes`: another type by GGUF tensor
    name, as llama-quantize mixes them), norms and biases as F32 (as
    llama.cpp does), and llama's q/k rows are permuted as
    convert_hf_to_gguf.py does.
    """
    model = model or TinyModel()
    arch, vocab = model.arch, model.vocab
    writer = gguf.GGUFWriter(path, arch)
    writer.add_uint32(f"{arch}.block_count", model.layers)
    writer.add_uint32(f"{arch}.context_length", 256)
    writer.add_uint32(f"{arch}.embedding_length", model.hidden)
    writer.add_uint32(f"{arch}.feed_forward_length", model.ffn)
    writer.add_uint32(f"{arch}.attention.head_count", model.heads)
    writer.add_uint32(f"{arch}.attention.head_count_kv", model.kv_heads)
    writer.add_float32(f"{arch}.rope.freq_base", model.rope_theta)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_tokenizer_model(vocab.model)
    if vocab.pre is not None:
        writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    if vocab.merges:
        writer.add_token_merges(vocab.merges)
    if vocab.scores is not None:
        writer.add_token_scores(vocab.scores)
    for key, value in (("bos", vocab.bos), ("eos", vocab.eos), ("unknown", vocab.unk)):
        if value is not None:
            writer.add_uint32(f"tokenizer.ggml.{key}_token_id", value)
    if vocab.add_bos is not None:
        writer.add_add_bos_token(vocab.add_bos)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    for key, value in (kv or {}).items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, value)

    rng = np.random.default_rng(1)
    default_qtype = qtype
    rope_heads = {"attn_q": model.heads, "attn_k": model.kv_heads} if arch == "llama" else {}
    expected: dict[str, np.ndarray] = {}
    for hf_name, weight in model.hf_weights().items():
        name = gguf_name(hf_name)
        if name in drop:
            continue
        rows = np.arange(weight.shape[0])
        if (heads := rope_heads.get(name.split(".")[-2])) is not None:
            rows = llama_cpp_permute(rows, heads)  # GGUF row i holds HF row rows[i]
        stored = weight[rows]
        qtype = (qtypes or {}).get(name, default_qtype)
        if weight.ndim == 1 or qtype == Q.F32:
            writer.add_tensor(name, stored)
            values = stored
        elif qtype == Q.F16:
            writer.add_tensor(name, stored.astype(np.float16))
            values = stored.astype(np.float16).astype(np.float32)
        else:
            raw = encode_tensor(stored, qtype, rng)
            writer.add_tensor(name, raw, raw_dtype=qtype)
            values = gguf.quants.dequantize(raw, qtype)
        expected[hf_name] = np.empty_like(values)
        expected[hf_name][rows] = values
    for name, extra in (extra_tensors or {}).items():
        if isinstance(extra, tuple):
            writer.add_tensor(name, extra[0], raw_dtype=extra[1])
        else:
            writer.add_tensor(name, extra)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


@pytest.fixture
def tiny_gguf(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.gguf"
    write_gguf(path)
    return path


def partials(folder: Path) -> list[Path]:
    return [entry for entry in folder.iterdir() if ".partial-" in entry.name]


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def folder_weights(folder: Path) -> dict[str, np.ndarray]:
    """The folder's weights as float32 arrays, quantized ones dequantized."""
    return {name: tensor.numpy() for name, tensor in read_weights(folder).items()}


# --------------------------------------------------------------------------
# Tensors


@pytest.mark.parametrize(
    "qtype",
    [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K],
    ids=lambda qtype: qtype.name,
)
def test_imports_each_type_into_hf_layout(tmp_path: Path, qtype: Q) -> None:
    # K-quants need rows that are a multiple of 256.
    model = TinyModel(hidden=256, heads=4, kv_heads=2, ffn=256, layers=1)
    expected = write_gguf(tmp_path / "m.gguf", model, qtype=qtype)
    folder = import_gguf(tmp_path / "m.gguf", tmp_path / "out")
    tensors = folder_weights(folder)
    assert tensors.keys() == expected.keys()
    formats = quantized_formats(folder)
    kept = {Q.Q8_0: "q8_0", Q.Q4_0: "q4_0", Q.Q4_1: "q4_1", Q.Q4_K: "q4_k", Q.Q5_K: "q5_k", Q.Q6_K: "q6_k",
            Q.Q5_0: "q5_0", Q.Q5_1: "q5_1"}
    float_types = (Q.F32, Q.F16, Q.BF16)
    if qtype in float_types:
        assert formats == {}
    else:
        # Every matrix (embedding included) stays quantized, norms stay float.
        assert set(formats) == {name for name, value in expected.items() if value.ndim == 2}
        # Q2_K and Q3_K are the K-quants still requantized.
        target = kept.get(qtype) or "q4_1"
        assert set(formats.values()) == {target}
        section = read_json(folder / "config.json")["quantization"]
        assert section["requantized"] == ({} if qtype in kept else {qtype.name: target})
    for name, want in expected.items():
        assert tensors[name].dtype == np.float32
        if qtype in kept or qtype in float_types or name not in formats:
            # Blocks copied as they are: exactly what GGUF's dequantization gives.
            np.testing.assert_array_equal(tensors[name], want, err_msg=name)
        else:
            # Requantized from the dequantized source, within the new format's bound.
            bound = error_bound(quantize(torch.from_numpy(want), formats[name])).numpy()[:, None]
            assert (np.abs(tensors[name] - want) <= bound).all(), name
    if qtype == Q.F32:
        # Lossless: every tensor, q/k rows included, is back exactly in HF layout.
        for name, original in model.hf_weights().items():
            np.testing.assert_array_equal(tensors[name], original, err_msg=name)


def test_quantized_values_are_close_to_the_original(tmp_path: Path) -> None:
    model = TinyModel()
    write_gguf(tmp_path / "m.gguf", model, qtype=Q.Q8_0)
    tensors = folder_weights(import_gguf(tmp_path / "m.gguf", tmp_path / "out"))
    for name, original in model.hf_weights().items():
        np.testing.assert_allclose(tensors[name], original, atol=0.01, err_msg=name)


def test_untied_output_is_written_as_lm_head(tmp_path: Path) -> None:
    model = TinyModel(tied=False)
    write_gguf(tmp_path / "m.gguf", model)
    folder = import_gguf(tmp_path / "m.gguf", tmp_path / "out")
    assert read_json(folder / "config.json")["tie_word_embeddings"] is False
    np.testing.assert_array_equal(
        folder_weights(folder)["lm_head.weight"], model.hf_weights()["lm_head.weight"]
    )


def test_llama_biases_are_unpermuted_like_their_weights(tmp_path: Path) -> None:
    model = TinyModel(qkv_bias=True)
    write_gguf(tmp_path / "m.gguf", model)
    folder = import_gguf(tmp_path / "m.gguf", tmp_path / "out")
    tensors = folder_weights(folder)
    for name, original in model.hf_weights().items():
        np.testing.assert_array_equal(tensors[name], original, err_msg=name)
    assert read_json(folder / "config.json")["attention_bias"] is True


def test_qwen2_rows_and_biases_are_stored_unpermuted(tmp_path: Path) -> None:
    model = TinyModel(arch="qwen2", qkv_bias=True, vocab=byte_level_vocab(pre="qwen2"))
    write_gguf(tmp_path / "q.gguf", model)
    folder = import_gguf(tmp_path / "q.gguf", tmp_path / "out")
    tensors = folder_weights(folder)
    for name, original in model.hf_weights().items():
        np.testing.assert_array_equal(tensors[name], original, err_msg=name)
    config = read_json(folder / "config.json")
    assert config["model_type"] == "qwen2"
    assert config["architectures"] == ["Qwen2ForCausalLM"]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_models_match_transformers_gguf_loading(tmp_path: Path, arch: str) -> None:
    transformers = pytest.importorskip("transformers")
    model = TinyModel(arch=arch, qkv_bias=arch == "qwen2", tied=False, vocab=byte_level_vocab(pre="qwen2"))
    write_gguf(tmp_path / "m.gguf", model, qtype=Q.Q8_0)
    ours = folder_weights(import_gguf(tmp_path / "m.gguf", tmp_path / "out"))
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file="m.gguf", dtype=torch.float32
    ).state_dict()
    assert ours.keys() == reference.keys()
    for name, tensor in ours.items():
        np.testing.assert_array_equal(tensor, reference[name].numpy(), err_msg=name)


# --------------------------------------------------------------------------
# Config


def test_config_describes_the_model(tmp_path: Path) -> None:
    model = TinyModel(hidden=64, heads=4, kv_heads=2, ffn=96, layers=2)
    write_gguf(tmp_path / "m.gguf", model, chat_template="{{ bos_token }}hi")
    folder = import_gguf(tmp_path / "m.gguf", tmp_path / "out")
    assert read_json(folder / "config.json") == {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-06,
        "rope_theta": 10000.0,
        "max_position_embeddings": 256,
        "vocab_size": len(model.vocab.tokens),
        "tie_word_embeddings": True,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    }
    assert read_json(folder / "generation_config.json") == {"bos_token_id": 1, "eos_token_id": 2}
    tokenizer_config = read_json(folder / "tokenizer_config.json")
    assert tokenizer_config["chat_template"] == "{{ bos_token }}hi"
    assert tokenizer_config["bos_token"] == "<|im_start|>"
    assert tokenizer_config["eos_token"] == "<|im_end|>"
    assert tokenizer_config["add_bos_token"] is False
    assert tokenizer_config["model_max_length"] == 256


def test_end_of_turn_tokens_join_eos_in_generation_config(tmp_path: Path) -> None:
    write_gguf(tmp_path / "m.gguf", kv={"tokenizer.ggml.eot_token_id": 0})
    folder = import_gguf(tmp_path / "m.gguf", tmp_path / "out")
    assert read_json(folder / "generation_config.json")["eos_token_id"] == [2, 0]
    assert read_json(folder / "config.json")["eos_token_id"] == 2


def test_recommended_sampling_is_carried_into_generation_config(tmp_path: Path) -> None:
    write_gguf(tmp_path / "m.gguf", kv={
        "general.sampling.temp": 0.6, "general.sampling.top_p": 0.95, "general.sampling.top_k": 20,
        "general.sampling.min_p": 0.0,
        # Out of range: no advice, and no reason to refuse the file.
        "general.sampling.penalty_repeat": -1.0,
    })
    folder = import_gguf(tmp_path / "m.gguf", tmp_path / "out")
    generation = read_json(folder / "generation_config.json")
    assert {k: generation[k] for k in ("temperature", "top_p", "top_k", "min_p")} == {
        "temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0,
    }
    assert "repetition_penalty" not in generation
    assert read_recommended_sampling(folder) == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0}


@pytest.mark.parametrize(
    ("kv", "expected"),
    [
        (
            {"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0},
            {"rope_type": "linear", "factor": 4.0},
        ),
        (
            {
                "llama.rope.scaling.type": "yarn",
                "llama.rope.scaling.factor": 4.0,
                "llama.rope.scaling.original_context_length": 4096,
            },
            {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096},
        ),
        ({"llama.rope.scaling.type": "none"}, None),
    ],
    ids=["linear", "yarn", "none"],
)
def test_rope_scaling_from_metadata(
    tmp_path: Path, kv: dict[str, Any], expected: dict[str, Any] | None
) -> None:
    write_gguf(tmp_path / "m.gguf", kv=kv)
    config = read_json(import_gguf(tmp_path / "m.gguf", tmp_path / "out") / "config.json")
    assert config.get("rope_scaling") == expected


def llama_cpp_rope_freqs(
    theta: float, head_dim: int, factor: float, low: float, high: float, original: int
) -> np.ndarray:
    """The rope_freqs tensor convert_hf_to_gguf.py writes for Llama 3.1 and later."""
    divisors = []
    for i in range(0, head_dim, 2):
        wavelength = 2 * math.pi * theta ** (i / head_dim)
        if wavelength < original / high:
            divisors.append(1.0)
        elif wavelength > original / low:
            divisors.append(factor)
        else:
            smooth = (original / wavelength - low) / (high - low)
            divisors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(divisors, dtype=np.float32)


def test_llama3_rope_freqs_become_llama3_rope_scaling(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    model = TinyModel(hidden=256, heads=2, kv_heads=1, rope_theta=500000.0)
    freqs = llama_cpp_rope_freqs(500000.0, 128, factor=32.0, low=1.0, high=4.0, original=8192)
    write_gguf(tmp_path / "m.gguf", model, extra_tensors={"rope_freqs.weight": freqs})
    folder = import_gguf(tmp_path / "m.gguf", tmp_path / "out")
    assert read_json(folder / "config.json")["rope_scaling"] == {
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    assert "rope_freqs.weight" not in folder_weights(folder)
    # transformers, reading our config, rotates with llama.cpp's frequencies.
    inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](transformers.AutoConfig.from_pretrained(folder), "cpu")
    base = 1 / 500000.0 ** (np.arange(0, 128, 2) / 128)
    np.testing.assert_allclose(inv_freq.numpy(), base / freqs, rtol=1e-5)


def test_rope_freqs_that_are_not_llama3_are_refused(tmp_path: Path) -> None:
    model = TinyModel(hidden=256, heads=2, kv_heads=1, rope_theta=500000.0)
    freqs = np.linspace(1, 5, 64, dtype=np.float32)
    write_gguf(tmp_path / "m.gguf", model, extra_tensors={"rope_freqs.weight": freqs})
    with pytest.raises(UnsupportedModelError, match="rope_freqs"):
        import_gguf(tmp_path / "m.gguf", tmp_path / "out")


# --------------------------------------------------------------------------
# Tokenizer, on tiny vocabularies


def import_tokenizer(tmp_path: Path, vocab: Vocab) -> Tokenizer:
    write_gguf(tmp_path / "m.gguf", TinyModel(vocab=vocab))
    return Tokenizer.from_file(str(import_gguf(tmp_path / "m.gguf", tmp_path / "out") / "tokenizer.json"))


def transformers_tokenizer(tmp_path: Path) -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="m.gguf")


def test_special_and_user_defined_tokens_stay_whole(tmp_path: Path) -> None:
    vocab = byte_level_vocab()
    tokenizer = import_tokenizer(tmp_path, vocab)
    ids = tokenizer.encode("<|im_start|>the<think> xyz<|im_end|>").ids
    assert ids[0] == vocab.id("<|im_start|>")
    assert vocab.id("<think>") in ids
    assert ids[-1] == vocab.id("<|im_end|>")
    # Control tokens are special (skipped on request); user-defined ones are text.
    assert tokenizer.decode(ids) == "the<think> xyz"
    assert tokenizer.decode(ids, skip_special_tokens=False) == "<|im_start|>the<think> xyz<|im_end|>"


@pytest.mark.parametrize("pre", ["llama-bpe", "qwen2"])
def test_byte_level_pre_tokenizers_match_transformers(tmp_path: Path, pre: str) -> None:
    digit_merges = (("1", "2"), ("12", "3"), ("4", "5"))
    tokenizer = import_tokenizer(tmp_path, byte_level_vocab(pre, extra_merges=digit_merges))
    reference = transformers_tokenizer(tmp_path)
    texts = ["the world", "12345 in 2024", "it's\n\n  the\tworld!!", "Ünï the", "a  b   c", "<|im_start|>the"]
    for text in texts:
        assert tokenizer.encode(text).ids == reference(text)["input_ids"], text
    # Llama 3 splits digits in runs of up to three, Qwen2 one by one.
    pieces = tokenizer.encode("12345").tokens
    assert pieces == (["123", "45"] if pre == "llama-bpe" else ["1", "2", "3", "4", "5"])


def test_tekken_splits_words_at_capitals_and_digits_one_by_one(tmp_path: Path) -> None:
    # Mistral Nemo's pre-tokenizer (llama.cpp "tekken", its tokenizer.json's
    # regex): "HelloWorld" is two words where Llama 3's split keeps one, and
    # whole words come from the vocabulary ("xyz" has no merges).
    vocab = byte_level_vocab(pre="tekken")
    tokenizer = import_tokenizer(tmp_path, vocab)
    pieces = [piece for piece, _ in tokenizer.pre_tokenizer.pre_tokenize_str("HelloWorld's 123 a/b\n")]
    assert pieces == ["Hello", "World", "'s", byte_level(" "), "1", "2", "3", byte_level(" a"), "/b", byte_level("\n")]
    assert tokenizer.encode("xyz").ids == [vocab.id("xyz")]


def test_llama3_takes_whole_words_from_the_vocabulary(tmp_path: Path) -> None:
    # "xyz" has no merges; llama.cpp (and Llama 3's tokenizer.json, with
    # ignore_merges) still produce it whole.
    vocab = byte_level_vocab(pre="llama-bpe")
    tokenizer = import_tokenizer(tmp_path, vocab)
    assert tokenizer.encode("xyz").ids == [vocab.id("xyz")]
    # The file says add_bos_token false, which wins over the Llama 3 default.
    assert read_json(tmp_path / "out" / "tokenizer_config.json")["add_bos_token"] is False


def test_bos_is_added_when_the_file_asks(tmp_path: Path) -> None:
    vocab = byte_level_vocab()
    vocab.add_bos = True
    tokenizer = import_tokenizer(tmp_path, vocab)
    assert tokenizer.encode("the").ids == [vocab.bos, vocab.id("t"), vocab.id("he")]
    assert tokenizer.encode("the", add_special_tokens=False).ids == [vocab.id("t"), vocab.id("he")]
    assert read_json(tmp_path / "out" / "tokenizer_config.json")["add_bos_token"] is True


def test_sentencepiece_matches_transformers(tmp_path: Path) -> None:
    vocab = sentencepiece_vocab()
    tokenizer = import_tokenizer(tmp_path, vocab)
    reference = transformers_tokenizer(tmp_path)
    for text in ["the cat", "in the cat on a mat", "thecat", "a  b", "tab\tcat\nnew", "Ünï 😀 日本"]:
        ids = tokenizer.encode(text).ids
        assert ids == reference(text)["input_ids"], text
        assert tokenizer.decode(ids) == text
    # BOS first, then "▁the"; characters outside the vocabulary fall back to bytes.
    assert tokenizer.encode("the").ids == [1, vocab.id("▁the")]
    assert tokenizer.encode("é", add_special_tokens=False).tokens == ["▁", "<0xC3>", "<0xA9>"]


def test_sentencepiece_prefixes_a_space_after_special_tokens(tmp_path: Path) -> None:
    # llama.cpp (and HF's legacy Llama tokenizer) start every stretch of text
    # with a space, also after a special token; transformers 5 only the first.
    vocab = sentencepiece_vocab()
    tokenizer = import_tokenizer(tmp_path, vocab)
    assert tokenizer.encode("the</s>cat", add_special_tokens=False).tokens == ["▁the", "</s>", "▁cat"]
    assert tokenizer.encode(" the", add_special_tokens=False).tokens == ["▁", "▁the"]


def test_sentencepiece_never_builds_control_pieces_from_text(tmp_path: Path) -> None:
    # CodeLlama's "▁<PRE>" is a control piece. SentencePiece merges text only
    # into normal pieces, so " <PRE>" in plain text stays "▁<" + "PRE>".
    vocab = sentencepiece_vocab()
    pieces = ["▁<", "PRE>", "PRE", "PR", "<", ">", "P", "R", "E"]
    vocab.tokens += ["▁<PRE>", *pieces]
    vocab.types += [int(TokenType.CONTROL)] + [int(TokenType.NORMAL)] * len(pieces)
    assert vocab.scores is not None
    vocab.scores += [0.0] + [-100.0 - rank for rank in range(len(pieces))]
    tokenizer = import_tokenizer(tmp_path, vocab)
    assert tokenizer.encode("x <PRE>", add_special_tokens=False).tokens == ["▁", "x", "▁<", "PRE>"]
    assert tokenizer.encode("x▁<PRE>", add_special_tokens=False).ids[-1] == vocab.id("▁<PRE>")


def test_gemma_sentencepiece_adds_no_space_prefix_and_ends_turns(tmp_path: Path) -> None:
    # Gemma's files (conversion/gemma.py): SentencePiece pieces with scores,
    # add_space_prefix false, and <end_of_turn> ending a turn although eos is
    # another token and no eot id is written.
    vocab = sentencepiece_vocab()
    pieces = ["the", "▁▁", "<start_of_turn>", "<end_of_turn>"]
    vocab.tokens += pieces
    vocab.types += [int(TokenType.NORMAL)] * 2 + [int(TokenType.CONTROL)] * 2
    assert vocab.scores is not None
    vocab.scores += [-3.5, -40.0, 0.0, 0.0]
    write_gguf(tmp_path / "m.gguf", TinyModel(vocab=vocab), kv={"tokenizer.ggml.add_space_prefix": False})
    folder = import_gguf(tmp_path / "m.gguf", tmp_path / "out")
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    text = "<start_of_turn>user\nthe cat  <end_of_turn>\n"
    encoded = tokenizer.encode(text, add_special_tokens=False)
    assert encoded.tokens == [
        "<start_of_turn>", "u", "s", "er", "<0x0A>", "the", "▁cat", "▁▁", "<end_of_turn>", "<0x0A>",
    ]
    assert tokenizer.decode(encoded.ids, skip_special_tokens=False) == text
    assert tokenizer.encode("the").tokens == ["<s>", "the"]
    assert read_json(folder / "generation_config.json")["eos_token_id"] == [vocab.eos, vocab.id("<end_of_turn>")]


def test_unknown_pre_tokenizer_is_refused(tmp_path: Path) -> None:
    write_gguf(tmp_path / "m.gguf", TinyModel(vocab=byte_level_vocab(pre="some-new-model")))
    with pytest.raises(UnsupportedModelError, match="some-new-model"):
        import_gguf(tmp_path / "m.gguf", tmp_path / "out")


def test_unknown_tokenizer_model_is_refused(tmp_path: Path) -> None:
    vocab = byte_level_vocab()
    vocab.model = "bert"
    write_gguf(tmp_path / "m.gguf", TinyModel(vocab=vocab))
    with pytest.raises(UnsupportedModelError, match="tokenizer model 'bert'"):
        import_gguf(tmp_path / "m.gguf", tmp_path / "out")


def test_malformed_merges_are_a_tokenizer_error(tmp_path: Path) -> None:
    vocab = byte_level_vocab()
    vocab.merges = ["nospace"]
    write_gguf(tmp_path / "m.gguf", TinyModel(vocab=vocab))
    with pytest.raises(TokenizerError, match="nospace"):
        import_gguf(tmp_path / "m.gguf", tmp_path / "out")


# --------------------------------------------------------------------------
# Errors


def test_not_a_gguf_file(tmp_path: Path) -> None:
    text = tmp_path / "notes.gguf"
    text.write_text("just some text, long enough to look like something")
    empty = tmp_path / "empty.gguf"
    empty.touch()
    for path in (text, empty):
        with pytest.raises(ModelLoadError, match="not a GGUF file"):
            import_gguf(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("cut", [200, -100], ids=["in-metadata", "in-tensor-data"])
def test_truncated_file(tmp_path: Path, tiny_gguf: Path, cut: int) -> None:
    tiny_gguf.write_bytes(tiny_gguf.read_bytes()[:cut])
    with pytest.raises(ModelLoadError, match="truncated or corrupt"):
        import_gguf(tiny_gguf, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert partials(tmp_path) == []


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not found"):
        import_gguf(tmp_path / "nope.gguf", tmp_path / "out")


def test_unsupported_architecture(tmp_path: Path) -> None:
    writer = gguf.GGUFWriter(tmp_path / "mamba.gguf", "mamba")
    writer.add_uint32("mamba.block_count", 1)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedModelError, match="architecture 'mamba'") as refused:
        import_gguf(tmp_path / "mamba.gguf", tmp_path / "out")
    assert str(refused.value).endswith(
        "Tandem imports these GGUF architectures: gemma2, gemma3, granite, llama, phi3, qwen2, qwen3."
    )


def test_unsupported_tensor_type_names_tensor_and_type(tmp_path: Path) -> None:
    # Q8_1 is llama.cpp's activation format; the gguf package cannot dequantize it.
    model = TinyModel()
    block_size, type_size = gguf.GGML_QUANT_SIZES[Q.Q8_1]
    raw = np.zeros((model.ffn, model.hidden // block_size * type_size), dtype=np.uint8)
    name = "blk.0.ffn_up.weight"
    write_gguf(tmp_path / "m.gguf", model, drop=(name,), extra_tensors={name: (raw, Q.Q8_1)})
    with pytest.raises(UnsupportedModelError, match=r"blk\.0\.ffn_up\.weight.*Q8_1"):
        import_gguf(tmp_path / "m.gguf", tmp_path / "out")
    assert partials(tmp_path) == []


def test_unknown_tensor_is_refused(tmp_path: Path) -> None:
    experts = np.zeros((4, 4), np.float32)
    write_gguf(tmp_path / "m.gguf", extra_tensors={"blk.0.ffn_gate_exps.weight": experts})
    with pytest.raises(UnsupportedModelError, match="ffn_gate_exps"):
        import_gguf(tmp_path / "m.gguf", tmp_path / "out")


def test_missing_tensor_is_reported(tmp_path: Path) -> None:
    write_gguf(tmp_path / "m.gguf", drop=("blk.1.attn_v.weight",))
    with pytest.raises(ModelLoadError, match=r"blk\.1\.attn_v\.weight"):
        import_gguf(tmp_path / "m.gguf", tmp_path / "out")


# --------------------------------------------------------------------------
# Publishing: atomic, reused, replaced


def test_failure_mid_import_leaves_nothing(
    tmp_path: Path, tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = tmp_path / "models" / "tiny"
    real_write = gguf_import._write_safetensors

    def write_then_fail(path: Path, tensors: list[Any], *args: Any) -> None:
        real_write(path, tensors, *args)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gguf_import, "_write_safetensors", write_then_fail)
    with pytest.raises(ModelLoadError, match="disk is full"):
        import_gguf(tiny_gguf, dest)
    assert not dest.exists()
    assert partials(dest.parent) == []

    monkeypatch.undo()
    assert import_gguf(tiny_gguf, dest) == dest
    assert read_json(dest / MARKER_NAME)["source_name"] == "tiny.gguf"


def test_rename_is_the_last_step(tmp_path: Path, tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A crash right before publishing: every file is written, nothing is at dest.
    written: list[set[str]] = []

    def crash(staging: Path, dest: Path, stamp: dict[str, Any]) -> Path:
        written.append({entry.name for entry in staging.iterdir()})
        raise KeyboardInterrupt

    monkeypatch.setattr(gguf_import, "publish", crash)
    with pytest.raises(KeyboardInterrupt):
        import_gguf(tiny_gguf, tmp_path / "out")
    assert {MARKER_NAME, "model.safetensors", "tokenizer.json", "config.json"} <= written[0]
    assert not (tmp_path / "out").exists()


def test_stale_partials_are_swept_and_fresh_ones_kept(tmp_path: Path, tiny_gguf: Path) -> None:
    stale = tmp_path / ".tiny.partial-deadbeef"  # left by a crashed import
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    two_hours_ago = time.time() - 7200
    for entry in (stale / "model.safetensors", stale):
        os.utime(entry, (two_hours_ago, two_hours_ago))
    fresh = tmp_path / ".other.partial-cafe"  # maybe an import still running
    fresh.mkdir()

    import_gguf(tiny_gguf, tmp_path / "tiny")
    assert not stale.exists()
    assert fresh.exists()


def test_current_import_is_reused(tmp_path: Path, tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dest = import_gguf(tiny_gguf, tmp_path / "out")
    before = (dest / MARKER_NAME).stat()

    def no_second_read(source: Path) -> None:
        raise AssertionError(f"{source} was read again")

    monkeypatch.setattr(gguf_import, "_read_checkpoint", no_second_read)
    assert import_gguf(tiny_gguf, dest) == dest
    after = (dest / MARKER_NAME).stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_changed_source_is_imported_again(tmp_path: Path, tiny_gguf: Path) -> None:
    dest = import_gguf(tiny_gguf, tmp_path / "out")
    write_gguf(tiny_gguf, TinyModel(layers=1))
    os.utime(tiny_gguf, ns=(time.time_ns(), time.time_ns() + 10**9))
    import_gguf(tiny_gguf, dest)
    assert read_json(dest / MARKER_NAME)["source_mtime_ns"] == tiny_gguf.stat().st_mtime_ns
    assert read_json(dest / "config.json")["num_hidden_layers"] == 1
    assert partials(tmp_path) == []


def test_import_by_an_older_importer_is_redone(tmp_path: Path, tiny_gguf: Path) -> None:
    dest = import_gguf(tiny_gguf, tmp_path / "out")
    marker = read_json(dest / MARKER_NAME)
    (dest / MARKER_NAME).write_text(json.dumps(marker | {"importer_version": 0}))
    import_gguf(tiny_gguf, dest)
    assert read_json(dest / MARKER_NAME) == marker


def test_folder_without_marker_is_not_replaced(tmp_path: Path, tiny_gguf: Path) -> None:
    dest = tmp_path / "mine"
    dest.mkdir()
    (dest / "notes.txt").write_text("keep me")
    with pytest.raises(ModelLoadError, match="not a model folder Tandem imported"):
        import_gguf(tiny_gguf, dest)
    assert (dest / "notes.txt").read_text() == "keep me"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert import_gguf(tiny_gguf, empty) == empty
    assert (empty / MARKER_NAME).is_file()


def test_losing_a_publish_race_uses_the_winners_folder(
    tmp_path: Path, tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_publish = gguf_import.publish

    def another_process_wins_first(staging: Path, dest: Path, stamp: dict[str, Any]) -> Path:
        monkeypatch.setattr(gguf_import, "publish", real_publish)
        import_gguf(tiny_gguf, dest)  # the winner, finishing while we were writing
        winner = (dest / MARKER_NAME).stat().st_ino
        assert real_publish(staging, dest, stamp) == dest
        assert (dest / MARKER_NAME).stat().st_ino == winner
        return dest

    monkeypatch.setattr(gguf_import, "publish", another_process_wins_first)
    dest = tmp_path / "out"
    assert import_gguf(tiny_gguf, dest) == dest
    assert partials(tmp_path) == []
    assert gguf_import.is_current(dest, read_json(dest / MARKER_NAME))


def test_concurrent_imports_agree(tmp_path: Path, tiny_gguf: Path) -> None:
    dest = tmp_path / "out"
    results: list[Path | BaseException] = []
    start = threading.Barrier(3)

    def run() -> None:
        start.wait()
        try:
            results.append(import_gguf(tiny_gguf, dest))
        except BaseException as exc:  # reported by the assert below
            results.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [dest] * 3
    assert partials(tmp_path) == []
    assert set(folder_weights(dest)) == set(TinyModel().hf_weights())


# --------------------------------------------------------------------------
# The real default model against transformers


TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "  leading, trailing and   inner   spaces   ",
    "Ünïcödé àccents: café, naïve, Zürich, São Paulo, Ελληνικά, русский",
    "日本語のテキストと中文文本、한국어 텍스트",
    "emoji 😀🚀 family 👩‍👩‍👧 flag 🇫🇷",
    "def f(x):\n    return x ** 2  # square\n\n\tindented\r\n",
    "tabs\t\tand\n\n\nnewlines",
    "I'm sure they'll've done it, don't you?",
    "It costs $1,234.56 (in 2024), i.e. 3x more: 10% off!",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "inline<|im_end|>special<|endoftext|>tokens",
    "<repo_name>tandem<file_sep>main.py",
    "",
    "a" * 300,
]


@pytest.fixture(scope="module")
def transformers_reference() -> Any:
    transformers = pytest.importorskip("transformers")
    gguf_path = default_gguf_path()
    return transformers.AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)


@pytest.fixture(scope="module")
def default_tokenizer(default_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(default_model_dir / "tokenizer.json"))


@pytest.mark.parametrize("text", TEXTS)
def test_default_tokenizer_matches_transformers(
    default_tokenizer: Tokenizer, transformers_reference: Any, text: str
) -> None:
    ids = default_tokenizer.encode(text).ids
    assert ids == transformers_reference(text)["input_ids"]
    assert default_tokenizer.decode(ids, skip_special_tokens=False) == text


def test_default_tokenizer_splits_off_every_digit(default_tokenizer: Tokenizer) -> None:
    # SmolLM2 was trained with every digit split off before the GPT-2 regex
    # (its tokenizer.json: Digits(individual_digits) then ByteLevel; llama.cpp
    # for pre "smollm": "\p{N}" then the GPT-2 regex). transformers' GGUF
    # conversion leaves the digit split out. On ASCII digits this vocabulary
    # hides the difference (it has no multi-digit or " 1" tokens), but a space
    # before another numeric character shows it: " ½" is "Ġ" + "Â½" here and
    # "ĠÂ" + "½" in transformers.
    vocab = default_tokenizer.get_vocab()
    assert default_tokenizer.encode("12345").tokens == ["1", "2", "3", "4", "5"]
    assert default_tokenizer.encode("in 2024").tokens == ["in", byte_level(" "), "2", "0", "2", "4"]
    assert default_tokenizer.encode(" ½").ids == [vocab[byte_level(" ")], vocab[byte_level("½")]]
    assert default_tokenizer.encode("x ²").tokens == ["x", byte_level(" "), byte_level("²")]


def test_default_chat_template_and_special_tokens(
    default_model_dir: Path, default_tokenizer: Tokenizer
) -> None:
    tokenizer_config = read_json(default_model_dir / "tokenizer_config.json")
    assert "<|im_start|>" in tokenizer_config["chat_template"]
    assert tokenizer_config["eos_token"] == "<|im_end|>"
    assert tokenizer_config["add_bos_token"] is False
    eos_id = read_json(default_model_dir / "config.json")["eos_token_id"]
    assert default_tokenizer.token_to_id("<|im_end|>") == eos_id


@pytest.fixture(scope="module")
def transformers_model(default_model_dir: Path) -> Any:
    transformers = pytest.importorskip("transformers")
    gguf_path = default_gguf_path()
    return transformers.AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
    )


def test_default_tensors_match_transformers(default_model_dir: Path, transformers_model: Any) -> None:
    reference = transformers_model.state_dict()
    assert transformers_model.config.tie_word_embeddings
    del reference["lm_head.weight"]  # tied: the embedding itself
    ours = read_weights(default_model_dir)
    assert set(ours) == set(reference)
    for name, tensor in ours.items():
        assert torch.equal(tensor, reference[name]), name
    # Q4_1 layers and the Q8_0 embedding stay quantized: the folder is the GGUF file's size.
    formats = quantized_formats(default_model_dir)
    assert formats["model.embed_tokens.weight"] == "q8_0"
    assert formats["model.layers.0.mlp.down_proj.weight"] == "q4_1"
    assert (default_model_dir / "model.safetensors").stat().st_size <= 1.05 * default_gguf_path().stat().st_size


def test_default_config_matches_transformers(default_model_dir: Path, transformers_model: Any) -> None:
    hf_config = transformers_model.config
    ours = read_json(default_model_dir / "config.json")
    for key in (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
        "vocab_size",
        "bos_token_id",
        "eos_token_id",
    ):
        assert ours[key] == getattr(hf_config, key), key
    assert ours["rope_theta"] == hf_config.rope_parameters["rope_theta"] == 100000.0
    assert ours["rms_norm_eps"] == 1e-05  # the original config's value, not float32(1e-5)
    assert "rope_scaling" not in ours


def test_imported_weights_run_quantized_by_default_where_a_kernel_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_gguf(tmp_path / "m.gguf", qtype=Q.Q8_0)
    model = load_model(import_gguf(tmp_path / "m.gguf", tmp_path / "out"), "cpu", "float32")
    assert isinstance(model.layers[0].qkv, QuantLinear if cpu_kernel_available() else Linear)
    # Without the GPU kernel (no triton): an imported model is dequantized,
    # never refused, but weights quantized on request (--quantize) are not.
    monkeypatch.setitem(sys.modules, "engine.kernels.triton.quant", None)
    cuda = torch.device("cuda")
    assert resolve_quantized_compute("auto", cuda) == "dequantize"
    assert resolve_quantized_compute("kernel", cuda) == "dequantize"
    with pytest.raises(ModelLoadError, match="Quantizing at load"):
        resolve_quantized_compute("auto", cuda, asked=True)
