"""The chat store's migrations: one function per schema version step, applied in order.

`STEPS[v]` takes a store of version v to version v + 1. Each step runs
inside the one transaction `migrate` is called in (app.store.connection
opens it with foreign keys off, checks them after, and sets the new
`user_version`), so a store is either migrated all the way or left as it
was.

A step writes out the tables of the version it produces in full, as they
were at that version, instead of importing app.store.schema: the current
schema moves on, and a step must keep producing the version it names.
tests/app/test_store_migrations.py builds a store of every old version,
migrates it with its data, and checks the result has exactly the current
schema.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable

from app.store.records import pack_ids
from app.store.schema import SCHEMA_VERSION

# -- v1 -> v2 ---------------------------------------------------------------------

_V2_CONVERSATIONS = """
CREATE TABLE conversations_v2 (
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

_V2_MESSAGES = """
CREATE TABLE messages_v2 (
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

_V2_LAYOUT = """
CREATE TABLE layout (
    position INTEGER PRIMARY KEY NOT NULL,
    conversation_id TEXT NOT NULL,
    title TEXT NOT NULL DEFAULT '',
    remote_base_url TEXT,
    remote_model TEXT,
    remote_api_key TEXT,
    width INTEGER
)"""


def _json_ids_to_blob(text: str | bytes | None) -> bytes:
    """Token ids from v1's JSON text to v2's packed int32 (nothing for a value that is not a list of ints)."""
    if isinstance(text, bytes):
        return text
    try:
        ids = json.loads(text or "[]")
        if isinstance(ids, list) and all(isinstance(i, int) and -(2**31) <= i < 2**31 for i in ids):
            return pack_ids(ids)
    except (ValueError, TypeError):
        pass
    return b""


def migrate_v1_to_v2(conn: sqlite3.Connection) -> None:
    """Token ids as packed BLOBs, the context policy, soft delete, each reply's model and sampling, the layout.

    Both tables are rebuilt (SQLite cannot change a column's type in place).
    A v1 reply gets its conversation's model (v1 had one model per
    conversation); its sampling parameters are unknown (NULL). v1's meta
    table, with the session flag, is kept as it is.
    """
    conn.create_function("tandem_ids_blob", 1, _json_ids_to_blob, deterministic=True)
    conn.execute(_V2_CONVERSATIONS)
    conn.execute(
        """INSERT INTO conversations_v2 (id, title, created_at, updated_at, system_prompt, params,
                                         model_id, context_policy, kept_ids, deleted_at)
           SELECT id, title, created_at, updated_at, system_prompt, params,
                  model_id, 'stop', tandem_ids_blob(kept_ids), NULL
           FROM conversations"""
    )
    conn.execute(_V2_MESSAGES)
    conn.execute(
        """INSERT INTO messages_v2 (conversation_id, position, role, text, token_ids, state, model_id,
                                    params, stats, error, created_at, turn_mark)
           SELECT m.conversation_id, m.position, m.role, m.text, tandem_ids_blob(m.token_ids), m.state,
                  CASE WHEN m.role = 'assistant' THEN c.model_id END,
                  NULL, m.stats, m.error, m.created_at, m.turn_mark
           FROM messages AS m JOIN conversations AS c ON c.id = m.conversation_id"""
    )
    conn.execute("DROP TABLE messages")
    conn.execute("DROP TABLE conversations")
    conn.execute("ALTER TABLE conversations_v2 RENAME TO conversations")
    conn.execute("ALTER TABLE messages_v2 RENAME TO messages")
    conn.execute("CREATE INDEX conversations_by_update ON conversations (updated_at DESC)")
    conn.execute(_V2_LAYOUT)
    conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL)")


# -- the steps, in order -------------------------------------------------------------

Step = Callable[[sqlite3.Connection], None]

# STEPS[v] takes a store of version v to version v + 1.
STEPS: dict[int, Step] = {
    1: migrate_v1_to_v2,
}

# Every version from the first to the current one has its step: a gap would
# leave stores of that version unopenable.
assert sorted(STEPS) == list(range(1, SCHEMA_VERSION)), "one migration step per schema version"


def migrate(conn: sqlite3.Connection, version: int) -> int:
    """Apply every step from `version` to SCHEMA_VERSION, in order; returns the version reached.

    Runs inside the caller's transaction and sets no `user_version`: the
    caller does, once the whole migration has succeeded.
    """
    if not 1 <= version <= SCHEMA_VERSION:
        raise ValueError(f"There is no migration from schema version {version}")
    while version < SCHEMA_VERSION:
        STEPS[version](conn)
        version += 1
    return version
