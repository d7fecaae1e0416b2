"""A broadcast to three panes on the default model in the default settings
(its quantized weights on the native kernels, deterministic mode off), as the
window sends one: each pane's greedy reply is the reply its prompt gets alone,
and the history the panes share is computed once.

The engine is loaded by the workspace from `Settings()`, on one CPU thread
(a test checks behaviour, not speed; see tests/app/conftest.py). The
message is long enough that its prefill is one step of well over a hundred
rows while each follower computes only its last few tokens, so the replies
are compared across steps of very different sizes.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from app.settings import Settings
from app.workspace.workspace import Workspace
from engine import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=24)

MESSAGE = (
    "I am planning a small vegetable garden behind my house. The plot gets about six "
    "hours of sun in the morning and shade in the afternoon, the soil is heavy clay "
    "that stays wet for days after rain, and I can spend an hour or two a week on it. "
    "I would like to grow tomatoes, lettuce, beans and some herbs such as basil and "
    "parsley, and I live in a place with cold winters and warm, dry summers. Which of "
    "these plants will do well there, how should I improve the soil before planting, "
    "and what should I plant first in the spring?"
)


def test_a_broadcast_on_the_default_model_replies_as_each_pane_alone_and_prefills_once(
    default_model_dir: Path,  # makes "default" resolve to the test session's import
) -> None:
    workspace = Workspace(Settings(threads=1))
    panes = [workspace.add_pane() for _ in range(3)]
    for pane in panes:
        workspace.set_params(pane.id, GREEDY)

    async def main() -> None:
        assert await workspace.load_engine()
        engine = workspace.engine
        assert engine is not None
        assert not engine.deterministic and "(kernel)" in engine.stats().weights
        page_size = engine.stats().page_size
        before = engine.stats()
        await (await workspace.send(MESSAGE)).wait()
        computed = engine.stats().prompt_tokens_computed - before.prompt_tokens_computed

        replies = [pane.conversation.messages[-1] for pane in panes]
        assert all(r.role == "assistant" and r.state == "complete" for r in replies)
        prompt_len = replies[0].stats.prompt_tokens
        prompts = [pane.conversation.kept_ids[:prompt_len] for pane in panes]
        assert prompt_len > 128 and prompts[1] == prompts[0] == prompts[2]
        # One pane computed the history; the others took its full pages.
        shared = (prompt_len - 1) // page_size * page_size
        assert sorted(r.stats.cached_prompt_tokens for r in replies) == [0, shared, shared]
        assert computed == prompt_len + 2 * (prompt_len - shared)

        # The panes computed their last tokens in one step, in chunks of the
        # same shape: the same settings give the same reply in every pane.
        assert replies[1].token_ids == replies[0].token_ids == replies[2].token_ids

        # Alone, on a cold cache, the same prompt gives each pane's reply.
        for pane, reply, prompt in zip(panes, replies, prompts):
            engine.reset_prefix_cache()
            alone = engine.generate_outputs([prompt], GREEDY)[0]
            assert alone.metrics.cached_prompt_tokens == 0
            assert reply.token_ids == alone.token_ids, f"pane {pane.id}"
            assert reply.text == alone.text
        await workspace.shutdown()

    asyncio.run(main())
