"""Shared in-flight prefill: requests whose prompts share full pages that are
not cached yet compute those pages once.

A broadcast of one conversation to several panes on a cold cache is the
case: the first request computes the shared full pages, the others wait
until they are in the prefix cache and are admitted from it, so each computes
only its own tail (at least the last token, whose logits it samples from).

The scheduler is driven step by step on a page pool alone where exact step
counts matter; the rest runs on the tiny random model, whose greedy replies
with followers must equal each request's reply alone.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from engine.core.page_pool import PagePool
from engine.core.scheduler import ScheduleResult, Scheduler
from engine.core.sequence import Sequence, SequenceStatus
from engine.llm import Engine
from engine.params import SamplingParams

PS = 16  # tokens per page in every test here
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def random_ids(count: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    # Ordinary vocabulary ids of the default model's tokenizer (the tiny model shares it).
    return [rng.randrange(100, 40000) for _ in range(count)]


def shared_tokens(prompt_len: int) -> int:
    """Prompt tokens a follower can take from a leader: the full pages before
    its last token (which it always computes itself)."""
    return (prompt_len - 1) // PS * PS


# -- the scheduler alone ------------------------------------------------------


def new_seq(request_id: int, ids: list[int], max_tokens: int = 4) -> Sequence:
    # The scheduler reads ids, params and pages only: no sampler or detokenizer.
    return Sequence(
        request_id=request_id, prompt_ids=list(ids), params=SamplingParams(max_tokens=max_tokens),
        sampler=None, detokenizer=None, sink=lambda event: None,  # type: ignore[arg-type]
        stop_token_ids=frozenset(),
    )


class Driver:
    """Runs the scheduler as the engine thread does, with a made-up next token;
    counts the prompt tokens each request computed."""

    def __init__(self, *, budget: int, pages: int = 256, prefix_cache: bool = True) -> None:
        self.pool = PagePool(pages, PS, enable_prefix_cache=prefix_cache)
        self.scheduler = Scheduler(self.pool, budget, max_running=64, max_context=4096)
        self.computed: dict[int, int] = {}

    def add(self, *seqs: Sequence) -> None:
        for seq in seqs:
            self.scheduler.add(seq)

    def step(self) -> ScheduleResult:
        result = self.scheduler.schedule()
        self.scheduler.commit(result)
        for chunk in result.chunks:
            seq = chunk.seq
            prompt_end = min(chunk.start + chunk.num_tokens, len(seq.prompt_ids))
            self.computed[seq.request_id] = (
                self.computed.get(seq.request_id, 0) + max(0, prompt_end - chunk.start)
            )
            if chunk.samples:
                seq.token_ids.append(7)
                if seq.num_generated >= seq.params.max_tokens:
                    self.scheduler.finish(seq)
        return result

    def run(self, limit: int = 200) -> int:
        steps = 0
        while self.scheduler.has_work:
            self.step()
            steps += 1
            assert steps < limit, "the scheduler stopped making progress"
        return steps


def scheduled_ids(result: ScheduleResult) -> list[int]:
    return sorted(c.seq.request_id for c in result.chunks)


def test_a_cold_broadcast_computes_the_shared_pages_once() -> None:
    prompt = random_ids(100, seed=1)  # 6 full pages before the last token
    driver = Driver(budget=40)
    seqs = [new_seq(i, prompt) for i in range(4)]
    driver.add(*seqs)
    # The first request computes the prompt 40 tokens a step, stopping at its
    # last full page in the third; the others wait, though budget is left.
    for _ in range(3):
        assert scheduled_ids(driver.step()) == [0]
        assert [s.status for s in seqs[1:]] == [SequenceStatus.WAITING] * 3
    # That step registered the last shared page: the followers come in from
    # the cache, and all four compute the last partial page (never shared)
    # in one step, in chunks of one shape.
    step = driver.step()
    assert scheduled_ids(step) == [0, 1, 2, 3]
    for chunk in step.prefills:
        assert (chunk.start, chunk.num_tokens) == (96, 4)
    assert [s.metrics.cached_prompt_tokens for s in seqs] == [0, 96, 96, 96]
    driver.run()
    assert driver.computed == {0: 100, 1: 4, 2: 4, 3: 4}
    assert driver.pool.num_used == 0


@pytest.mark.parametrize("twin", [True, False], ids=["twin-waiting", "no-twin"])
def test_a_leader_computes_its_last_page_in_the_step_its_twins_do(twin: bool) -> None:
    prompt = random_ids(100, seed=20)
    # A follower that shares the full pages but not the last partial one is
    # no twin: the leader has no reason to wait for it.
    other = prompt if twin else prompt[:-1] + [prompt[-1] + 1]
    driver = Driver(budget=256)
    leader, follower = new_seq(0, prompt), new_seq(1, other)
    driver.add(leader, follower)
    first = driver.step()
    assert [(c.seq.request_id, c.start, c.num_tokens) for c in first.prefills] == [
        (0, 0, 96 if twin else 100)
    ]
    second = driver.step()
    tails = [(c.seq.request_id, c.start, c.num_tokens) for c in second.prefills]
    assert tails == ([(0, 96, 4), (1, 96, 4)] if twin else [(1, 96, 4)])
    driver.run()
    assert driver.computed == {0: 100, 1: 4}


def test_unrelated_requests_are_not_held_behind_a_follower() -> None:
    prompt = random_ids(100, seed=2)
    driver = Driver(budget=128)
    leader, follower, other = new_seq(0, prompt), new_seq(1, prompt), new_seq(2, random_ids(20, seed=3))
    driver.add(leader, follower, other)
    step = driver.step()
    # The leader takes 100 tokens of the budget, the follower waits, and the
    # request behind it is admitted with what is left.
    assert scheduled_ids(step) == [0, 2]
    assert list(driver.scheduler.waiting) == [follower]


@pytest.mark.parametrize(
    ("common", "expected_shared"),
    [(40, 32), (47, 32), (48, 48), (49, 48)],
    ids=["mid-page", "one-before-a-page-end", "at-a-page-end", "one-after"],
)
def test_diverging_prompts_share_only_the_full_pages_before(common: int, expected_shared: int) -> None:
    head = random_ids(common, seed=4)
    a = head + random_ids(60, seed=5)
    b = head + random_ids(60, seed=6)
    assert a[common] != b[common]
    driver = Driver(budget=256)
    first, second = new_seq(0, a), new_seq(1, b)
    driver.add(first, second)
    assert scheduled_ids(driver.step()) == [0]
    assert second.status is SequenceStatus.WAITING
    driver.run()
    assert second.metrics.cached_prompt_tokens == expected_shared
    assert driver.computed == {0: len(a), 1: len(b) - expected_shared}


@pytest.mark.parametrize(("length", "shares"), [(PS, False), (PS + 1, True)])
def test_a_prompt_shares_only_when_a_full_page_precedes_its_last_token(length: int, shares: bool) -> None:
    prompt = random_ids(length, seed=7)
    driver = Driver(budget=256)
    seqs = [new_seq(0, prompt), new_seq(1, prompt)]
    driver.add(*seqs)
    first = driver.step()
    assert scheduled_ids(first) == ([0] if shares else [0, 1])
    driver.run()
    assert seqs[1].metrics.cached_prompt_tokens == (PS if shares else 0)
    assert driver.computed[1] == length - (PS if shares else 0)


def test_a_cancelled_leader_leaves_its_pages_and_a_follower_computes_the_rest() -> None:
    prompt = random_ids(160, seed=8)  # 9 full pages before the last token
    driver = Driver(budget=64)
    seqs = [new_seq(i, prompt) for i in range(3)]
    driver.add(*seqs)
    driver.step()
    driver.step()  # the leader has computed and registered 8 pages
    driver.scheduler.finish(seqs[0])  # the pane was closed mid-prefill
    # The next request is admitted at once from the leader's pages and leads
    # the third, which still computes only its last page, beside its twin.
    step = driver.step()
    assert scheduled_ids(step) == [1]
    assert (step.prefills[0].start, step.prefills[0].num_tokens) == (128, 16)
    step = driver.step()
    assert [(c.seq.request_id, c.start, c.num_tokens) for c in step.prefills] == [(1, 144, 16), (2, 144, 16)]
    driver.run()
    assert [s.metrics.cached_prompt_tokens for s in seqs[1:]] == [128, 144]
    assert driver.computed == {0: 128, 1: 32, 2: 16}
    assert driver.pool.num_used == 0


def test_a_leader_preempted_mid_prefill_does_not_strand_its_follower() -> None:
    driver = Driver(budget=32, pages=7)
    # An older request decoding to 76 tokens (5 pages) takes pages from the
    # leader of two 96-token twins as it grows: the leader, newest, gives way.
    older = new_seq(9, random_ids(16, seed=30), max_tokens=60)
    driver.add(older)
    driver.step()
    prompt = random_ids(96, seed=31)
    leader, follower = new_seq(0, prompt), new_seq(1, prompt)
    driver.add(leader, follower)
    preempted_mid_prefill = False
    for _ in range(400):
        step = driver.step()
        preempted_mid_prefill |= leader in step.preempted and leader.num_generated == 0
        if not driver.scheduler.has_work:
            break
    assert preempted_mid_prefill
    assert all(s.status is SequenceStatus.FINISHED for s in (older, leader, follower))
    # The leader, back from the cache, led again: the follower still took
    # every full page before its last token.
    assert follower.metrics.cached_prompt_tokens == 80
    assert driver.computed[1] == 16
    assert driver.pool.num_used == 0


def test_without_a_prefix_cache_nobody_waits() -> None:
    prompt = random_ids(100, seed=10)
    driver = Driver(budget=512, prefix_cache=False)
    driver.add(new_seq(0, prompt), new_seq(1, prompt))
    assert scheduled_ids(driver.step()) == [0, 1]


def test_a_leader_in_another_scheduler_is_not_waited_for() -> None:
    # One engine per model, each with its own scheduler and pool: a request on
    # one model never waits for pages another model computes.
    prompt = random_ids(100, seed=11)
    one, other = Driver(budget=32), Driver(budget=32)
    one.add(new_seq(0, prompt))
    other.add(new_seq(1, prompt))
    assert scheduled_ids(one.step()) == [0]
    assert scheduled_ids(other.step()) == [1]


# -- the engine, tiny random model ------------------------------------------------


@pytest.fixture(scope="module", params=[False, True], ids=["default", "deterministic"])
def engine(request: pytest.FixtureRequest, tiny_model_dir: Path):
    # 64 tokens a step: a 300-token prompt is prefilled in five chunks.
    with Engine(tiny_model_dir, device="cpu", dtype="float32", threads=1, page_size=PS,
                max_batch_tokens=64, kv_pages=512, deterministic=request.param) as eng:
        yield eng


def solo(engine: Engine, prompts: list[list[int]], params: SamplingParams = GREEDY) -> list[list[int]]:
    """Each prompt's greedy reply alone, on a cold cache."""
    replies = []
    for prompt in prompts:
        engine.reset_prefix_cache()
        replies.append(engine.generate_outputs([prompt], params)[0].token_ids)
    engine.reset_prefix_cache()
    return replies


