"""Random-weight Llama folders for benchmarks: no download, any size.

`write_random_llama` writes config.json, model.safetensors and a word-level
tokenizer (token i is the word "w<i>"), so the engine and transformers can
both load the folder; prompts are given as token ids. Weights are drawn
with a 1/sqrt(fan_in) scale, which keeps activations and logits well spread,
so greedy decoding has clear winners (a parity check between devices is not
decided by near-ties).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

# A Llama-3.2-1B-like shape with SmolLM2's vocabulary size: 1.07 B parameters.
LLAMA_1B = {
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "vocab_size": 49152,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
}

# Small enough for a CPU dry run of the benchmark and for a CPU-vs-GPU parity check.
SMALL = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 1024,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
}


def parameter_count(shape: dict) -> int:
    h, i, n = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    q = shape["num_attention_heads"] * shape["head_dim"]
    kv = shape["num_key_value_heads"] * shape["head_dim"]
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h
    embed = shape["vocab_size"] * h * (1 if shape["tie_word_embeddings"] else 2)
    return n * per_layer + embed + h


def write_random_llama(
    folder: Path, shape: dict, *, seed: int = 0, dtype: torch.dtype = torch.bfloat16,
    device: str = "cpu",
) -> Path:
    """A loadable random-weight Llama folder with `shape` (see LLAMA_1B)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    h, inter = shape["hidden_size"], shape["intermediate_size"]
    heads, kv_heads, head_dim = (
        shape["num_attention_heads"], shape["num_key_value_heads"], shape["head_dim"]
    )
    vocab = shape["vocab_size"]
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "bos_token_id": None,
        "eos_token_id": None,
        "torch_dtype": str(dtype).removeprefix("torch."),
        **shape,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    write_wordlevel_tokenizer(folder, vocab)

    gen = torch.Generator(device=device).manual_seed(seed)

    def rand(rows: int, cols: int) -> torch.Tensor:
        w = torch.randn(rows, cols, generator=gen, device=device, dtype=torch.float32)
        return (w / cols**0.5).to(dtype).cpu()

    tensors = {
        "model.embed_tokens.weight": torch.randn(
            vocab, h, generator=gen, device=device
        ).to(dtype).cpu(),
        "model.norm.weight": torch.ones(h, dtype=dtype),
    }
    if not shape["tie_word_embeddings"]:
        tensors["lm_head.weight"] = rand(vocab, h)
    for layer in range(shape["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        tensors |= {
            p + "input_layernorm.weight": torch.ones(h, dtype=dtype),
            p + "post_attention_layernorm.weight": torch.ones(h, dtype=dtype),
            p + "self_attn.q_proj.weight": rand(heads * head_dim, h),
            p + "self_attn.k_proj.weight": rand(kv_heads * head_dim, h),
            p + "self_attn.v_proj.weight": rand(kv_heads * head_dim, h),
            p + "self_attn.o_proj.weight": rand(h, heads * head_dim),
            p + "mlp.gate_proj.weight": rand(inter, h),
            p + "mlp.up_proj.weight": rand(inter, h),
            p + "mlp.down_proj.weight": rand(h, inter),
        }
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def write_wordlevel_tokenizer(folder: Path, vocab_size: int) -> None:
    """tokenizer.json where id i is the word "w<i>": every id decodes to text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"add_bos_token": False, "model_max_length": 1 << 20}), encoding="utf-8"
    )


def random_prompts(count: int, length: int, vocab_size: int, seed: int = 0) -> list[list[int]]:
    """Distinct token-id prompts (no prefix-cache hits between them)."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab_size, (length,), generator=gen).tolist() for _ in range(count)]
