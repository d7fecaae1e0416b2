"""The weights a checkpoint of any family Tandem runs holds, by name and
shape (each family's layer names: engine/model/families): the loader's
rules, without torch.

engine/formats/loader.py refuses a folder whose tensors differ from
`expected_weights`; app/models/checks.py checks a folder by the same rules
before it is registered, and engine/formats/weight_memory.py counts them for
a memory estimate. Those run while the window is built, so this module
imports nothing heavy: importing torch takes seconds, and the window must be
on screen before that (ui/startup.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.model.families import family_named

if TYPE_CHECKING:
    from engine.model.config import ModelConfig

EMBEDDING_NAME = "model.embed_tokens.weight"
LM_HEAD_NAME = "lm_head.weight"
# Rotary inverse-frequency buffers saved by old exports carry no information.
IGNORED_WEIGHT_SUFFIX = "rotary_emb.inv_freq"


# A multimodal checkpoint (Gemma 3 4B and up) keeps its text model under a
# prefix, beside a vision tower Tandem does not run: exports made before
# transformers 4.52 name it "language_model.model.*", later ones
# "model.language_model.*".
_TEXT_MODEL_PREFIXES = (
    ("language_model.model.", "model."),
    ("model.language_model.", "model."),
    ("language_model.lm_head.", "lm_head."),
)
_VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")


def model_weight_name(name: str) -> str | None:
    """The name the loader knows a stored tensor by ("model.layers.0...."),
    or None for one it skips unread: a vision tower, an exporter's extras."""
    for prefix, replacement in _TEXT_MODEL_PREFIXES:
        if name.startswith(prefix):
            return replacement + name[len(prefix):]
    if name.startswith(_VISION_PREFIXES) or not name.startswith(("model.", LM_HEAD_NAME)):
        return None
    return name


def is_model_weight(name: str) -> bool:
    """Whether the loader takes a stored tensor (under `model_weight_name`)."""
    return model_weight_name(name) is not None


def quantized_layer_weights(c: ModelConfig) -> tuple[str, ...]:
    """The names (inside a layer) of the matrices a quantized copy stores in
    blocks (engine/formats/loader.py quantized_copy)."""
    return tuple(f"{name}.weight" for name in family_named(c.family).layer.products())


def layer_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Module name inside a layer -> the shape of its weight (biases are
    `.bias` of the same shape's first dimension), for this config's family."""
    names = family_named(c.family).layer
    hidden, inter, d = c.hidden_size, c.intermediate_size, c.head_dim
    q_out, kv_out = c.num_attention_heads * d, c.num_key_value_heads * d
    shapes: dict[str | None, tuple[int, ...]] = {
        names.q: (q_out, hidden), names.k: (kv_out, hidden), names.v: (kv_out, hidden),
        names.qkv: (q_out + 2 * kv_out, hidden), names.o: (hidden, q_out),
        names.gate: (inter, hidden), names.up: (inter, hidden), names.gate_up: (2 * inter, hidden),
        names.down: (hidden, inter), names.q_norm: (d,), names.k_norm: (d,),
    }
    shapes |= {norm: (hidden,) for norm in names.norms()}
    return {name: shape for name, shape in shapes.items() if name is not None}


def expected_weights(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """name -> shape of every weight the loader takes for this config, a
    separate LM head included when the embeddings are not tied (a folder
    whose weights differ is refused)."""
    names = family_named(c.family).layer
    shapes = layer_shapes(c)
    biases: list[str | None] = []
    if c.qkv_bias:
        biases += [names.q, names.k, names.v, names.qkv]
    if c.o_bias:
        biases.append(names.o)
    if c.mlp_bias:
        biases += [names.gate, names.up, names.gate_up, names.down]
    expected: dict[str, tuple[int, ...]] = {}
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        expected |= {f"{p}{name}.weight": shape for name, shape in shapes.items()}
        expected |= {f"{p}{name}.bias": shapes[name][:1] for name in biases if name is not None}
    hidden = c.hidden_size
    expected[EMBEDDING_NAME] = (c.vocab_size, hidden)
    expected["model.norm.weight"] = (hidden,)
    if not c.tie_word_embeddings:
        expected[LM_HEAD_NAME] = (c.vocab_size, hidden)
    return expected
