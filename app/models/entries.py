"""The records of the model list: an entry as models.json keeps it, and the
details a model shows.

An entry is written to models.json by `entry_to_json` and read back by
`entry_from_json`; a field added later (quantize, max_context) is optional
there, so a file an older Tandem wrote still loads, and a value this Tandem
does not understand is dropped with a warning rather than losing the model.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from engine.errors import ModelLoadError
from engine import model_files as default_model
from engine.inspect import ModelShape, QuantizedWeights
from engine.config import QUANTIZE_MODES

log = logging.getLogger(__name__)

DEFAULT_MODEL_ID = "default"

# "download": a safetensors folder downloaded from Hugging Face into the
# models folder (a downloaded GGUF file is imported: "gguf").
ModelKind = Literal["default", "folder", "gguf", "download"]
# Kinds whose folder Tandem wrote into its models folder, deleted on removal.
IMPORTED_KINDS: tuple[str, ...] = ("gguf", "download")

# "Quantize at load" choices of a float model (engine.config.QUANTIZE_MODES).
QUANTIZE_CHOICES: tuple[str, ...] = tuple(QUANTIZE_MODES)


@dataclass(slots=True, frozen=True)
class ModelEntry:
    id: str
    name: str
    # The folder the engine loads: the user's folder, the imported copy of
    # a GGUF file or the downloaded folder. None for the default (imported on first use, engine's choice).
    path: Path | None
    kind: ModelKind
    # Imports only: the GGUF file it was imported from; downloads:
    # 'owner/repo/file.gguf' or 'owner/repo' (a relative path).
    source: Path | None = None
    # Float checkpoints only: quantize the weights at load ("int8", "int4";
    # engine/formats/loader.py quantized_copy caches the result), None to run them
    # as stored.
    quantize: str | None = None
    # The context the engine is capped to (fewer tokens, a smaller KV pool);
    # None: the model's trained context.
    max_context: int | None = None

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
        if self.downloaded:
            return "Downloaded GGUF" if self.kind == "gguf" else "Downloaded"
        return {"default": "Built in", "folder": "Folder", "gguf": "Imported GGUF"}[self.kind]

    @property
    def downloaded(self) -> bool:
        """Whether it came from Hugging Face (its source is 'owner/repo[/file]')."""
        return self.kind == "download" or (self.source is not None and not self.source.is_absolute())


@dataclass(slots=True, frozen=True)
class ModelDetails:
    architecture: str  # "llama (LlamaForCausalLM)"
    parameters: int
    context_length: int  # the context the model was trained for
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


def slug(text: str) -> str:
    """'Qwen2.5-0.5B-Instruct Q4_K_M' -> 'qwen2-5-0-5b-instruct-q4-k-m'."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    result = re.sub(r"[^a-z0-9]+", "-", ascii_text.lower()).strip("-")[:48].strip("-")
    return result or "model"


def entry_to_json(entry: ModelEntry) -> dict[str, Any]:
    out: dict[str, Any] = {"id": entry.id, "name": entry.name, "kind": entry.kind}
    if entry.kind == "folder":
        out["path"] = str(entry.path)
    if entry.source is not None:
        out["source"] = str(entry.source)
    if entry.quantize is not None:
        out["quantize"] = entry.quantize
    if entry.max_context is not None:
        out["max_context"] = entry.max_context
    return out


def entry_from_json(item: Any, imports_dir: Path) -> ModelEntry:
    """An entry of models.json; TypeError, ValueError or KeyError for one
    that cannot be used. Imports are stored by id: their folder is
    `imports_dir/<id>`, so the data folder can move."""
    if not isinstance(item, dict):
        raise TypeError("not an object")
    model_id, name, kind = item["id"], item["name"], item["kind"]
    if not isinstance(model_id, str) or slug(model_id) != model_id:
        raise ValueError(f"bad id {model_id!r}")
    if not isinstance(name, str) or not name:
        raise ValueError(f"bad name {name!r}")
    quantize = item.get("quantize")
    if quantize is not None and quantize not in QUANTIZE_CHOICES:
        # A choice this Tandem does not know (a newer one wrote it): the
        # model itself is still usable, as stored.
        log.warning("model %s: ignoring the unknown quantize choice %r", model_id, quantize)
        quantize = None
    max_context = max_context_from_json(item.get("max_context"), model_id)
    if kind == "folder":
        path = Path(item["path"])
        if not path.is_absolute():
            raise ValueError(f"the folder {item['path']!r} is not an absolute path")
        return ModelEntry(model_id, name, path, "folder", quantize=quantize, max_context=max_context)
    if kind in IMPORTED_KINDS:
        source = item.get("source")
        return ModelEntry(
            model_id, name, imports_dir / model_id, kind,
            Path(source) if isinstance(source, str) else None, quantize, max_context,
        )
    raise ValueError(f"unknown kind {kind!r}")


def max_context_from_json(value: Any, model_id: str) -> int | None:
    """A saved context cap; one that is not a positive whole number is
    dropped (the model then runs at its trained context)."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    log.warning("model %s: ignoring the invalid context cap %r", model_id, value)
    return None
