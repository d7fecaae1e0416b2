"""The blind arena's labels and votes: the order drawn per turn, the contender
names, the votes kept in a real chat store across a restart, damaged rows."""

from __future__ import annotations

import dataclasses
import logging
import random
import sqlite3
from pathlib import Path

import pytest

from app.arena.labels import arena_labels, draw_order
from app.arena.leaderboard import leaderboard
from app.arena.votes import (
    ArenaSide,
    ArenaVote,
    ArenaVoteError,
    contender_key,
    contender_name,
    contender_settings,
    sides_from_json,
    sides_to_json,
)
from app.store.chat_store import ChatStore
from engine.params import SamplingParams

SMOL = "SmolLM2-135M-Instruct"


def side(label: str, temperature: float, reply: str, pane_id: int | None = None, **more: object) -> ArenaSide:
    settings = contender_settings(SamplingParams(temperature=temperature), str(more.pop("system_prompt", "")))
    settings.update(more)
    return ArenaSide(label, SMOL, settings, reply, pane_id)


def votes() -> list[ArenaVote]:
    return [
        ArenaVote("Name a fruit.", (side("A", 0.8, "Apple.", 2), side("B", 0.2, "Pear ☕", 1)), "win", "A", 100.0,
                  arena_id="c" * 32),
        ArenaVote("Name a city.", (side("A", 0.2, "Lyon", 1), side("B", 0.8, "Kyoto", 2),
                                   side("C", 0.8, "Oslo", 3, system_prompt="Be brief.")), "tie", None, 101.0),
        ArenaVote("Name a river.", (side("A", 0.2, "", 1), side("B", 0.8, "Nile\n\nthe end", 2)), "both_bad", None,
                  102.5),
    ]


# -- labels ----------------------------------------------------------------------------


def test_labels_are_letters_then_pairs_of_letters() -> None:
    assert arena_labels(0) == []
    assert arena_labels(4) == ["A", "B", "C", "D"]
    labels = arena_labels(28)
    assert labels[25:] == ["Z", "AA", "AB"] and len(set(labels)) == 28
    with pytest.raises(ValueError):
        arena_labels(-1)


def test_the_order_is_a_permutation_drawn_anew_each_turn() -> None:
    panes = [7, 3, 11]
    rng = random.Random(1234)
    turns = [draw_order(panes, rng) for _ in range(30)]
    for order in turns:
        assert list(order) == ["A", "B", "C"] and sorted(order.values()) == sorted(panes)
    orders = {tuple(order.values()) for order in turns}
    assert len(orders) >= 4  # it varies from turn to turn (6 orders possible)
    assert {order["A"] for order in turns} == set(panes)  # every pane is shown first some turn
    again = random.Random(1234)
    assert [draw_order(panes, again) for _ in range(30)] == turns  # seeded: the same turns again
    with pytest.raises(ValueError, match="once"):
        draw_order([1, 1], rng)


# -- contenders ---------------------------------------------------------------------------


def test_a_contender_is_a_model_and_the_settings_that_differ_from_the_defaults() -> None:
    warm = side("A", 1.1, "x")
    assert contender_name(warm) == f"{SMOL} · temperature 1.1"
    assert contender_name(side("A", SamplingParams().temperature, "x")) == SMOL  # every setting at its default
    named = ArenaSide("B", SMOL, contender_settings(
        SamplingParams(temperature=1, top_p=0.9, seed=3, stop=("###",)), "Answer like a pirate would, always."), "y")
    assert contender_name(named) == (
        f'{SMOL} · temperature 1 · top-p 0.9 · seed 3 · stop "###" · '
        'system prompt "Answer like a pirate would, alw…"'
    )
    # The same contender however the settings were spelled out: the label, reply and pane do not count,
    # a default left out or given, 1 or 1.0 for a float setting, a tuple or a list.
    same = [
        ArenaSide("C", SMOL, {"temperature": 1.1}, "other reply", 9),
        ArenaSide("D", SMOL, {"temperature": 1.1, "top_p": SamplingParams().top_p, "stop": (), "system_prompt": ""}, "z"),
    ]
    assert {contender_key(s) for s in same} == {contender_key(warm)}
    assert contender_key(ArenaSide("A", SMOL, {"temperature": 1}, "")) == contender_key(
        ArenaSide("A", SMOL, {"temperature": 1.0}, ""))
    different = [side("A", 0.2, "x"), ArenaSide("A", "other-model", warm.settings, "x"),
                 side("A", 1.1, "x", system_prompt="Be brief."), side("A", 1.1, "x", seed=1)]
    keys = {contender_key(s) for s in (warm, *different)}
    assert len(keys) == 5
    assert contender_key(warm) == f'["{SMOL}",{{"temperature":1.1}}]'


