"""Phi-3, Phi-3.5 and Phi-4 / Phi-4-mini (`phi3`): the Llama block with q/k/v
and gate/up each stored as one fused matrix, LongRoPE (short and long
factors over the pretrained context, engine.model.config), and partial
rotary on Phi-4-mini (the leading 3/4 of each head rotates)."""

from engine.model.families.base import Family, GGUFNames, LayerNames, no_features

# llama.cpp keeps both fusions: attn_qkv, and ffn_up holding gate and up.
_GGUF_TENSORS = {
    "attn_norm": "attn_norm", "attn_qkv": "qkv", "attn_output": "o",
    "ffn_norm": "ffn_norm", "ffn_up": "gate_up", "ffn_down": "down",
}

FAMILY = Family(
    name="phi3",
    title="Phi-3",
    model_types=("phi3",),
    hf_architecture="Phi3ForCausalLM",
    layer=LayerNames(
        q=None, k=None, v=None, qkv="self_attn.qkv_proj",
        gate=None, up=None, gate_up="mlp.gate_up_proj",
    ),
    gguf=GGUFNames(architectures=("phi3",), layer_tensors=_GGUF_TENSORS),
    read_features=no_features,
    hub_tags=("phi3",),
    tool_calls="tool_call_tag",
)
