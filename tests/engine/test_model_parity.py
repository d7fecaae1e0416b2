"""Logits of the engine's model equal Hugging Face transformers' on tiny
random-weight checkpoints of every supported architecture, through the paged
KV cache, for a full prefill, a chunked prefill and single-token decodes."""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from engine.errors import ModelLoadError, PickleCheckpointError, UnsupportedModelError
from engine.formats.loader import load_model
from engine.runner.cpu import ModelRunner
from engine.core.scheduler import ScheduledChunk, ScheduleResult

transformers = pytest.importorskip("transformers")

TINY = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)

ARCHS = {
    "llama": lambda: transformers.LlamaConfig(**TINY, rope_theta=500000.0),
    "llama3-rope-scaling": lambda: transformers.LlamaConfig(
        **TINY,
        tie_word_embeddings=True,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    ),
    "llama-linear-rope": lambda: transformers.LlamaConfig(
        **TINY, rope_scaling={"rope_type": "linear", "factor": 2.0}
    ),
    "qwen2-bias": lambda: transformers.Qwen2Config(**TINY, tie_word_embeddings=True),
    "mistral-sliding-window": lambda: transformers.MistralConfig(**TINY, sliding_window=7),
    "qwen3": lambda: transformers.Qwen3Config(**TINY, head_dim=24, rope_theta=1e6),
    # Soft-caps small enough to change the result: a model that ignored them
    # would fail.
    "gemma2-softcaps-alternating-window": lambda: transformers.Gemma2Config(
        **TINY, head_dim=16, query_pre_attn_scalar=32, sliding_window=5,
        attn_logit_softcapping=0.5, final_logit_softcapping=0.3,
    ),
    # Sliding layers on their own RoPE base; global ones scaled (linear).
    "gemma3-local-global-rope": lambda: transformers.Gemma3TextConfig(
        **TINY, head_dim=16, query_pre_attn_scalar=16, sliding_window=5,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
    ),
    # LongRoPE both sides of the pretrained context (which set of factors
    # rotates), and partial rotary (Phi-4-mini).
    "phi3-longrope-short": lambda: transformers.Phi3Config(
        **{**TINY, "max_position_embeddings": 256}, original_max_position_embeddings=256, pad_token_id=0,
        bos_token_id=1, eos_token_id=2,
        rope_parameters=_longrope(pairs=8),
    ),
    "phi3-longrope-long-partial-rotary": lambda: transformers.Phi3Config(
        **{**TINY, "max_position_embeddings": 256}, original_max_position_embeddings=6, pad_token_id=0,
        bos_token_id=1, eos_token_id=2,
        rope_parameters={**_longrope(pairs=4), "partial_rotary_factor": 0.5},
    ),
    "qwen2-yarn": lambda: transformers.Qwen2Config(
        **TINY, rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                                 "rope_theta": 10000.0},
    ),
    "granite-multipliers": lambda: transformers.GraniteConfig(
        **TINY, embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.1, logits_scaling=4.0,
    ),
}

def _longrope(pairs: int) -> dict:
    return {
        "rope_type": "longrope", "rope_theta": 10000.0,
        "short_factor": [1.0 + 0.3 * i for i in range(pairs)],
        "long_factor": [2.0 + 1.5 * i for i in range(pairs)],
    }


CLASSES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "granite": "GraniteForCausalLM",
    "phi3": "Phi3ForCausalLM",
}


