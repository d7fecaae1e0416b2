"""Per-request control: batch handles with ids up front, stopping one request,
live fields on events, and a failing request that does not take its
neighbours down."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path
from typing import Any

import pytest

from engine.core.batch import AsyncBatch
from engine.llm import Engine
from engine.errors import PromptError
from engine.params import SamplingParams
from engine.core.sequence import RequestOutput, StreamEvent

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
LONG = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
QUESTIONS = ["Hi!", "What is the capital of France?", "Write a haiku about the sea.", "Why is the sky blue?"]


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path):
    # The control paths do not depend on what the text says: a tiny random
    # model keeps this fast. fp32: a request's tokens do not depend on what
    # it is batched with.
    with Engine(tiny_model_dir, device="cpu", dtype="float32", kv_pages=128) as eng:
        yield eng


def wait_idle(eng: Engine) -> None:
    eng.run_on_engine_thread(lambda: None)


def assert_idle_and_consistent(eng: Engine) -> None:
    wait_idle(eng)
    stats = eng.stats()
    assert stats.running == stats.waiting == 0
    assert stats.pages_used == 0
    assert stats.pages_free + stats.pages_cached == stats.pages_total


def collect(batch: Any) -> tuple[list[list[StreamEvent]], list[RequestOutput]]:
    """Read a sync Batch to the end: every event per request and the outputs."""
    events: list[list[StreamEvent]] = [[] for _ in batch.request_ids]
    for idx, event in batch:
        events[idx].append(event)
    return events, list(batch.outputs)


def check_live_fields(events: list[StreamEvent], prompt_len: int) -> None:
    """The live fields agree with the deltas and the final output."""
    output = events[-1].output
    assert output is not None
    assert all(e.output is None for e in events[:-1])
    generated = 0
    last_elapsed = 0.0
    for event in events:
        generated += len(event.token_ids)
        assert event.num_generated == generated
        assert event.prompt_tokens == prompt_len
        assert event.elapsed_s >= last_elapsed
        last_elapsed = event.elapsed_s
        if generated:
            assert event.ttft_s is not None and 0 < event.ttft_s <= event.elapsed_s
    assert generated == len(output.token_ids)
    assert "".join(e.text for e in events) == output.text
    assert events[-1].ttft_s == output.metrics.time_to_first_token
    assert events[-1].cached_prompt_tokens == output.metrics.cached_prompt_tokens


# --------------------------------------------------------------------------
# asyncio handles


def test_async_batch_knows_ids_at_once_and_stops_one_request(engine: Engine) -> None:
    prompts = [chat(q) for q in QUESTIONS[:3]]
    full = engine.generate_outputs(prompts, LONG)

    async def run() -> tuple[AsyncBatch, list[list[StreamEvent]]]:
        batch = engine.start_batch_async(prompts, LONG)
        # Known before anything was read, and distinct.
        assert len(set(batch.request_ids)) == 3
        assert [len(p) for p in batch.prompt_token_ids] == [len(o.prompt_token_ids) for o in full]
        events: list[list[StreamEvent]] = [[], [], []]
        async for idx, event in batch:
            assert event.request_id == batch.request_ids[idx]
            events[idx].append(event)
            if idx == 1 and event.num_generated >= 3 and not batch.finished(1):
                batch.abort(1)
        return batch, events

    batch, events = asyncio.run(run())
    assert batch.done
    stopped = batch.outputs[1]
    assert stopped is not None and stopped.finish_reason == "abort"
    # The partial reply reaches the consumer: ids, text and timings.
    assert 3 <= len(stopped.token_ids) < LONG.max_tokens
    assert stopped.token_ids == full[1].token_ids[: len(stopped.token_ids)]
    assert full[1].text.startswith(stopped.text)
    assert stopped.metrics.time_to_first_token is not None
    for idx in (0, 2):
        assert batch.outputs[idx].finish_reason == "length"
        assert batch.outputs[idx].token_ids == full[idx].token_ids
    for idx in range(3):
        check_live_fields(events[idx], len(full[idx].prompt_token_ids))
    assert_idle_and_consistent(engine)


def test_async_batch_reports_cached_prompt_tokens(engine: Engine) -> None:
    prompt = chat("Repeat after me: the quick brown fox jumps over the lazy dog, twice.")
    engine.generate(prompt, params=GREEDY)  # now cached

    async def run() -> list[StreamEvent]:
        batch = engine.start_batch_async(prompt, GREEDY)  # one prompt: a batch of one
        return [event async for _, event in batch]

    events = asyncio.run(run())
    n = len(events[-1].output.prompt_token_ids)
    assert events[0].cached_prompt_tokens == (n - 1) // 16 * 16 > 0
    check_live_fields(events, n)


def test_aclose_aborts_the_rest_and_keeps_outputs(engine: Engine) -> None:
    async def run() -> AsyncBatch:
        batch = engine.start_batch_async([chat(q) for q in QUESTIONS], LONG)
        async for idx, event in batch:
            if event.num_generated >= 2:
                break
        await batch.aclose()
        return batch

    batch = asyncio.run(run())
    assert batch.done
    reasons = [o.finish_reason for o in batch.outputs]
    assert set(reasons) <= {"abort", "length"} and "abort" in reasons
    assert_idle_and_consistent(engine)


def test_stopped_request_output_reaches_events_async_consumer(engine: Engine) -> None:
    async def run() -> list[StreamEvent]:
        events = []
        async for _, event in engine.events_async(chat("Tell me a story."), LONG):
            events.append(event)
            if len(events) == 4:  # each event before the last brings >= 1 token
                engine.abort(event.request_id)
        return events

    events = asyncio.run(run())
    output = events[-1].output
    assert output is not None and output.finish_reason == "abort"
    assert 4 <= len(output.token_ids) < LONG.max_tokens
    check_live_fields(events, len(output.prompt_token_ids))


def test_bad_prompt_fails_before_any_request_starts(engine: Engine) -> None:
    async def run() -> None:
        engine.start_batch_async([chat("Hi!"), ""], GREEDY)

    with pytest.raises(PromptError, match="empty"):
        asyncio.run(run())
    with pytest.raises(PromptError, match="vocabulary"):
        engine.start_batch([chat("Hi!"), [10**9]], GREEDY)
    assert_idle_and_consistent(engine)


def test_dropped_batch_aborts_its_requests(engine: Engine) -> None:
    batch = engine.start_batch([chat(q) for q in QUESTIONS], SamplingParams(max_tokens=1000, ignore_eos=True))
    next(iter(batch))
    del batch
    gc.collect()
    assert_idle_and_consistent(engine)


# --------------------------------------------------------------------------
# The blocking twin


def test_sync_batch_abort_one(engine: Engine) -> None:
    batch = engine.start_batch([chat(q) for q in QUESTIONS[:2]], LONG)
    batch.abort(0)  # before it produced anything
    events, outputs = collect(batch)
    assert outputs[0].finish_reason == "abort"
    assert len(outputs[0].token_ids) < LONG.max_tokens
    assert outputs[1].finish_reason == "length" and len(outputs[1].token_ids) == LONG.max_tokens
    check_live_fields(events[1], len(batch.prompt_token_ids[1]))
    with pytest.raises(IndexError):
        batch.abort(2)
    assert_idle_and_consistent(engine)


def test_sync_events_carry_live_fields(engine: Engine) -> None:
    events = [event for _, event in engine.events(chat("Name a fruit."), GREEDY)]
    check_live_fields(events, len(events[-1].output.prompt_token_ids))


def test_stats_name_device_dtype_and_context(engine: Engine) -> None:
    stats = engine.stats()
    assert stats.device == "cpu"
    assert stats.dtype == "float32"
    assert stats.max_context == engine.max_context == engine.config.max_position_embeddings


# --------------------------------------------------------------------------
# A failing step


@pytest.fixture
def failing_runner(engine: Engine, monkeypatch: pytest.MonkeyPatch):
    """Make the model fail for any step that contains a request with seed 666,
    the way a kernel bug or a bad input of one request would."""
    runner = engine.runner
    real_execute = runner.execute
    steps: list[int] = []

    def execute(step: Any, masks: Any = None) -> list[int]:
        steps.append(len(step.chunks))
        if any(c.seq.params.seed == 666 for c in step.chunks):
            raise RuntimeError("injected failure")
        return real_execute(step, masks)

    monkeypatch.setattr(runner, "execute", execute)
    return steps


def test_a_failing_request_does_not_fail_its_neighbours(engine: Engine, failing_runner: list[int]) -> None:
    good = [chat(q) for q in QUESTIONS[:3]]
    expected = engine.generate_outputs(good, GREEDY)
    bad = SamplingParams(temperature=0.0, max_tokens=12, seed=666)
    prompts = [good[0], chat("This one breaks."), good[1], good[2]]
    params = [GREEDY, bad, GREEDY, GREEDY]

    async def run() -> AsyncBatch:
        batch = engine.start_batch_async(prompts, params)
        async for _ in batch:
            pass
        return batch

    batch = asyncio.run(run())
    culprit = batch.outputs[1]
    assert culprit.finish_reason == "error"
    assert isinstance(culprit.error, RuntimeError) and "injected" in str(culprit.error)
    assert [batch.outputs[i].token_ids for i in (0, 2, 3)] == [o.token_ids for o in expected]
    assert all(batch.outputs[i].finish_reason != "error" for i in (0, 2, 3))
    assert max(failing_runner) > 1  # the culprit really was batched with others
    assert_idle_and_consistent(engine)
    # Still serving.
    assert engine.generate_outputs(good[:1], GREEDY)[0].token_ids == expected[0].token_ids


def test_a_step_that_fails_only_batched_is_retried_one_by_one(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts = [chat(q) for q in QUESTIONS]
    expected = engine.generate_outputs(prompts, GREEDY)
    runner = engine.runner
    real_execute = runner.execute
    failures: list[int] = []

    def execute(step: Any, masks: Any = None) -> list[int]:
        if len(step.chunks) > 1 and len(failures) < 3:  # e.g. out of memory for the big batch
            failures.append(len(step.chunks))
            raise RuntimeError("transient")
        return real_execute(step, masks)

    monkeypatch.setattr(runner, "execute", execute)
    outputs = engine.generate_outputs(prompts, GREEDY)
    assert len(failures) == 3
    assert [o.token_ids for o in outputs] == [o.token_ids for o in expected]
    assert_idle_and_consistent(engine)
