"""Gemma 2 and Gemma 3 (text): the block both share.

- Norms multiply by `1 + w` (Hugging Face stores w; llama.cpp's converter
  stores 1 + w, so GGUF norms arrive shifted), and there are four per layer:
  before and after attention, before and after the feed-forward network.
- The feed-forward network is GeGLU with tanh-approximated GELU.
- Embeddings are scaled by sqrt(hidden_size) (rounded to the weights'
  dtype in Hugging Face; the engine keeps activations in float32 on the CPU).
- Attention scales by query_pre_attn_scalar^-0.5, not head_dim^-0.5.
- Some layers attend over a sliding window: every other one in Gemma 2, five
  of six in Gemma 3 (`layer_types`, or the older `sliding_window_pattern`).
- Gemma 2 soft-caps attention scores (50) and final logits (30); Gemma 3
  drops both caps for q/k norms (`1 + w` as well) and gives its sliding
  layers their own RoPE base (10k) while the global layers use 1M with the
  config's scaling.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from engine.errors import InvalidModelConfigError
from engine.formats.model_json import shown_value

_GGUF_TENSORS = {
    "attn_norm": "attn_norm", "attn_q": "q", "attn_k": "k", "attn_v": "v", "attn_output": "o",
    "post_attention_norm": "attn_out_norm",
    "ffn_norm": "ffn_norm", "ffn_gate": "gate", "ffn_up": "up", "ffn_down": "down",
    "post_ffw_norm": "ffn_out_norm",
}
GEMMA3_GGUF_TENSORS = {**_GGUF_TENSORS, "attn_q_norm": "q_norm", "attn_k_norm": "k_norm"}
GEMMA2_GGUF_TENSORS = _GGUF_TENSORS

ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu_tanh"}


def gemma_features(raw: Mapping[str, Any], source: str, *, default_pattern: int, softcaps: bool) -> dict[str, Any]:
    """The features Gemma 2 and 3 share, read from config.json's fields."""
    hidden = raw.get("hidden_size")
    act = raw.get("hidden_activation") or raw.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ACTIVATIONS:
        raise InvalidModelConfigError(f"{source}: hidden_activation {shown_value(act)} is not one Gemma uses")
    scalar = raw.get("query_pre_attn_scalar") or raw.get("head_dim") or 256
    if not isinstance(scalar, (int, float)) or isinstance(scalar, bool) or not 0 < scalar < 1e9:
        raise InvalidModelConfigError(
            f"{source}: query_pre_attn_scalar is {shown_value(scalar)}, not a positive number"
        )
    layers = raw.get("num_hidden_layers")
    features: dict[str, Any] = {
        "norm_offset": 1.0,
        "activation": ACTIVATIONS[act],
        "embedding_scale": math.sqrt(hidden) if isinstance(hidden, int) and hidden > 0 else 1.0,
        "attention_scale": float(scalar) ** -0.5,
    }
    if isinstance(layers, int) and 0 < layers <= 1024:
        features["sliding_layers"] = sliding_layers(raw, layers, default_pattern, source)
    if softcaps:
        features["attn_softcap"] = _cap(raw.get("attn_logit_softcapping"), "attn_logit_softcapping", source)
        features["final_softcap"] = _cap(raw.get("final_logit_softcapping"), "final_logit_softcapping", source)
    return features


def sliding_layers(raw: Mapping[str, Any], layers: int, default_pattern: int, source: str) -> tuple[bool, ...]:
    """Which layers attend over the sliding window: config.json's
    `layer_types` when it has them, else every `pattern`-th layer is global
    (`sliding_window_pattern`; Gemma 2's is 2, with layer 0 sliding)."""
    types = raw.get("layer_types")
    if isinstance(types, list):
        if len(types) != layers or not all(t in ("sliding_attention", "full_attention") for t in types):
            raise InvalidModelConfigError(
                f"{source}: layer_types must name sliding_attention or full_attention for each of "
                f"the {layers} layers"
            )
        return tuple(t == "sliding_attention" for t in types)
    pattern = raw.get("sliding_window_pattern") or raw.get("_sliding_window_pattern") or default_pattern
    if not isinstance(pattern, int) or isinstance(pattern, bool) or not 1 <= pattern <= layers + 1:
        raise InvalidModelConfigError(f"{source}: sliding_window_pattern is {shown_value(pattern)}")
    return tuple((i + 1) % pattern != 0 for i in range(layers))


def _cap(value: Any, key: str, source: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e6:
        raise InvalidModelConfigError(f"{source}: {key} is {shown_value(value)}, not a positive number")
    return float(value)
