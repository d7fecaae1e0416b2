"""The chat store's migrations, one step at a time, on databases built here.

Each step gets a store of the version it starts from, written with that
version's own schema and data, and must leave every row readable at the next
version; all steps together must arrive at exactly the schema a new store has.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from pathlib import Path

import pytest

from app.store import migrations
from app.store.chat_store import ChatStore
from app.store.records import pack_ids, unpack_ids
from app.store.schema import SCHEMA_VERSION, create_schema
from tests.app.fixtures.make_chats_v1 import SCHEMA_V1

CONV = "c" * 32
OTHER = "d" * 32
PARAMS = json.dumps({"temperature": 0.5, "top_k": 40, "stop": ["\n\nUser:"]})
STATS = json.dumps({"generated_tokens": 3, "tokens_per_s": 9.5, "ttft_s": 0.25, "prompt_tokens": 8,
                    "cached_prompt_tokens": 0, "finish_reason": "stop", "elapsed_s": 0.5})


def build_v1(path: Path) -> None:
    """A version-1 store: one model per conversation, token ids as JSON text, a damaged ids value."""
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA_V1)
    conn.executemany(
        "INSERT INTO conversations VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (CONV, "Trip", 100.0, 200.0, "Be brief.", PARAMS, "smollm", json.dumps([1, 2, 3, 2**31 - 1])),
            (OTHER, "Ünïcode ☕", 300.0, 400.0, "", "{}", "default", "not json"),
        ],
    )
    conn.executemany(
        "INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (CONV, 0, "user", "Where to?", "[]", "complete", None, None, 101.0, None),
            (CONV, 1, "assistant", "Paris.", json.dumps([7, 8, 9]), "complete", STATS, None, 102.0, 4),
            (CONV, 2, "user", "Then?", "[]", "complete", None, None, 103.0, None),
            (CONV, 3, "assistant", "Ly", json.dumps([10]), "streaming", None, None, 104.0, None),
            (OTHER, 0, "user", "Bonjour ☕", json.dumps(["x"]), "complete", None, None, 301.0, None),
            (OTHER, 1, "assistant", "", "[]", "error", None, "Out of memory.", 302.0, None),
        ],
    )
    conn.execute("INSERT INTO meta VALUES ('session', 'clean')")
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()


def schema_of(conn: sqlite3.Connection) -> dict[str, object]:
    """Every table's columns, keys, foreign keys and indexes, as SQLite reports them."""
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    shape: dict[str, object] = {}
    for table in tables:
        indexes = sorted(
            (name, unique, [c[2] for c in conn.execute(f"PRAGMA index_info('{name}')")])
            for _, name, unique, origin, _ in conn.execute(f"PRAGMA index_list('{table}')")
            if origin == "c"  # declared with CREATE INDEX (automatic ones follow from the columns)
        )
        shape[table] = {
            "columns": conn.execute(f"PRAGMA table_info('{table}')").fetchall(),
            "foreign_keys": conn.execute(f"PRAGMA foreign_key_list('{table}')").fetchall(),
            "indexes": indexes,
        }
    return shape


def test_every_version_has_one_step_in_order() -> None:
    assert sorted(migrations.STEPS) == list(range(1, SCHEMA_VERSION))
    with pytest.raises(ValueError, match="no migration from schema version 0"):
        migrations.migrate(sqlite3.connect(":memory:"), 0)
    with pytest.raises(ValueError, match=f"no migration from schema version {SCHEMA_VERSION + 1}"):
        migrations.migrate(sqlite3.connect(":memory:"), SCHEMA_VERSION + 1)


