"""Import a GGUF file once into a Hugging Face style checkpoint folder.

The engine loads one format: a folder with config.json, model.safetensors,
tokenizer.json and tokenizer_config.json. A GGUF file (llama.cpp's format) is
turned into such a folder by `import_gguf`:

- Quantized matrices stay quantized (engine.model.quant): Q8_0, Q4_0 and Q4_1
  blocks are split into levels and scales, Q4_K, Q5_K, Q6_K, Q5_0 and Q5_1
  blocks are stored whole, each row's bytes as the file holds them (the
  folder is about the GGUF file's size); the other quantized types (Q2_K,
  Q3_K, the IQ types) are requantized to the nearest kept format (at most
  4.5 bits per weight to q4_1, more to q8_0), which config.json's
  "quantization" section records with the format of every kept tensor.
  Embeddings stay quantized too, as in llama.cpp: the loader dequantizes
  the rows it looks up. Norms, biases and float matrices (F16, BF16, F32)
  are stored as float32.
- The file's `general.architecture` names its family (engine/model/families);
  its metadata becomes the family's config.json fields
  (engine/formats/gguf/hparams.py). Tensors get the family's Hugging Face
  names, llama.cpp's reordering of the q/k rows for its RoPE kernel is
  undone where the converter made it, and Gemma's norms, stored as `1 + w`,
  are stored as w: the folder matches the original checkpoint layout.
- The tokenizer is rebuilt from the vocabulary, merges and token types in the
  metadata, with the pre-tokenizer llama.cpp uses for the file's
  `tokenizer.ggml.pre`: the ids must be the ones the model was trained with.
- The folder is written under a hidden sibling and renamed into place, with
  a marker file (the source's name, size and mtime) written last
  (engine/formats/staged_folder.py): a folder at `dest` is always complete,
  and an import whose marker matches the source is reused.

The file is read by engine/formats/gguf/reader.py, and what is kept in which
format follows the tables of engine/formats/gguf/tables.py; the tokenizer is
rebuilt by engine/formats/gguf/tokenizer.py.
"""

from __future__ import annotations

import errno
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf.quants import dequantize
from tokenizers import Tokenizer

from engine.errors import FolderWriteError, ModelLoadError, TokenizerError, UnsupportedModelError
from engine.formats.gguf.reader import GGUFFile, GGUFMetadata, GGUFTensorInfo, open_gguf
from engine.formats.gguf.hparams import family_fields
from engine.formats.gguf.rope_scaling import longrope_scaling, rope_labels, rope_scaling
from engine.formats.gguf.tables import (
    CONFIG_TENSORS,
    FLOAT_TYPES,
    KEPT_TYPES,
    LAYER_NUMBER_RE,
    LAYER_TENSOR_RE,
    gguf_family,
    hf_tensor_name,
    is_shifted_norm,
    layer_modules,
    required_layer_tensors,
    stored_format,
)
from engine.formats.gguf.tokenizer import build_tokenizer
from engine.formats import model_json
from engine.params import recommended_sampling
from engine.formats.safetensors import TensorEntry, entry_nbytes, write_streamed
from engine.formats.staged_folder import (
    MARKER_NAME,
    check_replaceable,
    discard_folder,
    fsync_dir,
    is_current,
    publish,
    remove_stale_partials,
    staging_path,
    write_file,
    write_json,
)
from engine.model.config import check_dimensions, check_layer_indices, check_rope_and_window
from engine.model.quant_formats import FOLDER_FORMAT_VERSION, GROUP_SIZE, RAW_BLOCK_FORMATS
from engine.model import tokenizer as model_tokenizer
from engine.model.families import Family
from engine.progress import (
    LoadReporter,
    ProgressCallback,
    as_reporter,
    display_path,
    format_bytes,
)

__all__ = ["IMPORTER_VERSION", "MARKER_NAME", "discard_folder", "import_gguf"]

