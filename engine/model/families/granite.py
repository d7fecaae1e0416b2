"""IBM Granite 3.x (dense): the Llama block with four multipliers: the
embeddings', the residual branches', the attention scale (which replaces
head_dim^-0.5) and a divisor of the final logits."""

from collections.abc import Mapping
from typing import Any

from engine.errors import InvalidModelConfigError
from engine.formats.model_json import shown_value
from engine.model.families.base import Family, GGUFNames, LayerNames


def _positive(raw: Mapping[str, Any], key: str, source: str) -> float:
    value = raw.get(key, 1.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1e-9 < value < 1e9:
        raise InvalidModelConfigError(f"{source}: {key} is {shown_value(value)}, not a positive number")
    return float(value)


def _features(raw: Mapping[str, Any], source: str) -> dict[str, Any]:
    return {
        "embedding_scale": _positive(raw, "embedding_multiplier", source),
        "residual_scale": _positive(raw, "residual_multiplier", source),
        "attention_scale": _positive(raw, "attention_multiplier", source),
        "logit_scale": 1.0 / _positive(raw, "logits_scaling", source),
    }


FAMILY = Family(
    name="granite",
    title="Granite",
    model_types=("granite",),
    hf_architecture="GraniteForCausalLM",
    layer=LayerNames(),
    # conversion/granite.py is LlamaModel's subclass: q/k rows are permuted as Llama's.
    gguf=GGUFNames(architectures=("granite",), permutes_qk=True),
    read_features=_features,
    hub_tags=("granite",),
    tool_calls="tool_call_tag",
)