def test_v1_to_v2_keeps_every_row(tmp_path: Path) -> None:
    path = tmp_path / "v1.sqlite3"
    build_v1(path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    migrations.migrate_v1_to_v2(conn)
    conn.execute("COMMIT")

    conversations = conn.execute(
        """SELECT id, title, created_at, updated_at, system_prompt, params, model_id, context_policy,
                  kept_ids, deleted_at FROM conversations ORDER BY id"""
    ).fetchall()
    assert [row[:8] for row in conversations] == [
        (CONV, "Trip", 100.0, 200.0, "Be brief.", PARAMS, "smollm", "stop"),
        (OTHER, "Ünïcode ☕", 300.0, 400.0, "", "{}", "default", "stop"),
    ]
    # Token ids packed as int32 (the largest one whole); a value that was never a list becomes empty.
    assert [unpack_ids(row[8]) for row in conversations] == [[1, 2, 3, 2**31 - 1], []]
    assert conversations[0][8] == pack_ids([1, 2, 3, 2**31 - 1])
    assert [row[9] for row in conversations] == [None, None]  # nothing deleted

    messages = conn.execute(
        """SELECT conversation_id, position, role, text, token_ids, state, model_id, params, stats, error,
                  created_at, turn_mark FROM messages ORDER BY conversation_id, position"""
    ).fetchall()
    assert [(m[0], m[1], m[2], m[3], unpack_ids(m[4]), m[5]) for m in messages] == [
        (CONV, 0, "user", "Where to?", [], "complete"),
        (CONV, 1, "assistant", "Paris.", [7, 8, 9], "complete"),
        (CONV, 2, "user", "Then?", [], "complete"),
        (CONV, 3, "assistant", "Ly", [10], "streaming"),
        (OTHER, 0, "user", "Bonjour ☕", [], "complete"),  # ["x"] is not token ids
        (OTHER, 1, "assistant", "", [], "error"),
    ]
    # A v1 reply was written by its conversation's one model; its sampling is not known.
    assert [(m[2], m[6], m[7]) for m in messages] == [
        ("user", None, None), ("assistant", "smollm", None), ("user", None, None),
        ("assistant", "smollm", None), ("user", None, None), ("assistant", "default", None),
    ]
    assert [(m[8], m[9], m[10], m[11]) for m in messages] == [
        (None, None, 101.0, None), (STATS, None, 102.0, 4), (None, None, 103.0, None),
        (None, None, 104.0, None), (None, None, 301.0, None), (None, "Out of memory.", 302.0, None),
    ]
    assert conn.execute("SELECT key, value FROM meta").fetchall() == [("session", "clean")]
    assert conn.execute("SELECT count(*) FROM layout").fetchone() == (0,)
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    conn.close()


def test_migrating_arrives_at_the_schema_a_new_store_has(tmp_path: Path) -> None:
    old = tmp_path / "old.sqlite3"
    build_v1(old)
    with ChatStore.open(old, recover=False) as store:
        assert store.schema_version == SCHEMA_VERSION and store.open_warning is None
        migrated = schema_of(store._conn)
        assert [s.title for s in store.list_conversations()] == ["Ünïcode ☕", "Trip"]
        trip = store.load_conversation(CONV)
        assert [m.text for m in trip.messages] == ["Where to?", "Paris.", "Then?", "Ly"]
        assert trip.messages[3].state == "interrupted"  # cut short in v1, as any reply saved mid-stream
        assert trip.params.top_k == 40 and trip.params.stop == ("\n\nUser:",)
    fresh = sqlite3.connect(":memory:")
    create_schema(fresh)
    assert migrated == schema_of(fresh)


# The conversations table as v2 to v7 wrote it (v8 added `thinking`).
V7_CONVERSATIONS = """
CREATE TABLE conversations (
    id TEXT PRIMARY KEY NOT NULL,
    title TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    system_prompt TEXT NOT NULL DEFAULT '',
    params TEXT NOT NULL DEFAULT '{}',
    model_id TEXT NOT NULL DEFAULT 'default',
    context_policy TEXT NOT NULL DEFAULT 'stop',
    kept_ids BLOB NOT NULL DEFAULT x'',
    deleted_at REAL
)"""


# The v3 messages table, as v3 wrote it (the other v3 tables are v4's).
_V3_MESSAGES = """
CREATE TABLE messages (
    conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    role TEXT NOT NULL,
    text TEXT NOT NULL,
    token_ids BLOB NOT NULL DEFAULT x'',
    state TEXT NOT NULL,
    model_id TEXT,
    params TEXT,
    stats TEXT,
    error TEXT,
    created_at REAL NOT NULL,
    turn_mark INTEGER,
    PRIMARY KEY (conversation_id, position)
)"""


def build_v3(path: Path) -> None:
    """A version-3 store: one conversation, its reply with its own ids and mark, no versions column."""
    from app.store import schema

    conn = sqlite3.connect(path)
    for statement in (V7_CONVERSATIONS, _V3_MESSAGES, schema.CREATE_LAYOUT, schema.CREATE_META,
                      *schema.CREATE_INDEXES):
        conn.execute(statement)
    conn.execute(
        """INSERT INTO conversations (id, title, created_at, updated_at, system_prompt, params, model_id,
                                      context_policy, kept_ids) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)""",
        (CONV, "Trip", 100.0, 200.0, "", PARAMS, "smollm", "stop", pack_ids([1, 2, 3, 7, 8, 9])),
    )
    conn.executemany(
        "INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (CONV, 0, "user", "Where to?", b"", "complete", None, None, None, None, 101.0, None),
            (CONV, 1, "assistant", "Paris.", pack_ids([7, 8, 9]), "complete", "smollm", PARAMS, STATS, None, 102.0, 6),
        ],
    )
    conn.execute("INSERT INTO layout (position, conversation_id, title) VALUES (0, ?, 'Pane 1')", (CONV,))
    conn.execute("INSERT INTO meta VALUES ('session', 'clean')")
    conn.execute("PRAGMA user_version = 3")
    conn.commit()
    conn.close()


