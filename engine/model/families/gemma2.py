"""Gemma 2: see engine.model.families.gemma for the block; soft-caps on
attention scores and final logits, every other layer on a sliding window."""

from collections.abc import Mapping
from typing import Any

from engine.model.families.base import Family, GGUFNames, LayerNames
from engine.model.families.gemma import GEMMA2_GGUF_TENSORS, gemma_features


def _features(raw: Mapping[str, Any], source: str) -> dict[str, Any]:
    return gemma_features(raw, source, default_pattern=2, softcaps=True)


FAMILY = Family(
    name="gemma2",
    title="Gemma 2",
    model_types=("gemma2",),
    hf_architecture="Gemma2ForCausalLM",
    layer=LayerNames(
        attn_out_norm="post_attention_layernorm",
        ffn_norm="pre_feedforward_layernorm",
        ffn_out_norm="post_feedforward_layernorm",
    ),
    gguf=GGUFNames(architectures=("gemma2",), layer_tensors=GEMMA2_GGUF_TENSORS, norms_shifted=True),
    read_features=_features,
    hub_tags=("gemma2",),
    tool_calls="json",
)
