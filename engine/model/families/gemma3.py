"""Gemma 3 (the text model; the 4B+ GGUFs keep the vision tower in a
separate mmproj file): see engine.model.families.gemma for the block; q/k
norms, five of six layers on a sliding window with their own RoPE base."""

from collections.abc import Mapping
from typing import Any

from engine.model.families.base import Family, GGUFNames, LayerNames
from engine.model.families.gemma import GEMMA3_GGUF_TENSORS, gemma_features


def _features(raw: Mapping[str, Any], source: str) -> dict[str, Any]:
    return {**gemma_features(raw, source, default_pattern=6, softcaps=True), "qk_norm": True}


FAMILY = Family(
    name="gemma3",
    title="Gemma 3",
    model_types=("gemma3_text",),
    hf_architecture="Gemma3ForCausalLM",
    layer=LayerNames(
        q_norm="self_attn.q_norm",
        k_norm="self_attn.k_norm",
        attn_out_norm="post_attention_layernorm",
        ffn_norm="pre_feedforward_layernorm",
        ffn_out_norm="post_feedforward_layernorm",
    ),
    gguf=GGUFNames(architectures=("gemma3",), layer_tensors=GEMMA3_GGUF_TENSORS, norms_shifted=True),
    read_features=_features,
    hub_tags=("gemma3", "gemma3_text"),
)
