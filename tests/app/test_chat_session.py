"""The workspace recorded into a real chat store: replies saved when they end
and checkpointed while they stream, the layout restored by the next run, a
killed run detected; plus what the store depends on in the workspace:
context overflow by dropping the oldest turns, and panes on two models."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from app.store.chat_store import ChatStore
from app.errors import ContextFullError, EngineNotReadyError
from app.store.session import ChatSession
from app.settings import Settings
from app.workspace.workspace import Workspace
from engine import Engine, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
ENDLESS = SamplingParams(temperature=0.0, max_tokens=1500, ignore_eos=True)


def _store_messages(path: Path, conversation_id: str) -> list[tuple[str, str, str]]:
    with ChatStore.open(path, recover=False) as store:
        return [(m.role, m.state, m.text) for m in store.load_conversation(conversation_id).messages]


def test_replies_are_saved_and_the_next_run_restores_the_panes(tiny_engine: Engine, tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"

    async def first_run() -> tuple[list[str], list[list[int]]]:
        session = ChatSession.open(path)
        assert not session.crashed_last_time
        workspace = Workspace(Settings(), engine=tiny_engine)
        panes = session.restore(workspace, default_panes=2)
        assert len(panes) == 2
        workspace.set_params(panes[1].id, SamplingParams(temperature=0.0, max_tokens=6))
        workspace.set_title(panes[1].id, "Short answers")
        turn = await workspace.send("Name three rivers.")
        await turn.wait()
        turn = await workspace.send("And three lakes?", targets=[panes[0].id])
        await turn.wait()
        workspace.set_params(panes[0].id, GREEDY)
        await workspace.wait_idle()  # (shutdown would close the engine the next run uses)
        assert await session.aclose()
        return [p.conversation.id for p in panes], [p.conversation.kept_ids for p in panes]

    ids, kept = asyncio.run(first_run())
    assert [r[0] for r in _store_messages(path, ids[0])] == ["user", "assistant", "user", "assistant"]
    assert all(state == "complete" for _, state, _ in _store_messages(path, ids[0]))

    async def second_run() -> None:
        session = ChatSession.open(path)
        assert not session.crashed_last_time  # the first run ended cleanly
        workspace = Workspace(Settings(), engine=tiny_engine)
        panes = session.restore(workspace)
        assert [p.conversation.id for p in panes] == ids
        assert [p.conversation.kept_ids for p in panes] == kept
        assert panes[1].title == "Short answers"
        assert panes[1].conversation.params.max_tokens == 6
        assert panes[0].conversation.params == GREEDY
        assert panes[0].conversation.title == "Name three rivers."
        # The restored conversation goes on from its kept ids: the prompt of
        # the next turn starts with them.
        prompt = panes[0].conversation.next_prompt(tiny_engine.tokenizer, user_text="Thanks")
        assert prompt[: len(kept[0])] == kept[0]
        turn = await workspace.send("Thanks", targets=[panes[0].id])
        await turn.wait()
        await workspace.shutdown()
        await session.aclose()

    asyncio.run(second_run())
    assert len(_store_messages(path, ids[0])) == 6


def test_a_streaming_reply_is_checkpointed_and_a_killed_run_is_detected(tiny_engine: Engine, tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"

    async def run_without_closing() -> tuple[str, int]:
        session = ChatSession.open(path)
        workspace = Workspace(Settings(), engine=tiny_engine)
        (pane,) = session.restore(workspace, default_panes=1)
        assert session.recorder is not None
        session.recorder.checkpoint_interval = 0.05
        workspace.set_params(pane.id, ENDLESS)
        turn = await workspace.send("Tell me a long story.")
        conversation = pane.conversation
        while len(conversation.messages[1].token_ids) < 40:
            await asyncio.sleep(0.02)
        session.recorder.checkpoint_now()
        assert await asyncio.to_thread(session.writer.flush, 10)
        saved = _store_messages(path, conversation.id)
        turn.stop()
        await turn.wait()
        # Like a crash: no session.close(), so no clean-exit mark. The writer
        # is closed only so its thread does not outlive the test.
        session.writer.close()
        session.store.close()
        assert saved[1][1] == "interrupted" and saved[1][2]  # as a reader sees a reply saved mid-stream
        return conversation.id, len(saved[1][2])

    conversation_id, checkpointed = asyncio.run(run_without_closing())

    async def next_run() -> None:
        session = ChatSession.open(path)
        assert session.crashed_last_time
        workspace = Workspace(Settings(), engine=tiny_engine)
        (pane,) = session.restore(workspace)
        reply = pane.conversation.messages[1]
        # The stop's final save may or may not have landed before the writer
        # closed; either way nothing the checkpoint had is lost.
        assert reply.state in ("interrupted", "stopped")
        assert len(reply.text) >= checkpointed
        assert pane.conversation.id == conversation_id
        await workspace.shutdown()
        await session.aclose()

    asyncio.run(next_run())


def test_drop_oldest_keeps_the_system_prompt_and_later_turns_hit_the_cache(tiny_model_dir: Path, tmp_path: Path) -> None:
    short = tmp_path / "short-context"
    shutil.copytree(tiny_model_dir, short)
    config = json.loads((short / "config.json").read_text())
    (short / "config.json").write_text(json.dumps(dict(config, max_position_embeddings=200)))
    engine = Engine(str(short), device="cpu", dtype="float32", kv_pages=256, threads=1)

    async def main() -> None:
        workspace = Workspace(Settings(), engine=engine)
        pane = workspace.add_pane()
        conversation = pane.conversation
        assert conversation.context_limit == 200
        workspace.set_system_prompt(pane.id, "You are terse.")
        workspace.set_params(pane.id, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
        long_text = "Tell me about the weather in a city by the sea, please. " * 3
        # Turns until the next no longer fits: the default policy refuses it, and changes nothing.
        turns = 0
        while True:
            try:
                turn = await workspace.send(long_text)
            except ContextFullError:
                break
            await turn.wait()
            turns += 1
        assert turns >= 2 and len(conversation.messages) == 2 * turns

        workspace.set_context_policy(pane.id, "drop_oldest")
        await (await workspace.send(long_text)).wait()
        notices = [i for i, m in enumerate(conversation.messages) if m.role == "notice"]
        assert len(notices) == 1
        assert "left out" in conversation.messages[notices[0]].text
        assert len(conversation.messages) == 2 * turns + 3  # nothing is removed from view
        assert conversation.messages[-1].state == "complete"
        chat = conversation.chat_messages()
        assert chat[0] == {"role": "system", "content": "You are terse."}
        assert len(chat) < 1 + 2 * turns + 2
        assert conversation.context_used <= 200

        # The turn after the drop extends the rebuilt ids: its prompt hits the cache.
        await (await workspace.send("Thanks.")).wait()
        stats = conversation.messages[-1].stats
        assert stats is not None and stats.cached_prompt_tokens > 0
        await workspace.shutdown()

    try:
        asyncio.run(main())
    finally:
        engine.close()


def test_panes_on_two_models_stream_at_once(tiny_model_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "other-model"
    shutil.copytree(tiny_model_dir, other)

    async def main() -> None:
        settings = Settings(model=str(tiny_model_dir), device="cpu", dtype="float32", threads=1, kv_cache_mb=8)
        workspace = Workspace(settings)
        first, second = workspace.add_pane(), workspace.add_pane()
        workspace.set_model(second.id, str(other))
        with pytest.raises(EngineNotReadyError):
            await workspace.send("Hello")
        assert await workspace.load_model(str(tiny_model_dir))
        assert await workspace.load_model(str(other))
        assert set(workspace.loaded_models()) == {str(tiny_model_dir), str(other)}
        assert workspace.engine_for(str(tiny_model_dir)) is not workspace.engine_for(str(other))
        for pane in (first, second):
            workspace.set_params(pane.id, SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True))
        turn = await workspace.send("Hello")
        assert len(turn.request_ids) == 2
        # Both stream at the same time, each from its own engine.
        while not all(len(p.conversation.messages[1].token_ids) >= 5 for p in (first, second)):
            assert not turn.done
            await asyncio.sleep(0.01)
        assert first.busy and second.busy
        await turn.wait()
        assert all(p.conversation.messages[1].state == "complete" for p in (first, second))
        assert workspace.model_busy(str(other)) is False
        await workspace.unload_model(str(other))
        assert workspace.model_state(str(other)) == "unloaded"
        with pytest.raises(EngineNotReadyError, match="not loaded"):
            await workspace.send("Again", targets=[second.id])
        await workspace.shutdown()
        assert workspace.model_state(str(tiny_model_dir)) == "closed"

    asyncio.run(main())


def test_a_new_run_forgets_deleted_chats_and_panes_closed_unused(tiny_engine: Engine, tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"

    async def first_run() -> tuple[str, str, str]:
        session = ChatSession.open(path)
        workspace = Workspace(Settings(), engine=tiny_engine)
        kept, deleted = session.restore(workspace, default_panes=2)
        unused = workspace.add_pane()
        for pane in (kept, deleted):
            workspace.set_params(pane.id, GREEDY)
            await (await workspace.send("Hello", targets=[pane.id])).wait()
        workspace.close_pane(unused.id)
        workspace.close_pane(deleted.id)
        session.writer.delete(deleted.conversation.id)
        await session.aclose()
        return kept.conversation.id, deleted.conversation.id, unused.conversation.id

    kept, deleted, unused = asyncio.run(first_run())
    with ChatStore.open(path, recover=False) as store:
        assert store.is_deleted(deleted)  # undoable until the next run
        assert store.load_conversation(unused).messages == []

    async def second_run() -> None:
        session = ChatSession.open(path)
        assert await asyncio.to_thread(session.writer.flush, 10)
        ids = {c.id for c in session.store.list_conversations()} | {c.id for c in session.store.list_conversations(deleted=True)}
        assert ids == {kept}
        await session.aclose()

    asyncio.run(second_run())


def test_reply_versions_are_recorded_and_restored_by_the_next_run(tiny_engine: Engine, tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"

    async def first_run() -> tuple[str, list[str], list[int]]:
        session = ChatSession.open(path)
        workspace = Workspace(Settings(), engine=tiny_engine)
        (pane,) = session.restore(workspace, default_panes=1)
        workspace.set_params(pane.id, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
        await (await workspace.send("Name three rivers.")).wait()
        workspace.set_params(pane.id, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
        await (await workspace.regenerate(pane.id)).wait()
        workspace.show_version(pane.id, 1, 0)  # the first reply is shown when the app ends
        texts = [m.text for m in pane.conversation.messages]
        kept = pane.conversation.kept_ids
        await workspace.wait_idle()
        assert await session.aclose()
        return pane.conversation.id, texts, kept

    conversation_id, texts, kept = asyncio.run(first_run())

    async def second_run() -> None:
        session = ChatSession.open(path)
        workspace = Workspace(Settings(), engine=tiny_engine)
        (pane,) = session.restore(workspace)
        conversation = pane.conversation
        assert conversation.id == conversation_id
        assert [m.text for m in conversation.messages] == texts
        assert conversation.kept_ids == kept
        versions = conversation.messages[1].versions
        assert versions is not None and (versions.current, versions.count) == (0, 2)
        # The other version comes back with its own ids, and the next turn continues from them.
        workspace.show_version(pane.id, 1, 1)
        assert len(conversation.messages[1].token_ids) == 4
        other = conversation.kept_ids
        await (await workspace.send("And lakes?")).wait()
        assert conversation.kept_ids[: len(other)] == other
        assert conversation.messages[3].stats.cached_prompt_tokens > 0
        await workspace.wait_idle()
        await session.aclose()

    asyncio.run(second_run())
    with ChatStore.open(path, recover=False) as store:
        saved = store.load_conversation(conversation_id)
    assert len(saved.messages) == 4 and saved.messages[1].versions is not None
