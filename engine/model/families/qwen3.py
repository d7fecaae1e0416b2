"""Qwen3 (dense): the Llama block with an RMSNorm over each query and key
head before RoPE, an explicit head_dim (128 for every size, not
hidden/heads) and no biases. Its template's `enable_thinking` switch is a
template variable (engine.model.tokenizer)."""

from collections.abc import Mapping
from typing import Any

from engine.model.families.base import Family, GGUFNames, LayerNames

_GGUF_TENSORS = {
    "attn_norm": "attn_norm", "attn_q": "q", "attn_k": "k", "attn_v": "v", "attn_output": "o",
    "attn_q_norm": "q_norm", "attn_k_norm": "k_norm",
    "ffn_norm": "ffn_norm", "ffn_gate": "gate", "ffn_up": "up", "ffn_down": "down",
}


def _features(raw: Mapping[str, Any], source: str) -> dict[str, Any]:
    return {"qk_norm": True}


FAMILY = Family(
    name="qwen3",
    title="Qwen3",
    model_types=("qwen3",),
    hf_architecture="Qwen3ForCausalLM",
    layer=LayerNames(q_norm="self_attn.q_norm", k_norm="self_attn.k_norm"),
    gguf=GGUFNames(architectures=("qwen3",), layer_tensors=_GGUF_TENSORS),
    read_features=_features,
    hub_tags=("qwen3",),
)