def test_a_broadcast_prefills_its_history_once_and_replies_as_alone(engine: Engine) -> None:
    prompt = random_ids(300, seed=12)
    alone = solo(engine, [prompt])[0]
    before = engine.stats()
    outputs = engine.generate_outputs([prompt] * 4, GREEDY)
    after = engine.stats()
    shared = shared_tokens(len(prompt))
    assert after.prompt_tokens_computed - before.prompt_tokens_computed == len(prompt) + 3 * (len(prompt) - shared)
    assert after.prompt_tokens_reused - before.prompt_tokens_reused == 3 * shared
    assert [o.metrics.cached_prompt_tokens for o in outputs] == [0, shared, shared, shared]
    assert [o.token_ids for o in outputs] == [alone] * 4
    assert after.pages_used == 0


def test_followers_stream_honest_cached_prompt_tokens(engine: Engine) -> None:
    prompt = random_ids(200, seed=13)
    engine.reset_prefix_cache()
    cached: dict[int, set[int]] = {0: set(), 1: set()}
    for idx, event in engine.events([prompt, prompt], GREEDY):
        cached[idx].add(event.cached_prompt_tokens)
    assert cached == {0: {0}, 1: {shared_tokens(200)}}


def test_prompts_diverging_mid_page_share_the_pages_before(engine: Engine) -> None:
    head = random_ids(150, seed=14)  # 9 full pages and 6 tokens of a tenth
    prompts = [head + random_ids(40, seed=15 + i) for i in range(3)]
    alone = solo(engine, prompts)
    before = engine.stats()
    outputs = engine.generate_outputs(prompts, GREEDY)
    computed = engine.stats().prompt_tokens_computed - before.prompt_tokens_computed
    assert [o.metrics.cached_prompt_tokens for o in outputs] == [0, 144, 144]
    assert computed == 190 + 2 * (190 - 144)
    assert [o.token_ids for o in outputs] == alone


