"""The chat store's current schema: its version and the statements that create it.

The version is SQLite's `PRAGMA user_version`. A new store is created from
these statements directly; an older one is brought here step by step by
app.store.migrations. Changing the schema means: bump SCHEMA_VERSION, change
the statements below, and add the one migration step from the previous
version (tests/app/test_store_migrations.py checks that a migrated store
ends up with exactly the schema a new one has).

Schema history
--------------
v1  conversations(id, title, created_at, updated_at, system_prompt, params,
    model_id, kept_ids TEXT json), messages(conversation_id, position, role,
    text, token_ids TEXT json, state, stats, error, created_at, turn_mark),
    meta(key, value). One model per conversation, token ids as JSON text.
v2  token ids packed as little-endian int32 BLOBs (4 bytes a token instead
    of ~6 characters, no JSON parse on load); conversations gain
    context_policy and deleted_at (soft delete, undoable); messages gain
    model_id and params (each reply remembers the model and sampling that
    wrote it; v1 replies get their conversation's model, params unknown);
    the layout table (the panes that were open).
v3  the layout keeps a remote pane's API key out of the file: remote_api_key
    gives way to remote_key_id, the key's id in app.secrets (the OS keyring
    or a 0600 file); v2's plain-text keys are moved there.
v4  messages gain versions: for a reply that regenerate or edit-and-resend
    made again, the turn's other versions (JSON, app.store.records
    `versions_to_dict`: each version's messages, the user text it answers
    and its kept token ids); NULL for every other message.
v5  arena_votes: one row per blind-arena vote (app.arena.votes): the
    prompt, the outcome ("win", "tie", "both_bad"), the winning label, and
    the sides as JSON (app.arena.votes `sides_to_json`: each side's label,
    model, settings and reply). Not tied to a conversation: deleting a chat
    keeps its votes on the leaderboard.
v6  messages gain system_prompt: the system prompt a reply was written
    under ('' for none), so a prompt set midway is known to apply to the
    replies after it only; NULL for a user message or a notice, and for a
    reply stored before v6 (which prompt it saw is not known).
v7  attachments: the documents sent with a user message (engine.documents
    Document), one row each in the order they were attached: the file's
    name, kind, size and SHA-256, its pages, whether the text is whole
    (`complete` 0: only its first part was kept or sent) and the extracted
    text, never the file's bytes. Keyed by the message's (conversation_id,
    position); deleting or cutting back the messages deletes them.
v8  conversations gain thinking: the pane's "Think before answering" (1 on,
    0 off), for a model whose template has the switch; on for older chats.
"""

from __future__ import annotations

import sqlite3

SCHEMA_VERSION = 8

CREATE_CONVERSATIONS = """
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
    deleted_at REAL,
    thinking INTEGER NOT NULL DEFAULT 1
)"""

CREATE_MESSAGES = """
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
    system_prompt TEXT,
    PRIMARY KEY (conversation_id, position)
)"""

CREATE_LAYOUT = """
CREATE TABLE layout (
    position INTEGER PRIMARY KEY NOT NULL,
    conversation_id TEXT NOT NULL,
    title TEXT NOT NULL DEFAULT '',
    remote_base_url TEXT,
    remote_model TEXT,
    remote_key_id TEXT,
    width INTEGER
)"""

CREATE_ARENA_VOTES = """
CREATE TABLE arena_votes (
    id INTEGER PRIMARY KEY NOT NULL,
    arena_id TEXT,
    created_at REAL NOT NULL,
    prompt TEXT NOT NULL,
    outcome TEXT NOT NULL,
    winner TEXT,
    sides TEXT NOT NULL
)"""

CREATE_ATTACHMENTS = """
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

CREATE_META = "CREATE TABLE meta (key TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL)"

CREATE_INDEXES = ("CREATE INDEX conversations_by_update ON conversations (updated_at DESC)",)


def create_schema(conn: sqlite3.Connection) -> None:
    """Create the current schema's tables in an empty database (inside the caller's transaction)."""
    for statement in (
        CREATE_CONVERSATIONS, CREATE_MESSAGES, CREATE_ATTACHMENTS, CREATE_LAYOUT, CREATE_ARENA_VOTES, CREATE_META,
        *CREATE_INDEXES,
    ):
        conn.execute(statement)
