"""Checking a model folder or a GGUF file before it is registered, and what
its details show, without loading any weights.

Every rule is the engine's (engine.formats): the choice of weight files and
their headers (engine/formats/safetensors.py), the weights a config calls
for (engine/formats/weight_names.py `expected_weights`, the loader's rule), the GGUF header
(engine/formats/gguf/reader.py) and what an import keeps in which format
(engine/formats/gguf/tables.py). A folder that passes `check_model_folder`
is one `engine.Engine(folder)` loads; the errors are app.models.errors ones,
each with a sentence a person can act on.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.models.errors import (
    CorruptGGUFError,
    CorruptWeightsError,
    ModelConfigError,
    ModelError,
    ModelNotSupportedError,
    ModelTokenizerError,
    NotAModelError,
    PickleOnlyError,
)
from engine.errors import (
    CorruptSafetensorsError,
    GGUFFormatError,
    ModelLoadError,
    NoWeightsError,
    PickleCheckpointError,
    TokenizerError,
    UnsupportedModelError,
)
from engine.formats.safetensors import FLOAT_DTYPES, read_headers, weight_files
from engine.formats.weight_memory import ModelShape, QuantizedWeights
from engine.formats.weight_names import EMBEDDING_NAME, IGNORED_WEIGHT_SUFFIX, LM_HEAD_NAME, expected_weights, is_model_weight
from engine.model.config import ModelConfig, read_config_json
from engine.model.families import Family, for_gguf_architecture, for_model_type

if TYPE_CHECKING:
    from engine.formats.gguf.reader import GGUFHeader

# This module is imported while the window is built (app.models.registry), so
# it imports only light, torch-free parts of the engine at the top; the
# quantized formats' rules (engine.model.quant, engine.formats.loader import
# torch), the GGUF reader and tables (numpy, gguf) and the tokenizer (jinja2,
# tokenizers) are imported by the checks that use them, which run later.


@cache
def _quantized_dtypes() -> dict[str, str]:
    """Block-quantized weights as fold_quantized_headers names their dtype: {"Q4_1": "q4_1", ...}."""
    from engine.model.quant import FORMATS

    return {fmt.upper(): fmt for fmt in FORMATS}

# name -> (shape, safetensors dtype; a quantized weight's format in capitals)
Headers = dict[str, tuple[tuple[int, ...], str]]


# ---------------------------------------------------------------------------
# Model folders


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
    config, raw_config = read_config(folder)
    from engine.model.tokenizer import Tokenizer

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
    headers = _read_headers(folder)
    _check_tensors(folder, config, headers)
    return _folder_check(config, raw_config, headers)


def describe_model_folder(folder: str | Path) -> FolderCheck:
    """config.json and the weights' headers of a folder checked when it was
    added (no tokenizer load, no tensor check: fast enough for a list)."""
    folder = Path(folder)
    config, raw_config = read_config(folder)
    return _folder_check(config, raw_config, _read_headers(folder))


def read_config(folder: Path) -> tuple[ModelConfig, dict[str, Any]]:
    """The folder's config.json, parsed by the engine and as it is."""
    if not folder.exists():
        raise NotAModelError(f"{folder} does not exist.")
    if not folder.is_dir():
        raise NotAModelError(
            f"{folder} is not a folder. Choose a Hugging Face model folder (config.json, "
            "*.safetensors, tokenizer.json); for a .gguf file use “Import GGUF file…”."
        )
    # The engine's bounded reader and checks (engine.model.config): a value
    # that would fail at load (a RoPE base of -1, a window of 10^30) is
    # refused here, before the model is registered.
    try:
        raw_config = read_config_json(folder)
        config = ModelConfig.from_dict(raw_config, source=str(folder / "config.json"))
    except UnsupportedModelError as exc:
        raise ModelNotSupportedError(str(exc)) from exc
    except ModelLoadError as exc:
        if not (folder / "config.json").is_file():
            raise NotAModelError(str(exc)) from exc
        message = str(exc).rstrip(".")
        if "again" not in message:
            message += ". The folder's config.json is damaged; download it again"
        raise ModelConfigError(f"{message}.") from exc
    return config, raw_config