def test_v3_to_v4_adds_reply_versions(tmp_path: Path) -> None:
    path = tmp_path / "v3.sqlite3"
    build_v3(path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    migrations.migrate_v3_to_v4(conn)
    conn.execute("COMMIT")
    rows = conn.execute("SELECT position, text, turn_mark, versions FROM messages ORDER BY position").fetchall()
    assert rows == [(0, "Where to?", None, None), (1, "Paris.", 6, None)]  # every v3 reply has one version
    conn.close()

    path = tmp_path / "v3-opened.sqlite3"  # the same file, migrated by the store's own open
    build_v3(path)
    with ChatStore.open(path, recover=False) as store:
        assert store.schema_version == SCHEMA_VERSION
        migrated = schema_of(store._conn)
        trip = store.load_conversation(CONV)
        assert [m.text for m in trip.messages] == ["Where to?", "Paris."]
        assert trip.messages[1].versions is None
        assert trip.kept_ids == [1, 2, 3, 7, 8, 9] and trip.turn_marks == [None, 6]
        assert [p.conversation_id for p in store.load_layout()] == [CONV]
        # A migrated store keeps versions like a new one.
        from app.workspace.messages import Message, ReplyVersion, ReplyVersions

        old = Message("assistant", "Lyon.", token_ids=[4, 5])
        trip.messages[1].versions = ReplyVersions([ReplyVersion("Where to?", [old], [5], [1, 2, 3, 4, 5]), None], 1)
        store.save_conversation(trip)
        again = store.load_conversation(CONV)
        versions = again.messages[1].versions
        assert versions is not None and versions.current == 1 and versions.versions[1] is None
        kept = versions.versions[0]
        assert kept is not None and kept.messages[0].text == "Lyon." and kept.kept_ids == [1, 2, 3, 4, 5]
        again.show_version(1, 0)
        assert again.kept_ids == [1, 2, 3, 4, 5] and again.messages[1].token_ids == [4, 5]
    fresh = sqlite3.connect(":memory:")
    create_schema(fresh)
    assert migrated == schema_of(fresh)


# The v4 and v5 messages table, as they wrote it (v3's with the versions column).
_V4_MESSAGES = """
CREATE TABLE messages (
    conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    role TEXT NOT NULL,
    text TEXT NOT NULL,
    token_ids BLOB NOT NULL DEFAULT x'',
    state TEXT NOT NULL,
    model_id TEXT,
    params TEXT,
    stats TEXT,
    error TEXT,
    created_at REAL NOT NULL,
    turn_mark INTEGER,
    versions TEXT,
    PRIMARY KEY (conversation_id, position)
)"""


def build_v4(path: Path) -> None:
    """A version-4 store: a conversation with a reply that has another version, no arena table."""
    from app.store import schema

    conn = sqlite3.connect(path)
    for statement in (V7_CONVERSATIONS, _V4_MESSAGES, schema.CREATE_LAYOUT, schema.CREATE_META,
                      *schema.CREATE_INDEXES):
        conn.execute(statement)
    conn.execute(
        """INSERT INTO conversations (id, title, created_at, updated_at, system_prompt, params, model_id,
                                      context_policy, kept_ids) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)""",
        (CONV, "Trip", 100.0, 200.0, "", PARAMS, "smollm", "stop", pack_ids([1, 2, 3, 7, 8, 9])),
    )
    versions = json.dumps({"current": 1, "versions": [
        {"user_text": "Where to?", "turn_marks": [5], "kept_ids": [1, 2, 3, 4, 5],
         "messages": [{"role": "assistant", "text": "Lyon.", "token_ids": [4, 5], "state": "complete",
                       "model_id": "smollm", "params": None, "stats": None, "error": None,
                       "created_at": 101.5, "versions": None}]},
        None,
    ]})
    conn.executemany(
        "INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (CONV, 0, "user", "Where to?", b"", "complete", None, None, None, None, 101.0, None, None),
            (CONV, 1, "assistant", "Paris.", pack_ids([7, 8, 9]), "complete", "smollm", PARAMS, STATS, None, 102.0,
             6, versions),
        ],
    )
    conn.execute("INSERT INTO meta VALUES ('session', 'clean')")
    conn.execute("PRAGMA user_version = 4")
    conn.commit()
    conn.close()


