"""Inspecting a model before loading it: which family it is, its shape, what
an import keeps in which format, and what it will need in memory.

The app's model manager, Get models and the memory estimate read models
through this module only, so every rule here is the one the loader itself
follows (engine/formats: the weight files and their headers, the weights a
config calls for, the GGUF header and what the importer keeps). Nothing is
loaded: a folder is read from config.json and the safetensors headers, a GGUF
file from its header (the vocabulary skipped).

Light at import: this module is read while the window is built, before torch
is. The heavier parts (the GGUF reader and tables need numpy and gguf; the
sizing rules need torch) are imported by the functions that use them, and
the names re-exported from them resolve on first use.
"""

from __future__ import annotations

import importlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import CorruptSafetensorsError, UnsupportedModelError
from engine.formats.safetensors import FLOAT_DTYPES, read_headers, weight_files
from engine.formats.weight_memory import ModelShape, QuantizedWeights, weight_bytes
from engine.formats.weight_names import (
    EMBEDDING_NAME,
    IGNORED_WEIGHT_SUFFIX,
    LM_HEAD_NAME,
    expected_weights,
    is_model_weight,
    model_weight_name,
)
from engine.model.config import ModelConfig, read_config_json
from engine.model.families import FAMILIES, Family, for_gguf_architecture, for_model_type
from engine.model.quant_formats import KEPT_FORMATS

if TYPE_CHECKING:
    from engine.formats.gguf.reader import GGUFHeader

__all__ = [
    "EMBEDDING_NAME", "FAMILIES", "FLOAT_DTYPES", "LM_HEAD_NAME", "Family", "FolderSummary", "GGUFSummary",
    "Headers", "ModelConfig", "ModelShape", "QuantizedWeights", "check_folder_weights", "for_gguf_architecture",
    "for_model_type", "read_config_json", "read_folder_headers", "read_gguf_summary", "summarize_folder",
    "weight_bytes",
    # resolved on first use (they import torch):
    "available_cores", "resolve_device", "resolve_dtype", "resolve_quantized_compute",
    "quantized_formats", "cpu_weight_packing", "activation_dtype", "kv_cache_dtype", "default_kv_budget", "default_kv_pages", "kv_bytes_per_page",
    "sequence_pages", "MIB", "DESKTOP_RESERVE_BYTES", "RUNTIME_EXTRA_BYTES", "requantized_note",
]

# Sizing rules, each where the engine keeps it.
_ON_FIRST_USE = {
    "available_cores": "engine.runner.threads",
    "resolve_device": "engine.formats.loader",
    "resolve_dtype": "engine.formats.loader",
    "resolve_quantized_compute": "engine.formats.loader",
    "quantized_formats": "engine.formats.loader",
    "requantized_note": "engine.formats.gguf.tables",
    "cpu_weight_packing": "engine.model.linear",
    "activation_dtype": "engine.runner.memory",
    "kv_cache_dtype": "engine.runner.memory",
    "default_kv_budget": "engine.runner.memory",
    "default_kv_pages": "engine.runner.memory",
    "kv_bytes_per_page": "engine.runner.memory",
    "sequence_pages": "engine.runner.memory",
    "MIB": "engine.runner.memory",
    "DESKTOP_RESERVE_BYTES": "engine.runner.memory",
    "RUNTIME_EXTRA_BYTES": "engine.runner.memory",
}


