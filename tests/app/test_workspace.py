"""The workspace over a real engine: one batched call per broadcast, replies
routed to their panes, stop/regenerate/edit/fork, and the prefix cache
reused across turns and forks. No widgets: the events are what a window sees."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from app.errors import (
    ContextFullError,
    EmptyMessageError,
    EngineNotReadyError,
    LastPaneError,
    MessageIndexError,
    NothingToRegenerateError,
    PaneBusyError,
    UnknownPaneError,
)
from app.events import (
    EngineStateChanged,
    MessageAppended,
    MessagesTruncated,
    PaneAdded,
    PaneClosed,
    PanesReordered,
    PaneUpdated,
    ReplyDelta,
    ReplyFinished,
)
from app.settings import Settings
from app.workspace.pane_defaults import PREFERENCES_DEFAULTS
from app.workspace.workspace import Workspace
from engine import Engine, SamplingParams
from engine.model.quant import cpu_kernel_available
from engine.params import MODEL_RECOMMENDED, TANDEM_DEFAULTS
from tests.conftest import write_tiny_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=24)
# A stream that does not end by itself: the random model may emit an end token at any point.
ENDLESS = SamplingParams(temperature=0.0, max_tokens=1500, ignore_eos=True)


class Recorder:
    """Every event a workspace emits, with the streamed text per (pane, message)."""

    def __init__(self, workspace: Workspace) -> None:
        self.events: list[Any] = []
        self.streamed: dict[tuple[int, int], str] = defaultdict(str)
        workspace.subscribe(self.on_event)

    def on_event(self, event: Any) -> None:
        self.events.append(event)
        if isinstance(event, ReplyDelta):
            self.streamed[event.pane_id, event.index] += event.text

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


def pages_below(tokens: int, page_size: int) -> int:
    """Prompt tokens that full pages of a `tokens`-long sequence cover, when the
    sequence's last token was never fed (it was sampled, not computed)."""
    return (tokens - 1) // page_size * page_size


def workspace_with(engine: Engine, params: list[SamplingParams]) -> tuple[Workspace, Recorder]:
    workspace = Workspace(Settings(), engine=engine)
    recorder = Recorder(workspace)
    for p in params:
        pane = workspace.add_pane()
        workspace.set_params(pane.id, p)
    return workspace, recorder


# -- broadcast -----------------------------------------------------------------