def test_followers_finish_as_alone_when_the_leader_is_cancelled_mid_prefill(engine: Engine) -> None:
    prompt = random_ids(400, seed=16)
    alone = solo(engine, [prompt])[0]
    batch = engine.start_batch([prompt] * 3, GREEDY)
    leader = batch.request_ids[0]
    scheduler = engine.scheduler
    commit = scheduler.commit
    aborted_at: list[int] = []

    def commit_then_stop_the_leader(result: ScheduleResult) -> None:
        commit(result)
        for chunk in result.chunks:
            # Queued now, the abort is handled before the next step: the
            # leader stops with 2 of its 6 chunks computed.
            if chunk.seq.request_id == leader and chunk.seq.num_computed == 128 and not aborted_at:
                aborted_at.append(chunk.seq.num_computed)
                engine.abort(leader)

    scheduler.commit = commit_then_stop_the_leader  # type: ignore[method-assign]
    try:
        for _ in batch:
            pass
    finally:
        del scheduler.commit
    outputs = batch.outputs
    assert aborted_at == [128]
    assert outputs[0].finish_reason == "abort" and outputs[0].token_ids == []
    # The second request took the leader's 8 pages and led the third.
    assert [o.metrics.cached_prompt_tokens for o in outputs[1:]] == [128, shared_tokens(400)]
    assert [o.token_ids for o in outputs[1:]] == [alone, alone]
    assert engine.stats().pages_used == 0


def test_a_broadcast_under_page_pressure_replies_as_alone(tiny_model_dir: Path) -> None:
    prompt = random_ids(120, seed=17)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    # Alone: 10 pages (159 tokens). Four sharing 7 full pages need 7 + 4 * 3;
    # 16 pages hold the leader and two followers, not the fourth.
    with Engine(tiny_model_dir, device="cpu", dtype="float32", threads=1, page_size=PS,
                max_batch_tokens=64, kv_pages=16) as small:
        alone = small.generate_outputs([prompt], params)[0].token_ids
        small.reset_prefix_cache()
        outputs = small.generate_outputs([prompt] * 4, params)
        assert small.stats().preemptions > 0
        assert [o.token_ids for o in outputs] == [alone] * 4
        small.run_on_engine_thread(lambda: None)
        assert small.stats().pages_used == 0
