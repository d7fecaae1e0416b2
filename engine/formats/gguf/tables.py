"""The GGUF tables: which architectures and tensors Tandem imports, and in
which engine.model.quant format each tensor is kept.

A GGUF file's `general.architecture` names its family (engine/model/families,
each declaring llama.cpp's names for it in `Family.gguf`); the tensors'
Hugging Face names follow from the family's layer. The importer
(engine/formats/gguf/importer.py) converts by these rules, and the app's
model details (app/models/checks.py) predict from them what an import will
hold, so the two cannot disagree. Nothing here imports torch: the window
reads these tables while it starts.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from engine.errors import UnsupportedModelError
from engine.formats.model_json import shown_value
from engine.model.families import SUPPORTED_GGUF_ARCHITECTURES, Family, for_gguf_architecture

# GGUF tensor name -> Hugging Face name, for the tensors outside the layers.
GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
LAYER_TENSOR_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
# The layer number of any layer tensor, known kind or not.
LAYER_NUMBER_RE = re.compile(r"blk\.(\d+)\.")
# Tensors that never become model weights (folded into config.json instead).
# rope_factors_*: LongRoPE's short and long factors (Phi-3.5, Phi-4-mini).
CONFIG_TENSORS = frozenset({"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"})

FLOAT_TYPES = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.F64)
# GGUF block types whose blocks are our formats byte for byte: the first three
# split into levels and scales (engine.model.quant's grouped layout), the
# K-quants and Q5 kept whole, each row's blocks as the file holds them
# (engine.model.quant_formats.RAW_BLOCK_FORMATS). Q4_K_M files are Q4_K and
# Q6_K (and Q5_0 / Q8_0 in some architectures); Q5_K_M adds Q5_K.
KEPT_TYPES = {
    GGMLQuantizationType.Q8_0: "q8_0",
    GGMLQuantizationType.Q4_0: "q4_0",
    GGMLQuantizationType.Q4_1: "q4_1",
    GGMLQuantizationType.Q4_K: "q4_k",
    GGMLQuantizationType.Q5_K: "q5_k",
    GGMLQuantizationType.Q6_K: "q6_k",
    GGMLQuantizationType.Q5_0: "q5_0",
    GGMLQuantizationType.Q5_1: "q5_1",
}
# Quantized types of at most this many bits per weight (Q2_K, Q3_K, IQ4_XS,
# ...) are requantized to q4_1 (4 bits plus a scale and min per 32), the
# others to q8_0: the nearest kept format that loses no more than the source did.
REQUANT_TO_Q4_MAX_BITS = 4.5
# Layer matrices kept quantized: the products' weights (the embedding and
# the output table are kept quantized too, see `is_quantizable`).
QUANTIZABLE_LAYER_TENSORS = frozenset(
    {"attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}
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
    return "q4_1" if bits_per_weight(tensor_type.name) <= REQUANT_TO_Q4_MAX_BITS else "q8_0"


def bits_per_weight(type_name: str) -> float:
    """Bits one weight takes in a GGUF type ("Q4_K": 4.5), scales included."""
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    return size * 8 / block


def requantized_note(type_name: str, fmt: str) -> str:
    """What requantizing a GGUF type costs, for the model's details:
    "Q3_K (3.44 bits per weight) requantized to q4_1 (5.0 bits): 45% more
    bytes, rounded twice"."""
    from engine.model.quant_formats import BLOCK_BYTES, GROUP_SIZE

    source = bits_per_weight(type_name)
    kept = BLOCK_BYTES[fmt] * 8 / GROUP_SIZE
    return (
        f"{type_name} ({source:.3g} bits per weight) requantized to {fmt} ({kept:.1f} bits): "
        f"{round(100 * (kept / source - 1))}% more bytes, rounded twice"
    )


def gguf_family(architecture: str, source_name: str) -> Family:
    """The family a GGUF file's `general.architecture` names; refused,
    listing the ones Tandem imports, when it names none."""
    family = for_gguf_architecture(architecture)
    if family is None:
        raise UnsupportedModelError(
            f"{source_name}: the GGUF architecture {shown_value(architecture)} is not supported. "
            f"Tandem imports these GGUF architectures: {', '.join(sorted(SUPPORTED_GGUF_ARCHITECTURES))}."
        )
    return family


def layer_modules(family: Family) -> dict[str, str]:
    """GGUF layer tensor kind -> the Hugging Face module inside the layer
    ("attn_q" -> "self_attn.q_proj"; Gemma's "ffn_norm" ->
    "pre_feedforward_layernorm")."""
    modules = {kind: getattr(family.layer, part) for kind, part in family.gguf.layer_tensors.items()}
    return {kind: module for kind, module in modules.items() if module is not None}


def required_layer_tensors(family: Family) -> tuple[str, ...]:
    """The weights every layer of a file of this family must have."""
    return tuple(f"{kind}.weight" for kind in layer_modules(family))


def hf_tensor_name(gguf_name: str, family: Family) -> str | None:
    """The Hugging Face name of a GGUF tensor ("blk.3.attn_q.weight" ->
    "model.layers.3.self_attn.q_proj.weight"), None for one Tandem does not
    know in this family."""
    if gguf_name in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[gguf_name]
    match = LAYER_TENSOR_RE.fullmatch(gguf_name)
    module = None if match is None else layer_modules(family).get(match[2])
    if match is None or module is None:
        return None
    return f"model.layers.{int(match[1])}.{module}.{match[3]}"


def is_shifted_norm(hf_name: str, family: Family) -> bool:
    """Whether the file stores this weight plus the family's norm offset
    (Gemma's `1 + w`): convert_hf_to_gguf.py's Gemma2Model and Gemma3Model
    add 1 to every tensor whose Hugging Face name ends in "norm.weight"."""
    return family.gguf.norms_shifted and hf_name.endswith("norm.weight")


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
    length, which must be whole groups of GROUP_SIZE to be kept in blocks
    (a type kept byte for byte has whole blocks of its own in every row).
    """
    from engine.model.quant_formats import GROUP_SIZE

    if not is_quantizable(gguf_name) or len(dims) != 2 or dims[0] % GROUP_SIZE:
        return None
    return kept_format(tensor_type)
