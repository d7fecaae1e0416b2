"""The engine on the real default model: batching, preemption, prefix cache,
streaming and aborts behave as a user of the API expects.

The engines here run the model as a user does, on the quantized native
path, which computes every row alone in one order: a request's greedy
tokens alone and in a batch (or after a preemption) are equal by
construction, not only in practice (tests/engine/test_deterministic.py).
The float paths are checked against transformers elsewhere
(tests/engine/test_model_parity.py, test_cli.py)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from engine.llm import Engine
from engine.errors import EngineClosedError, PromptError, RequestTooLargeError
from engine.params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=24)

QUESTIONS = [
    "Hi!",
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three primary colors, separated by commas, and explain why they are called primary.",
    "Translate 'good morning' into Spanish.",
    "Give me a short tip for learning to play the guitar as an adult beginner with little free time.",
    "Why is the sky blue?",
    "Name a fruit that is yellow.",
]


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def engine(default_model_dir: Path):
    with Engine(default_model_dir, device="cpu") as eng:
        yield eng


def wait_idle(eng: Engine) -> None:
    """Returns once the engine thread has handled everything queued before."""
    eng.run_on_engine_thread(lambda: None)


def assert_pool_consistent(eng: Engine) -> None:
    pool = eng.pool
    assert pool.num_free + pool.num_cached + pool.num_used == pool.num_pages


@pytest.fixture(scope="module")
def alone(engine: Engine) -> list[list[int]]:
    """Each question's greedy reply, run by itself."""
    return [engine.generate_outputs([chat(q)], GREEDY)[0].token_ids for q in QUESTIONS]


def test_batch_equals_each_alone(engine: Engine, alone: list[list[int]]) -> None:
    batch = engine.generate_outputs([chat(q) for q in QUESTIONS], GREEDY)
    assert [o.token_ids for o in batch] == alone
    assert all(len(ids) > 0 for ids in alone)


def test_batch_under_preemption_equals_each_alone(
    default_model_dir: Path, engine: Engine, alone: list[list[int]]
) -> None:
    # 8 prompts of 30-60 tokens plus 24 new ones need ~5 pages of 16 each:
    # 14 pages cannot hold them all at once.
    with Engine(default_model_dir, device="cpu", kv_pages=14) as small:
        batch = small.generate_outputs([chat(q) for q in QUESTIONS], GREEDY)
        stats = small.stats()
        assert stats.preemptions > 0
        assert [o.token_ids for o in batch] == alone
        wait_idle(small)
        assert small.stats().pages_used == 0
        assert_pool_consistent(small)


def test_second_turn_computes_only_the_new_tokens(default_model_dir: Path) -> None:
    question = "Tell me about cats."
    params = SamplingParams(temperature=0.0, max_tokens=40)
    with Engine(default_model_dir, device="cpu") as eng:
        first = eng.generate_outputs([chat(question)], params)[0]
        messages = chat(question) + [
            {"role": "assistant", "content": first.text},
            {"role": "user", "content": "And dogs?"},
        ]
        history = first.prompt_token_ids + first.token_ids
        turn2 = eng.tokenizer.encode_next_turn(history, messages)
        # The template only appends, so the kept ids are the prompt's start.
        assert turn2[: len(history)] == history
        before = eng.stats()
        second = eng.generate_outputs([turn2], params)[0]
        after = eng.stats()

    ps = before.page_size
    # Turn 1 computed its prompt and all but its last sampled token; every
    # full page of those is cached.
    computed_turn1 = len(first.prompt_token_ids) + len(first.token_ids) - 1
    expected_reuse = computed_turn1 // ps * ps
    reused = after.prompt_tokens_reused - before.prompt_tokens_reused
    computed = after.prompt_tokens_computed - before.prompt_tokens_computed
    assert reused == expected_reuse
    assert computed == len(turn2) - expected_reuse
    new_tokens = len(turn2) - len(first.prompt_token_ids) - len(first.token_ids)
    assert computed < new_tokens + ps + 1
    assert second.metrics.cached_prompt_tokens == expected_reuse

    with Engine(default_model_dir, device="cpu", enable_prefix_cache=False) as cold:
        reference = cold.generate_outputs([turn2], params)[0]
        assert cold.stats().prompt_tokens_reused == 0
    assert second.token_ids == reference.token_ids


