"""Llama 2/3, Mistral (Nemo and Small too) and SmolLM: the plain block.

llama.cpp's converter reorders q/k rows for ggml's interleaved RoPE; the
importer undoes it. Mistral Nemo's head_dim (128) is not hidden/heads: it is
read from config.json's `head_dim` or GGUF's `attention.key_length`.
"""

from engine.model.families.base import Family, GGUFNames, LayerNames, no_features

FAMILY = Family(
    name="llama",
    title="Llama",
    model_types=("llama", "mistral"),
    hf_architecture="LlamaForCausalLM",
    layer=LayerNames(),
    gguf=GGUFNames(architectures=("llama",), permutes_qk=True),
    read_features=no_features,
    hub_tags=("llama", "mistral"),
    tool_calls="llama3_json",
)