def _save_tiny(config, folder: Path, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    cls = getattr(transformers, CLASSES[config.model_type])
    config._attn_implementation = "eager"
    model = cls(config).eval()
    # Random init leaves norms at 1 and biases at 0; perturb every tensor so
    # a weight loaded into the wrong place shows up in the logits.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(folder)
    return model


def _hf_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def _chunk(ids: list[int], pages: list[int], start: int, num: int) -> ScheduledChunk:
    seq = SimpleNamespace(token_ids=ids, pages=pages, sampler=None)
    return ScheduledChunk(seq, start, num)  # type: ignore[arg-type]


def _run(runner: ModelRunner, decodes: list[ScheduledChunk], prefills: list[ScheduledChunk]):
    hidden, _, _ = runner.forward(ScheduleResult(decodes=decodes, prefills=prefills))
    return runner.model.logits(hidden)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_logits_match_transformers(arch: str, tmp_path: Path) -> None:
    config = ARCHS[arch]()
    hf = _save_tiny(config, tmp_path)
    model = load_model(tmp_path, "cpu", "float32")
    rng = random.Random(1)
    ids = [rng.randrange(TINY["vocab_size"]) for _ in range(23)]
    expected = _hf_logits(hf, ids)

    page_size = 4
    # Non-contiguous, shuffled pages so that the page table matters.
    pages = list(range(1, 16))
    rng.shuffle(pages)
    runner = ModelRunner(model, model.new_kv_cache(16, page_size))

    # 1. one prefill of the whole prompt from position 0
    full = _run(runner, [], [_chunk(ids, pages, 0, len(ids))])
    torch.testing.assert_close(full, expected, atol=2e-4, rtol=1e-4)

    # 2. chunked prefill (10 + 6 tokens) and then single-token decodes, the
    # decode batched next to a second sequence's prefill
    other = [rng.randrange(TINY["vocab_size"]) for _ in range(9)]
    other_pages = [0, 16 - 1]  # disjoint from `pages[:6]` below
    pages = pages[:6]
    assert not set(other_pages) & set(pages)
    a = _run(runner, [], [_chunk(ids, pages, 0, 10)])
    b = _run(runner, [], [_chunk(ids, pages, 10, 6)])
    torch.testing.assert_close(torch.cat([a, b]), expected[:16], atol=2e-4, rtol=1e-4)
    for pos in range(16, len(ids)):
        if pos == 16:
            logits = _run(runner, [_chunk(ids, pages, pos, 1)], [_chunk(other, other_pages, 0, 8)])
            torch.testing.assert_close(logits[1:], _hf_logits(hf, other[:8]), atol=2e-4, rtol=1e-4)
        else:
            logits = _run(runner, [_chunk(ids, pages, pos, 1)], [])
        torch.testing.assert_close(logits[0], expected[pos], atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ["gemma2-softcaps-alternating-window", "gemma3-local-global-rope"])
def test_batch_invariant_path_matches_transformers(arch: str, tmp_path: Path) -> None:
    """The deterministic mode's tiled attention applies the soft-cap and each
    layer's window too: a prefill in chunks, then decodes beside another
    sequence's prefill."""
    hf = _save_tiny(ARCHS[arch](), tmp_path)
    model = load_model(tmp_path, "cpu", "float32")
    runner = ModelRunner(model, model.new_kv_cache(16, 4), deterministic=True)
    rng = random.Random(3)
    ids = [rng.randrange(TINY["vocab_size"]) for _ in range(14)]
    other = [rng.randrange(TINY["vocab_size"]) for _ in range(7)]
    pages, other_pages = [5, 2, 9, 7], [11, 3]
    expected = _hf_logits(hf, ids)
    a = _run(runner, [], [_chunk(ids, pages, 0, 9)])
    b = _run(runner, [], [_chunk(ids, pages, 9, 3)])
    torch.testing.assert_close(torch.cat([a, b]), expected[:12], atol=2e-4, rtol=1e-4)
    logits = _run(runner, [_chunk(ids, pages, 12, 1)], [_chunk(other, other_pages, 0, 7)])
    torch.testing.assert_close(logits[0], expected[12], atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(logits[1:], _hf_logits(hf, other), atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(_run(runner, [_chunk(ids, pages, 13, 1)], [])[0], expected[13], atol=2e-4, rtol=1e-4)


def test_batched_decodes_of_different_lengths(tmp_path: Path) -> None:
    hf = _save_tiny(ARCHS["llama"](), tmp_path)
    model = load_model(tmp_path, "cpu", "float32")
    runner = ModelRunner(model, model.new_kv_cache(32, 4))
    rng = random.Random(2)
    seqs = [[rng.randrange(TINY["vocab_size"]) for _ in range(n)] for n in (3, 9, 14)]
    tables = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    _run(runner, [], [_chunk(s, t, 0, len(s) - 1) for s, t in zip(seqs, tables)])
    logits = _run(runner, [_chunk(s, t, len(s) - 1, 1) for s, t in zip(seqs, tables)], [])
    for row, s in enumerate(seqs):
        torch.testing.assert_close(logits[row], _hf_logits(hf, s)[-1], atol=2e-4, rtol=1e-4)


def test_sharded_checkpoint_loads(tmp_path: Path) -> None:
    config = ARCHS["qwen2-bias"]()
    _save_tiny(config, tmp_path / "single")
    hf = transformers.Qwen2ForCausalLM.from_pretrained(tmp_path / "single")
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    a = load_model(tmp_path / "single", "cpu", "float32")
    b = load_model(tmp_path / "sharded", "cpu", "float32")
    for la, lb in zip(a.layers, b.layers):
        assert torch.equal(la.qkv.weight, lb.qkv.weight)
        assert torch.equal(la.qkv.bias, lb.qkv.bias)


def test_pickle_only_checkpoint_is_refused(tmp_path: Path) -> None:
    hf = _save_tiny(ARCHS["llama"](), tmp_path)
    torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(PickleCheckpointError, match="pickle"):
        load_model(tmp_path, "cpu", "float32")


def test_corrupt_safetensors_is_a_clear_error(tmp_path: Path) -> None:
    _save_tiny(ARCHS["llama"](), tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match="model.safetensors"):
        load_model(tmp_path, "cpu", "float32")


def test_unknown_architecture_is_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    save_file({"x": torch.zeros(1)}, tmp_path / "model.safetensors")
    with pytest.raises(UnsupportedModelError, match="mamba"):
        load_model(tmp_path, "cpu", "float32")


def test_missing_weight_is_named(tmp_path: Path) -> None:
    hf = _save_tiny(ARCHS["llama"](), tmp_path)
    state = {k: v for k, v in hf.state_dict().items() if "layers.1.mlp.up_proj" not in k}
    save_file({k: v.contiguous() for k, v in state.items()}, tmp_path / "model.safetensors")
    with pytest.raises(ModelLoadError, match="layers.1.mlp.up_proj"):
        load_model(tmp_path, "cpu", "float32")


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not found"):
        load_model(tmp_path / "nope", "cpu", "float32")


def _save_tiny_gemma3_multimodal(folder: Path) -> torch.nn.Module:
    """A Gemma 3 4B-style checkpoint: the text model beside a vision tower,
    as transformers saves Gemma3ForConditionalGeneration."""
    text = ARCHS["gemma3-local-global-rope"]().to_dict()
    vision = transformers.SiglipVisionConfig(
        hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14,
    )
    config = transformers.Gemma3Config(
        text_config=text, vision_config=vision.to_dict(), mm_tokens_per_image=4,
        image_token_index=96, boi_token_index=95, eoi_token_index=94,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(folder)
    return model


@pytest.mark.parametrize("naming", ["language_model.model", "model.language_model"])
def test_a_multimodal_gemma3_folder_runs_its_text_model(naming: str, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from engine import inspect

    hf = _save_tiny_gemma3_multimodal(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    assert any(name.startswith("vision_tower.") for name in weights)
    if naming == "model.language_model":  # transformers >= 4.52 exports
        weights = {
            name.replace("language_model.model.", "model.language_model.").replace("vision_tower.", "model.vision_tower.")
            .replace("multi_modal_projector.", "model.multi_modal_projector."): t for name, t in weights.items()
        }
        save_file(weights, tmp_path / "model.safetensors")

    # Checked before a load as the model manager checks it: the text model only.
    config = inspect.ModelConfig.from_folder(tmp_path)
    headers = inspect.read_folder_headers(tmp_path)
    inspect.check_folder_weights(tmp_path, config, headers)
    assert config.model_type == "gemma3_text" and not any("vision" in name for name in headers)

    model = load_model(tmp_path, "cpu", "float32")
    ids = [random.Random(2).randrange(TINY["vocab_size"]) for _ in range(11)]
    runner = ModelRunner(model, model.new_kv_cache(8, 4))
    logits = _run(runner, [], [_chunk(ids, [0, 1, 2], 0, len(ids))])
    torch.testing.assert_close(logits, _hf_logits(hf, ids), atol=2e-4, rtol=1e-4)


def test_a_gemma3_4b_config_json_gets_the_text_config_defaults() -> None:
    from engine.model.config import ModelConfig

    # google/gemma-3-4b-it's config.json: the text model gives only what
    # differs from Gemma3TextConfig's defaults.
    raw = {
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
        "boi_token_index": 255999, "eoi_token_index": 256000, "image_token_index": 262144,
        "mm_tokens_per_image": 256, "initializer_range": 0.02,
        "text_config": {
            "hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
            "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024,
        },
        "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model", "num_hidden_layers": 27},
    }
    config = ModelConfig.from_dict(raw)
    assert (config.model_type, config.vocab_size, config.hidden_size, config.num_hidden_layers) == (
        "gemma3_text", 262208, 2560, 34)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (8, 4, 256)
    assert config.sliding_window == 1024 and config.local_rope_theta == 10_000.0 and config.rope_theta == 1_000_000.0
    assert config.sliding_layers == tuple((i + 1) % 6 != 0 for i in range(34))
    assert config.tie_word_embeddings