def _folder_check(config: ModelConfig, raw_config: dict[str, Any], headers: Headers) -> FolderCheck:
    dtypes = Counter(dtype for _, dtype in headers.values())
    quantized = _quantized_dtypes()
    formats = {name: quantized[dtype] for name, (_, dtype) in headers.items() if dtype in quantized}
    shapes = {name: shape for name, (shape, _) in headers.items() if name in formats and len(shape) == 2}
    return FolderCheck(
        config=config,
        raw_config=raw_config,
        parameters=sum(_numel(shape) for shape, _ in headers.values()),
        dtypes=tuple(FLOAT_DTYPES.get(d) or quantized.get(d, d) for d, _ in dtypes.most_common()),
        stored=QuantizedWeights.from_formats(formats, shapes),
    )


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def _read_headers(folder: Path) -> Headers:
    """name -> (shape, dtype) of the weights the loader takes, a quantized
    weight's parts folded into one entry in its format."""
    try:
        files = weight_files(folder)
        headers = read_headers(files, keep=is_model_weight)
    except PickleCheckpointError as exc:
        raise PickleOnlyError(str(exc)) from exc
    except NoWeightsError as exc:
        raise NotAModelError(str(exc)) from exc
    except CorruptSafetensorsError as exc:
        raise CorruptWeightsError(str(exc)) from exc
    from engine.formats.loader import quantized_formats
    from engine.model.quant import fold_quantized_headers

    try:
        formats = quantized_formats(folder)
    except ModelLoadError as exc:
        raise ModelNotSupportedError(str(exc)) from exc
    return fold_quantized_headers({name: (t.shape, t.dtype) for name, t in headers.items()}, formats)


def _check_tensors(folder: Path, config: ModelConfig, headers: Headers) -> None:
    expected = expected_weights(config)
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
        if name not in expected and name != LM_HEAD_NAME and not name.endswith(IGNORED_WEIGHT_SUFFIX)
    )
    if leftovers:
        raise ModelNotSupportedError(
            f"{folder} has weights a plain Llama-family model does not ({', '.join(leftovers[:3])}"
            f"{', ...' if len(leftovers) > 3 else ''}). It may be quantized (GPTQ, AWQ) or of "
            "another architecture; Tandem runs unquantized safetensors or GGUF files."
        )
    odd = sorted({dtype for _, dtype in headers.values()} - set(FLOAT_DTYPES) - set(_quantized_dtypes()))
    if odd:
        raise ModelNotSupportedError(
            f"{folder} stores weights as {', '.join(odd)}; Tandem loads float32, float16 and "
            "bfloat16 safetensors. Use an unquantized copy of the model or a GGUF file of it."
        )


def architecture_label(model_type: str) -> str:
    """The family a folder's config.json model_type runs as, and that name:
    'Gemma 3 (gemma3_text)'."""
    return _family_label(for_model_type(model_type), model_type)


def gguf_architecture_label(architecture: str) -> str:
    """The same for a GGUF file's general.architecture: 'Gemma 3 (gemma3)'."""
    return _family_label(for_gguf_architecture(architecture), architecture)


def _family_label(family: Family | None, name: str) -> str:
    return f"{family.title} ({name})" if family is not None else name


def size_on_disk(path: Path) -> int:
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
        """The memory-relevant shape of the model this file imports into."""
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
        from engine.formats.gguf.reader import GGUFMetadata

        # Read through the reader's typed accessors: a value of the wrong
        # type (a string, an array) is the file's corruption, not a crash.
        meta = GGUFMetadata(self.header)
        arch = self.architecture
        try:
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
        except GGUFFormatError as exc:
            raise CorruptGGUFError(str(exc)) from exc


def read_gguf_summary(path: str | Path) -> GGUFSummary:
    """A GGUF file's header, its long arrays (the vocabulary) skipped.

    Raises CorruptGGUFError for a file that is damaged or not (all) there,
    ModelNotSupportedError for a kind of GGUF Tandem cannot import,
    NotAModelError for one that cannot be read at all.
    """
    from engine.formats.gguf.reader import read_gguf_header

    try:
        return GGUFSummary(read_gguf_header(path, long_arrays=False))
    except (GGUFFormatError, UnsupportedModelError, ModelLoadError) as exc:
        raise gguf_error(exc) from exc


def gguf_error(exc: ModelLoadError) -> ModelError:
    """The app error for an engine error about a GGUF file."""
    if isinstance(exc, GGUFFormatError):
        return CorruptGGUFError(str(exc))
    if isinstance(exc, UnsupportedModelError):
        return ModelNotSupportedError(str(exc))
    if isinstance(exc, TokenizerError):
        return ModelTokenizerError(str(exc))
    if isinstance(exc.__cause__, OSError):  # missing or unreadable
        return NotAModelError(str(exc))
    return CorruptGGUFError(str(exc))


def check_gguf_file(source: Path) -> GGUFSummary:
    """Refuse what is not a whole GGUF file before it is imported: a missing
    path, a folder, another kind of file, a damaged or truncated download.
    Reads the header only, so a truncated file is refused in a fraction of a
    second, before the importer parses the whole vocabulary."""
    if not source.exists():
        raise NotAModelError(f"{source} does not exist.")
    if not source.is_file():
        raise NotAModelError(
            f"{source} is not a file. Choose a .gguf file; for a Hugging Face model folder "
            "use “Add model folder…”."
        )
    return read_gguf_summary(source)
