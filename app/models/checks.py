"""Checking a model folder or a GGUF file before it is registered, and what
its details show, without loading any weights.

Every rule is the engine's, read through its public inspection module
(engine.inspect: the weight files and their headers, the weights a config
calls for, the GGUF header and what an import keeps in which format). A
folder that passes `check_model_folder` is one `engine.Engine(folder)`
loads; the errors here are app.models.errors ones, each with a sentence a
person can act on.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

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
from engine import inspect
from engine.errors import (
    CorruptSafetensorsError,
    GGUFFormatError,
    ModelLoadError,
    NoWeightsError,
    PickleCheckpointError,
    TokenizerError,
    UnsupportedModelError,
)
from engine.inspect import Family, GGUFSummary, ModelConfig, ModelShape

# This module is imported while the window is built (app.models.registry);
# engine.inspect imports torch, the GGUF reader and the tokenizer only when a
# check that needs them runs.

__all__ = ["FolderCheck", "GGUFSummary", "architecture_label", "check_gguf_file", "check_model_folder",
           "describe_model_folder", "gguf_architecture_label", "gguf_error", "gguf_shape", "read_config", "read_gguf_summary",
           "size_on_disk"]


# ---------------------------------------------------------------------------
# Model folders


class FolderCheck(inspect.FolderSummary):
    """A folder's summary as the engine reads it (config, parameters, dtypes,
    the block-quantized weights), and how the details word its storage."""

    __slots__ = ()

    def storage_label(self, origin: str = "") -> str:
        """How the weights are stored, for the details: "float32", or
        "q4_1 + q8_0 blocks (from a Q4_1 GGUF)" for a folder that keeps them
        quantized (`origin` names where they came from), with what each GGUF
        type the importer requantized cost, and the formats by kind of
        matrix where the layers mix them (a Q4_K_M file's: "... blocks:
        q_proj, k_proj q5_0; down_proj q4_k+q6_k; embedding q8_0")."""
        if not self.stored:
            return ", ".join(self.dtypes) or "unknown"
        notes = [origin] if origin else []
        section = self.raw_config.get("quantization")
        kept: dict[str, Any] = {}
        if isinstance(section, dict):
            requantized = section.get("requantized")
            if isinstance(requantized, dict) and requantized:
                notes.append(", ".join(_requantized_note(src, dst) for src, dst in requantized.items()))
            if isinstance(section.get("tensors"), dict):
                kept = section["tensors"]
        label = f"{' + '.join(self.stored.formats)} blocks" + (f" ({'; '.join(notes)})" if notes else "")
        by_kind = formats_by_kind(kept)
        return f"{label}: {by_kind}" if by_kind else label


def _requantized_note(source_type: str, fmt: Any) -> str:
    try:
        return inspect.requantized_note(source_type, fmt)
    except (KeyError, TypeError):  # a config.json not written by this importer
        return f"{source_type} requantized to {fmt}"


def formats_by_kind(formats: dict[str, Any]) -> str:
    """A folder's kept formats (config.json's quantization "tensors" map) by
    kind of matrix, kinds of the same formats together: "q_proj, k_proj
    q5_0; down_proj q4_k+q6_k; embedding q8_0". Empty where the layers'
    matrices are all of one format (the details' label says it all then)."""
    kinds: dict[str, set[str]] = {}
    for name, fmt in formats.items():
        if isinstance(fmt, str):
            kind = {inspect.EMBEDDING_NAME: "embedding", inspect.LM_HEAD_NAME: "output"}.get(name)
            kinds.setdefault(kind or name.rsplit(".", 2)[-2], set()).add(fmt)
    in_layers = {fmt for kind, found in kinds.items() if kind not in ("embedding", "output") for fmt in found}
    if len(in_layers) < 2:
        return ""
    groups: dict[str, list[str]] = {}
    for kind, found in kinds.items():
        groups.setdefault("+".join(sorted(found)), []).append(kind)
    return "; ".join(f"{', '.join(names)} {fmts}" for fmts, names in groups.items())


def check_model_folder(folder: str | Path) -> FolderCheck:
    """Everything `engine.Engine(folder)` would refuse, found without loading weights.

    Raises NotAModelError, ModelConfigError, ModelNotSupportedError,
    ModelTokenizerError, PickleOnlyError or CorruptWeightsError; each message
    names the file and says what to do.
    """
    folder = Path(folder)
    # The engine's order: not-a-model and architecture first, then the tokenizer, then weights.
    config, raw_config = read_config(folder)
    from engine import Tokenizer  # jinja2 and tokenizers: only when a folder is checked

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
    try:
        inspect.check_folder_weights(folder, config, headers)
    except CorruptSafetensorsError as exc:
        raise CorruptWeightsError(str(exc)) from exc
    except UnsupportedModelError as exc:
        raise ModelNotSupportedError(str(exc)) from exc
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
        raw_config = inspect.read_config_json(folder)
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


def _folder_check(config: ModelConfig, raw_config: dict[str, Any], headers: inspect.Headers) -> FolderCheck:
    summary = inspect.summarize_folder(config, raw_config, headers)
    return FolderCheck(summary.config, summary.raw_config, summary.parameters, summary.dtypes, summary.stored)


def _read_headers(folder: Path) -> inspect.Headers:
    try:
        return inspect.read_folder_headers(folder)
    except PickleCheckpointError as exc:
        raise PickleOnlyError(str(exc)) from exc
    except NoWeightsError as exc:
        raise NotAModelError(str(exc)) from exc
    except CorruptSafetensorsError as exc:
        raise CorruptWeightsError(str(exc)) from exc
    except ModelLoadError as exc:
        raise ModelNotSupportedError(str(exc)) from exc


def architecture_label(model_type: str) -> str:
    """The family a folder's config.json model_type runs as, and that name:
    'Gemma 3 (gemma3_text)'."""
    return _family_label(inspect.for_model_type(model_type), model_type)


def gguf_architecture_label(architecture: str) -> str:
    """The same for a GGUF file's general.architecture: 'Gemma 3 (gemma3)'."""
    return _family_label(inspect.for_gguf_architecture(architecture), architecture)


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


def read_gguf_summary(path: str | Path) -> GGUFSummary:
    """A GGUF file's header, its long arrays (the vocabulary) skipped.

    Raises CorruptGGUFError for a file that is damaged or not (all) there,
    ModelNotSupportedError for a kind of GGUF Tandem cannot import,
    NotAModelError for one that cannot be read at all.
    """
    try:
        return inspect.read_gguf_summary(path)
    except (GGUFFormatError, UnsupportedModelError, ModelLoadError) as exc:
        raise gguf_error(exc) from exc


def gguf_shape(summary: GGUFSummary) -> ModelShape:
    """The memory-relevant shape of the model a GGUF file imports into;
    CorruptGGUFError for metadata of the wrong type."""
    try:
        return summary.shape()
    except GGUFFormatError as exc:
        raise CorruptGGUFError(str(exc)) from exc


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
