"""The model families Tandem runs, one module each (see base.py for what a
family declares). Look families up here; never by comparing model_type
strings elsewhere."""

from __future__ import annotations

from engine.model.families import gemma2, gemma3, granite, llama, phi3, qwen2, qwen3
from collections.abc import Mapping
from typing import Any

from engine.model.families.base import Family, GGUFNames, LayerNames

FAMILIES: tuple[Family, ...] = tuple(
    module.FAMILY for module in (llama, qwen2, qwen3, gemma2, gemma3, phi3, granite)
)
_BY_MODEL_TYPE = {model_type: family for family in FAMILIES for model_type in family.model_types}
_BY_GGUF_ARCH = {arch: family for family in FAMILIES for arch in family.gguf_architectures}
_BY_NAME = {family.name: family for family in FAMILIES}
_BY_MULTIMODAL_TYPE = {family.multimodal.model_type: family for family in FAMILIES if family.multimodal is not None}

SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(_BY_MODEL_TYPE)
SUPPORTED_GGUF_ARCHITECTURES: tuple[str, ...] = tuple(_BY_GGUF_ARCH)

__all__ = [
    "FAMILIES", "Family", "GGUFNames", "LayerNames", "SUPPORTED_GGUF_ARCHITECTURES", "SUPPORTED_MODEL_TYPES",
    "family_named", "for_gguf_architecture", "for_model_type", "supported_titles", "text_model_config",
]


def for_model_type(model_type: str) -> Family | None:
    return _BY_MODEL_TYPE.get(model_type)


def for_gguf_architecture(architecture: str) -> Family | None:
    return _BY_GGUF_ARCH.get(architecture)


def family_named(name: str) -> Family:
    return _BY_NAME[name]


def supported_titles() -> str:
    """"Llama, Qwen2, ... and Granite", for messages."""
    titles = [family.title for family in FAMILIES]
    return f"{', '.join(titles[:-1])} and {titles[-1]}"


def text_model_config(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    """The config of the model Tandem runs: `raw` itself, or for a
    multimodal config.json (Gemma 3 4B+: model_type "gemma3") its text
    model's, the text config class's defaults filled in and the wrapper's
    top-level tie of the embeddings kept."""
    model_type = raw.get("model_type")
    family = _BY_MULTIMODAL_TYPE.get(model_type) if isinstance(model_type, str) else None
    text = raw.get("text_config")
    if family is None or family.multimodal is None or not isinstance(text, Mapping):
        return raw
    merged = {**family.multimodal.text_defaults, **text, "model_type": family.model_types[0]}
    if "tie_word_embeddings" in raw and "tie_word_embeddings" not in text:
        merged["tie_word_embeddings"] = raw["tie_word_embeddings"]
    return merged
