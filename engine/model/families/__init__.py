"""The model families Tandem runs, one module each (see base.py for what a
family declares). Look families up here; never by comparing model_type
strings elsewhere."""

from __future__ import annotations

from engine.model.families import gemma2, gemma3, granite, llama, phi3, qwen2, qwen3
from engine.model.families.base import Family, GGUFNames, LayerNames

FAMILIES: tuple[Family, ...] = tuple(
    module.FAMILY for module in (llama, qwen2, qwen3, gemma2, gemma3, phi3, granite)
)
_BY_MODEL_TYPE = {model_type: family for family in FAMILIES for model_type in family.model_types}
_BY_GGUF_ARCH = {arch: family for family in FAMILIES for arch in family.gguf_architectures}
_BY_NAME = {family.name: family for family in FAMILIES}

SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(_BY_MODEL_TYPE)
SUPPORTED_GGUF_ARCHITECTURES: tuple[str, ...] = tuple(_BY_GGUF_ARCH)

__all__ = [
    "FAMILIES", "Family", "GGUFNames", "LayerNames", "SUPPORTED_GGUF_ARCHITECTURES", "SUPPORTED_MODEL_TYPES",
    "family_named", "for_gguf_architecture", "for_model_type", "supported_titles",
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