# Bump whenever the folder written for the same GGUF file changes, so that
# existing imports are redone.
# 2: quantized tensors kept quantized (version 1 folders held float32 only
# and load still; they are replaced on the next import of their file).
# 3: the families' registry (engine/model/families); generation also stops
# at the end-of-turn tokens llama.cpp finds by their text.
# 4: Q4_K, Q5_K, Q6_K, Q5_0 and Q5_1 kept byte for byte, no longer requantized.
IMPORTER_VERSION = 4

# config.json's dimension fields -> the GGUF keys they come from (after the
# architecture's prefix), so that a refusal names the key in the file.
GGUF_DIMENSION_KEYS = {
    "hidden_size": "embedding_length",
    "intermediate_size": "feed_forward_length",
    "num_hidden_layers": "block_count",
    "num_attention_heads": "attention.head_count",
    "num_key_value_heads": "attention.head_count_kv",
    "head_dim": "attention.key_length",
    "max_position_embeddings": "context_length",
}


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
    if is_current(dest, stamp):
        return dest
    check_replaceable(dest)
    reporter.check()

    checkpoint = _read_checkpoint(source)
    total = sum(t.nbytes for t in checkpoint.tensors)
    detail = (
        f"Importing {source.name} ({format_bytes(stat.st_size)}) into "
        f"{display_path(dest)} ({format_bytes(total)}); this happens once"
    )
    reporter.report("import", 0, total, detail)
    staging = staging_path(dest)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_partials(dest.parent)
        staging.mkdir()
        write_json(staging / "config.json", checkpoint.config)
        write_json(staging / "generation_config.json", checkpoint.generation_config)
        write_file(staging / "tokenizer.json", checkpoint.tokenizer.to_str().encode())
        write_json(staging / "tokenizer_config.json", checkpoint.tokenizer_config)
        _check_loadable_sizes(staging, source)
        _write_safetensors(
            staging / "model.safetensors",
            checkpoint.tensors,
            lambda done: reporter.report("import", done, total, detail),
        )
        write_json(staging / MARKER_NAME, stamp)
        fsync_dir(staging)
        return publish(staging, dest, stamp)
    except OSError as exc:
        hint = " The disk is full: free some space and try again." if exc.errno == errno.ENOSPC else ""
        raise FolderWriteError(
            f"Could not write the imported model to {dest.parent}: {exc.strerror or exc}.{hint}"
        ) from exc
    finally:
        # Gone already when published; otherwise the import failed half way.
        shutil.rmtree(staging, ignore_errors=True)


def _check_loadable_sizes(staging: Path, source: Path) -> None:
    """Refuse an import whose files the loader would refuse as too big (a
    chat template or vocabulary of tens of megabytes fits the GGUF reader's
    budget but not a folder's JSON files)."""
    limits = {name: model_json.MAX_JSON_BYTES for name in ("config.json", "generation_config.json", "tokenizer_config.json")}
    limits["tokenizer.json"] = model_tokenizer.MAX_TOKENIZER_FILE_BYTES
    for name, limit in limits.items():
        size = (staging / name).stat().st_size
        if size > limit:
            raise TokenizerError(
                f"{source.name}: its {name} would be {format_bytes(size)}, more than the loader reads "
                f"({format_bytes(limit)}); its tokenizer or chat template is not a real model's."
            )


# --------------------------------------------------------------------------
# Reading the GGUF file


