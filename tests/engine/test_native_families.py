"""The native CPU path (DecoderModel._forward_native) on every family's block:
q/k head norms (Qwen3, Gemma 3), GeGLU, the branch-output norms and the
embedding and residual scales (Gemma, Granite), the attention soft-cap and
sliding windows beside global layers with their own RoPE base (Gemma 2 and
3), partial rotary (Phi-4-mini). Tiny random models made by transformers (test_model_parity.ARCHS),
quantized to int8 at load: the native path computes what the torch path
computes on the same weights (which test_model_parity checks against
transformers), and keeps batch invariance."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from engine.core.scheduler import ScheduledChunk, ScheduleResult
from engine.formats.loader import load_model, quantized_copy
from engine.kernels import native
from engine.model.decoder import DecoderModel
from engine.runner.cpu import ModelRunner
from tests.engine.test_model_parity import ARCHS, TINY, _save_tiny

pytestmark = pytest.mark.skipif(not native.available(), reason="no C compiler to build the native kernels")

FAMILIES = [
    "qwen3", "gemma2-softcaps-alternating-window", "gemma3-local-global-rope", "granite-multipliers",
    "phi3-longrope-long-partial-rotary",
]
PAGE_SIZE = 4  # ARCHS' sliding windows are 5 keys: a window starts mid-page


@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory):
    """family -> its tiny model quantized to int8 (q8_0 blocks), on the CPU."""
    models: dict[str, DecoderModel] = {}

    def get(arch: str) -> DecoderModel:
        if arch not in models:
            folder = tmp_path_factory.mktemp(arch)
            _save_tiny(ARCHS[arch](), folder / "float")
            copy = quantized_copy(folder / "float", "int8", cache_dir=folder)
            models[arch] = load_model(copy, "cpu", "float32")
        return models[arch]

    return get


def _chunk(ids: list[int], pages: list[int], start: int, num: int) -> ScheduledChunk:
    sequence = SimpleNamespace(token_ids=ids, pages=pages, sampler=None)
    return ScheduledChunk(sequence, start, num)  # type: ignore[arg-type]


def _logits(runner: ModelRunner, decodes: list[ScheduledChunk], prefills: list[ScheduledChunk]) -> torch.Tensor:
    hidden, _, _ = runner.forward(ScheduleResult(decodes=decodes, prefills=prefills))
    return runner.model.logits(hidden)


def _conversation(model: DecoderModel, native_path: bool, kv_dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    """Logits of every step of two sequences on shuffled pages: prefills side
    by side, a decode beside a prefill chunk, then decodes together well past
    the sliding window."""
    model.native_forward = native_path
    try:
        runner = ModelRunner(model, model.new_kv_cache(16, PAGE_SIZE, kv_dtype))
        rng = random.Random(5)
        a = [rng.randrange(TINY["vocab_size"]) for _ in range(21)]
        b = [rng.randrange(TINY["vocab_size"]) for _ in range(17)]
        a_pages, b_pages = [5, 2, 9, 7, 12, 1], [11, 3, 0, 14, 8]
        steps = [_logits(runner, [], [_chunk(a, a_pages, 0, 11), _chunk(b, b_pages, 0, 6)])]
        steps.append(_logits(runner, [_chunk(a, a_pages, 11, 1)], [_chunk(b, b_pages, 6, 4)]))
        for offset in range(7):
            steps.append(_logits(runner, [_chunk(a, a_pages, 12 + offset, 1), _chunk(b, b_pages, 10 + offset, 1)], []))
        return steps
    finally:
        model.native_forward = True


@pytest.mark.parametrize("arch", FAMILIES)
def test_native_path_computes_what_the_torch_path_computes(quantized, arch: str) -> None:
    model = quantized(arch)
    assert model.native_forward
    fast = torch.cat(_conversation(model, native_path=True))
    generic = torch.cat(_conversation(model, native_path=False))
    # The same int8 weights and int8-rounded activations, from norms and
    # activations computed in different code: equal up to a rounding flip
    # here and there (the tolerance of test_native_forward.py).
    cosine = F.cosine_similarity(fast, generic, dim=-1)
    assert cosine.min() > 0.999, cosine
    assert (fast - generic).abs().max() <= 0.05 * generic.abs().max()


@pytest.mark.parametrize("arch", FAMILIES)
def test_an_fp16_cache_moves_the_logits_by_its_rounding_only(quantized, arch: str) -> None:
    """The engine's native path keeps K and V in fp16 (as llama.cpp does):
    each key and value moves by at most half an fp16 ulp (2^-11 relative),
    and so the logits, through the same kernels, by little."""
    model = quantized(arch)
    wide = torch.cat(_conversation(model, native_path=True, kv_dtype=torch.float32))
    half = torch.cat(_conversation(model, native_path=True, kv_dtype=torch.float16))
    assert not torch.equal(half, wide)  # the cache's dtype does reach the arithmetic
    # Measured: cosine 0.9996-0.9999, the largest move 1.2-1.9% of the
    # largest logit, 9.6% for the soft-capped Gemma 2 (its random logits
    # span 0.3, so one int8 rounding flip downstream is a large share). A
    # key or value read from the wrong place moves every row by O(1).
    cosine = F.cosine_similarity(half, wide, dim=-1)
    assert cosine.min() > 0.999, cosine
    assert (half - wide).abs().max() <= 0.15 * wide.abs().max()


def test_a_sequence_has_the_same_bits_alone_beside_others_chunked_and_cached(quantized) -> None:
    """Gemma 2's block: soft-capped attention, sliding layers between global
    ones. Positions 0..18 with windows of 5 keys over pages of 4."""
    model = quantized("gemma2-softcaps-alternating-window")
    rng = random.Random(9)
    ids = [rng.randrange(TINY["vocab_size"]) for _ in range(19)]
    other = [rng.randrange(TINY["vocab_size"]) for _ in range(21)]

    def runner() -> ModelRunner:
        return ModelRunner(model, model.new_kv_cache(24, PAGE_SIZE))

    alone = _logits(runner(), [], [_chunk(ids, [3, 8, 1, 6, 10], 0, len(ids))])

    # In chunks of 7, 5 and 7 tokens, beside another sequence's prefill and decodes.
    pages, other_pages = [4, 0, 9, 2, 7], [12, 5, 11, 13, 17, 18]
    r = runner()
    chunks = [_logits(r, [], [_chunk(ids, pages, 0, 7), _chunk(other, other_pages, 0, 12)])[:7]]
    chunks.append(_logits(r, [_chunk(other, other_pages, 12, 1)], [_chunk(ids, pages, 7, 5)])[1:])
    chunks.append(_logits(r, [_chunk(other, other_pages, 13, 1)], [_chunk(ids, pages, 12, 7)])[1:])
    assert torch.equal(torch.cat(chunks), alone)

    # Decoded one token at a time past the window, beside another decode.
    r = runner()
    _logits(r, [], [_chunk(ids, pages, 0, 9), _chunk(other, other_pages, 0, 9)])
    for pos in range(9, len(ids)):
        step = _logits(r, [_chunk(other, other_pages, pos, 1), _chunk(ids, pages, pos, 1)], [])
        assert torch.equal(step[1], alone[pos]), pos

    # After a prefix-cache hit: a second sequence shares the first two pages
    # (positions 0..7) and computes only the rest, on pages of its own.
    shared = pages[:2] + [14, 15, 16]
    assert torch.equal(_logits(r, [], [_chunk(ids, shared, 8, len(ids) - 8)]), alone[8:])