def __getattr__(name: str) -> Any:
    module = _ON_FIRST_USE.get(name)
    if module is None:
        raise AttributeError(f"module 'engine.inspect' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


# name -> (shape, safetensors dtype; a block-quantized weight's format in capitals)
Headers = dict[str, tuple[tuple[int, ...], str]]

_QUANTIZED_DTYPES = {fmt.upper(): fmt for fmt in KEPT_FORMATS}


# ---------------------------------------------------------------------------
# Model folders


@dataclass(slots=True, frozen=True)
class FolderSummary:
    """What a Hugging Face style folder holds, read from config.json and the weights' headers."""

    config: ModelConfig
    raw_config: dict[str, Any]
    parameters: int
    dtypes: tuple[str, ...]  # the weights' stored dtypes, most common first
    stored: QuantizedWeights  # which weights are block-quantized (empty: none)


def read_folder_headers(folder: Path) -> Headers:
    """name -> (shape, dtype) of the weights the loader takes, a quantized
    weight's parts folded into one entry in its format.

    Raises PickleCheckpointError, NoWeightsError, CorruptSafetensorsError
    or a ModelLoadError for a folder whose quantization section is not one
    the engine runs."""
    headers = read_headers(weight_files(folder), keep=is_model_weight)
    from engine.formats.loader import quantized_formats
    from engine.model.quant import fold_quantized_headers

    formats = quantized_formats(folder)
    loaded: dict[str, tuple[tuple[int, ...], str]] = {}
    for name, t in headers.items():
        loaded_name = model_weight_name(name)
        if loaded_name in loaded:
            raise CorruptSafetensorsError(
                f"{folder}: the weight '{loaded_name}' is stored twice (also as '{name}'). "
                "Download the model's .safetensors files again."
            )
        loaded[loaded_name] = (t.shape, t.dtype)
    return fold_quantized_headers(loaded, formats)


def summarize_folder(config: ModelConfig, raw_config: dict[str, Any], headers: Headers) -> FolderSummary:
    dtypes = Counter(dtype for _, dtype in headers.values())
    formats = {name: _QUANTIZED_DTYPES[dtype] for name, (_, dtype) in headers.items() if dtype in _QUANTIZED_DTYPES}
    shapes = {name: shape for name, (shape, _) in headers.items() if name in formats and len(shape) == 2}
    return FolderSummary(
        config=config,
        raw_config=raw_config,
        parameters=sum(_numel(shape) for shape, _ in headers.values()),
        dtypes=tuple(FLOAT_DTYPES.get(d) or _QUANTIZED_DTYPES.get(d, d) for d, _ in dtypes.most_common()),
        stored=QuantizedWeights.from_formats(formats, shapes),
    )


def check_folder_weights(folder: Path, config: ModelConfig, headers: Headers) -> None:
    """The loader's weight checks, without loading: every weight the config
    calls for, at its shape, nothing a plain decoder of the family does not
    have, and only dtypes the engine loads.

    Raises CorruptSafetensorsError (missing or misshapen weights) or
    UnsupportedModelError (other weights or dtypes)."""
    expected = expected_weights(config)
    missing = [name for name in expected if name not in headers]
    if missing:
        raise CorruptSafetensorsError(
            f"{folder} is incomplete: the weight(s) {', '.join(missing[:3])}"
            f"{' and more' if len(missing) > 3 else ''} that config.json calls for are missing. "
            "Download the model's .safetensors files again."
        )
    for name, shape in expected.items():
        if headers[name][0] != shape:
            raise CorruptSafetensorsError(
                f"{folder}: the weight '{name}' has shape {headers[name][0]}, but config.json implies "
                f"{shape}. The weights and config.json belong to different models."
            )
    leftovers = sorted(
        name for name in headers
        if name not in expected and name != LM_HEAD_NAME and not name.endswith(IGNORED_WEIGHT_SUFFIX)
    )
    if leftovers:
        raise UnsupportedModelError(
            f"{folder} has weights a plain Llama-family model does not ({', '.join(leftovers[:3])}"
            f"{', ...' if len(leftovers) > 3 else ''}). It may be quantized (GPTQ, AWQ) or of "
            "another architecture; Tandem runs unquantized safetensors or GGUF files."
        )
    odd = sorted({dtype for _, dtype in headers.values()} - set(FLOAT_DTYPES) - set(_QUANTIZED_DTYPES))
    if odd:
        raise UnsupportedModelError(
            f"{folder} stores weights as {', '.join(odd)}; Tandem loads float32, float16 and "
            "bfloat16 safetensors. Use an unquantized copy of the model or a GGUF file of it."
        )


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


# ---------------------------------------------------------------------------
# GGUF files


@dataclass(slots=True, frozen=True)
class GGUFSummary:
    """What the details need of a GGUF file: its metadata (the vocabulary
    skipped) and tensor table; no tensor data is read."""

    header: GGUFHeader

    @property
    def metadata(self) -> dict[str, Any]:
        return self.header.metadata

    @property
    def data_end(self) -> int:
        return self.header.data_end

    @property
    def architecture(self) -> str:
        return self.header.architecture

    @property
    def family(self) -> Family | None:
        """The family the file imports as; None for an architecture Tandem does not import."""
        return for_gguf_architecture(self.architecture)

    def arch_value(self, key: str, default: Any = None) -> Any:
        return self.header.arch_value(key, default)

    @property
    def parameters(self) -> int:
        from engine.formats.gguf.tables import CONFIG_TENSORS

        return sum(t.n_elements for name, t in self.header.tensors.items() if name not in CONFIG_TENSORS)

    @property
    def main_type(self) -> str:
        """The type most weight elements are stored as (Q4_K, F16, ...)."""
        from engine.formats.gguf.tables import CONFIG_TENSORS

        counts: Counter[str] = Counter()
        for name, tensor in self.header.tensors.items():
            if name not in CONFIG_TENSORS:
                counts[tensor.type.name] += tensor.n_elements
        return counts.most_common(1)[0][0] if counts else "unknown"

    def kept_formats(self) -> QuantizedWeights:
        """The weights the GGUF importer keeps block-quantized when it
        imports this file (engine/formats/gguf/tables.py `stored_format`);
        none for a file of an architecture Tandem does not import."""
        from engine.formats.gguf.tables import hf_tensor_name, stored_format

        formats: dict[str, str] = {}
        shapes: dict[str, tuple[int, ...]] = {}
        family = self.family
        for name, tensor in self.header.tensors.items():
            fmt = stored_format(name, tensor.type, tensor.dims)
            hf_name = None if family is None else hf_tensor_name(name, family)
            if fmt is None or hf_name is None:
                continue
            formats[hf_name] = fmt
            shapes[hf_name] = tensor.shape
        return QuantizedWeights.from_formats(formats, shapes)

    def shape(self) -> ModelShape:
        """The memory-relevant shape of the model this file imports into.
        Raises GGUFFormatError for metadata of the wrong type."""
        from engine.formats.gguf.reader import GGUFMetadata
        from engine.formats.gguf.tables import GLOBAL_TENSORS

        counts: Counter[str] = Counter()
        for name, tensor in self.header.tensors.items():
            hf_name = GLOBAL_TENSORS.get(name)
            if hf_name == EMBEDDING_NAME:
                counts["embedding"] += tensor.n_elements
            elif hf_name == LM_HEAD_NAME:
                counts["lm_head"] += tensor.n_elements
            elif name.endswith("norm.weight"):
                counts["norm"] += tensor.n_elements
            elif name.endswith(".bias"):
                counts["bias"] += tensor.n_elements
            elif name.startswith("blk."):
                counts["matmul"] += tensor.n_elements
        # Read through the reader's typed accessors: a value of the wrong
        # type (a string, an array) is the file's corruption, not a crash.
        meta = GGUFMetadata(self.header)
        arch = self.architecture
        heads = meta.integer(f"{arch}.attention.head_count", 1)
        kv_key = f"{arch}.attention.head_count_kv"
        per_layer = meta.integers(kv_key) if isinstance(meta.get(kv_key), list) else None
        kv_heads = max(per_layer, default=heads) if per_layer is not None else meta.integer(kv_key, heads)
        hidden = meta.integer(f"{arch}.embedding_length", 0)
        return ModelShape(
            matmul_params=counts["matmul"],
            embedding_params=counts["embedding"],
            lm_head_params=counts["lm_head"],
            norm_params=counts["norm"],
            bias_params=counts["bias"],
            num_layers=meta.integer(f"{arch}.block_count", 0),
            num_kv_heads=kv_heads,
            head_dim=meta.integer(f"{arch}.attention.key_length", hidden // max(1, heads)),
            max_context=meta.integer(f"{arch}.context_length", 2048),
        )


def read_gguf_summary(path: str | Path) -> GGUFSummary:
    """A GGUF file's header, its long arrays (the vocabulary) skipped.

    Raises GGUFFormatError for a file that is damaged or not (all) there,
    UnsupportedModelError for a kind of GGUF Tandem cannot import, and
    ModelLoadError (caused by an OSError) for one that cannot be read."""
    from engine.formats.gguf.reader import read_gguf_header

    return GGUFSummary(read_gguf_header(path, long_arrays=False))

