"""Each family's GGUF metadata, as the config.json fields of its block.

llama.cpp's converter (convert_hf_to_gguf.py, conversion/<family>.py) writes
a family's features as `<arch>.<key>` metadata and leaves some out; llama.cpp
then fills those in itself (src/models/<arch>.cpp, `load_arch_hparams`).
`family_fields` returns, for a file's family, the Hugging Face config.json
fields the family's feature reader (engine/model/families) takes, with
llama.cpp's defaults where the file says nothing, so that the imported
folder computes what llama.cpp computes from the file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from engine.errors import InvalidModelConfigError
from engine.formats.gguf.reader import GGUFMetadata
from engine.formats.model_json import shown_value
from engine.model.config import MIN_ROPE_THETA
from engine.model.families import Family

# (the file's metadata, its architecture, config.json's common fields) -> the family's fields
_FieldReader = Callable[[GGUFMetadata, str, Mapping[str, Any]], dict[str, Any]]

_SWIGLU = {"hidden_act": "silu"}


def family_fields(family: Family, meta: GGUFMetadata, arch: str, common: Mapping[str, Any]) -> dict[str, Any]:
    """config.json's fields for the block of `family`, read from the file."""
    reader = _READERS.get(family.name)
    return dict(_SWIGLU) if reader is None else reader(meta, arch, common)


def _gemma2(meta: GGUFMetadata, arch: str, common: Mapping[str, Any]) -> dict[str, Any]:
    # conversion/gemma.py Gemma2Model writes both soft-caps and the window;
    # src/models/gemma2.cpp defaults them to 50, 30 and 4096, with every
    # other layer sliding (pattern 2).
    return {
        **_gemma_common(common, big_layers=46),
        "attn_logit_softcapping": meta.real(f"{arch}.attn_logit_softcapping", 50.0),
        "final_logit_softcapping": meta.real(f"{arch}.final_logit_softcapping", 30.0),
        "sliding_window": meta.integer(f"{arch}.attention.sliding_window", 4096),
        "layer_types": _layer_types(meta, arch, common["num_hidden_layers"], default_pattern=2),
    }


def _gemma3(meta: GGUFMetadata, arch: str, common: Mapping[str, Any]) -> dict[str, Any]:
    # conversion/gemma.py Gemma3Model writes the global layers' RoPE base and
    # linear scaling (read as for every family), the window and a final
    # soft-cap only when there is one. src/models/gemma3.cpp: no window means
    # no sliding layers; else five of six slide (pattern 6), on their own
    # base (`rope.freq_base_swa`, 10000 when absent) and unscaled.
    fields = {
        **_gemma_common(common, big_layers=62),
        "attn_logit_softcapping": None,
        "final_logit_softcapping": meta.optional_real(f"{arch}.final_logit_softcapping") or None,
    }
    window = meta.integer(f"{arch}.attention.sliding_window", 0)
    if window > 0:
        fields["sliding_window"] = window
        fields["layer_types"] = _layer_types(meta, arch, common["num_hidden_layers"], default_pattern=6)
        fields["rope_local_base_freq"] = _rope_base(meta, f"{arch}.rope.freq_base_swa", 10000.0)
    return fields


def _rope_base(meta: GGUFMetadata, key: str, default: float) -> float:
    base = meta.real(key, default)
    if base < MIN_ROPE_THETA:
        raise InvalidModelConfigError(
            f"{meta.source.name}: {key} is {base}, less than {MIN_ROPE_THETA}; the file is corrupt."
        )
    return base


def _gemma_common(common: Mapping[str, Any], big_layers: int) -> dict[str, Any]:
    # The converter writes no attention scale for Gemma: llama.cpp scales by
    # head_dim^-0.5, and by (hidden/heads)^-0.5 for the 27B model (told apart
    # by its layer count), which is what query_pre_attn_scalar says in those
    # models' config.json.
    if common["num_hidden_layers"] == big_layers:
        scalar = common["hidden_size"] // common["num_attention_heads"]
    else:
        scalar = common["head_dim"]
    return {"hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": scalar}


def _layer_types(meta: GGUFMetadata, arch: str, layers: int, default_pattern: int) -> list[str]:
    """config.json's `layer_types` from `attention.sliding_window_pattern`:
    one flag per layer, or a period n where layer i slides unless
    i % n == n - 1 (llama_hparams::set_swa_pattern; 0: every layer slides)."""
    key = f"{arch}.attention.sliding_window_pattern"
    value = meta.get(key, default_pattern)
    if isinstance(value, (list, np.ndarray)):
        flags = list(value)
        if len(flags) != layers or not all(isinstance(flag, (bool, np.bool_)) for flag in flags):
            raise InvalidModelConfigError(
                f"{meta.source.name}: {key} must be {layers} true/false values, one per layer; "
                "the file is corrupt."
            )
        sliding = [bool(flag) for flag in flags]
    else:
        period = meta.integer(key, default_pattern)
        # A period longer than the model (Gemma 3's default 6 in a file of
        # fewer layers) leaves every layer sliding, as llama.cpp reads it.
        if period < 0:
            raise InvalidModelConfigError(f"{meta.source.name}: {key} is {shown_value(period)}; the file is corrupt.")
        sliding = [period == 0 or i % period < period - 1 for i in range(layers)]
    return ["sliding_attention" if flag else "full_attention" for flag in sliding]


def _granite(meta: GGUFMetadata, arch: str, common: Mapping[str, Any]) -> dict[str, Any]:
    # conversion/granite.py writes each multiplier only when the config has a
    # non-zero one; src/models/granite.cpp (and llama-graph.cpp) treat an
    # absent or zero scale as none, and attention's as head_dim^-0.5.
    def scale(key: str, default: float) -> float:
        return meta.optional_real(f"{arch}.{key}") or default

    return {
        **_SWIGLU,
        "embedding_multiplier": scale("embedding_scale", 1.0),
        "residual_multiplier": scale("residual_scale", 1.0),
        "attention_multiplier": scale("attention.scale", common["head_dim"] ** -0.5),
        "logits_scaling": scale("logit_scale", 1.0),
    }


def _phi3(meta: GGUFMetadata, arch: str, common: Mapping[str, Any]) -> dict[str, Any]:
    # conversion/phi.py Phi3MiniModel writes the window, 0 for none (Phi-4).
    window = meta.integer(f"{arch}.attention.sliding_window", 0)
    return {**_SWIGLU, "sliding_window": window or None}


_READERS: dict[str, _FieldReader] = {"gemma2": _gemma2, "gemma3": _gemma3, "granite": _granite, "phi3": _phi3}
