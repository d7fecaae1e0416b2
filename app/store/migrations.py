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

A step that moves data out of the store (v2 -> v3: remote panes' API keys)
takes the `Secrets` to move it to as its second argument; the others ignore
it.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Callable
from typing import TYPE_CHECKING

from app.store.records import pack_ids
from app.store.schema import SCHEMA_VERSION

if TYPE_CHECKING:
    from app.secrets import Secrets

log = logging.getLogger(__name__)

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


def migrate_v1_to_v2(conn: sqlite3.Connection, secrets: Secrets | None = None) -> None:
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


# -- v2 -> v3 ---------------------------------------------------------------------

_V3_LAYOUT = """
CREATE TABLE layout_v3 (
    position INTEGER PRIMARY KEY NOT NULL,
    conversation_id TEXT NOT NULL,
    title TEXT NOT NULL DEFAULT '',
    remote_base_url TEXT,
    remote_model TEXT,
    remote_key_id TEXT,
    width INTEGER
)"""


def migrate_v2_to_v3(conn: sqlite3.Connection, secrets: Secrets | None = None) -> None:
    """Remote panes' API keys out of the store: each goes to `secrets` (default:
    app.secrets.default_secrets(), the OS keyring or a 0600 file) and the
    layout keeps its id in remote_key_id instead.

    The layout table is rebuilt without the plain-text column; the connection
    runs with secure_delete (app.store.connection), so the freed pages that
    held the keys are zeroed, not left readable in the file. A key the
    secret store refuses is dropped with a warning (the pane asks for it
    again) rather than keeping every chat from opening.
    """
    rows = conn.execute(
        """SELECT position, conversation_id, title, remote_base_url, remote_model, remote_api_key, width
           FROM layout ORDER BY position"""
    ).fetchall()
    moved = []
    for position, conversation_id, title, base_url, model, key, width in rows:
        key_id = None
        if key:
            from app.secrets import REMOTE_PANE_PREFIX, SecretStoreError, default_secrets

            if secrets is None:
                secrets = default_secrets()
            # The same id when a failed migration is tried again: no stray copies.
            key_id = f"{REMOTE_PANE_PREFIX}v2-{conversation_id}-{position}"
            try:
                secrets.set(key_id, key)
            except SecretStoreError as exc:
                log.warning("a remote pane's API key could not be moved out of the chat store: %s", exc)
                key_id = None
        moved.append((position, conversation_id, title, base_url, model, key_id, width))
    conn.execute(_V3_LAYOUT)
    conn.executemany(
        """INSERT INTO layout_v3 (position, conversation_id, title, remote_base_url, remote_model,
                                  remote_key_id, width) VALUES (?, ?, ?, ?, ?, ?, ?)""",
        moved,
    )
    # Blank the keys before dropping the table: with secure_delete the cells are zeroed in place.
    conn.execute("UPDATE layout SET remote_api_key = NULL")
    conn.execute("DROP TABLE layout")
    conn.execute("ALTER TABLE layout_v3 RENAME TO layout")


# -- v3 -> v4 ---------------------------------------------------------------------


def migrate_v3_to_v4(conn: sqlite3.Connection, secrets: Secrets | None = None) -> None:
    """Reply versions: messages gain a `versions` column (NULL: a reply with
    one version, which every v3 reply is). ADD COLUMN appends it after
    turn_mark, where the v4 table declares it."""
    conn.execute("ALTER TABLE messages ADD COLUMN versions TEXT")


# -- v4 -> v5 ---------------------------------------------------------------------

_V5_ARENA_VOTES = """
CREATE TABLE arena_votes (
    id INTEGER PRIMARY KEY NOT NULL,
    arena_id TEXT,
    created_at REAL NOT NULL,
    prompt TEXT NOT NULL,
    outcome TEXT NOT NULL,
    winner TEXT,
    sides TEXT NOT NULL
)"""


def migrate_v4_to_v5(conn: sqlite3.Connection, secrets: Secrets | None = None) -> None:
    """The blind arena's votes: a new, empty arena_votes table (no v4 data changes)."""
    conn.execute(_V5_ARENA_VOTES)


# -- v5 -> v6 ---------------------------------------------------------------------


def migrate_v5_to_v6(conn: sqlite3.Connection, secrets: Secrets | None = None) -> None:
    """Each reply's system prompt: messages gain a `system_prompt` column,
    appended after versions, where the v6 table declares it. Every v5 row
    gets NULL: a v5 store kept one system prompt per conversation, the one
    it had last, so which prompt an older reply was written under is not
    known, and guessing the last one would be wrong exactly where it matters
    (a prompt set midway)."""
    conn.execute("ALTER TABLE messages ADD COLUMN system_prompt TEXT")


# -- v6 -> v7 ---------------------------------------------------------------------

_V7_ATTACHMENTS = """
CREATE TABLE attachments (
    conversation_id TEXT NOT NULL,
    message_position INTEGER NOT NULL,
    position INTEGER NOT NULL,
    name TEXT NOT NULL,
    kind TEXT NOT NULL,
    size INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    pages INTEGER,
    complete INTEGER NOT NULL,
    text TEXT NOT NULL,
    PRIMARY KEY (conversation_id, message_position, position),
    FOREIGN KEY (conversation_id, message_position) REFERENCES messages (conversation_id, position)
        ON DELETE CASCADE
)"""


def migrate_v6_to_v7(conn: sqlite3.Connection, secrets: Secrets | None = None) -> None:
    """Documents attached to messages: a new, empty attachments table (no v6 message had one)."""
    conn.execute(_V7_ATTACHMENTS)


def migrate_v7_to_v8(conn: sqlite3.Connection, secrets: Secrets | None = None) -> None:
    """The pane's "Think before answering", saved with its conversation: on, as every chat had it."""
    conn.execute("ALTER TABLE conversations ADD COLUMN thinking INTEGER NOT NULL DEFAULT 1")


# -- the steps, in order -------------------------------------------------------------

# A step takes the store's connection and the secrets a step may move data to.
Step = Callable[[sqlite3.Connection, "Secrets | None"], None]

# STEPS[v] takes a store of version v to version v + 1.
STEPS: dict[int, Step] = {
    1: migrate_v1_to_v2,
    2: migrate_v2_to_v3,
    3: migrate_v3_to_v4,
    4: migrate_v4_to_v5,
    5: migrate_v5_to_v6,
    6: migrate_v6_to_v7,
    7: migrate_v7_to_v8,
}

# Every version from the first to the current one has its step: a gap would
# leave stores of that version unopenable.
assert sorted(STEPS) == list(range(1, SCHEMA_VERSION)), "one migration step per schema version"


def migrate(conn: sqlite3.Connection, version: int, secrets: Secrets | None = None) -> int:
    """Apply every step from `version` to SCHEMA_VERSION, in order; returns the version reached.

    Runs inside the caller's transaction and sets no `user_version`: the
    caller does, once the whole migration has succeeded. `secrets`: where
    secrets found in an old store go (default: app.secrets.default_secrets()).
    """
    if not 1 <= version <= SCHEMA_VERSION:
        raise ValueError(f"There is no migration from schema version {version}")
    while version < SCHEMA_VERSION:
        STEPS[version](conn, secrets)
        version += 1
    return version
