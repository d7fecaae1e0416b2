"""Qwen2 and Qwen2.5 (and the DeepSeek-R1 Qwen distills): the Llama block
with biases on q, k and v (always, whatever config.json says) and none on o."""

from engine.model.families.base import Family, GGUFNames, LayerNames, no_features

FAMILY = Family(
    name="qwen2",
    title="Qwen2",
    model_types=("qwen2",),
    hf_architecture="Qwen2ForCausalLM",
    layer=LayerNames(),
    gguf=GGUFNames(architectures=("qwen2",)),
    read_features=no_features,
    hub_tags=("qwen2",),
    qkv_bias_always=True,
)