def test_full_prefix_hit_still_computes_last_token(engine: Engine) -> None:
    prompt = chat("Repeat after me: the quick brown fox jumps over the lazy dog.")
    a = engine.generate_outputs([prompt], GREEDY)[0]
    b = engine.generate_outputs([prompt], GREEDY)[0]
    assert a.token_ids == b.token_ids
    n = len(b.prompt_token_ids)
    assert b.metrics.cached_prompt_tokens == (n - 1) // 16 * 16


def test_stream_pairs_concatenate_to_outputs(engine: Engine) -> None:
    prompts = [chat(q) for q in QUESTIONS[:4]]
    expected = [o.text for o in engine.generate_outputs(prompts, GREEDY)]
    pieces = ["" for _ in prompts]
    order = []
    for idx, delta in engine.generate(prompts, stream=True, params=GREEDY):
        pieces[idx] += delta
        order.append(idx)
    assert pieces == expected
    # Continuous batching interleaves the sequences' deltas.
    assert order != sorted(order)
    single = "".join(engine.generate(prompts[0], stream=True, params=GREEDY))
    assert single == expected[0]
    assert engine.generate(prompts[0], params=GREEDY) == expected[0]
    assert engine.generate(prompts, params=GREEDY) == expected


def test_stream_async(engine: Engine) -> None:
    prompts = [chat(q) for q in QUESTIONS[:3]]
    expected = engine.generate(prompts, params=GREEDY)

    async def collect() -> list[str]:
        pieces = ["", "", ""]
        async for idx, delta in engine.stream_async(prompts, params=GREEDY):
            pieces[idx] += delta
        return pieces

    assert asyncio.run(collect()) == expected


def test_closing_a_stream_early_aborts_and_frees_pages(engine: Engine) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
    gen = engine.generate([chat(q) for q in QUESTIONS[:3]], stream=True, params=params)
    for count, _ in enumerate(gen):
        if count == 5:
            break
    gen.close()
    wait_idle(engine)
    stats = engine.stats()
    assert stats.pages_used == 0
    assert stats.running == stats.waiting == 0
    assert_pool_consistent(engine)


def test_random_aborts_leak_no_pages(default_model_dir: Path) -> None:
    rng = random.Random(7)
    with Engine(default_model_dir, device="cpu", kv_pages=48) as eng:
        outputs = {}
        events = []

        def sink(event) -> None:
            events.append(event.request_id)
            if event.output is not None:
                outputs[event.request_id] = event.output

        handles = []
        for i in range(100):
            params = SamplingParams(temperature=0.8, seed=i, max_tokens=rng.randint(4, 40))
            handles.append(eng.submit(chat(QUESTIONS[i % len(QUESTIONS)]), params, sink))
        # Abort at random moments while the batch runs: some before their
        # first step, some mid-prefill or mid-decode, some after finishing.
        for handle in rng.sample(handles, len(handles)):
            eng.abort(handle)
            if rng.random() < 0.3:
                eng.run_on_engine_thread(lambda: None)
        wait_idle(eng)
        assert len(outputs) == 100
        reasons = {o.finish_reason for o in outputs.values()}
        assert "abort" in reasons
        stats = eng.stats()
        assert stats.pages_used == 0 and stats.running == 0 and stats.waiting == 0
        assert_pool_consistent(eng)
        # The engine still serves normally afterwards.
        assert eng.generate(chat("Hi!"), params=GREEDY)


def test_seed_reproducible_across_batches(engine: Engine) -> None:
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=1234, max_tokens=16)
    alone = engine.generate(chat("Tell me a story."), params=params)
    mixed = engine.generate(
        [chat("Tell me a story."), chat("Why is the sky blue?")],
        params=[params, SamplingParams(temperature=0.7, seed=5, max_tokens=16)],
    )
    assert mixed[0] == alone


