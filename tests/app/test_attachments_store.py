"""Documents attached to messages in the chat store (real SQLite files): saved, restored,
kept by forks and versions, migrated from schema 6, exported and found by search."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from app.store import schema
from app.store.chat_store import SCHEMA_VERSION, ChatStore
from app.store.export import ChatImportError, from_json, to_json, to_markdown
from app.workspace.conversation import Conversation
from engine.documents import Document, document_from_bytes, user_message_with_documents
from tests.app.test_store_migrations import V7_CONVERSATIONS
from tests.app.test_store_migrations import schema_of

NOTES = document_from_bytes("notes.md", b"# Plan\n\nThe lantern festival starts at dusk.\n\nBring a `coat`.")
TABLE = Document(name="table.csv", text="city,visits\nKyoto,3", kind="csv", size=20, sha256="ab" * 32, pages=None,
                 complete=False)


def conversation_with_documents() -> Conversation:
    conv = Conversation(title="Trip")
    conv.append_user("What do these say?", [NOTES, TABLE])
    conv.begin_reply([1, 2, 3])
    conv.end_reply("complete", text="A festival.", token_ids=[4, 5])
    conv.append_user("And the weather?")
    conv.begin_reply(conv.kept_ids + [6])
    conv.end_reply("complete", text="Cold.", token_ids=[7])
    return conv


def attachment_rows(path: Path) -> list[tuple]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(
            "SELECT conversation_id, message_position, position, name FROM attachments ORDER BY 1, 2, 3"
        ).fetchall()
    finally:
        conn.close()


def test_attachments_are_saved_restored_and_cut_back_with_their_message(tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"
    conv = conversation_with_documents()
    # The model reads the documents before the question, in the one stable form.
    assert conv.chat_messages()[0]["content"] == user_message_with_documents("What do these say?", [NOTES, TABLE])
    with ChatStore.open(path) as store:
        store.save_conversation(conv)
    with ChatStore.open(path) as store:
        restored = store.load_conversation(conv.id)
    assert restored.messages[0].text == "What do these say?"
    assert restored.messages[0].attachments == (NOTES, TABLE)  # every field, `complete` False included
    assert [m.attachments for m in restored.messages[1:]] == [(), (), ()]
    assert restored.chat_messages() == conv.chat_messages()
    assert attachment_rows(path) == [(conv.id, 0, 0, "notes.md"), (conv.id, 0, 1, "table.csv")]

    # A fork carries them; regenerating the first reply keeps them with the version set aside.
    fork = restored.fork(1)
    assert fork.messages[0].attachments == (NOTES, TABLE)
    restored.set_version_aside(1)
    restored.begin_reply([1, 2, 3])
    restored.end_reply("complete", text="Lanterns.", token_ids=[8])
    with ChatStore.open(path) as store:
        store.save_conversation(restored)
        store.save_conversation(fork)
        again = store.load_conversation(restored.id)
        assert store.load_conversation(fork.id).messages[0].attachments == (NOTES, TABLE)
    assert again.messages[0].attachments == (NOTES, TABLE)
    again.show_version(1, 0)  # the first version: the conversation as it was, its later question too
    assert [m.text for m in again.messages] == ["What do these say?", "A festival.", "And the weather?", "Cold."]

    # Cutting the conversation back removes the attachments of the messages it drops.
    with ChatStore.open(path) as store:
        store.truncate(conv.id, 0)
        assert store.load_conversation(conv.id).messages == []
    assert attachment_rows(path) == [(fork.id, 0, 0, "notes.md"), (fork.id, 0, 1, "table.csv")]


def test_a_schema_6_store_gains_the_attachments_table(tmp_path: Path) -> None:
    path = tmp_path / "v6.sqlite3"
    conn = sqlite3.connect(path)
    for statement in (V7_CONVERSATIONS, schema.CREATE_MESSAGES, schema.CREATE_LAYOUT,
                      schema.CREATE_ARENA_VOTES, schema.CREATE_META, *schema.CREATE_INDEXES):
        conn.execute(statement)
    conn.execute("INSERT INTO conversations (id, title, created_at, updated_at) VALUES ('c', 'Old', 1.0, 2.0)")
    conn.execute("""INSERT INTO messages (conversation_id, position, role, text, state, created_at)
                    VALUES ('c', 0, 'user', 'Hello', 'complete', 1.5)""")
    conn.execute("PRAGMA user_version = 6")
    conn.commit()
    conn.close()
    with ChatStore.open(path, recover=False) as store:
        assert store.schema_version == SCHEMA_VERSION == 8
        old = store.load_conversation("c")
        assert [(m.text, m.attachments) for m in old.messages] == [("Hello", ())]
        old.append_user("Now with a file", [NOTES])
        store.save_conversation(old)
        assert store.load_conversation("c").messages[1].attachments == (NOTES,)
        migrated = schema_of(store._conn)
    fresh = sqlite3.connect(":memory:")
    schema.create_schema(fresh)
    assert migrated == schema_of(fresh)


def test_export_json_and_markdown_carry_the_documents() -> None:
    conv = conversation_with_documents()
    data = json.loads(json.dumps(to_json(conv)))
    first = data["conversation"]["messages"][0]
    assert first["text"] == "What do these say?"
    assert [a["name"] for a in first["attachments"]] == ["notes.md", "table.csv"]
    assert first["attachments"][1] == {"name": "table.csv", "kind": "csv", "size": 20, "sha256": "ab" * 32,
                                       "pages": None, "complete": False, "text": "city,visits\nKyoto,3"}
    assert "attachments" not in data["conversation"]["messages"][1]
    assert from_json(data).messages[0].attachments == (NOTES, TABLE)

    md = to_markdown(conv)
    assert "<summary>Attached: notes.md (" in md and "Bring a `coat`." in md
    assert "<summary>Attached: table.csv (20 bytes, first part only)</summary>" in md
    assert md.index("What do these say?") < md.index("Attached: notes.md") < md.index("A festival.")

    first["attachments"][0]["size"] = "big"
    with pytest.raises(ChatImportError, match=r"Message 1: an attachment's 'size' must be a whole number"):
        from_json(data)


def test_search_finds_text_inside_an_attachment_and_names_it(tmp_path: Path) -> None:
    with ChatStore.open(tmp_path / "chats.sqlite3") as store:
        conv = conversation_with_documents()
        store.save_conversation(conv)
        other = Conversation(title="Lanterns elsewhere")
        other.append_user("Where are the lanterns?")
        store.save_conversation(other)

        [hit] = store.list_conversations("festival STARTS")
        assert (hit.id, hit.found_in_attachment) == (conv.id, "notes.md")
        assert hit.preview == "Found in the attached notes.md"
        # A match in the messages or title shows as before, the document not named.
        assert {(s.id, s.found_in_attachment) for s in store.list_conversations("lantern")} == {
            (conv.id, "notes.md"), (other.id, None)}
        assert [(s.id, s.found_in_attachment) for s in store.list_conversations("weather")] == [(conv.id, None)]
        assert [s.found_in_attachment for s in store.list_conversations("table.csv")] == ["table.csv"]
        assert store.list_conversations("nowhere at all") == []