def test_a_vote_that_cannot_be_right_is_refused() -> None:
    a, b = side("A", 0.8, "x"), side("B", 0.2, "y")
    for kwargs, message in [
        (dict(sides=(a,), outcome="tie", winner=None), "at least two sides"),
        (dict(sides=(a, dataclasses.replace(b, label="A")), outcome="tie", winner=None), "different labels"),
        (dict(sides=(a, b), outcome="draw", winner=None), "outcome is one of win, tie, both_bad"),
        (dict(sides=(a, b), outcome="win", winner="C"), "winner of a vote is one of its labels"),
        (dict(sides=(a, b), outcome="win", winner=None), "winner of a vote is one of its labels"),
        (dict(sides=(a, b), outcome="both_bad", winner="A"), "has no winner"),
    ]:
        with pytest.raises(ArenaVoteError, match=message):
            ArenaVote(prompt="p", created_at=1.0, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ArenaVoteError, match="JSON-able"):
        ArenaSide("A", SMOL, {"temperature": object()}, "x")
    vote = ArenaVote("p", [a, b], "win", "B", 1.0)  # type: ignore[arg-type]
    assert vote.sides == (a, b) and vote.side("B") is b


# -- the store ------------------------------------------------------------------------------


def test_votes_are_stored_with_everything_hidden_and_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"
    written = votes()
    with ChatStore.open(path) as store:
        ids = [store.add_arena_vote(vote) for vote in written]
    assert len(set(ids)) == 3
    with ChatStore.open(path, recover=False) as store:
        read = store.arena_votes()
    assert read == [dataclasses.replace(vote, id=i) for vote, i in zip(written, ids)]  # oldest first
    city = read[1]
    assert city.prompt == "Name a city." and [s.reply for s in city.sides] == ["Lyon", "Kyoto", "Oslo"]
    assert city.sides[2].model == SMOL and city.sides[2].settings["system_prompt"] == "Be brief."
    assert city.sides[2].settings["temperature"] == 0.8 and city.sides[2].pane_id == 3
    assert read[2].outcome == "both_bad" and read[0].arena_id == "c" * 32 and read[0].winner == "A"

    with ChatStore.open(path, recover=False) as store:
        store.delete_arena_vote(ids[1])
        assert [v.id for v in store.arena_votes()] == [ids[0], ids[2]]
        with pytest.raises(Exception, match=f"no arena vote {ids[1]}"):
            store.delete_arena_vote(ids[1])


def test_damaged_vote_rows_are_left_out_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "chats.sqlite3"
    written = votes()
    with ChatStore.open(path) as store:
        ids = [store.add_arena_vote(vote) for vote in written]
    conn = sqlite3.connect(path)
    damage = [
        ('{"label": "A", "mod', ids[0]),  # cut short: not JSON
        (sides_to_json(written[1].sides).replace('"label": "C"', '"label": 3'), ids[1]),  # a label that is a number
    ]
    conn.executemany("UPDATE arena_votes SET sides = ? WHERE id = ?", damage)
    conn.execute("INSERT INTO arena_votes (created_at, prompt, outcome, winner, sides) VALUES (1, 'p', 'win', 'Q', ?)",
                 (sides_to_json(written[0].sides),))  # a winner that is none of its sides
    conn.execute("INSERT INTO arena_votes (created_at, prompt, outcome, winner, sides) VALUES ('soon', 'p', 'tie', "
                 "NULL, ?)", (sides_to_json(written[0].sides),))  # a time that is not a number
    conn.commit()
    conn.close()
    problems: list[str] = []
    with caplog.at_level(logging.WARNING, logger="app.store.chat_store"), ChatStore.open(path, recover=False) as store:
        read = store.arena_votes(problems=problems)
    assert [v.id for v in read] == [ids[2]]
    assert len(problems) == 4 and len(caplog.records) == 4
    assert f"Arena vote {ids[0]} " in problems[0] and "not valid JSON" in problems[0] and "left out" in problems[0]
    assert "label" in problems[1] and "winner" in problems[2] and "time" in problems[3]
    rows = leaderboard(read, rounds=20)  # what is left still makes a leaderboard
    assert {r.both_bad for r in rows} == {1}


def test_sides_json_refuses_what_is_not_sides() -> None:
    for text, message in [(None, "JSON text"), ("[1", "not valid JSON"), ('{"a": 1}', "a list"),
                          ("[1]", "an object"), ('[{"label": "A"}]', "no 'model'")]:
        with pytest.raises(ArenaVoteError, match=message):
            sides_from_json(text)
