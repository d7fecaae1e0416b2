"""The GGUF tables: which architectures and tensors Tandem imports, and in
which engine.model.quant format each tensor is kept.

The importer (engine/formats/gguf/importer.py) converts by these rules, and
the app's model details (app/models/checks.py) predict from them what an
import will hold, so the two cannot disagree.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType



@dataclass(frozen=True, slots=True)
class Architecture:
    hf_class: str
    model_type: str
    # llama.cpp's converter reorders the q/k rows of these models so that
    # ggml's interleaved RoPE matches HF's rotate-half; NEOX-style models
    # (qwen2) are stored unchanged.
    permutes_qk: bool


ARCHITECTURES = {
    "llama": Architecture("LlamaForCausalLM", "llama", permutes_qk=True),
    "qwen2": Architecture("Qwen2ForCausalLM", "qwen2", permutes_qk=False),
}

# GGUF tensor name -> Hugging Face name, for the tensors outside the layers.
GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# GGUF layer tensor kind -> Hugging Face module name inside the layer.
LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
REQUIRED_LAYER_TENSORS = tuple(f"{name}.weight" for name in LAYER_TENSORS)
LAYER_TENSOR_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
# The layer number of any layer tensor, known kind or not.
LAYER_NUMBER_RE = re.compile(r"blk\.(\d+)\.")
# Tensors that never become model weights (folded into config.json instead).
CONFIG_TENSORS = frozenset({"rope_freqs.weight"})

FLOAT_TYPES = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.F64)
# GGUF block types whose blocks are our formats byte for byte.
KEPT_TYPES = {
    GGMLQuantizationType.Q8_0: "q8_0",
    GGMLQuantizationType.Q4_0: "q4_0",
    GGMLQuantizationType.Q4_1: "q4_1",
}
# Quantized types of at most this many bits per weight are requantized to
# q4_1 (4 bits plus a scale and min per 32), the others to q8_0: the nearest
# kept format that loses no more than the source did.
REQUANT_TO_Q4_MAX_BITS = 4.5
# Layer matrices kept quantized: the products' weights (the embedding and
# the output table are kept quantized too, see `is_quantizable`).
QUANTIZABLE_LAYER_TENSORS = frozenset(
    {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}
)
_QUANTIZABLE_GLOBAL_TENSORS = frozenset({"token_embd.weight", "output.weight"})


def kept_format(tensor_type: GGMLQuantizationType) -> str | None:
    """The engine.model.quant format a quantizable matrix of this GGUF type is
    stored in, None to store it as float32."""
    if tensor_type in FLOAT_TYPES or tensor_type == GGMLQuantizationType.BF16:
        return None
    kept = KEPT_TYPES.get(tensor_type)
    if kept is not None:
        return kept
    block, size = GGML_QUANT_SIZES[tensor_type]
    return "q4_1" if size * 8 / block <= REQUANT_TO_Q4_MAX_BITS else "q8_0"


def hf_tensor_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor ("blk.3.attn_q.weight" ->
    "model.layers.3.self_attn.q_proj.weight"), None for one Tandem does not know."""
    if gguf_name in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[gguf_name]
    match = LAYER_TENSOR_RE.fullmatch(gguf_name)
    if match is None or match[2] not in LAYER_TENSORS:
        return None
    return f"model.layers.{int(match[1])}.{LAYER_TENSORS[match[2]]}.{match[3]}"


def is_quantizable(gguf_name: str) -> bool:
    """Whether the importer may keep this tensor block-quantized: the
    embedding, the output table and the layers' product matrices."""
    if gguf_name in _QUANTIZABLE_GLOBAL_TENSORS:
        return True
    match = LAYER_TENSOR_RE.fullmatch(gguf_name)
    return match is not None and match[2] in QUANTIZABLE_LAYER_TENSORS and match[3] == "weight"


def stored_format(gguf_name: str, tensor_type: GGMLQuantizationType, dims: Sequence[int]) -> str | None:
    """The format the importer stores this tensor in, None for float32.

    `dims` run innermost first, as GGUF stores them: dims[0] is a row's
    length, which must be whole groups of GROUP_SIZE to be kept in blocks.
    """
    # Imported here: engine.model.quant imports torch, and the window's model
    # checks read these tables at start-up, before torch is needed.
    from engine.model.quant import GROUP_SIZE

    if not is_quantizable(gguf_name) or len(dims) != 2 or dims[0] % GROUP_SIZE:
        return None
    return kept_format(tensor_type)