def test_broadcast_streams_each_reply_into_its_pane(default_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    batches: list[int] = []
    start_batch_async = default_engine.start_batch_async

    def counted(prompts: Any, params: Any = None, **sampling: Any) -> Any:
        batches.append(len(prompts))
        return start_batch_async(prompts, params, **sampling)

    monkeypatch.setattr(default_engine, "start_batch_async", counted)
    params = [
        GREEDY,
        SamplingParams(temperature=0.9, top_p=0.95, max_tokens=24, seed=7),
        SamplingParams(temperature=1.2, top_k=40, max_tokens=24, seed=11),
    ]
    workspace, recorder = workspace_with(default_engine, params)
    workspace.set_system_prompt(workspace.panes[2].id, "Answer like a pirate.")
    text = "Name three fruits."

    async def main() -> None:
        turn = await workspace.send(text)
        assert sorted(turn.pane_ids) == sorted(p.id for p in workspace.panes)
        assert len(turn.request_ids) == 3
        assert all(p.busy for p in workspace.panes)
        await turn.wait()

    asyncio.run(main())
    assert batches == [3]  # one batched engine call for the whole broadcast

    # The same prompts, run to completion without streaming, give the same replies.
    prompts = [
        default_engine.tokenizer.encode_chat(
            ([{"role": "system", "content": "Answer like a pirate."}] if i == 2 else [])
            + [{"role": "user", "content": text}]
        )
        for i in range(3)
    ]
    expected = default_engine.generate_outputs(prompts, params)
    for pane, output in zip(workspace.panes, expected):
        user, reply = pane.conversation.messages
        assert (user.role, user.text) == ("user", text)
        assert reply.role == "assistant" and reply.state == "complete"
        assert reply.text == output.text
        assert reply.token_ids == output.token_ids
        assert recorder.streamed[pane.id, 1] == reply.text
        assert reply.stats.finish_reason == output.finish_reason
        assert reply.stats.prompt_tokens == len(output.prompt_token_ids)
        assert reply.stats.generated_tokens == len(output.token_ids)
        assert pane.conversation.kept_ids == output.prompt_token_ids + output.token_ids
        assert not pane.busy
    # Three different parameter sets really gave three different replies.
    assert len({p.conversation.messages[1].text for p in workspace.panes}) == 3
    # Every delta went to a pane's reply message, and each reply finished once.
    assert {(e.pane_id, e.index) for e in recorder.of(ReplyDelta)} == {(p.id, 1) for p in workspace.panes}
    assert sorted((e.pane_id, e.index) for e in recorder.of(ReplyFinished)) == sorted(
        (p.id, 1) for p in workspace.panes
    )
    assert default_engine.stats().pages_used == 0


def test_send_to_selected_panes_only(tiny_engine: Engine) -> None:
    workspace, recorder = workspace_with(tiny_engine, [SamplingParams(temperature=0, max_tokens=4)] * 3)
    first, second, third = workspace.panes

    async def main() -> None:
        await (await workspace.send("hello", targets=[third.id, first.id])).wait()

    asyncio.run(main())
    assert len(first.conversation.messages) == 2 and len(third.conversation.messages) == 2
    assert second.conversation.messages == []
    assert {e.pane_id for e in recorder.of(MessageAppended)} == {first.id, third.id}


# -- stop ----------------------------------------------------------------------


def test_stop_keeps_partial_replies_and_frees_every_page(tiny_engine: Engine) -> None:
    workspace, recorder = workspace_with(tiny_engine, [ENDLESS, ENDLESS])
    deltas: dict[int, int] = defaultdict(int)

    def stop_after_three(event: Any) -> None:
        if isinstance(event, ReplyDelta):
            deltas[event.pane_id] += 1
            if sum(deltas.values()) == 6:
                workspace.stop()  # every running reply

    workspace.subscribe(stop_after_three)

    async def main() -> None:
        turn = await workspace.send("Tell me a long story.")
        await turn.wait()

    asyncio.run(main())
    for pane in workspace.panes:
        reply = pane.conversation.messages[1]
        assert reply.state == "stopped"
        assert reply.stats.finish_reason == "abort"
        assert 0 < len(reply.token_ids) < ENDLESS.max_tokens
        assert reply.stats.generated_tokens == len(reply.token_ids)
        assert recorder.streamed[pane.id, 1] == reply.text
        assert not pane.busy
        # The partial reply is part of the conversation: the next turn builds on it.
        assert pane.conversation.kept_ids[-len(reply.token_ids) :] == reply.token_ids
    assert tiny_engine.stats().pages_used == 0


def test_stop_one_pane_lets_the_others_finish(tiny_engine: Engine) -> None:
    short = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    workspace, recorder = workspace_with(tiny_engine, [ENDLESS, short])
    endless, finishing = workspace.panes

    def stop_endless(event: Any) -> None:
        if isinstance(event, ReplyDelta) and event.pane_id == endless.id:
            workspace.stop(endless.id)

    workspace.subscribe(stop_endless)

    async def main() -> None:
        await (await workspace.send("go")).wait()

    asyncio.run(main())
    assert endless.conversation.messages[1].state == "stopped"
    assert finishing.conversation.messages[1].state == "complete"
    assert len(finishing.conversation.messages[1].token_ids) == 12
    assert tiny_engine.stats().pages_used == 0


# -- refusals --------------------------------------------------------------------


def test_busy_pane_refuses_a_new_message(tiny_engine: Engine) -> None:
    workspace, recorder = workspace_with(tiny_engine, [ENDLESS, ENDLESS, GREEDY])
    first, second, idle = workspace.panes

    async def main() -> None:
        turn = await workspace.send("one", targets=[first.id, second.id])
        with pytest.raises(PaneBusyError) as refused:
            await workspace.send("two", targets=[idle.id, second.id])
        assert refused.value.pane_ids == [second.id]
        assert second.title in str(refused.value)
        # Nothing was queued for the idle pane of the refused broadcast.
        assert idle.conversation.messages == []
        with pytest.raises(PaneBusyError):
            await workspace.regenerate(first.id)
        with pytest.raises(PaneBusyError):
            await workspace.edit_and_resend(first.id, 0, "edited")
        with pytest.raises(PaneBusyError):  # skipping every target is no send either
            await workspace.send("two", targets=[first.id, second.id], skip_busy=True)
        # As the window sends: a busy pane does not hold back a broadcast; the idle one takes it.
        other = await workspace.send("three", targets=[idle.id, second.id], skip_busy=True)
        assert other.pane_ids == [idle.id]
        assert other.skipped == [second]
        await other.wait()
        assert [m.text for m in idle.conversation.messages if m.role == "user"] == ["three"]
        assert [m.text for m in second.conversation.messages if m.role == "user"] == ["one"]
        workspace.stop()
        await turn.wait()

    asyncio.run(main())
    assert [m.text for m in second.conversation.messages][:1] == ["one"]
    assert len(second.conversation.messages) == 2
    assert idle.conversation.messages[0].text == "three"
    assert tiny_engine.stats().pages_used == 0


def test_refusals_leave_every_pane_unchanged(tiny_engine: Engine) -> None:
    workspace, recorder = workspace_with(tiny_engine, [GREEDY, SamplingParams(max_tokens=2048)])
    small, huge = workspace.panes

    async def main() -> None:
        with pytest.raises(ContextFullError) as too_long:
            await workspace.send("hi")
        assert huge.title in str(too_long.value)
        with pytest.raises(EmptyMessageError):
            await workspace.send("   ")
        with pytest.raises(UnknownPaneError):
            await workspace.send("hi", targets=[999])
        with pytest.raises(NothingToRegenerateError):
            await workspace.regenerate(small.id)
        with pytest.raises(MessageIndexError):
            await workspace.edit_and_resend(small.id, 0, "x")

    asyncio.run(main())
    assert small.conversation.messages == [] and huge.conversation.messages == []
    assert not recorder.of(MessageAppended)


def test_drop_oldest_leaves_old_turns_out_and_marks_the_cut(tiny_engine: Engine) -> None:
    """A pane whose conversation outgrew the context: "stop" refuses the turn,
    "drop_oldest" sends only the newest turns and puts a notice where they start."""
    short = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    workspace, recorder = workspace_with(tiny_engine, [short])
    pane = workspace.panes[0]
    conversation = pane.conversation

    async def main() -> None:
        for text in ("first question " * 20, "second question " * 20):
            await (await workspace.send(text)).wait()
        whole = conversation.next_prompt(tiny_engine.tokenizer, user_text="third")
        newest = tiny_engine.tokenizer.encode_chat(conversation.chat_messages(user_text="third", start=4))
        # Room for the newest message and its reply, not for the older turns.
        conversation.context_limit = len(newest) + short.max_tokens
        assert len(whole) + short.max_tokens > conversation.context_limit
        with pytest.raises(ContextFullError) as full:
            await workspace.send("third")
        assert pane.title in str(full.value)
        assert len(conversation.messages) == 4  # the refused turn changed nothing

        workspace.set_context_policy(pane.id, "drop_oldest")
        recorder.events.clear()
        turn = await workspace.send("third")
        await turn.wait()
        assert len(turn.request_ids) == 1

    asyncio.run(main())
    roles = [m.role for m in conversation.messages]
    assert roles == ["user", "assistant", "user", "assistant", "notice", "user", "assistant"]
    notice = conversation.messages[4].text
    assert notice.startswith("4 earlier messages no longer fit the model's context of ")
    assert f"{conversation.context_limit:,} tokens" in notice
    assert conversation.messages[-1].state == "complete"
    assert conversation.messages[-1].stats is not None
    assert conversation.messages[-1].stats.prompt_tokens <= conversation.context_limit - short.max_tokens
    # The view redraws from the notice on, then gets the new message and reply.
    assert recorder.of(MessagesTruncated)[0].length == 4
    assert [e.index for e in recorder.of(MessageAppended)] == [4, 5, 6]
    with pytest.raises(ValueError, match="Unknown context policy"):
        workspace.set_context_policy(pane.id, "shrink")


def test_sending_without_an_engine() -> None:
    workspace = Workspace(Settings())
    workspace.add_pane()
    with pytest.raises(EngineNotReadyError) as refused:
        asyncio.run(workspace.send("hi"))
    assert "load" in str(refused.value)


# -- turns, regenerate, edit, fork -----------------------------------------------


def test_second_turn_reuses_the_first_turns_pages(default_engine: Engine) -> None:
    workspace, _ = workspace_with(default_engine, [SamplingParams(temperature=0, max_tokens=40)])
    (pane,) = workspace.panes
    conversation = pane.conversation
    page_size = default_engine.stats().page_size

    async def main() -> None:
        await (await workspace.send("Write one sentence about the sea.")).wait()
        first_kept = conversation.kept_ids
        await (await workspace.send("And one about mountains.")).wait()
        reply = conversation.messages[3]
        assert reply.state == "complete"
        second_prompt = conversation.kept_ids[: reply.stats.prompt_tokens]
        assert second_prompt[: len(first_kept)] == first_kept
        assert reply.stats.cached_prompt_tokens >= pages_below(len(first_kept), page_size)
        # The pages of the first reply's own tokens were reused, not just its prompt's.
        assert reply.stats.cached_prompt_tokens > conversation.messages[1].stats.prompt_tokens

    asyncio.run(main())


def test_regenerate_replaces_the_last_reply(default_engine: Engine) -> None:
    workspace, recorder = workspace_with(default_engine, [SamplingParams(temperature=0, max_tokens=20)])
    (pane,) = workspace.panes
    conversation = pane.conversation
    page_size = default_engine.stats().page_size

    async def main() -> None:
        await (await workspace.send("What is a cat?")).wait()
        first = conversation.messages[1]
        prompt = conversation.kept_ids[: first.stats.prompt_tokens]

        await (await workspace.regenerate(pane.id)).wait()
        assert MessagesTruncated(pane.id, 1) in recorder.events
        assert [m.role for m in conversation.messages] == ["user", "assistant"]
        again = conversation.messages[1]
        assert again is not first
        assert again.text == first.text  # greedy: the same prompt gives the same reply
        assert again.stats.cached_prompt_tokens >= pages_below(len(prompt) + 1, page_size)

        sampled = SamplingParams(temperature=1.0, max_tokens=20, seed=3)
        workspace.set_params(pane.id, sampled)
        await (await workspace.regenerate(pane.id)).wait()
        assert len(conversation.messages) == 2
        (expected,) = default_engine.generate_outputs([prompt], sampled)
        assert conversation.messages[1].text == expected.text
        assert conversation.kept_ids == prompt + expected.token_ids

    asyncio.run(main())


def test_edit_and_resend_replaces_the_message_and_what_follows(default_engine: Engine) -> None:
    workspace, recorder = workspace_with(default_engine, [SamplingParams(temperature=0, max_tokens=16)])
    (pane,) = workspace.panes
    conversation = pane.conversation
    tokenizer = default_engine.tokenizer

    async def main() -> None:
        await (await workspace.send("Say hello.")).wait()
        after_first = conversation.kept_ids
        await (await workspace.send("Say goodbye.")).wait()
        assert len(conversation.messages) == 4

        with pytest.raises(MessageIndexError):
            await workspace.edit_and_resend(pane.id, 1, "not mine")  # a reply is not the user's to edit

        await (await workspace.edit_and_resend(pane.id, 2, "Say thanks.")).wait()
        assert MessagesTruncated(pane.id, 2) in recorder.events
        assert [m.text for m in conversation.messages[:3]] == [
            "Say hello.", conversation.messages[1].text, "Say thanks."
        ]
        expected_prompt = tokenizer.encode_next_turn(
            after_first, conversation.chat_messages(upto=2, user_text="Say thanks.")
        )
        (expected,) = default_engine.generate_outputs([expected_prompt], conversation.params)
        reply = conversation.messages[3]
        assert reply.text == expected.text
        assert conversation.kept_ids == expected_prompt + expected.token_ids
        assert conversation.kept_ids[: len(after_first)] == after_first

        await (await workspace.edit_and_resend(pane.id, 0, "Say yes.")).wait()
        assert [m.text for m in conversation.messages][:1] == ["Say yes."]
        assert len(conversation.messages) == 2
        (fresh,) = default_engine.generate_outputs(
            [tokenizer.encode_chat([{"role": "user", "content": "Say yes."}])], conversation.params
        )
        assert conversation.messages[1].text == fresh.text

    asyncio.run(main())


def test_fork_reuses_the_shared_prefix(default_engine: Engine) -> None:
    workspace, recorder = workspace_with(default_engine, [SamplingParams(temperature=0, max_tokens=16)] * 2)
    source, neighbour = workspace.panes
    page_size = default_engine.stats().page_size

    async def main() -> None:
        await (await workspace.send("Name a planet.", targets=[source.id])).wait()
        shared = source.conversation.kept_ids
        await (await workspace.send("Name a star.", targets=[source.id])).wait()
        source_messages = [m.text for m in source.conversation.messages]

        fork = workspace.fork_pane(source.id, 1)
        assert [p.id for p in workspace.panes] == [source.id, fork.id, neighbour.id]
        assert recorder.of(PaneAdded)[-1].pane is fork
        assert [m.text for m in fork.conversation.messages] == source_messages[:2]
        assert fork.conversation.kept_ids == shared
        assert fork.conversation.params == source.conversation.params

        computed_before = default_engine.stats().prompt_tokens_computed
        await (await workspace.send("Name a moon.", targets=[fork.id])).wait()
        reply = fork.conversation.messages[3]
        assert fork.conversation.kept_ids[: len(shared)] == shared
        # The fork's prompt starts with the source's first turn, and those
        # pages came from the prefix cache instead of being computed again.
        assert reply.stats.cached_prompt_tokens >= pages_below(len(shared), page_size)
        computed = default_engine.stats().prompt_tokens_computed - computed_before
        assert computed == reply.stats.prompt_tokens - reply.stats.cached_prompt_tokens
        # The source is untouched.
        assert [m.text for m in source.conversation.messages] == source_messages

        # Forking at a user message and regenerating answers it exactly as the source did.
        at_question = workspace.fork_pane(source.id, 2)
        assert len(at_question.conversation.messages) == 3
        await (await workspace.regenerate(at_question.id)).wait()
        assert at_question.conversation.messages[3].text == source_messages[3]
        assert at_question.conversation.kept_ids == source.conversation.kept_ids

    asyncio.run(main())


# -- panes -------------------------------------------------------------------------


def test_pane_management(tiny_engine: Engine) -> None:
    settings = Settings(default_params=SamplingParams(temperature=0.4, max_tokens=64), default_system_prompt="Hi.")
    workspace = Workspace(settings, engine=tiny_engine)
    recorder = Recorder(workspace)
    a = workspace.add_pane()
    b = workspace.add_pane()
    c = workspace.add_pane(after=a.id)
    assert [p.id for p in workspace.panes] == [a.id, c.id, b.id]
    assert len({a.id, b.id, c.id}) == 3
    assert c.conversation.params == settings.default_params
    assert c.conversation.system_prompt == "Hi."
    assert c.conversation.context_limit == tiny_engine.max_context

    workspace.move_pane(b.id, 0)
    assert recorder.of(PanesReordered)[-1].order == [b.id, a.id, c.id]
    with pytest.raises(IndexError):
        workspace.move_pane(b.id, 3)

    workspace.close_pane(a.id)
    assert PaneClosed(a.id) in recorder.events
    with pytest.raises(UnknownPaneError):
        workspace.pane(a.id)
    workspace.close_pane(b.id)
    with pytest.raises(LastPaneError):
        workspace.close_pane(c.id)
    # Ids are never reused.
    assert workspace.add_pane().id not in {a.id, b.id, c.id}


def test_a_failing_listener_does_not_stop_the_others(tiny_engine: Engine) -> None:
    workspace, recorder = workspace_with(tiny_engine, [SamplingParams(temperature=0, max_tokens=5)])
    (pane,) = workspace.panes

    def broken(event: Any) -> None:
        raise RuntimeError("a view's bug")

    workspace.subscribe(broken)
    late = Recorder(workspace)
    dropped: list[Any] = []
    unsubscribe = workspace.subscribe(dropped.append)
    unsubscribe()

    async def main() -> None:
        await (await workspace.send("hi")).wait()

    asyncio.run(main())
    assert pane.conversation.messages[1].state == "complete"
    assert late.of(ReplyFinished) == [ReplyFinished(pane.id, 1)]
    assert dropped == []

    workspace.clear_pane(pane.id)
    assert pane.conversation.messages == [] and pane.conversation.kept_ids == []
    assert late.events[-1] == MessagesTruncated(pane.id, 0)


def test_closing_a_streaming_pane_stops_its_reply(tiny_engine: Engine) -> None:
    workspace, recorder = workspace_with(tiny_engine, [ENDLESS, SamplingParams(temperature=0, max_tokens=6)])
    closing, staying = workspace.panes

    async def main() -> None:
        turn = await workspace.send("go")
        workspace.close_pane(closing.id)
        closed_at = len(recorder.events)
        await turn.wait()
        assert all(getattr(e, "pane_id", None) != closing.id for e in recorder.events[closed_at:])

    asyncio.run(main())
    assert staying.conversation.messages[1].state == "complete"
    assert closing.conversation.messages[1].state == "stopped"
    assert tiny_engine.stats().pages_used == 0


# -- engine lifetime ----------------------------------------------------------------


def tiny_settings(tiny_model_dir: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = dict(model=str(tiny_model_dir), device="cpu", dtype="float32", kv_cache_mb=8, threads=1)
    values.update(overrides)
    return Settings(**values)


def test_load_engine_reports_progress_without_blocking_the_loop(tiny_model_dir: Path) -> None:
    workspace = Workspace(tiny_settings(tiny_model_dir))
    recorder = Recorder(workspace)
    pane = workspace.add_pane()
    assert workspace.engine_state == "unloaded"
    ticks = 0

    async def ticker(stop: asyncio.Event) -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0.001)

    async def main() -> None:
        stop = asyncio.Event()
        ticking = asyncio.create_task(ticker(stop))
        await asyncio.sleep(0)
        before = ticks
        assert await workspace.load_engine()
        loaded_at = ticks
        stop.set()
        await ticking
        # The loop ran other work while the model loaded.
        assert loaded_at > before
        turn = await workspace.send("hi")
        await turn.wait()
        await workspace.shutdown()

    asyncio.run(main())
    states = [e.state for e in recorder.of(EngineStateChanged)]
    assert states[0] == "loading" and states[-2:] == ["ready", "closed"]
    stages = [e.progress.stage for e in recorder.of(EngineStateChanged) if e.progress is not None]
    assert "weights" in stages
    assert pane.conversation.context_limit == 2048
    assert pane.conversation.messages[1].state == "complete"


def test_load_failure_is_reported(tmp_path: Path) -> None:
    workspace = Workspace(Settings(model=str(tmp_path / "missing-model"), device="cpu"))
    workspace.add_pane()
    recorder = Recorder(workspace)

    async def main() -> None:
        assert not await workspace.load_engine()
        with pytest.raises(EngineNotReadyError) as refused:
            await workspace.send("hi")
        assert "missing-model" in str(refused.value)

    asyncio.run(main())
    assert workspace.engine_state == "error"
    assert "missing-model" in workspace.load_error
    assert recorder.of(EngineStateChanged)[-1].error == workspace.load_error


def test_shutdown_while_streaming_keeps_partial_replies(tiny_model_dir: Path) -> None:
    workspace = Workspace(tiny_settings(tiny_model_dir, default_params=ENDLESS))
    for _ in range(3):
        workspace.add_pane()

    async def main() -> None:
        assert await workspace.load_engine()
        first_delta = asyncio.Event()
        workspace.subscribe(lambda e: isinstance(e, ReplyDelta) and first_delta.set())
        turn = await workspace.send("go")
        await first_delta.wait()
        await workspace.shutdown()
        assert turn.done
        with pytest.raises(EngineNotReadyError):
            await workspace.send("again")

    asyncio.run(main())
    assert workspace.engine_state == "closed"
    for pane in workspace.panes:
        assert not pane.busy
        assert pane.conversation.messages[1].state == "stopped"


def test_shutdown_while_loading_cancels_the_load(tiny_model_dir: Path) -> None:
    workspace = Workspace(tiny_settings(tiny_model_dir))
    workspace.add_pane()

    async def main() -> bool:
        loading = asyncio.create_task(workspace.load_engine())
        await asyncio.sleep(0)  # the load has started on its thread
        assert workspace.engine_state == "loading"
        await workspace.shutdown()
        return await loading

    assert asyncio.run(main()) is False
    assert workspace.engine_state == "closed"
    assert workspace.engine is None


def test_the_model_slots_a_window_shows_are_public(tiny_model_dir: Path, tmp_path: Path) -> None:
    """What the window's banner reads: the models asked for, each one's state,
    load progress or error, and whether the workspace has shut down."""
    missing = str(tmp_path / "missing-model")
    workspace = Workspace(tiny_settings(tiny_model_dir))
    workspace.add_pane()
    seen: list[tuple[str, str, Any, Any]] = []

    def on_event(event: Any) -> None:
        if isinstance(event, EngineStateChanged) and event.state in ("loading", "error"):
            slot = workspace.model_slot(event.model_id)
            assert slot is not None
            seen.append((slot.model_id, slot.state, slot.progress, slot.error))

    workspace.subscribe(on_event)
    default = workspace.default_model
    assert workspace.slot_model_ids() == [] and workspace.model_slot(default) is None
    assert workspace.closed is False

    async def main() -> None:
        assert await workspace.load_model(default)
        assert not await workspace.load_model(missing)
        assert workspace.slot_model_ids() == [default, missing]
        ready, failed = workspace.model_slot(default), workspace.model_slot(missing)
        assert ready is not None and ready.state == "ready" and ready.engine is workspace.engine
        assert failed is not None and failed.state == "error" and failed.engine is None
        assert failed.error is not None and "missing-model" in failed.error
        await workspace.unload_model(missing)
        assert workspace.slot_model_ids() == [default] and workspace.model_slot(missing) is None
        await workspace.shutdown()

    asyncio.run(main())
    # Every event found the slot it speaks of, in the state it reports.
    loading = [s for s in seen if s[1] == "loading"]
    assert {s[0] for s in loading} == {default, missing}
    assert any(progress is not None and progress.stage == "weights" for _, _, progress, _ in loading)
    assert [s[0] for s in seen if s[1] == "error"] == [missing]
    assert workspace.closed is True
    assert workspace.slot_model_ids() == [] and workspace.model_state(default) == "closed"
    with pytest.raises(AttributeError):
        workspace.closed = False  # type: ignore[misc]


# -- quantize at load (the model registry's per-model choice) ------------------------


def registered_tiny(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: Path) -> tuple[Any, str]:
    """A real registry in `data` (the quantized copies' cache too) with a copy of the tiny float model."""
    import shutil

    from app.models.registry import ModelRegistry

    monkeypatch.setenv("TANDEM_DATA_DIR", str(data))
    registry = ModelRegistry(tmp_path / "registry" / "models.json")
    entry = registry.add_folder(shutil.copytree(tiny_model_dir, tmp_path / "Tiny Float"))
    return registry, entry.id


@pytest.mark.skipif(not cpu_kernel_available(), reason="the native quantized CPU kernel does not run here")
def test_a_models_quantize_choice_is_loaded_and_a_change_applies_at_the_next_load(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry, model_id = registered_tiny(tiny_model_dir, tmp_path, monkeypatch, tmp_path / "data")
    registry.set_quantize(model_id, "int4")
    workspace = Workspace(
        tiny_settings(tiny_model_dir, model=model_id),
        resolve_model=registry.engine_model, model_options=registry.engine_options,
    )
    pane = workspace.add_pane()
    held: list[str] = []

    async def main() -> None:
        assert await workspace.load_model(model_id)
        held.append(workspace.stats(model_id).weights)
        turn = await workspace.send("hi")
        await turn.wait()
        # Changed while loaded: the engine keeps what it was loaded with.
        registry.set_quantize(model_id, None)
        held.append(workspace.stats(model_id).weights)
        assert workspace.model_slot(model_id).options == {"quantize": "int4"}
        assert await workspace.load_model(model_id)
        held.append(workspace.stats(model_id).weights)
        assert workspace.model_slot(model_id).options == {}
        await workspace.shutdown()

    asyncio.run(main())
    assert held == ["q4_1+q8_0 (kernel)", "q4_1+q8_0 (kernel)", "float32"]
    assert pane.conversation.messages[1].state == "complete"
    # Quantized once into the data folder's models/, reused from there.
    assert [p.name.split("-int4-")[0] for p in (tmp_path / "data" / "models").iterdir()] == ["Tiny Float"]


def test_a_failed_quantize_at_load_says_what_to_do_and_the_workspace_goes_on(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A file where the data folder should be: the quantized copy cannot be
    # written, whoever runs the test (permissions do not stop root).
    blocker = tmp_path / "blocked"
    blocker.write_text("not a folder")
    registry, model_id = registered_tiny(tiny_model_dir, tmp_path, monkeypatch, blocker)
    registry.set_quantize(model_id, "int8")
    workspace = Workspace(
        tiny_settings(tiny_model_dir, model=model_id),
        resolve_model=registry.engine_model, model_options=registry.engine_options,
    )
    workspace.add_pane()
    recorder = Recorder(workspace)

    async def main() -> None:
        assert not await workspace.load_model(model_id)
        assert workspace.model_state(model_id) == "error"
        registry.set_quantize(model_id, None)
        assert await workspace.load_model(model_id)  # as stored, at the user's word
        turn = await workspace.send("hi")
        await turn.wait()
        await workspace.shutdown()

    asyncio.run(main())
    errors = [e.error for e in recorder.of(EngineStateChanged) if e.state == "error"]
    assert len(errors) == 1
    assert errors[0].startswith("Loading the model quantized to int8 failed: ")
    assert "set “Quantize at load” to Off" in errors[0]
    assert workspace.panes[0].conversation.messages[1].state == "complete"


# -- pane identity ------------------------------------------------------------------


def test_panes_are_numbered_left_to_right_and_numbers_come_back() -> None:
    workspace = Workspace(Settings())
    recorder = Recorder(workspace)
    first, second = workspace.add_pane(), workspace.add_pane()
    assert [p.title for p in workspace.panes] == ["Pane 1", "Pane 2"]
    # A pane inserted beside the first takes the second place and number; the one after moves on.
    beside = workspace.add_pane(after=first.id)
    assert [p.id for p in workspace.panes] == [first.id, beside.id, second.id]
    assert [p.title for p in workspace.panes] == ["Pane 1", "Pane 2", "Pane 3"]
    assert PaneUpdated(second.id) in recorder.events  # its header and chip follow
    # Numbers come back when a pane closes; a moved pane takes its new place's number.
    fourth = workspace.add_pane()
    workspace.close_pane(beside.id)
    assert [p.title for p in workspace.panes] == ["Pane 1", "Pane 2", "Pane 3"]
    assert fourth.title == "Pane 3"
    workspace.move_pane(fourth.id, 0)
    assert [(p.id, p.title) for p in workspace.panes] == [(fourth.id, "Pane 1"), (first.id, "Pane 2"),
                                                          (second.id, "Pane 3")]
    # A name the user gives stays put; clearing it gives the number back.
    workspace.set_title(first.id, "Drafts")
    workspace.move_pane(first.id, 2)
    assert [p.title for p in workspace.panes] == ["Pane 1", "Pane 2", "Drafts"]
    workspace.set_title(first.id, "")
    assert first.title == "Pane 3"
    # A saved layout's automatic title does not pin a number.
    from app.workspace.conversation import Conversation

    reopened = workspace.open_conversation(Conversation(), after=fourth.id, title="Pane 7")
    assert reopened.title == "Pane 2" and reopened.name == ""


def test_forks_sweeps_and_named_panes_lead_their_chats_titles_with_what_tells_them_apart() -> None:
    from app.workspace.conversation import Conversation
    from app.workspace.sweep import open_sweep

    question = "What is the capital of France, and why did it become the capital?"
    workspace = Workspace(Settings())
    source = workspace.open_conversation(Conversation(title=question))
    source.conversation.append_user(question)
    # The sidebar cuts a title at its end, so the mark that tells a fork apart comes first.
    fork = workspace.fork_pane(source.id, 0)
    assert fork.conversation.title == f"Fork: {question}"
    assert workspace.fork_pane(fork.id, 0).conversation.title == f"Fork 2: {question}"
    # Each sweep pane's name (its value) leads its chat's title, without the fork mark.
    swept = open_sweep(workspace, source.id, "seed", [1, 2])
    assert [p.conversation.title for p in swept] == [f"seed 1 · {question}", f"seed 2 · {question}"]
    # Renaming a pane replaces the name in its chat's title; clearing it takes it out.
    workspace.set_title(source.id, "  baseline ")
    assert source.conversation.title == f"baseline · {question}"
    workspace.set_title(source.id, "control")
    assert source.conversation.title == f"control · {question}"
    named_fork = workspace.fork_pane(source.id, 0)
    assert named_fork.conversation.title == f"control fork · {question}"
    workspace.set_title(source.id, "")
    assert source.conversation.title == question
    # A pane named before its first message gets the name once the message titles the chat.
    early = workspace.add_pane()
    workspace.set_title(early.id, "seed 9")
    assert early.conversation.title == ""
    early.conversation.append_user("Hello there")
    early.conversation.begin_reply([1, 2, 3])
    assert early.conversation.title == "seed 9 · Hello there"
    # A saved layout reopened under its pane's name does not stack the name twice.
    saved = Conversation(title=f"seed 1 · {question}")
    assert workspace.open_conversation(saved, title="seed 1").conversation.title == f"seed 1 · {question}"


# -- where a new pane's sampling settings come from ----------------------------------------


def test_a_model_without_a_recommendation_gives_new_panes_tandems_defaults(tiny_engine: Engine) -> None:
    workspace = Workspace(Settings(), engine=tiny_engine)
    pane = workspace.add_pane()
    assert pane.conversation.params == SamplingParams()
    assert pane.params_source == TANDEM_DEFAULTS
    # A field changed in Preferences is the user's choice, and the pane says whose settings they are.
    workspace.settings.default_params = SamplingParams(temperature=0.3)
    second = workspace.add_pane()
    assert second.conversation.params == SamplingParams(temperature=0.3)
    assert second.params_source == PREFERENCES_DEFAULTS


def test_a_models_generation_config_gives_new_panes_its_settings(
    default_model_dir: Path, tmp_path: Path
) -> None:
    folder = write_tiny_model(default_model_dir, tmp_path / "m")
    config = json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
    config.update(temperature=0.6, top_p=0.9, top_k=20, min_p=0.0)
    (folder / "generation_config.json").write_text(json.dumps(config), encoding="utf-8")
    settings = tiny_settings(folder, default_params=SamplingParams(max_tokens=64, repetition_penalty=1.2))
    workspace = Workspace(settings)
    early = workspace.add_pane()  # opened before the model is loaded, as at start-up
    edited = workspace.add_pane()
    workspace.set_params(edited.id, SamplingParams(temperature=1.5))
    assert early.params_source == PREFERENCES_DEFAULTS

    async def main() -> None:
        assert await workspace.load_model(str(folder))

    asyncio.run(main())
    recommended = SamplingParams(temperature=0.6, top_p=0.9, top_k=20, min_p=0.0, max_tokens=64, repetition_penalty=1.2)
    assert early.conversation.params == recommended
    assert early.params_source == MODEL_RECOMMENDED
    later = workspace.add_pane()
    assert later.conversation.params == recommended and later.params_source == MODEL_RECOMMENDED
    # Settings the user set in the pane stay theirs.
    assert edited.conversation.params == SamplingParams(temperature=1.5) and edited.params_source == ""
    asyncio.run(workspace.shutdown())
