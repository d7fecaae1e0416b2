"""Arena turns over a real workspace (tiny model): labels drawn afresh each
turn (seeded: the order varies), a vote only once every reply has ended,
and the vote names what each label hid; stored through the writer thread it
survives a restart."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from app.arena.votes import contender_settings
from app.settings import Settings
from app.store.chat_store import ChatStore
from app.store.session import ChatSession
from app.errors import ArenaError
from app.workspace.arena import Arena, vote_choices
from app.workspace.workspace import Workspace
from engine import Engine, SamplingParams


def test_labels_are_drawn_each_turn_and_the_vote_reveals_the_sides(tiny_engine: Engine, tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"

    async def main() -> list:
        session = ChatSession.open(path)
        workspace = Workspace(Settings(), engine=tiny_engine)
        panes = session.restore(workspace, default_panes=2)
        for t, pane in zip((0.3, 1.1), panes):
            workspace.set_params(pane.id, SamplingParams(temperature=t, seed=1, max_tokens=5, ignore_eos=True))
        workspace.set_system_prompt(panes[1].id, "Be brief.")
        arena = Arena.over(workspace.panes, rng=random.Random(7))
        assert arena.revealed and not arena.awaiting_vote
        with pytest.raises(ArenaError, match="nothing to vote on"):
            arena.vote(workspace, "tie")

        orders = []
        votes = []
        for n in range(6):
            turn = await arena.send(workspace, f"Question {n}")
            assert not arena.revealed and arena.awaiting_vote
            assert sorted(arena.turn.labels) == ["A", "B"]
            assert sorted(arena.turn.labels.values()) == sorted(p.id for p in panes)
            # Seated in label order: A is the leftmost reply.
            assert [p.id for p in workspace.panes] == list(arena.turn.labels.values())
            if n == 0:
                with pytest.raises(ArenaError, match="still being written"):
                    arena.vote(workspace, "win", "A")
            await turn.wait()
            orders.append(tuple(arena.turn.labels.values()))
            with pytest.raises(ArenaError, match="winner is one of A, B"):
                arena.vote(workspace, "win", "C")
            vote = arena.vote(workspace, "win", "B", model_name=lambda model_id: "Tiny")
            assert arena.revealed
            with pytest.raises(ArenaError, match="has its vote"):
                arena.vote(workspace, "tie")
            session.writer.submit(lambda store, vote=vote: store.add_arena_vote(vote))
            votes.append(vote)
        # Seeded, so the same every run, and both orders occur: position tells nothing.
        assert len(set(orders)) == 2

        vote = votes[-1]
        assert (vote.prompt, vote.outcome, vote.winner, vote.arena_id) == ("Question 5", "win", "B", arena.id)
        for side in vote.sides:
            pane = workspace.pane(side.pane_id)
            assert side.label == arena.turn.label_of(pane.id)
            assert side.model == "Tiny"
            assert side.settings == contender_settings(pane.conversation.params, pane.conversation.system_prompt)
            assert side.reply == pane.conversation.messages[-1].text
        await workspace.shutdown()
        assert await session.aclose()
        return votes

    votes = asyncio.run(main())
    with ChatStore.open(path, recover=False) as store:
        stored = store.arena_votes()
    assert [(v.prompt, v.winner, v.sides) for v in stored] == [(v.prompt, v.winner, v.sides) for v in votes]


def test_an_arena_needs_two_to_seven_panes_and_a_refused_send_keeps_the_turn(tiny_engine: Engine) -> None:
    workspace = Workspace(Settings(), engine=tiny_engine)
    workspace.add_pane()
    with pytest.raises(ArenaError, match="two or more panes"):
        Arena.over(workspace.panes)
    for _ in range(7):
        workspace.add_pane()
    with pytest.raises(ArenaError, match="at most 7"):
        Arena.over(workspace.panes)
    arena = Arena.over([workspace.panes[i] for i in (1, 3, 5)], rng=random.Random(3))
    others = [p.id for i, p in enumerate(workspace.panes) if i not in (1, 3, 5)]

    async def main() -> None:
        for pane in workspace.panes:
            workspace.set_params(pane.id, SamplingParams(temperature=0.0, max_tokens=2))
        for _ in range(3):
            await (await arena.send(workspace, "Hello")).wait()
            # The arena's panes take the places they had, in label order; the others stay where they were.
            ids = [p.id for p in workspace.panes]
            assert [ids[i] for i in (1, 3, 5)] == list(arena.turn.labels.values())
            assert [pid for i, pid in enumerate(ids) if i not in (1, 3, 5)] == others
        fresh = Arena.over([workspace.panes[i] for i in (1, 3, 5)])
        with pytest.raises(Exception, match="empty"):
            await fresh.send(workspace, "   ")
        assert fresh.turn is None and fresh.revealed
        assert fresh.drop_closed([p.id for p in workspace.panes[2:]])
        assert not fresh.drop_closed([workspace.panes[3].id])
        await workspace.shutdown()

    asyncio.run(main())


def test_the_vote_keys_are_one_scheme_for_every_size() -> None:
    assert [(c.key, c.text) for c in vote_choices(2)] == [
        ("1", "A is better"), ("2", "B is better"), ("3", "Tie"), ("4", "Both are bad")]
    three = vote_choices(3)
    assert [c.key for c in three] == ["1", "2", "3", "4", "5"]
    assert [(c.outcome, c.winner) for c in three[2:]] == [("win", "C"), ("tie", None), ("both_bad", None)]
    assert three[-1].text == "All are bad"
    assert [c.key for c in vote_choices(7)][-1] == "9"


def test_an_arena_starts_only_from_one_shared_history() -> None:
    from app.workspace.conversation import Conversation

    workspace = Workspace(Settings())
    first, second = workspace.add_pane(), workspace.add_pane()
    Arena.over(workspace.panes)  # two new chats: nothing to give away
    first.conversation.append_user("What is the capital of France?")
    with pytest.raises(ArenaError, match="different conversations.*New arena"):
        Arena.over(workspace.panes)
    # The same history in every pane (as "Use in all panes" leaves it) shows nothing of who is who.
    second.conversation.append_user("What is the capital of France?")
    Arena.over(workspace.panes)
    third = workspace.open_conversation(Conversation())
    with pytest.raises(ArenaError, match="different conversations"):
        Arena.over([first, third])
