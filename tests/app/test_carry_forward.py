"""Use in all panes, on real engines (the tiny random model and a copy of it
as "another model"): the reply becomes every other pane's answer as a new
version, the panes on its model then hold the very ids it was generated with
(so the next broadcast is served from the prefix cache), a pane on another
model encodes the text once, and the carried versions survive a restart."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from app.errors import PaneBusyError
from app.events import ReplyVersionShown
from app.settings import Settings
from app.store.session import ChatSession
from app.errors import CarryError
from app.workspace.workspace import Workspace
from engine import SamplingParams


def pages_below(tokens: int, page_size: int) -> int:
    """Prompt tokens that full pages of a `tokens`-long sequence cover (its last token was sampled, never fed)."""
    return (tokens - 1) // page_size * page_size


def _settings(model: Path) -> Settings:
    return Settings(model=str(model), device="cpu", dtype="float32", threads=1, kv_cache_mb=8)


def test_the_reply_becomes_every_panes_answer_and_the_next_turn_hits_the_cache(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    other_model = tmp_path / "other-model"
    shutil.copytree(tiny_model_dir, other_model)
    path = tmp_path / "chats.sqlite3"

    async def first_run() -> tuple[list[str], list[list[int]], str]:
        session = ChatSession.open(path)
        workspace = Workspace(_settings(tiny_model_dir))
        shown: list[ReplyVersionShown] = []
        workspace.subscribe(lambda e: shown.append(e) if isinstance(e, ReplyVersionShown) else None)
        panes = session.restore(workspace, default_panes=4)
        best, second, third, elsewhere = panes
        workspace.set_model(elsewhere.id, str(other_model))
        assert await workspace.load_model(str(tiny_model_dir))
        assert await workspace.load_model(str(other_model))
        engine = workspace.engine_for(str(tiny_model_dir))
        page_size = engine.stats().page_size
        # Different settings, so each pane writes its own reply.
        for seed, pane in enumerate(panes, 1):
            workspace.set_params(pane.id, SamplingParams(temperature=5.0, seed=seed, max_tokens=8, ignore_eos=True, top_k=0, top_p=1.0, min_p=0.0))
        await (await workspace.send("Name a planet.")).wait()
        own = {pane.id: pane.conversation.messages[1].text for pane in panes}
        reply = best.conversation.messages[1]
        assert len({tuple(p.conversation.messages[1].token_ids) for p in panes}) == 4

        result = workspace.use_in_all_panes(best.id, 1)
        assert result.carried == [second.id, third.id, elsewhere.id] and result.skipped == []
        assert [(e.pane_id, e.index, e.first) for e in shown] == [(p.id, 1, 0) for p in (second, third, elsewhere)]
        for pane in (second, third, elsewhere):
            carried = pane.conversation.messages[1]
            assert carried.text == reply.text and carried.model_id == reply.model_id
            versions = carried.versions
            assert versions is not None and (versions.current, versions.count) == (1, 2)
        # The panes on the reply's model hold the ids it was generated with: one history everywhere.
        shared = best.conversation.kept_ids
        assert second.conversation.kept_ids == shared and third.conversation.kept_ids == shared
        assert second.conversation.messages[1].token_ids == reply.token_ids
        # The pane on another model keeps the text and encodes it once, at its next turn.
        other_engine = workspace.engine_for(str(other_model))
        assert elsewhere.conversation.messages[1].token_ids == []
        expected = other_engine.tokenizer.encode_chat(elsewhere.conversation.chat_messages(user_text="And a moon?"))

        await (await workspace.send("And a moon?")).wait()
        for pane in (best, second, third):
            stats = pane.conversation.messages[3].stats
            assert pane.conversation.kept_ids[: len(shared)] == shared
            assert stats.cached_prompt_tokens >= pages_below(len(shared), page_size) > 0
        assert elsewhere.conversation.messages[3].stats.prompt_tokens == len(expected)

        # Nothing is lost: each pane's own answer is the earlier version.
        workspace.show_version(second.id, 1, 0)
        assert second.conversation.messages[1].text == own[second.id]
        workspace.show_version(second.id, 1, 1)
        texts = [m.text for m in second.conversation.messages]
        kept = [p.conversation.kept_ids for p in panes]
        await workspace.shutdown()
        assert await session.aclose()
        return texts, kept, second.conversation.id

    texts, kept, second_id = asyncio.run(first_run())

    async def second_run() -> None:
        session = ChatSession.open(path)
        workspace = Workspace(_settings(tiny_model_dir))
        panes = session.restore(workspace)
        second = next(p for p in panes if p.conversation.id == second_id)
        assert [m.text for m in second.conversation.messages] == texts
        assert [p.conversation.kept_ids for p in panes] == kept
        versions = second.conversation.messages[1].versions
        assert versions is not None and versions.count == 2
        await session.aclose()

    asyncio.run(second_run())


def test_what_cannot_be_carried_is_refused_or_left_alone(tiny_model_dir: Path) -> None:
    async def main() -> None:
        workspace = Workspace(_settings(tiny_model_dir))
        source, asked_else, empty = workspace.add_pane(), workspace.add_pane(), workspace.add_pane()
        assert await workspace.load_model(str(tiny_model_dir))
        for pane in (source, asked_else):
            workspace.set_params(pane.id, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
        await (await workspace.send("Name a river.", targets=[source.id])).wait()
        await (await workspace.send("Name a lake.", targets=[asked_else.id])).wait()
        with pytest.raises(CarryError, match="is not a reply"):
            workspace.use_in_all_panes(source.id, 0)
        before = [m.text for m in asked_else.conversation.messages], asked_else.conversation.kept_ids

        result = workspace.use_in_all_panes(source.id, 1)
        assert result.carried == []
        assert dict(result.skipped) == {asked_else.id: "its last message is not the same",
                                        empty.id: "it has no message to answer"}
        assert "left as it was" in result.summary({p.id: p.title for p in workspace.panes})
        assert ([m.text for m in asked_else.conversation.messages], asked_else.conversation.kept_ids) == before

        await (await workspace.send("And a sea?", targets=[source.id])).wait()
        with pytest.raises(CarryError, match="Only the last reply"):
            workspace.use_in_all_panes(source.id, 1)
        workspace.set_params(asked_else.id, SamplingParams(temperature=0.0, max_tokens=1500, ignore_eos=True))
        turn = await workspace.send("Go on.", targets=[asked_else.id])
        with pytest.raises(PaneBusyError):
            workspace.use_in_all_panes(source.id, 3)
        with pytest.raises(CarryError, match="still being written"):
            workspace.use_in_all_panes(asked_else.id, 3)
        turn.stop()
        await turn.wait()
        await workspace.shutdown()

    asyncio.run(main())
