"""A random-weight Llama-family folder of any head layout, and the part of a
sequence a model runner reads: for runner tests that need no tokenizer."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch


def write_random_llama(folder: Path, *, heads: int, kv_heads: int, head_dim: int,
                       window: int | None, seed: int) -> Path:
    from safetensors.torch import save_file

    hidden, inter, vocab, layers = heads * head_dim, 96, 97, 2
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": True, "vocab_size": vocab, "torch_dtype": "float32",
    }
    if window:
        config["sliding_window"] = window
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) / shape[-1] ** 0.5

    tensors = {"model.embed_tokens.weight": torch.randn(vocab, hidden, generator=gen),
               "model.norm.weight": torch.ones(hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors |= {
            p + "input_layernorm.weight": torch.ones(hidden),
            p + "post_attention_layernorm.weight": torch.ones(hidden),
            p + "self_attn.q_proj.weight": rand(heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": rand(kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": rand(kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": rand(hidden, heads * head_dim),
            p + "mlp.gate_proj.weight": rand(inter, hidden),
            p + "mlp.up_proj.weight": rand(inter, hidden),
            p + "mlp.down_proj.weight": rand(hidden, inter),
        }
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


@dataclass
class FakeSequence:
    """What a runner reads of a sequence: its ids, its pages, its sampler."""

    token_ids: list[int]
    pages: list[int]
    sampler: object = None
