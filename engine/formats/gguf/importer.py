"""Import a GGUF file once into a Hugging Face style checkpoint folder.

The engine loads one format: a folder with config.json, model.safetensors,
tokenizer.json and tokenizer_config.json. A GGUF file (llama.cpp's format) is
turned into such a folder by `import_gguf`:

- Quantized matrices stay quantized (engine.model.quant): Q8_0, Q4_0 and Q4_1
  blocks are copied as they are (the folder is about the GGUF file's size),
  other quantized types are requantized to the nearest kept format (Q4_K and
  anything of at most 4.5 bits per weight to q4_1, 5-bit, 6-bit and 8-bit
  types to q8_0), which config.json's "quantization" section records with
  the format of every kept tensor. Embeddings stay quantized too, as in
  llama.cpp: the loader dequantizes the rows it looks up. Norms, biases and
  float matrices (F16, BF16, F32) are stored as float32.
- Tensors get their Hugging Face names, and llama.cpp's reordering of the
  q/k rows for its RoPE kernel is undone, so the folder matches the original
  checkpoint layout.
- The tokenizer is rebuilt from the vocabulary, merges and token types in the
  metadata, with the pre-tokenizer llama.cpp uses for the file's
  `tokenizer.ggml.pre`: the ids must be the ones the model was trained with.
- The folder is written under a hidden `.<name>.partial-<random>` sibling and
  renamed into place, with a marker file (the source's name, size and mtime)
  written last. A folder at `dest` is therefore always complete, and an import
  whose marker matches the source is reused.
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import shutil
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import (
    GGML_QUANT_SIZES,
    GGMLQuantizationType,
    GGUFReader,
    GGUFValueType,
    ReaderTensor,
    TokenType,
)
from gguf.quants import dequantize
from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)

from engine.errors import ModelLoadError, TokenizerError, UnsupportedModelError
from engine.progress import (
    LoadReporter,
    ProgressCallback,
    as_reporter,
    display_path,
    format_bytes,
)
from engine.model.quant import FOLDER_FORMAT_VERSION, GROUP_SIZE, quantize

# Bump whenever the folder written for the same GGUF file changes, so that
# existing imports are redone.
# 2: quantized tensors kept quantized (version 1 folders held float32 only
# and load still; they are replaced on the next import of their file).
IMPORTER_VERSION = 2
MARKER_NAME = "tandem-import.json"

_PARTIAL_INFIX = ".partial-"
# A partial folder nobody wrote to for this long belongs to a crashed import.
_STALE_PARTIAL_SECONDS = 3600.0
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def import_gguf(
    gguf_path: str | Path,
    dest: str | Path,
    *,
    on_progress: ProgressCallback | LoadReporter | None = None,
    cancel: threading.Event | None = None,
) -> Path:
    """Import `gguf_path` into the folder `dest` and return `dest`.

    Returns at once when `dest` already holds an import of this very file
    (same name, size and mtime, same importer version). Raises ModelLoadError
    for a missing, truncated or non-GGUF file, UnsupportedModelError for an
    architecture, tensor type or tokenizer we cannot convert faithfully.

    `on_progress` gets "import" LoadProgress reports (bytes of weights
    written); setting `cancel` stops the import between two tensors with
    LoadCancelled, leaving neither `dest` nor a partial folder behind.
    """
    reporter = as_reporter(on_progress, cancel)
    source = Path(gguf_path)
    dest = Path(dest)
    try:
        stat = source.stat()
    except FileNotFoundError:
        raise ModelLoadError(f"GGUF file not found: {source}") from None
    if not source.is_file():
        raise ModelLoadError(f"{source} is not a file; expected a .gguf model file.")
    stamp = {
        "importer_version": IMPORTER_VERSION,
        "source_name": source.name,
        "source_size": stat.st_size,
        "source_mtime_ns": stat.st_mtime_ns,
    }
    if _is_current_import(dest, stamp):
        return dest
    _check_replaceable(dest)
    reporter.check()

    checkpoint = _read_checkpoint(source)
    total = sum(t.nbytes for t in checkpoint.tensors)
    detail = (
        f"Importing {source.name} ({format_bytes(stat.st_size)}) into "
        f"{display_path(dest)} ({format_bytes(total)}); this happens once"
    )
    reporter.report("import", 0, total, detail)
    staging = dest.parent / f".{dest.name}{_PARTIAL_INFIX}{secrets.token_hex(6)}"
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_partials(dest.parent)
        staging.mkdir()
        _write_json(staging / "config.json", checkpoint.config)
        _write_json(staging / "generation_config.json", checkpoint.generation_config)
        _write_file(staging / "tokenizer.json", checkpoint.tokenizer.to_str().encode())
        _write_json(staging / "tokenizer_config.json", checkpoint.tokenizer_config)
        _write_safetensors(
            staging / "model.safetensors",
            checkpoint.tensors,
            lambda done: reporter.report("import", done, total, detail),
        )
        _write_json(staging / MARKER_NAME, stamp)
        _fsync_dir(staging)
        return _publish(staging, dest, stamp)
    except OSError as exc:
        hint = " The disk is full: free some space and try again." if exc.errno == errno.ENOSPC else ""
        raise ModelLoadError(
            f"Could not write the imported model to {dest.parent}: {exc.strerror or exc}.{hint}"
        ) from exc
    finally:
        # Gone already when published; otherwise the import failed half way.
        shutil.rmtree(staging, ignore_errors=True)


# --------------------------------------------------------------------------
# Reading the GGUF file


@dataclass(frozen=True, slots=True)
class _Architecture:
    hf_class: str
    model_type: str
    # llama.cpp's converter reorders the q/k rows of these models so that
    # ggml's interleaved RoPE matches HF's rotate-half; NEOX-style models
    # (qwen2) are stored unchanged.
    permutes_qk: bool


_ARCHITECTURES = {
    "llama": _Architecture("LlamaForCausalLM", "llama", permutes_qk=True),
    "qwen2": _Architecture("Qwen2ForCausalLM", "qwen2", permutes_qk=False),
}

_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_REQUIRED_LAYER_TENSORS = tuple(f"{name}.weight" for name in _LAYER_TENSORS)
_LAYER_TENSOR_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
_FLOAT_TYPES = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.F64)
# GGUF block types whose blocks are our formats byte for byte.
_KEPT_TYPES = {
    GGMLQuantizationType.Q8_0: "q8_0",
    GGMLQuantizationType.Q4_0: "q4_0",
    GGMLQuantizationType.Q4_1: "q4_1",
}
# Quantized types of at most this many bits per weight are requantized to
# q4_1 (4 bits plus a scale and min per 32), the others to q8_0: the nearest
# kept format that loses no more than the source did.
_REQUANT_TO_Q4_MAX_BITS = 4.5
# Matrices kept quantized: the products' weights and the embedding table.
_QUANTIZABLE_LAYER_TENSORS = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}


@dataclass(frozen=True, slots=True)
class _PlannedTensor:
    hf_name: str
    source: ReaderTensor
    shape: tuple[int, ...]
    # Undo llama.cpp's RoPE row permutation over this many heads.
    rope_heads: int | None = None
    # The engine.model.quant format the tensor is stored in; None: float32.
    quantized: str | None = None

    def entries(self) -> list[tuple[str, str, tuple[int, ...]]]:
        """(safetensors name, dtype, shape) of what the folder stores for it."""
        if self.quantized is None:
            return [(self.hf_name, "F32", self.shape)]
        rows, cols = self.shape
        groups = (rows, cols // GROUP_SIZE)
        out = [
            (f"{self.hf_name}.qdata", "I8", (rows, cols))
            if self.quantized == "q8_0"
            else (f"{self.hf_name}.qdata", "U8", (rows, cols // 2)),
            (f"{self.hf_name}.scales", "F16", groups),
        ]
        if self.quantized == "q4_1":
            out.append((f"{self.hf_name}.mins", "F16", groups))
        return out

    @property
    def nbytes(self) -> int:
        """Size as the folder stores it."""
        return sum(_DTYPE_SIZES[dtype] * int(np.prod(shape, dtype=np.int64)) for _, dtype, shape in self.entries())

    def load(self) -> list[np.ndarray]:
        """The arrays of `entries()`, in that order."""
        if self.quantized is None:
            arrays = [_dequantize(self.source).reshape(self.shape)]
        elif self.source.tensor_type in _KEPT_TYPES:
            arrays = _split_blocks(self.source, self.shape)
        else:
            requantized = quantize(_dequantize(self.source).reshape(self.shape), self.quantized)
            arrays = [requantized.data.numpy(), requantized.scales.numpy()]
            if requantized.mins is not None:
                arrays.append(requantized.mins.numpy())
        if self.rope_heads is not None:
            arrays = [_unpermute_rope_rows(array, self.rope_heads) for array in arrays]
        return arrays


def _split_blocks(tensor: ReaderTensor, shape: tuple[int, ...]) -> list[np.ndarray]:
    """A Q8_0 / Q4_0 / Q4_1 tensor's blocks as (qdata, scales[, mins]) arrays."""
    rows, cols = shape
    fmt = _KEPT_TYPES[tensor.tensor_type]
    blocks = np.asarray(tensor.data, dtype=np.uint8).reshape(rows, cols // GROUP_SIZE, -1)
    scales = np.ascontiguousarray(blocks[..., 0:2]).view("<f2").reshape(rows, -1)
    if fmt == "q8_0":
        return [np.ascontiguousarray(blocks[..., 2:]).view(np.int8).reshape(rows, cols), scales]
    if fmt == "q4_0":
        return [np.ascontiguousarray(blocks[..., 2:]).reshape(rows, cols // 2), scales]
    mins = np.ascontiguousarray(blocks[..., 2:4]).view("<f2").reshape(rows, -1)
    return [np.ascontiguousarray(blocks[..., 4:]).reshape(rows, cols // 2), scales, mins]


def _kept_format(tensor: ReaderTensor) -> str | None:
    """The format a quantizable matrix is stored in, None to store float32."""
    if tensor.tensor_type in _FLOAT_TYPES or tensor.tensor_type == GGMLQuantizationType.BF16:
        return None
    kept = _KEPT_TYPES.get(tensor.tensor_type)
    if kept is not None:
        return kept
    block, size = GGML_QUANT_SIZES[tensor.tensor_type]
    return "q4_1" if size * 8 / block <= _REQUANT_TO_Q4_MAX_BITS else "q8_0"


@dataclass(frozen=True, slots=True)
class _Checkpoint:
    config: dict[str, Any]
    generation_config: dict[str, Any]
    tokenizer: Tokenizer
    tokenizer_config: dict[str, Any]
    tensors: list[_PlannedTensor]


class _Metadata:
    """The key/value metadata of one GGUF file, as plain Python values."""

    def __init__(self, reader: GGUFReader, source: Path) -> None:
        self._fields = reader.fields
        self.source = source

    def get(self, key: str, default: Any = None) -> Any:
        field = self._fields.get(key)
        if field is None:
            return default
        try:
            value = field.contents()
        except UnicodeDecodeError as exc:
            raise ModelLoadError(
                f"{self.source.name}: the GGUF metadata {key!r} is not valid UTF-8; the file is corrupt."
            ) from exc
        if field.types == [GGUFValueType.FLOAT32]:
            # float32(1e-5) read as a double is 9.999999747378752e-06; the
            # shortest decimal that rounds to the same float32 is what the
            # original config said.
            value = float(str(np.float32(value)))
        return value

    def require(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise ModelLoadError(
                f"{self.source.name} has no {key!r} in its GGUF metadata; the file is incomplete "
                "or was written by a converter Tandem does not know."
            )
        return value


def _read_checkpoint(source: Path) -> _Checkpoint:
    reader = _open_reader(source)
    meta = _Metadata(reader, source)
    if reader.byte_order != "I":
        raise UnsupportedModelError(f"{source.name} is a big-endian GGUF file, which Tandem cannot import.")
    if int(meta.get("split.count", 1)) > 1:
        raise UnsupportedModelError(
            f"{source.name} is one part of a split GGUF model. Merge the parts into one file first "
            "(llama.cpp: llama-gguf-split --merge)."
        )
    arch_name = meta.require("general.architecture")
    arch = _ARCHITECTURES.get(arch_name)
    if arch is None:
        raise UnsupportedModelError(
            f"{source.name}: the GGUF architecture {arch_name!r} is not supported. "
            f"Tandem imports these GGUF architectures: {', '.join(sorted(_ARCHITECTURES))}."
        )
    if meta.get(f"{arch_name}.expert_count", 0):
        raise UnsupportedModelError(
            f"{source.name} is a mixture-of-experts model, which Tandem does not run."
        )

    tensors = {tensor.name: tensor for tensor in reader.tensors}
    config = _model_config(meta, arch_name, arch, tensors)
    planned = _plan_tensors(source, tensors, config, arch)
    quantization = _quantization_section(planned)
    if quantization is not None:
        config["quantization"] = quantization
    tokenizer, tokenizer_config = _build_tokenizer(meta)
    tokenizer_config["model_max_length"] = config["max_position_embeddings"]
    generation_config = {
        "bos_token_id": config["bos_token_id"],
        "eos_token_id": _end_of_generation_ids(meta),
    }
    return _Checkpoint(config, generation_config, tokenizer, tokenizer_config, planned)


def _open_reader(source: Path) -> GGUFReader:
    try:
        with source.open("rb") as file:
            magic = file.read(4)
    except OSError as exc:
        raise ModelLoadError(f"Cannot read {source}: {exc.strerror}.") from exc
    if magic != b"GGUF":
        raise ModelLoadError(f"{source} is not a GGUF file (it does not start with the GGUF signature).")
    try:
        return GGUFReader(source)
    except ValueError as exc:
        if "GGMLQuantizationType" in str(exc):
            raise UnsupportedModelError(
                f"{source.name} uses a tensor type the installed gguf package does not know ({exc}); "
                "upgrading the gguf package may help."
            ) from exc
        raise ModelLoadError(
            f"Cannot read {source}: {exc}. The file is probably truncated or corrupt; download it again."
        ) from exc
    except (IndexError, KeyError, OverflowError, UnicodeDecodeError) as exc:
        raise ModelLoadError(
            f"Cannot read {source} ({type(exc).__name__}: {exc}). The file is probably truncated or "
            "corrupt; download it again."
        ) from exc


def _model_config(
    meta: _Metadata, arch_name: str, arch: _Architecture, tensors: dict[str, ReaderTensor]
) -> dict[str, Any]:
    def key(name: str) -> str:
        return f"{arch_name}.{name}"

    embedding = tensors.get("token_embd.weight")
    if embedding is None:
        raise ModelLoadError(f"{meta.source.name} has no token_embd.weight tensor; the file is incomplete.")
    hidden_size = int(meta.require(key("embedding_length")))
    n_heads = int(meta.require(key("attention.head_count")))
    n_kv_heads = meta.get(key("attention.head_count_kv"), n_heads)
    if isinstance(n_kv_heads, list):
        if len(set(n_kv_heads)) != 1:
            raise UnsupportedModelError(f"{meta.source.name} has a different number of KV heads per layer.")
        n_kv_heads = n_kv_heads[0]
    head_dim = int(meta.get(key("attention.key_length"), hidden_size // n_heads))
    rotary_dim = int(meta.get(key("rope.dimension_count"), head_dim))
    if rotary_dim != head_dim:
        raise UnsupportedModelError(
            f"{meta.source.name} applies RoPE to {rotary_dim} of {head_dim} head dimensions, "
            "which Tandem does not support."
        )
    rope_theta = float(meta.get(key("rope.freq_base"), 10000.0))

    config: dict[str, Any] = {
        "architectures": [arch.hf_class],
        "model_type": arch.model_type,
        "hidden_size": hidden_size,
        "intermediate_size": int(meta.require(key("feed_forward_length"))),
        "num_hidden_layers": int(meta.require(key("block_count"))),
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(n_kv_heads),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": float(meta.require(key("attention.layer_norm_rms_epsilon"))),
        "rope_theta": rope_theta,
        "max_position_embeddings": int(meta.require(key("context_length"))),
        "vocab_size": int(embedding.shape[-1]),
        "tie_word_embeddings": "output.weight" not in tensors,
    }
    if arch.model_type == "llama":
        config["attention_bias"] = "blk.0.attn_q.bias" in tensors
        config["mlp_bias"] = False
    rope_freqs = tensors.get("rope_freqs.weight")
    rope_scaling = _rope_scaling(
        meta,
        arch_name,
        None if rope_freqs is None else _dequantize(rope_freqs).reshape(-1),
        rope_theta,
        head_dim,
    )
    if rope_scaling is not None:
        config["rope_scaling"] = rope_scaling
    config["bos_token_id"] = meta.get("tokenizer.ggml.bos_token_id")
    config["eos_token_id"] = meta.get("tokenizer.ggml.eos_token_id")
    config["torch_dtype"] = "float32"
    return config


def _rope_scaling(
    meta: _Metadata, arch_name: str, rope_freqs: np.ndarray | None, rope_theta: float, head_dim: int
) -> dict[str, Any] | None:
    kind = meta.get(f"{arch_name}.rope.scaling.type")
    factor = meta.get(f"{arch_name}.rope.scaling.factor")
    if kind is None and (linear := meta.get(f"{arch_name}.rope.scale_linear")) is not None:
        kind, factor = "linear", linear  # the key older converters wrote
    if rope_freqs is not None:
        if kind not in (None, "none"):
            raise UnsupportedModelError(
                f"{meta.source.name} combines a rope_freqs tensor with {kind!r} RoPE scaling."
            )
        return _llama3_rope_scaling(meta.source, rope_freqs, rope_theta, head_dim)
    if kind in (None, "none") or factor in (None, 1.0):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": factor}
    if kind == "yarn":
        scaling = {
            "rope_type": "yarn",
            "factor": factor,
            "original_max_position_embeddings": int(
                meta.require(f"{arch_name}.rope.scaling.original_context_length")
            ),
        }
        for name in ("beta_fast", "beta_slow"):
            if (value := meta.get(f"{arch_name}.rope.scaling.yarn_{name}")) is not None:
                scaling[name] = value
        return scaling
    raise UnsupportedModelError(
        f"{meta.source.name} uses {kind!r} RoPE scaling, which Tandem does not support."
    )


def _llama3_rope_scaling(
    source: Path, rope_freqs: np.ndarray, rope_theta: float, head_dim: int
) -> dict[str, Any]:
    """Recover HF's "llama3" rope_scaling from the rope_freqs tensor llama.cpp bakes it into.

    llama.cpp divides rotary frequency i by rope_freqs[i]: 1 for wavelengths
    below L/high, `factor` above L/low, and 1/((1-s)/factor + s) with
    s = (L/wavelength - low)/(high - low) in between (L: the original context).
    Only the ratios L/low and L/high affect the frequencies, so low = 1 and a
    line fit of L/wavelength = 1 + s (high - 1) over the blended band gives L
    and high. The result is checked by recomputing the tensor.
    """
    divisors = rope_freqs.astype(np.float64)
    wavelengths = 2 * np.pi * rope_theta ** (np.arange(0, head_dim, 2) / head_dim)
    factor = float(divisors.max())
    blended = (divisors > 1 + 1e-6) & (divisors < factor * (1 - 1e-6))
    scaling: dict[str, Any] | None = None
    if len(divisors) == len(wavelengths) and factor > 1 and blended.sum() >= 2:
        s = (1 / divisors[blended] - 1 / factor) / (1 - 1 / factor)
        slope, intercept = np.polyfit(s, 1 / wavelengths[blended], 1)
        original = round(1 / intercept)
        scaling = {
            "rope_type": "llama3",
            "factor": float(str(np.float32(factor))),
            "low_freq_factor": 1.0,
            "high_freq_factor": float(f"{1 + slope * original:.6g}"),
            "original_max_position_embeddings": original,
        }
    if scaling is None or not np.allclose(_llama3_divisors(scaling, wavelengths), divisors, rtol=1e-4):
        raise UnsupportedModelError(
            f"{source.name} has a rope_freqs tensor that is not Llama 3 RoPE scaling; Tandem cannot run it."
        )
    return scaling


def _llama3_divisors(scaling: dict[str, Any], wavelengths: np.ndarray) -> np.ndarray:
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    s = (original / wavelengths - low) / (high - low)
    blended = 1 / ((1 - s) / factor + s)
    scaled = np.where(wavelengths > original / low, factor, blended)
    return np.where(wavelengths < original / high, 1.0, scaled)


def _end_of_generation_ids(meta: _Metadata) -> int | list[int] | None:
    # Instruct models often end a turn with a token other than eos (Llama 3:
    # <|eot_id|>); generation must stop at any of them.
    ids: list[int] = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        token_id = meta.get(f"tokenizer.ggml.{key}")
        if token_id is not None and token_id not in ids:
            ids.append(token_id)
    if not ids:
        return None
    return ids[0] if len(ids) == 1 else ids


def _plan_tensors(
    source: Path, tensors: dict[str, ReaderTensor], config: dict[str, Any], arch: _Architecture
) -> list[_PlannedTensor]:
    hidden = config["hidden_size"]
    q_rows = config["num_attention_heads"] * config["head_dim"]
    kv_rows = config["num_key_value_heads"] * config["head_dim"]
    ffn = config["intermediate_size"]
    n_layers = config["num_hidden_layers"]
    matrix_shapes = {
        "attn_q": (q_rows, hidden),
        "attn_k": (kv_rows, hidden),
        "attn_v": (kv_rows, hidden),
        "attn_output": (hidden, q_rows),
        "ffn_gate": (ffn, hidden),
        "ffn_up": (ffn, hidden),
        "ffn_down": (hidden, ffn),
        "attn_norm": (hidden,),
        "ffn_norm": (hidden,),
    }
    rope_heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}

    planned: list[_PlannedTensor] = []
    for name, tensor in tensors.items():
        if name == "rope_freqs.weight":
            continue  # folded into config["rope_scaling"]
        if name in _GLOBAL_TENSORS:
            hf_name = _GLOBAL_TENSORS[name]
            expected: tuple[int, ...] = (
                (hidden,) if name == "output_norm.weight" else (config["vocab_size"], hidden)
            )
            heads = None
            quantizable = name != "output_norm.weight"
        else:
            match = _LAYER_TENSOR_RE.fullmatch(name)
            if match is None or match[2] not in _LAYER_TENSORS or int(match[1]) >= n_layers:
                raise UnsupportedModelError(
                    f"{source.name} contains a tensor Tandem does not know: {name!r}. "
                    "It is not a plain Llama-family model."
                )
            layer, kind, suffix = int(match[1]), match[2], match[3]
            hf_name = f"model.layers.{layer}.{_LAYER_TENSORS[kind]}.{suffix}"
            expected = matrix_shapes[kind] if suffix == "weight" else matrix_shapes[kind][:1]
            heads = rope_heads.get(kind) if arch.permutes_qk else None
            quantizable = kind in _QUANTIZABLE_LAYER_TENSORS and suffix == "weight"
        shape = tuple(int(dim) for dim in reversed(tensor.shape.tolist()))
        if shape != expected:
            raise ModelLoadError(
                f"{source.name}: tensor {name} has shape {shape}, but the model's metadata implies "
                f"{expected}. The file is corrupt or inconsistent."
            )
        _check_tensor_type(source, tensor)
        kept = _kept_format(tensor) if quantizable and shape[-1] % GROUP_SIZE == 0 else None
        planned.append(_PlannedTensor(hf_name, tensor, shape, heads, kept))

    names = set(tensors)
    missing = [name for name in ("token_embd.weight", "output_norm.weight") if name not in names]
    missing += [
        f"blk.{layer}.{name}"
        for layer in range(n_layers)
        for name in _REQUIRED_LAYER_TENSORS
        if f"blk.{layer}.{name}" not in names
    ]
    if missing:
        raise ModelLoadError(
            f"{source.name} lacks tensors the model needs ({', '.join(missing[:5])}"
            f"{', ...' if len(missing) > 5 else ''}); the file is incomplete."
        )
    return planned


def _quantization_section(planned: list[_PlannedTensor]) -> dict[str, Any] | None:
    """config.json's record of the kept formats (read by engine.formats.loader)."""
    kept = {t.hf_name: t.quantized for t in planned if t.quantized is not None}
    if not kept:
        return None
    requantized = {
        t.source.tensor_type.name: t.quantized
        for t in planned
        if t.quantized is not None and t.source.tensor_type not in _KEPT_TYPES
    }
    return {
        "method": "tandem-blocks",
        "version": FOLDER_FORMAT_VERSION,
        "group_size": GROUP_SIZE,
        "source": "gguf",
        # GGUF type -> the format it was requantized to (the model's details show it).
        "requantized": dict(sorted(requantized.items())),
        "tensors": kept,
    }


def _check_tensor_type(source: Path, tensor: ReaderTensor) -> None:
    """Fail before writing anything if a tensor's type cannot be dequantized."""
    if tensor.tensor_type in _FLOAT_TYPES:
        return
    sample = tensor.data[:1] if tensor.data.ndim > 1 else tensor.data
    try:
        dequantize(sample, tensor.tensor_type)
    except NotImplementedError:
        raise UnsupportedModelError(
            f"{source.name}: tensor {tensor.name} has type {tensor.tensor_type.name}, which the installed "
            "gguf package cannot dequantize. Use a file with another quantization (Q4_K_M, Q8_0, F16, ...)."
        ) from None


def _dequantize(tensor: ReaderTensor) -> np.ndarray:
    if tensor.tensor_type in _FLOAT_TYPES:
        return tensor.data.astype(np.float32, copy=False)
    return dequantize(tensor.data, tensor.tensor_type)


def _unpermute_rope_rows(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """Invert convert_hf_to_gguf.py's `permute` of q/k rows (weights or biases).

    llama.cpp stores each head's rows pairwise interleaved (x0, y0, x1, y1, ...)
    for ggml's RoPE; HF keeps the two halves apart (x0, x1, ..., y0, y1, ...).
    """
    half_head = weight.shape[0] // n_heads // 2
    return weight.reshape(n_heads, half_head, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


# --------------------------------------------------------------------------
# Tokenizer


# The GPT-2 split regex, applied after each digit has been split off on its
# own: llama.cpp's "smollm"/"starcoder" pre-tokenizers, and what the original
# tokenizer.json of those models does.
def _individual_digits_then_gpt2() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )


def _gpt2() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False)


def _split_then_bytes(pattern: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True, slots=True)
class _ByteLevelStyle:
    # A factory, so that no two tokenizers share one mutable pre-tokenizer.
    pre_tokenizer: Callable[[], pre_tokenizers.PreTokenizer]
    # llama.cpp takes a whole pre-token from the vocabulary before merging
    # (HF: BPE ignore_merges) for the Llama 3 family.
    ignore_merges: bool = False
    nfc: bool = False
    add_bos_default: bool = False


_LLAMA3_STYLE = _ByteLevelStyle(
    lambda: _split_then_bytes(_LLAMA3_SPLIT), ignore_merges=True, add_bos_default=True
)
# Qwen2's own tokenizer normalizes to NFC before splitting.
_QWEN2_STYLE = _ByteLevelStyle(lambda: _split_then_bytes(_QWEN2_SPLIT), nfc=True)

# Keyed by tokenizer.ggml.pre. A name missing here is refused rather than
# guessed: a wrong split silently gives the model ids it never saw.
_BYTE_LEVEL_STYLES = {
    "gpt2": _ByteLevelStyle(_gpt2),
    "smollm": _ByteLevelStyle(_individual_digits_then_gpt2),
    "starcoder": _ByteLevelStyle(_individual_digits_then_gpt2),
    "llama3": _LLAMA3_STYLE,
    "llama-v3": _LLAMA3_STYLE,
    "llama-bpe": _LLAMA3_STYLE,
    "qwen2": _QWEN2_STYLE,
    "deepseek-r1-qwen": _QWEN2_STYLE,
}


def _build_tokenizer(meta: _Metadata) -> tuple[Tokenizer, dict[str, Any]]:
    kind = meta.get("tokenizer.ggml.model")
    tokens: list[str] | None = meta.get("tokenizer.ggml.tokens")
    if kind is None or not tokens:
        raise TokenizerError(f"{meta.source.name} has no tokenizer in its metadata; Tandem cannot use it.")
    token_types: list[int] = meta.get("tokenizer.ggml.token_type") or [TokenType.NORMAL] * len(tokens)
    if len(token_types) != len(tokens):
        raise TokenizerError(
            f"{meta.source.name}: the tokenizer has {len(tokens)} tokens but {len(token_types)} token types."
        )
    # First occurrence wins for duplicated strings, as in llama.cpp's lookup.
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        vocab.setdefault(token, index)

    if kind == "gpt2":
        tokenizer, add_bos_default = _byte_level_tokenizer(meta, vocab)
        special_types = {TokenType.CONTROL}
    elif kind == "llama":
        tokenizer = _sentencepiece_tokenizer(meta, tokens, token_types, vocab)
        add_bos_default = True
        special_types = {TokenType.CONTROL, TokenType.UNKNOWN}
    else:
        raise UnsupportedModelError(
            f"{meta.source.name} uses the tokenizer model {kind!r}; Tandem supports 'gpt2' (byte-level BPE) "
            "and 'llama' (SentencePiece BPE)."
        )

    # Special and user-defined tokens are matched whole in the text, never
    # split; only special ones are dropped when decoding with skip_special_tokens.
    tokenizer.add_special_tokens(
        [
            AddedToken(token, special=True, normalized=False)
            for token, token_type in zip(tokens, token_types)
            if token_type in special_types and token
        ]
    )
    tokenizer.add_tokens(
        [
            AddedToken(token, special=False, normalized=False)
            for token, token_type in zip(tokens, token_types)
            if token_type == TokenType.USER_DEFINED and token
        ]
    )

    def special(key: str) -> tuple[str, int] | None:
        token_id = meta.get(f"tokenizer.ggml.{key}")
        if token_id is None or not 0 <= token_id < len(tokens):
            return None
        return tokens[token_id], token_id

    bos, eos = special("bos_token_id"), special("eos_token_id")
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", add_bos_default))
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
    added = [token for token, wanted in ((bos, add_bos), (eos, add_eos)) if wanted]
    if None in added:
        raise TokenizerError(f"{meta.source.name} asks to add a BOS/EOS token it does not define.")
    if added:
        template = ([bos[0]] if add_bos else []) + ["$A"] + ([eos[0]] if add_eos else [])
        tokenizer.post_processor = processors.TemplateProcessing(
            single=template, special_tokens=list(dict(added).items())
        )

    def text(token: tuple[str, int] | None) -> str | None:
        return None if token is None else token[0]

    tokenizer_config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "bos_token": text(bos),
        "eos_token": text(eos),
        "unk_token": text(special("unknown_token_id")),
        "pad_token": text(special("padding_token_id")),
        "clean_up_tokenization_spaces": False,
    }
    chat_template = meta.get("tokenizer.chat_template")
    if chat_template is not None:
        tokenizer_config["chat_template"] = chat_template
    return tokenizer, tokenizer_config


def _byte_level_tokenizer(meta: _Metadata, vocab: dict[str, int]) -> tuple[Tokenizer, bool]:
    pre = meta.get("tokenizer.ggml.pre", "default")
    style = _BYTE_LEVEL_STYLES.get(pre)
    if style is None:
        raise UnsupportedModelError(
            f"{meta.source.name} uses the byte-level pre-tokenizer {pre!r}, which Tandem does not know; "
            f"known: {', '.join(sorted(_BYTE_LEVEL_STYLES))}."
        )
    merges = _parse_merges(meta)
    tokenizer = Tokenizer(models.BPE(vocab, merges, ignore_merges=style.ignore_merges))
    if style.nfc:
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = style.pre_tokenizer()
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer, style.add_bos_default


def _parse_merges(meta: _Metadata) -> list[tuple[str, str]]:
    merges = []
    for merge in meta.get("tokenizer.ggml.merges") or ():
        left, sep, right = merge.partition(" ")
        if not sep or not left or not right:
            raise TokenizerError(f"{meta.source.name} has a malformed BPE merge: {merge!r}.")
        merges.append((left, right))
    return merges


def _sentencepiece_tokenizer(
    meta: _Metadata, tokens: list[str], token_types: list[int], vocab: dict[str, int]
) -> Tokenizer:
    """SentencePiece BPE (Llama 2, Mistral) as an HF BPE with byte fallback.

    Like llama.cpp (and HF's legacy Llama tokenizer), a space is prepended to
    every stretch of text, including the one right after a special token.
    """
    merges = _parse_merges(meta)
    if not merges:
        scores = meta.get("tokenizer.ggml.scores")
        if scores is None or len(scores) != len(tokens):
            raise TokenizerError(
                f"{meta.source.name} has a SentencePiece vocabulary without scores or merges."
            )
        merges = _merges_from_scores(tokens, token_types, scores, vocab)
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if unk_id is not None else None
    tokenizer = Tokenizer(models.BPE(vocab, merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    add_space_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    replace_spaces = normalizers.Replace(" ", "\u2581")
    if add_space_prefix:
        tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), replace_spaces])
    else:
        tokenizer.normalizer = replace_spaces
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    tokenizer.decoder = decoders.Sequence(steps)
    return tokenizer


def _merges_from_scores(
    tokens: list[str], token_types: list[int], scores: list[float], vocab: dict[str, int]
) -> list[tuple[str, str]]:
    """The merge ranks SentencePiece BPE implies: a higher-scored piece merges first.

    Only normal pieces are merge results; SentencePiece never builds control,
    byte or unknown pieces from text.
    """
    ranked: list[tuple[float, int, str, str]] = []
    for index, (piece, token_type) in enumerate(zip(tokens, token_types)):
        if token_type != TokenType.NORMAL or vocab[piece] != index:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                ranked.append((-scores[index], index, left, right))
    ranked.sort()
    return [(left, right) for _, _, left, right in ranked]


# --------------------------------------------------------------------------
# Writing the folder


def _write_safetensors(
    path: Path, tensors: list[_PlannedTensor], written: Callable[[int], None] | None = None
) -> None:
    """Stream the tensors into a safetensors file, converting one at a time.

    The header needs only shapes, so it is written first and at most one
    converted tensor is in memory at any time. `written(bytes_so_far)` is
    called after each tensor (it may raise to stop the import).
    """
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for tensor in tensors:
        for name, dtype, shape in tensor.entries():
            size = _DTYPE_SIZES[dtype] * int(np.prod(shape, dtype=np.int64))
            header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
            offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data section starts 8-byte aligned
    with path.open("wb") as file:
        file.write(struct.pack("<Q", len(encoded)))
        file.write(encoded)
        done = 0
        for tensor in tensors:
            for (_, dtype, shape), array in zip(tensor.entries(), tensor.load(), strict=True):
                array = np.ascontiguousarray(array, dtype=_NUMPY_DTYPES[dtype])
                assert array.shape == shape, (tensor.hf_name, array.shape, shape)
                file.write(memoryview(array.reshape(-1)).cast("B"))
                done += array.nbytes
            if written is not None:
                written(done)
        file.flush()
        os.fsync(file.fileno())


_DTYPE_SIZES = {"F32": 4, "F16": 2, "I8": 1, "U8": 1}
_NUMPY_DTYPES = {"F32": "<f4", "F16": "<f2", "I8": "i1", "U8": "u1"}


def _write_json(path: Path, value: Any) -> None:
    _write_file(path, (json.dumps(value, indent=2, ensure_ascii=False) + "\n").encode())


def _write_file(path: Path, data: bytes) -> None:
    with path.open("wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())


def _fsync_dir(path: Path) -> None:
    if os.name != "posix":
        return  # directories cannot be opened for fsync on Windows; NTFS journals renames
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_marker(folder: Path) -> dict[str, Any] | None:
    try:
        marker = json.loads((folder / MARKER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def _is_current_import(folder: Path, stamp: dict[str, Any]) -> bool:
    return _read_marker(folder) == stamp and all((folder / name).is_file() for name in _REQUIRED_FILES)


def _check_replaceable(dest: Path) -> None:
    """Refuse to replace anything but an older import or an empty folder."""
    if not dest.exists() and not dest.is_symlink():
        return
    if dest.is_dir() and not dest.is_symlink():
        if _read_marker(dest) is not None or not any(dest.iterdir()):
            return
    raise ModelLoadError(
        f"{dest} already exists and is not a model folder Tandem imported; move it away to import there."
    )


def _publish(staging: Path, dest: Path, stamp: dict[str, Any]) -> Path:
    """Rename the finished staging folder to `dest`.

    A concurrent import of the same file may win the rename; its folder is as
    good as ours. An outdated import at `dest` is moved aside and deleted.
    """
    for _ in range(3):
        try:
            os.rename(staging, dest)
        except OSError as exc:
            if _is_current_import(dest, stamp):
                return dest
            if not dest.exists():
                raise ModelLoadError(f"Could not create {dest}: {exc}") from exc
            _check_replaceable(dest)
            discard_folder(dest)
            continue
        _fsync_dir(dest.parent)
        return dest
    raise ModelLoadError(
        f"Could not move the imported model into {dest}; another process keeps replacing it."
    )


def discard_folder(folder: Path) -> None:
    """Delete an imported model folder. It is renamed to a partial name
    first, so a crash while deleting leaves only what the stale-partial sweep
    of the next import removes."""
    doomed = folder.parent / f".{folder.name}{_PARTIAL_INFIX}{secrets.token_hex(6)}"
    try:
        os.rename(folder, doomed)
    except FileNotFoundError:
        return
    shutil.rmtree(doomed, ignore_errors=True)


def _remove_stale_partials(parent: Path) -> None:
    now = time.time()
    for entry in parent.glob(f".*{_PARTIAL_INFIX}*"):
        try:
            if not entry.is_dir() or entry.is_symlink():
                continue
            last_write = max([entry.stat().st_mtime] + [child.stat().st_mtime for child in entry.iterdir()])
        except OSError:
            continue  # vanished meanwhile: another process finished or cleaned it
        if now - last_write > _STALE_PARTIAL_SECONDS:
            shutil.rmtree(entry, ignore_errors=True)