def test_v4_to_v5_adds_arena_votes(tmp_path: Path) -> None:
    from app.arena.votes import ArenaSide, ArenaVote

    path = tmp_path / "v4.sqlite3"
    build_v4(path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    migrations.migrate_v4_to_v5(conn)
    conn.execute("COMMIT")
    assert conn.execute("SELECT count(*) FROM arena_votes").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM messages").fetchone() == (2,)  # v4's rows untouched
    conn.close()

    path = tmp_path / "v4-opened.sqlite3"  # the same file, migrated by the store's own open
    build_v4(path)
    vote = ArenaVote(
        prompt="Where to?",
        sides=(ArenaSide("A", "smollm", {"temperature": 0.2}, "Paris.", 1),
               ArenaSide("B", "smollm", {"temperature": 1.0}, "Lyon.", 2)),
        outcome="win", winner="B", created_at=103.0, arena_id=CONV,
    )
    with ChatStore.open(path, recover=False) as store:
        assert store.schema_version == SCHEMA_VERSION
        migrated = schema_of(store._conn)
        trip = store.load_conversation(CONV)
        assert [m.text for m in trip.messages] == ["Where to?", "Paris."]
        versions = trip.messages[1].versions
        assert versions is not None and versions.versions[0] is not None
        assert versions.versions[0].messages[0].text == "Lyon."
        assert store.arena_votes() == []
        vote_id = store.add_arena_vote(vote)
    with ChatStore.open(path, recover=False) as store:
        assert store.arena_votes() == [dataclasses.replace(vote, id=vote_id)]
    fresh = sqlite3.connect(":memory:")
    create_schema(fresh)
    assert migrated == schema_of(fresh)


def build_v5(path: Path) -> None:
    """A version-5 store: one system prompt per conversation ("Be brief.", the
    one it had last), two turns, an arena vote; no per-reply system prompt."""
    from app.store import schema

    conn = sqlite3.connect(path)
    for statement in (V7_CONVERSATIONS, _V4_MESSAGES, schema.CREATE_LAYOUT, schema.CREATE_ARENA_VOTES,
                      schema.CREATE_META, *schema.CREATE_INDEXES):
        conn.execute(statement)
    conn.execute(
        """INSERT INTO conversations (id, title, created_at, updated_at, system_prompt, params, model_id,
                                      context_policy, kept_ids) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)""",
        (CONV, "Trip", 100.0, 200.0, "Be brief.", PARAMS, "smollm", "stop", pack_ids([1, 2, 3, 7, 8, 9])),
    )
    conn.executemany(
        "INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (CONV, 0, "user", "Where to?", b"", "complete", None, None, None, None, 101.0, None, None),
            (CONV, 1, "assistant", "Paris.", pack_ids([7, 8, 9]), "complete", "smollm", PARAMS, STATS, None, 102.0,
             6, None),
        ],
    )
    conn.execute(
        "INSERT INTO arena_votes (arena_id, created_at, prompt, outcome, winner, sides) VALUES (?, ?, ?, ?, ?, ?)",
        (CONV, 103.0, "Where to?", "tie", None, "[]"),
    )
    conn.execute("INSERT INTO meta VALUES ('session', 'clean')")
    conn.execute("PRAGMA user_version = 5")
    conn.commit()
    conn.close()