def test_stop_string_ends_generation(engine: Engine) -> None:
    free = engine.generate(chat("Count from 1 to 10, separated by commas."), params=GREEDY)
    assert "," in free
    cut = free.split(",", 1)[0]
    stopped = engine.generate_outputs(
        [chat("Count from 1 to 10, separated by commas.")],
        SamplingParams(temperature=0.0, max_tokens=24, stop=(",",)),
    )[0]
    assert stopped.text == cut
    assert stopped.finish_reason == "stop"


def test_prompt_errors_are_clear(engine: Engine) -> None:
    with pytest.raises(PromptError, match="empty"):
        engine.generate("")
    with pytest.raises(RequestTooLargeError, match="context"):
        engine.generate([1] * engine.max_context, params=GREEDY)
    with pytest.raises(PromptError, match="vocabulary"):
        engine.generate([10**9], params=GREEDY)
    # Still serving.
    assert engine.generate(chat("Hi!"), params=GREEDY)


def test_request_larger_than_pool_fails_at_once(default_model_dir: Path) -> None:
    with Engine(default_model_dir, device="cpu", kv_pages=4) as eng:
        with pytest.raises(RequestTooLargeError, match="pages"):
            eng.generate(chat(QUESTIONS[3]), params=SamplingParams(temperature=0, max_tokens=64))


def test_closed_engine_refuses_work(default_model_dir: Path) -> None:
    eng = Engine(default_model_dir, device="cpu", kv_pages=8)
    eng.close()
    with pytest.raises(EngineClosedError):
        eng.generate(chat("Hi!"), params=GREEDY)
    with pytest.raises(EngineClosedError):
        eng.reset_prefix_cache()


# -- the sampling of a request given no SamplingParams ----------------------------------


def test_a_request_without_params_samples_with_the_ecosystems_defaults(engine: Engine) -> None:
    # The default model's generation_config.json recommends nothing: llama.cpp's defaults apply.
    assert engine.recommended_sampling == {}
    assert engine.default_sampling == SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)
    spelled_out = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=5, max_tokens=16)
    assert engine.generate(chat("Hi!"), seed=5, max_tokens=16) == engine.generate(chat("Hi!"), params=spelled_out)


def test_a_request_without_params_samples_as_the_model_recommends(default_model_dir: Path, tmp_path: Path) -> None:
    import json
    import shutil

    # The default model with a generation_config.json that recommends greedy
    # decoding; its weights linked, not copied (97 MB).
    folder = tmp_path / "recommending"
    folder.mkdir()
    for path in default_model_dir.iterdir():
        if path.name == "model.safetensors":
            (folder / path.name).symlink_to(path)
        elif path.is_file():
            shutil.copyfile(path, folder / path.name)
    config = json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
    config.update(temperature=0.0, top_k=20)
    (folder / "generation_config.json").write_text(json.dumps(config), encoding="utf-8")
    haiku = chat("Write a haiku about the sea.")
    with Engine(folder, device="cpu") as eng:
        assert eng.default_sampling == SamplingParams(temperature=0.0, top_k=20)
        expected = eng.generate(haiku, params=SamplingParams(temperature=0.0, max_tokens=12))
        # Tandem's defaults sample another reply with this seed; the model's advice is greedy.
        assert eng.generate(haiku, params=SamplingParams(seed=1, max_tokens=12)) != expected
        # Keyword options change single fields of the recommendation (a seed does nothing to a greedy reply).
        assert eng.generate(haiku, max_tokens=12, seed=1) == expected
        assert [o.text for o in eng.generate_outputs([haiku] * 2, max_tokens=12, seed=1)] == [expected] * 2
        # SamplingParams given win over the model's advice.
        hot = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=1, max_tokens=12)
        assert eng.generate(haiku, params=hot) != expected
