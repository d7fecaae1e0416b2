"""A request's output does not depend on what it is batched with, on how
its prompt is chunked, or on prefix-cache hits.

Bit-level in deterministic mode on tiny random float models of every
supported architecture (the logits of a token are identical however the step
that computes it is composed, and still match transformers), then end to end
on the default model, greedy and seeded, both in deterministic mode and in
the default settings: the quantized kernels compute each row in one fixed
order whatever the step holds (engine/kernels/native/quant_matmul.c), so the
default path needs no special mode for it.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from engine.llm import Engine
from engine.formats.loader import load_model
from engine.runner.cpu import ModelRunner
from engine.params import SamplingParams

from tests.engine.test_model_parity import ARCHS, TINY, _chunk, _hf_logits, _run, _save_tiny

MIXED = [
    "Hi!",
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three primary colors, separated by commas, and explain why they are called primary. "
    "Then name a secondary color that each pair of them makes when mixed as paint.",
    "Translate 'good morning' into Spanish.",
    "Give me a short tip for learning to play the guitar as an adult beginner with little "
    "free time, a cheap instrument and no teacher nearby.",
    "Why is the sky blue?",
    "Name a fruit that is yellow.",
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
# Greedy and seeded requests side by side in every batch, the seeded ones
# long enough (32 tokens at temperature 0.8, as a chat is sampled) for a
# last-bit difference to flip a draw; half of them use top-p (its threshold
# is a row reduction over the vocabulary).
PARAMS = [
    GREEDY if i % 3 == 0 else SamplingParams(temperature=0.8, top_p=0.95 if i % 2 else 1.0, seed=100 + i,
                                             max_tokens=32)
    for i in range(len(MIXED))
]

def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


# -- bit-level, tiny models ---------------------------------------------------


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_logits_are_batch_invariant_and_match_transformers(arch: str, tmp_path: Path) -> None:
    hf = _save_tiny(ARCHS[arch](), tmp_path)
    model = load_model(tmp_path, "cpu", "float32")
    rng = random.Random(2)
    vocab = TINY["vocab_size"]
    # Long enough for several key blocks of the attention reduction.
    ids = [rng.randrange(vocab) for _ in range(150)]
    other = [rng.randrange(vocab) for _ in range(11)]
    third = [rng.randrange(vocab) for _ in range(230)]
    page_size = 4
    pages = list(range(1, 110))
    rng.shuffle(pages)
    ids_pages, other_pages, third_pages = pages[:38], pages[38:41], pages[41:100]
    runner = ModelRunner(model, model.new_kv_cache(110, page_size), deterministic=True)

    # The whole prompt alone in one prefill: the reference.
    alone = _run(runner, [], [_chunk(ids, ids_pages, 0, len(ids))])
    torch.testing.assert_close(alone, _hf_logits(hf, ids), atol=2e-4, rtol=1e-4)

    # The same tokens again, each step composed differently: chunks of 5, 125
    # and 10 tokens next to another sequence's prefill or decode, then
    # single-token decodes beside other decodes (of a longer context, so with
    # more key padding).
    _run(runner, [], [_chunk(third, third_pages, 0, 228)])
    got = [
        _run(runner, [], [_chunk(ids, ids_pages, 0, 5), _chunk(other, other_pages, 0, 11)])[:5],
        _run(runner, [_chunk(third, third_pages, 228, 1)], [_chunk(ids, ids_pages, 5, 125)])[1:],
        _run(runner, [], [_chunk(ids, ids_pages, 130, 10)]),
    ]
    for pos in range(140, len(ids)):
        decodes = [_chunk(other, other_pages, 10, 1), _chunk(ids, ids_pages, pos, 1)]
        if pos % 2:
            decodes.append(_chunk(third, third_pages, 229, 1))
        got.append(_run(runner, decodes, [])[1:2])
    assert torch.equal(torch.cat(got), alone)


def test_plain_runner_is_unchanged_by_the_mode_switch(tmp_path: Path) -> None:
    """The deterministic path computes the same function as the fast one."""
    _save_tiny(ARCHS["llama"](), tmp_path)
    model = load_model(tmp_path, "cpu", "float32")
    ids = list(range(3, 40))
    pages = list(range(10))
    fast = _run(ModelRunner(model, model.new_kv_cache(10, 4)), [], [_chunk(ids, pages, 0, len(ids))])
    tiled = _run(
        ModelRunner(model, model.new_kv_cache(10, 4), deterministic=True),
        [],
        [_chunk(ids, pages, 0, len(ids))],
    )
    torch.testing.assert_close(tiled, fast, atol=1e-4, rtol=1e-4)


# -- end to end, default model, default dtype ---------------------------------


# The engine's modes: deterministic=True, and the default (None). Both run
# the quantized model on the native forward; float32 is what `dtype auto`
# gives on a CPU without native bf16 dot products (the other side of that
# choice: test_bfloat16_replies_are_batch_invariant_in_both_modes).
MODES = {"deterministic": True, "default": None}


@pytest.fixture(scope="module", params=sorted(MODES))
def mode(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def engine(default_model_dir: Path, mode: str):
    with Engine(default_model_dir, device="cpu", deterministic=MODES[mode], dtype="float32") as eng:
        yield eng


@pytest.fixture(scope="module")
def alone(engine: Engine) -> list[list[int]]:
    """Every prompt run by itself, prefix cache emptied before each."""
    results = []
    for text, params in zip(MIXED, PARAMS):
        engine.reset_prefix_cache()
        results.append(engine.generate_outputs([chat(text)], params)[0].token_ids)
    return results


def test_engine_reports_the_mode(engine: Engine, mode: str) -> None:
    assert engine.deterministic is (mode == "deterministic")
    assert engine.stats().weights.endswith("(kernel)")


def test_batch_of_eight_equals_each_alone(engine: Engine, alone) -> None:
    engine.reset_prefix_cache()
    batch = engine.generate_outputs([chat(t) for t in MIXED], PARAMS)
    assert [o.token_ids for o in batch] == alone
    # Another composition: a different order, so other neighbours and rows.
    engine.reset_prefix_cache()
    order = [5, 2, 7, 0, 3]
    subset = engine.generate_outputs([chat(MIXED[i]) for i in order], [PARAMS[i] for i in order])
    assert [o.token_ids for o in subset] == [alone[i] for i in order]


def test_after_a_prefix_cache_hit_equals_alone(engine: Engine, alone) -> None:
    engine.reset_prefix_cache()
    engine.generate_outputs([chat(t) for t in MIXED], PARAMS)  # fills the cache
    again = engine.generate_outputs([chat(t) for t in MIXED], PARAMS)
    assert sum(o.metrics.cached_prompt_tokens for o in again) > 0
    assert [o.token_ids for o in again] == alone


def test_continuation_over_cached_pages_equals_fresh(engine: Engine) -> None:
    """A second turn whose first turn's pages (prompt and reply, computed as
    prefill and decodes) come from the cache gives what a cold run gives."""
    first = engine.generate_outputs([chat(MIXED[5])], GREEDY)[0]
    history = first.prompt_token_ids + first.token_ids
    messages = chat(MIXED[5]) + [
        {"role": "assistant", "content": first.text},
        {"role": "user", "content": "And a second tip?"},
    ]
    follow = engine.tokenizer.encode_next_turn(history, messages)
    params = SamplingParams(temperature=0.9, seed=3, max_tokens=16)
    hit = engine.generate_outputs([follow], params)[0]
    assert hit.metrics.cached_prompt_tokens >= 16
    engine.reset_prefix_cache()
    cold = engine.generate_outputs([follow], params)[0]
    assert cold.metrics.cached_prompt_tokens == 0
    assert hit.token_ids == cold.token_ids


def test_chunked_prefill_equals_alone(default_model_dir: Path, mode: str, alone) -> None:
    # 24 tokens a step: every prompt here is prefilled in several chunks,
    # interleaved with the other requests' decodes.
    with Engine(default_model_dir, device="cpu", deterministic=MODES[mode], dtype="float32",
                max_batch_tokens=24) as eng:
        outputs = eng.generate_outputs([chat(t) for t in MIXED], PARAMS)
        assert max(len(o.prompt_token_ids) for o in outputs) > 24
    assert [o.token_ids for o in outputs] == alone


@pytest.mark.parametrize("deterministic", [True, None], ids=["deterministic", "default"])
def test_bfloat16_replies_are_batch_invariant_in_both_modes(default_model_dir: Path, deterministic) -> None:
    """`dtype auto` is bfloat16 on CPUs with native bf16 dot products: the
    seeded chat replies are the same alone and in a batch of eight there too."""
    with Engine(default_model_dir, device="cpu", deterministic=deterministic, dtype="bfloat16") as eng:
        alone = []
        for text, params in zip(MIXED, PARAMS):
            eng.reset_prefix_cache()
            alone.append(eng.generate_outputs([chat(text)], params)[0].token_ids)
        eng.reset_prefix_cache()
        batch = eng.generate_outputs([chat(t) for t in MIXED], PARAMS)
    assert [o.token_ids for o in batch] == alone
