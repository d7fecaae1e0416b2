"""The weights a Llama-family checkpoint holds, by name and shape: the
loader's rules, without torch.

engine/formats/loader.py refuses a folder whose tensors differ from
`expected_weights`; app/models/checks.py checks a folder by the same rules
before it is registered, and engine/formats/weight_memory.py counts them for
a memory estimate. Those run while the window is built, so this module
imports nothing heavy: importing torch takes seconds, and the window must be
on screen before that (ui/startup.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.model.config import ModelConfig

EMBEDDING_NAME = "model.embed_tokens.weight"
LM_HEAD_NAME = "lm_head.weight"
# The layers' matrices, the ones a quantized copy stores in blocks (engine/formats/loader.py quantized_copy).
QUANTIZED_LAYER_WEIGHTS = (
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
)
# Rotary inverse-frequency buffers saved by old exports carry no information.
IGNORED_WEIGHT_SUFFIX = "rotary_emb.inv_freq"


def is_model_weight(name: str) -> bool:
    """Whether the loader takes a stored tensor: anything else in the files
    (an exporter's extras) is skipped unread."""
    return name.startswith(("model.", LM_HEAD_NAME))


def expected_weights(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """name -> shape of every weight the loader takes for this config, a
    separate LM head included when the embeddings are not tied (a folder
    whose weights differ is refused)."""
    hidden, inter, d = c.hidden_size, c.intermediate_size, c.head_dim
    q_out, kv_out = c.num_attention_heads * d, c.num_key_value_heads * d
    expected: dict[str, tuple[int, ...]] = {}
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        attn, mlp = p + "self_attn.", p + "mlp."
        expected |= {
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
            attn + "q_proj.weight": (q_out, hidden),
            attn + "k_proj.weight": (kv_out, hidden),
            attn + "v_proj.weight": (kv_out, hidden),
            attn + "o_proj.weight": (hidden, q_out),
            mlp + "gate_proj.weight": (inter, hidden),
            mlp + "up_proj.weight": (inter, hidden),
            mlp + "down_proj.weight": (hidden, inter),
        }
        if c.qkv_bias:
            expected |= {attn + "q_proj.bias": (q_out,), attn + "k_proj.bias": (kv_out,), attn + "v_proj.bias": (kv_out,)}
        if c.o_bias:
            expected[attn + "o_proj.bias"] = (hidden,)
        if c.mlp_bias:
            expected |= {mlp + "gate_proj.bias": (inter,), mlp + "up_proj.bias": (inter,), mlp + "down_proj.bias": (hidden,)}
    expected[EMBEDDING_NAME] = (c.vocab_size, hidden)
    expected["model.norm.weight"] = (hidden,)
    if not c.tie_word_embeddings:
        expected[LM_HEAD_NAME] = (c.vocab_size, hidden)
    return expected
