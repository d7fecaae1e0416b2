"""What a model family is to the engine: its names in each format, the
tensors of its decoder layer, and the features of its block.

Every family Tandem runs is one module of this package that builds a
`Family`. The config reader (engine/model/config.py), the loader, the weight
rules the app checks folders by (engine/formats/weight_names.py), the GGUF
importer and the Hub filter all read these declarations, so a new family is
one module plus its tests. Nothing here imports torch: the window reads
families while it starts, before torch is loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class LayerNames:
    """Hugging Face module names inside `model.layers.<i>.` for each part of
    the generic decoder layer; None where the family has no such part.

    Fused tensors (Phi-3's qkv_proj and gate_up_proj) name the fused module
    and leave the parts None."""

    attn_norm: str = "input_layernorm"
    q: str | None = "self_attn.q_proj"
    k: str | None = "self_attn.k_proj"
    v: str | None = "self_attn.v_proj"
    qkv: str | None = None
    o: str = "self_attn.o_proj"
    ffn_norm: str = "post_attention_layernorm"
    gate: str | None = "mlp.gate_proj"
    up: str | None = "mlp.up_proj"
    gate_up: str | None = None
    down: str = "mlp.down_proj"
    q_norm: str | None = None
    k_norm: str | None = None
    # Norms on the attention and feed-forward outputs before they join the
    # residual stream (Gemma 2 and 3's "sandwich" norms).
    attn_out_norm: str | None = None
    ffn_out_norm: str | None = None

    def products(self) -> tuple[str, ...]:
        """The layer's matrices: the ones a quantized copy stores in blocks."""
        parts = (self.qkv, self.q, self.k, self.v, self.o, self.gate_up, self.gate, self.up, self.down)
        return tuple(name for name in parts if name is not None)

    def norms(self) -> tuple[str, ...]:
        parts = (self.attn_norm, self.ffn_norm, self.attn_out_norm, self.ffn_out_norm)
        return tuple(name for name in parts if name is not None)


@dataclass(frozen=True, slots=True)
class GGUFNames:
    """How llama.cpp's converter writes the family: its `general.architecture`
    names, the layer tensor kinds (`blk.<i>.<kind>.weight`) of each part, and
    whether it reorders q/k rows for ggml's interleaved RoPE (Llama only)."""

    architectures: tuple[str, ...]
    permutes_qk: bool = False
    # GGUF layer tensor kind -> the LayerNames field it fills.
    layer_tensors: Mapping[str, str] = field(default_factory=lambda: {
        "attn_norm": "attn_norm", "attn_q": "q", "attn_k": "k", "attn_v": "v", "attn_output": "o",
        "ffn_norm": "ffn_norm", "ffn_gate": "gate", "ffn_up": "up", "ffn_down": "down",
    })
    # Whether norm weights are stored with the family's norm offset already
    # added (llama.cpp stores Gemma's `1 + w` as one weight; Hugging Face
    # stores w).
    norms_shifted: bool = False


@dataclass(frozen=True, slots=True)
class MultimodalWrapper:
    """A Hugging Face model_type whose config.json nests this family's text
    model under `text_config`, beside a vision model (Gemma 3 4B and up:
    "gemma3"). Tandem runs the text model and leaves the vision tower
    unread; `text_defaults` are the text config class's defaults, which such
    a config.json leaves out (transformers fills them from the class)."""

    model_type: str
    text_defaults: Mapping[str, Any]


# A family's reader of config.json: the raw dict in, the block features out
# (the keyword arguments of ModelConfig it sets beyond the common ones).
FeatureReader = Callable[[Mapping[str, Any], str], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Family:
    name: str  # short, stable: "gemma3"
    title: str  # for people: "Gemma 3"
    model_types: tuple[str, ...]  # Hugging Face config.json model_type values
    hf_architecture: str  # the class a folder written by Tandem names
    layer: LayerNames
    gguf: GGUFNames
    read_features: FeatureReader
    # Hub search: the `model_type`/tag names whose models this family runs.
    hub_tags: tuple[str, ...] = ()
    # Whether q/k/v carry biases by design (Qwen2), whatever the config says.
    qkv_bias_always: bool = False
    # How the family's instruct models write tool calls (a format of
    # engine.model.tool_calls), where the chat template's markers do not say.
    tool_calls: str = "hermes"
    # A multimodal model_type whose text model this family runs.
    multimodal: MultimodalWrapper | None = None

    @property
    def gguf_architectures(self) -> tuple[str, ...]:
        return self.gguf.architectures


def no_features(raw: Mapping[str, Any], source: str) -> dict[str, Any]:
    return {}