@dataclass(frozen=True, slots=True)
class _PlannedTensor:
    hf_name: str
    source: GGUFTensorInfo
    # The source's bytes: a view of the mapped file (see GGUFFile.tensor_data).
    data: np.ndarray
    shape: tuple[int, ...]
    # Undo llama.cpp's RoPE row permutation over this many heads.
    rope_heads: int | None = None
    # The engine.model.quant format the tensor is stored in; None: float32.
    quantized: str | None = None
    # Subtracted from a float tensor's values: the norm offset a file of a
    # `norms_shifted` family holds added in.
    norm_shift: float = 0.0

    def entries(self) -> list[TensorEntry]:
        """(safetensors name, dtype, shape) of what the folder stores for it."""
        if self.quantized is None:
            return [(self.hf_name, "F32", self.shape)]
        rows, cols = self.shape
        if self.quantized in RAW_BLOCK_FORMATS:
            block, block_bytes = RAW_BLOCK_FORMATS[self.quantized]
            return [(f"{self.hf_name}.qdata", "U8", (rows, cols // block * block_bytes))]
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
        return sum(entry_nbytes(entry) for entry in self.entries())

    def load(self) -> list[np.ndarray]:
        """The arrays of `entries()`, in that order."""
        if self.quantized is None:
            values = _dequantize(self.source, self.data).reshape(self.shape)
            arrays = [values - np.float32(self.norm_shift) if self.norm_shift else values]
        elif self.quantized in RAW_BLOCK_FORMATS:
            # The file's blocks, byte for byte: a row's bytes are its blocks in order.
            arrays = [np.asarray(self.data, dtype=np.uint8).reshape(self.shape[0], -1)]
        elif self.source.type in KEPT_TYPES:
            arrays = _split_blocks(self.source, self.data, self.shape)
        else:
            # Only a requantized tensor needs PyTorch: a file refused before
            # its tensors are written never loads it.
            from engine.model.quant import quantize

            requantized = quantize(_dequantize(self.source, self.data).reshape(self.shape), self.quantized)
            arrays = [requantized.data.numpy(), requantized.scales.numpy()]
            if requantized.mins is not None:
                arrays.append(requantized.mins.numpy())
        if self.rope_heads is not None:
            arrays = [_unpermute_rope_rows(array, self.rope_heads) for array in arrays]
        return arrays


def _split_blocks(tensor: GGUFTensorInfo, data: np.ndarray, shape: tuple[int, ...]) -> list[np.ndarray]:
    """A Q8_0 / Q4_0 / Q4_1 tensor's blocks as (qdata, scales[, mins]) arrays."""
    rows, cols = shape
    fmt = KEPT_TYPES[tensor.type]
    blocks = np.asarray(data, dtype=np.uint8).reshape(rows, cols // GROUP_SIZE, -1)
    scales = np.ascontiguousarray(blocks[..., 0:2]).view("<f2").reshape(rows, -1)
    if fmt == "q8_0":
        return [np.ascontiguousarray(blocks[..., 2:]).view(np.int8).reshape(rows, cols), scales]
    if fmt == "q4_0":
        return [np.ascontiguousarray(blocks[..., 2:]).reshape(rows, cols // 2), scales]
    mins = np.ascontiguousarray(blocks[..., 2:4]).view("<f2").reshape(rows, -1)
    return [np.ascontiguousarray(blocks[..., 4:]).reshape(rows, cols // 2), scales, mins]


@dataclass(frozen=True, slots=True)
class _Checkpoint:
    config: dict[str, Any]
    generation_config: dict[str, Any]
    tokenizer: Tokenizer
    tokenizer_config: dict[str, Any]
    tensors: list[_PlannedTensor]


def _read_checkpoint(source: Path) -> _Checkpoint:
    gguf = open_gguf(source)
    meta = GGUFMetadata(gguf.header)
    if meta.integer("split.count", 1) > 1:
        raise UnsupportedModelError(
            f"{source.name} is one part of a split GGUF model. Merge the parts into one file first "
            "(llama.cpp: llama-gguf-split --merge)."
        )
    arch_name = meta.string("general.architecture")
    family = gguf_family(arch_name, source.name)
    if meta.integer(f"{arch_name}.expert_count", 0):
        raise UnsupportedModelError(
            f"{source.name} is a mixture-of-experts model, which Tandem does not run."
        )

    config = _model_config(gguf, meta, arch_name, family)
    # The family's reader of its block's features, as a load runs it: a
    # value that imports is one that loads.
    features = family.read_features(config, source.name)
    planned = _plan_tensors(gguf, config, family, norm_offset=features.get("norm_offset", 0.0))
    quantization = _quantization_section(planned)
    if quantization is not None:
        config["quantization"] = quantization
    tokenizer, tokenizer_config = build_tokenizer(meta)
    tokenizer_config["model_max_length"] = config["max_position_embeddings"]
    generation_config = {
        "bos_token_id": config["bos_token_id"],
        "eos_token_id": _end_of_generation_ids(meta),
        **_recommended_sampling(meta),
    }
    return _Checkpoint(config, generation_config, tokenizer, tokenizer_config, planned)


# The GGUF keys (gguf-py's Keys.General.SAMPLING_*) a model's maker recommends
# sampling by, and the generation_config.json key each becomes.
_SAMPLING_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_p": "top_p",
    "general.sampling.top_k": "top_k",
    "general.sampling.min_p": "min_p",
    "general.sampling.penalty_repeat": "repetition_penalty",
}


def _recommended_sampling(meta: GGUFMetadata) -> dict[str, int | float]:
    """The file's recommended sampling as generation_config.json keys; a value
    SamplingParams would refuse is no advice and is left out, never an error."""
    found: dict[str, Any] = {}
    for key, name in _SAMPLING_KEYS.items():
        value = meta.get(key)
        # Stored as float32: 0.95 reads 0.949999988..., which a form would show as such.
        found[name] = round(value, 6) if isinstance(value, float) else value
    return recommended_sampling(found)


def _model_config(gguf: GGUFFile, meta: GGUFMetadata, arch_name: str, family: Family) -> dict[str, Any]:
    tensors = gguf.header.tensors

    def key(name: str) -> str:
        return f"{arch_name}.{name}"

    embedding = tensors.get("token_embd.weight")
    if embedding is None:
        raise ModelLoadError(f"{meta.source.name} has no token_embd.weight tensor; the file is incomplete.")
    n_kv_heads: Any = meta.get(key("attention.head_count_kv"))
    if isinstance(n_kv_heads, (list, np.ndarray)):  # one per layer
        per_layer = meta.integers(key("attention.head_count_kv")) or []
        if len(set(per_layer)) > 1:
            raise UnsupportedModelError(f"{meta.source.name} has a different number of KV heads per layer.")
        n_kv_heads = per_layer[0] if per_layer else None
    # The dimensions as config.json names them, checked (engine.model.config)
    # before anything is computed or sized from them.
    dimensions: dict[str, Any] = {
        "vocab_size": embedding.dims[-1],
        "hidden_size": meta.require(key("embedding_length")),
        "intermediate_size": meta.require(key("feed_forward_length")),
        "num_hidden_layers": meta.require(key("block_count")),
        "num_attention_heads": meta.require(key("attention.head_count")),
        "num_key_value_heads": n_kv_heads,
        "head_dim": meta.get(key("attention.key_length")),
        "max_position_embeddings": meta.require(key("context_length")),
    }
    check_dimensions(dimensions, meta.source.name, {field: key(name) for field, name in GGUF_DIMENSION_KEYS.items()})
    hidden_size = int(dimensions["hidden_size"])
    n_heads = int(dimensions["num_attention_heads"])
    head_dim = int(dimensions["head_dim"] or hidden_size // n_heads)
    rotary_dim = meta.integer(key("rope.dimension_count"), head_dim)
    if not 0 < rotary_dim <= head_dim or rotary_dim % 2:
        raise UnsupportedModelError(
            f"{meta.source.name} applies RoPE to {rotary_dim} of {head_dim} head dimensions; "
            "the file is corrupt or not a model Tandem runs."
        )
    rope_theta = meta.real(key("rope.freq_base"), 10000.0)

    config: dict[str, Any] = {
        "architectures": [family.hf_architecture],
        "model_type": family.model_types[0],
        "hidden_size": hidden_size,
        "intermediate_size": int(dimensions["intermediate_size"]),
        "num_hidden_layers": int(dimensions["num_hidden_layers"]),
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(dimensions["num_key_value_heads"] or n_heads),
        "head_dim": head_dim,
        "rms_norm_eps": meta.real(key("attention.layer_norm_rms_epsilon")),
        "rope_theta": rope_theta,
        "max_position_embeddings": int(dimensions["max_position_embeddings"]),
        "vocab_size": int(dimensions["vocab_size"]),
        "tie_word_embeddings": "output.weight" not in tensors,
    }
    if rotary_dim != head_dim:
        config["partial_rotary_factor"] = rotary_dim / head_dim  # Phi-4-mini: 96 of 128
    config.update(family_fields(family, meta, arch_name, config))
    if not family.qkv_bias_always:
        config["attention_bias"] = "blk.0.attn_q.bias" in tensors
        config["mlp_bias"] = False
    def values(name: str) -> np.ndarray | None:
        tensor = tensors.get(name)
        return None if tensor is None else _dequantize(tensor, gguf.tensor_data(tensor)).reshape(-1)

    rope_freqs = values("rope_freqs.weight")
    scaling = rope_scaling(meta, arch_name, rope_freqs, rope_theta, head_dim)
    long_factors, short_factors = values("rope_factors_long.weight"), values("rope_factors_short.weight")
    if long_factors is not None or short_factors is not None:
        scaling = longrope_scaling(meta, arch_name, long_factors, short_factors, rotary_dim, scaling)
    if scaling is not None:
        config["rope_scaling"] = scaling
    # The engine's own check of what it would load (engine.model.config),
    # here so that a value that imports is one that loads.
    check_rope_and_window(config, meta.source.name, rope_labels(meta, arch_name, rope_freqs is not None))
    config["bos_token_id"] = meta.optional_integer("tokenizer.ggml.bos_token_id")
    config["eos_token_id"] = meta.optional_integer("tokenizer.ggml.eos_token_id")
    config["torch_dtype"] = "float32"
    return config


# Texts of the tokens that end a chat turn, which llama.cpp stops at by their
# text whatever ids the file names (src/llama-vocab.cpp, the end-of-generation
# tokens): converters write an eot id for few models (not for Gemma's
# <end_of_turn> nor ChatML's <|im_end|> when eos is another token).
END_OF_TURN_TEXTS = ("<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>")


def _end_of_generation_ids(meta: GGUFMetadata) -> int | list[int] | None:
    # Instruct models often end a turn with a token other than eos (Llama 3:
    # <|eot_id|>); generation must stop at any of them.
    ids: list[int] = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        token_id = meta.optional_integer(f"tokenizer.ggml.{key}")
        if token_id is not None and token_id not in ids:
            ids.append(token_id)
    found: dict[str, int] = {}
    for index, token in enumerate(meta.strings("tokenizer.ggml.tokens") or ()):
        if token in END_OF_TURN_TEXTS:
            found.setdefault(token, index)
    ids += [token_id for text, token_id in found.items() if token_id not in ids]
    if not ids:
        return None
    return ids[0] if len(ids) == 1 else ids


def _plan_tensors(gguf: GGUFFile, config: dict[str, Any], family: Family, norm_offset: float) -> list[_PlannedTensor]:
    """The tensors the folder stores, each checked against the config's shapes.
    `norm_offset`: what a `norms_shifted` family's file holds added to its
    norms (Gemma's 1 of `1 + w`), taken off so that the folder holds w as
    Hugging Face's do (the loader adds it back)."""
    source, tensors = gguf.header.path, gguf.header.tensors
    hidden, head_dim = config["hidden_size"], config["head_dim"]
    q_rows = config["num_attention_heads"] * head_dim
    kv_rows = config["num_key_value_heads"] * head_dim
    ffn = config["intermediate_size"]
    n_layers = config["num_hidden_layers"]
    # The shape of each part of the layer (engine.model.families.LayerNames' fields).
    part_shapes = {
        "q": (q_rows, hidden), "k": (kv_rows, hidden), "v": (kv_rows, hidden), "o": (hidden, q_rows),
        "qkv": (q_rows + 2 * kv_rows, hidden), "gate": (ffn, hidden), "up": (ffn, hidden),
        "gate_up": (2 * ffn, hidden), "down": (hidden, ffn),
        "attn_norm": (hidden,), "ffn_norm": (hidden,), "attn_out_norm": (hidden,), "ffn_out_norm": (hidden,),
        "q_norm": (head_dim,), "k_norm": (head_dim,),
    }
    known_kinds = layer_modules(family)
    kind_shapes = {kind: part_shapes[part] for kind, part in family.gguf.layer_tensors.items() if kind in known_kinds}
    rope_heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}

    def unknown(name: str) -> UnsupportedModelError:
        return UnsupportedModelError(
            f"{source.name} contains a tensor Tandem does not know: {name!r}. "
            f"It is not a {family.title} model as Tandem runs them."
        )

    check_layer_indices(
        n_layers,
        (int(match[1]) for name in tensors if (match := LAYER_NUMBER_RE.match(name))),
        source.name,
        label=f"{gguf.header.architecture}.block_count (num_hidden_layers)",
    )
    planned: list[_PlannedTensor] = []
    for name, tensor in tensors.items():
        if name in CONFIG_TENSORS:
            continue  # rope_freqs: folded into config["rope_scaling"]
        hf_name = hf_tensor_name(name, family)
        match = LAYER_TENSOR_RE.fullmatch(name)
        if match is None:
            if hf_name is None:
                raise unknown(name)
            expected: tuple[int, ...] = (
                (hidden,) if name == "output_norm.weight" else (config["vocab_size"], hidden)
            )
            heads = None
        else:
            if hf_name is None or int(match[1]) >= n_layers:
                raise unknown(name)
            kind, suffix = match[2], match[3]
            expected = kind_shapes[kind] if suffix == "weight" else kind_shapes[kind][:1]
            heads = rope_heads.get(kind) if family.gguf.permutes_qk else None
        shape = tensor.shape
        if shape != expected:
            raise ModelLoadError(
                f"{source.name}: tensor {name} has shape {shape}, but the model's metadata implies "
                f"{expected}. The file is corrupt or inconsistent."
            )
        data = gguf.tensor_data(tensor)
        _check_tensor_type(source, tensor, data)
        planned.append(
            _PlannedTensor(
                hf_name, tensor, data, shape, heads, stored_format(name, tensor.type, tensor.dims),
                norm_shift=float(norm_offset) if is_shifted_norm(hf_name, family) else 0.0,
            )
        )

    names = set(tensors)
    missing = [name for name in ("token_embd.weight", "output_norm.weight") if name not in names]
    missing += [
        f"blk.{layer}.{name}"
        for layer in range(n_layers)
        for name in required_layer_tensors(family)
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
        t.source.type.name: t.quantized
        for t in planned
        if t.quantized is not None and t.source.type not in KEPT_TYPES
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


def _check_tensor_type(source: Path, tensor: GGUFTensorInfo, data: np.ndarray) -> None:
    """Fail before writing anything if a tensor's type cannot be dequantized."""
    if tensor.type in FLOAT_TYPES:
        return
    sample = data[:1] if data.ndim > 1 else data
    try:
        dequantize(sample, tensor.type)
    except NotImplementedError:
        raise UnsupportedModelError(
            f"{source.name}: tensor {tensor.name} has type {tensor.type.name}, which the installed "
            "gguf package cannot dequantize. Use a file with another quantization (Q4_K_M, Q8_0, F16, ...)."
        ) from None


def _dequantize(tensor: GGUFTensorInfo, data: np.ndarray) -> np.ndarray:
    if tensor.type in FLOAT_TYPES:
        return data.astype(np.float32, copy=False)
    return dequantize(data, tensor.type)


def _unpermute_rope_rows(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """Invert convert_hf_to_gguf.py's `permute` of q/k rows (weights or biases).

    llama.cpp stores each head's rows pairwise interleaved (x0, y0, x1, y1, ...)
    for ggml's RoPE; HF keeps the two halves apart (x0, x1, ..., y0, y1, ...).
    """
    half_head = weight.shape[0] // n_heads // 2
    return weight.reshape(n_heads, half_head, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


# --------------------------------------------------------------------------
# Writing the weights


def _write_safetensors(
    path: Path, tensors: list[_PlannedTensor], written: Callable[[int], None] | None = None
) -> None:
    """Stream the tensors into a safetensors file, converting one at a time:
    at most one converted tensor is in memory at any time. `written(bytes_so_far)`
    is called after each tensor (it may raise to stop the import)."""
    write_streamed(
        path,
        [entry for tensor in tensors for entry in tensor.entries()],
        ((tensor.entries(), tensor.load()) for tensor in tensors),
        written,
    )
