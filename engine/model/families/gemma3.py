"""Gemma 3 (the text model; the 4B+ GGUFs keep the vision tower in a
separate mmproj file): see engine.model.families.gemma for the block; q/k
norms, five of six layers on a sliding window with their own RoPE base."""

from collections.abc import Mapping
from typing import Any

from engine.model.families.base import Family, GGUFNames, LayerNames, MultimodalWrapper
from engine.model.families.gemma import GEMMA3_GGUF_TENSORS, gemma_features


def _features(raw: Mapping[str, Any], source: str) -> dict[str, Any]:
    return {**gemma_features(raw, source, default_pattern=6, softcaps=True), "qk_norm": True}


# transformers' Gemma3TextConfig defaults: Gemma 3 4B's config.json gives
# only the sizes that differ from them (no head counts, vocabulary or RoPE bases).
_TEXT_DEFAULTS = {
    "vocab_size": 262208,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "sliding_window_pattern": 6,
    "attention_bias": False,
    "tie_word_embeddings": True,
}

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
    tool_calls="json",
    multimodal=MultimodalWrapper("gemma3", _TEXT_DEFAULTS),
)