def test_v5_to_v6_keeps_each_replys_system_prompt(tmp_path: Path) -> None:
    from app.store.export import to_markdown

    path = tmp_path / "v5.sqlite3"
    build_v5(path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    migrations.migrate_v5_to_v6(conn)
    conn.execute("COMMIT")
    # Which prompt a v5 reply saw is not known: NULL, never a guess from the conversation's last one.
    rows = conn.execute("SELECT position, text, turn_mark, system_prompt FROM messages ORDER BY position").fetchall()
    assert rows == [(0, "Where to?", None, None), (1, "Paris.", 6, None)]
    assert conn.execute("SELECT prompt, outcome FROM arena_votes").fetchall() == [("Where to?", "tie")]
    conn.close()

    path = tmp_path / "v5-opened.sqlite3"  # the same file, migrated by the store's own open
    build_v5(path)
    with ChatStore.open(path, recover=False) as store:
        assert store.schema_version == SCHEMA_VERSION
        migrated = schema_of(store._conn)
        trip = store.load_conversation(CONV)
        assert [(m.text, m.system_prompt) for m in trip.messages] == [("Where to?", None), ("Paris.", None)]
        assert trip.system_prompt == "Be brief." and trip.kept_ids == [1, 2, 3, 7, 8, 9]
        # A turn after the migration under a new prompt: its reply keeps the prompt it was written under.
        trip.system_prompt = "Answer in French."
        trip.append_user("And then?")
        index = trip.begin_reply(trip.kept_ids + [10])
        trip.end_reply("complete", text="Lyon.", token_ids=[11])
        store.save_conversation(trip)
    with ChatStore.open(path, recover=False) as store:
        again = store.load_conversation(CONV)
    assert [m.system_prompt for m in again.messages] == [None, None, None, "Answer in French."]
    assert index == 3
    # The export does not claim the new prompt for the reply written before it.
    md = to_markdown(again)
    assert "## System prompt of new replies\n\n> Answer in French." in md and "## System prompt\n" not in md
    assert md.index("Paris.") < md.index("*System prompt not known") < md.index("Lyon.") < md.index(
        "*System prompt: “Answer in French.”*")
    fresh = sqlite3.connect(":memory:")
    create_schema(fresh)
    assert migrated == schema_of(fresh)


def test_v7_to_v8_leaves_thinking_on_and_then_keeps_the_switch(tmp_path: Path) -> None:
    path = tmp_path / "v5.sqlite3"
    build_v5(path)  # migrated through v7 to v8 by the store's own open
    with ChatStore.open(path, recover=False) as store:
        trip = store.load_conversation(CONV)
        assert store.schema_version == SCHEMA_VERSION and trip.thinking  # as every older chat had it
        trip.thinking = False  # "Think before answering" switched off in the pane
        store.save_conversation(trip)
    with ChatStore.open(path, recover=False) as store:
        assert store.load_conversation(CONV).thinking is False
