"""The chat store on real SQLite files: round trips, migration, damage, full and read-only disks."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.store import chat_store
from app.store import export as chat_export
from app.store.chat_store import (
    SCHEMA_VERSION,
    ChatStore,
    DiskFullError,
    NewerStoreError,
    PaneLayout,
    ReadOnlyStoreError,
    StoreError,
    UnknownConversationError,
    header_record,
)
from app.workspace.conversation import Conversation
from tests.app.fixtures.chats import assert_same, build_conversation, run_unprivileged

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "data" / "chats.sqlite3"


@pytest.fixture
def store(path: Path) -> Iterator[ChatStore]:
    s = ChatStore.open(path)
    yield s
    s.close()


def reopen(store: ChatStore) -> ChatStore:
    store.close()
    return ChatStore.open(store.path)


def rows(path: Path, sql: str) -> list[tuple]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def test_new_store_settings(store: ChatStore, path: Path) -> None:
    assert path.is_file()
    assert store.schema_version == SCHEMA_VERSION
    assert store.open_warning is None and store.crashed_last_time is False
    conn = store._conn
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] >= 1000


def test_round_trip_of_every_field(store: ChatStore) -> None:
    conv = build_conversation()
    assert conv.turn_marks[1] is not None and conv.messages[2].role == "notice"
    store.save_conversation(conv)
    store = reopen(store)
    loaded = store.load_conversation(conv.id)
    assert_same(conv, loaded)
    assert [(m.role, m.state) for m in loaded.messages] == [
        ("user", "complete"), ("assistant", "complete"), ("notice", "complete"), ("user", "complete"),
        ("assistant", "stopped"), ("user", "complete"), ("assistant", "error"),
    ]
    assert loaded.messages[4].params == conv.messages[4].params != conv.messages[1].params
    # Token ids are stored packed as little-endian int32.
    blob = store._conn.execute(
        "SELECT token_ids FROM messages WHERE conversation_id = ? AND position = 1", (conv.id,)
    ).fetchone()[0]
    assert blob == b"".join(i.to_bytes(4, "little") for i in (10, 11, 12, 2))
    store.close()


def test_each_reply_keeps_its_system_prompt(store: ChatStore) -> None:
    conv = Conversation(title="Prompts")
    for question, system in (("Hi", ""), ("Again", ""), ("And now?", "Be brief.")):
        conv.system_prompt = system
        conv.append_user(question)
        store.save_conversation(conv)
        # As the recorder writes a turn: a checkpoint while the reply streams, then the reply.
        index = conv.begin_reply(conv.kept_ids + [1])
        store.save_message(conv.id, index, conv.messages[index])
        conv.end_reply("complete", text=f"Reply to {question}", token_ids=[2])
        store.save_reply(conv, index)
    store = reopen(store)
    loaded = store.load_conversation(conv.id)
    assert [m.system_prompt for m in loaded.messages] == [None, "", None, "", None, "Be brief."]
    assert rows(store.path, "SELECT position, system_prompt FROM messages WHERE role = 'assistant'") == [
        (1, ""), (3, ""), (5, "Be brief."),
    ]
    # The reopened chat's export says where the prompt set midway took effect, as the live one does.
    md = chat_export.to_markdown(loaded)
    assert md == chat_export.to_markdown(conv)
    assert "## System prompt of new replies\n\n> Be brief." in md
    assert md.index("Reply to Hi") < md.index("*No system prompt*") < md.index("Reply to And now?") < md.index(
        "*System prompt: “Be brief.”*")
    # Regenerated under another prompt: the version set aside keeps the one it was written under.
    loaded.set_version_aside(5)
    loaded.system_prompt = "Be briefer."
    loaded.begin_reply(loaded.kept_ids + [1])
    loaded.end_reply("complete", text="Yes.", token_ids=[2])
    store.save_conversation(loaded)
    store = reopen(store)
    again = store.load_conversation(conv.id)
    store.close()
    versions = again.messages[5].versions
    assert again.messages[5].system_prompt == "Be briefer."
    assert versions is not None and versions.versions[0] is not None
    assert versions.versions[0].messages[0].system_prompt == "Be brief."


def test_checkpoint_then_final_write(store: ChatStore) -> None:
    conv = Conversation(title="Streaming")
    conv.append_user("Tell me a story")
    store.save_conversation(conv)
    index = conv.begin_reply([1, 2, 3])
    conv.add_reply_delta("Once upon", [7, 8])
    store.save_message(conv.id, index, conv.messages[index])  # a checkpoint
    conv.add_reply_delta(" a time", [9])

    # What a crash right now would leave: the reply as far as the checkpoint, interrupted.
    other = ChatStore.open(store.path, recover=False)
    interrupted = other.load_conversation(conv.id)
    assert interrupted.messages[index].text == "Once upon"
    assert interrupted.messages[index].state == "interrupted"
    assert interrupted.kept_ids == []

    conv.end_reply("complete", text="Once upon a time.", token_ids=[7, 8, 9, 2])
    store.save_reply(conv, index)
    final = other.load_conversation(conv.id)
    assert_same(conv, final)
    assert final.kept_ids == [1, 2, 3, 7, 8, 9, 2] and final.turn_marks == [None, 7]
    other.close()


def test_truncate_and_shorter_save(store: ChatStore) -> None:
    conv = build_conversation()
    store.save_conversation(conv)
    conv.truncate(2)
    store.truncate(conv.id, 2, header=header_record(conv))
    assert_same(conv, store.load_conversation(conv.id))

    longer = build_conversation()
    store.save_conversation(longer)
    longer.truncate(4)
    store.save_conversation(longer)  # deletes the stored messages past the end
    assert_same(longer, store.load_conversation(longer.id))
    assert rows(store.path, f"SELECT count(*) FROM messages WHERE conversation_id = '{longer.id}'") == [(4,)]


def test_search_titles_and_text_newest_first(store: ChatStore) -> None:
    def saved(title: str, *texts: str) -> str:
        conv = Conversation(title=title)
        for text in texts:
            conv.append_user(text)
        store.save_conversation(conv)
        return conv.id

    trip = saved("Trip to Lyon", "Où aller cet ÉTÉ ?")
    budget = saved("Budget", "Cut costs by 100% now")
    other = saved("Other", "1000 reasons", "a snake_case name")
    gone = saved("Deleted trip", "été")
    store.delete(gone)

    assert [s.id for s in store.list_conversations()] == [other, budget, trip]  # newest first
    assert [s.id for s in store.list_conversations("trip")] == [trip]  # a title
    assert [s.id for s in store.list_conversations("été")] == [trip]  # message text, case folded beyond ASCII
    assert [s.id for s in store.list_conversations("100%")] == [budget]  # % is literal, not a wildcard
    assert [s.id for s in store.list_conversations("e_c")] == [other]  # _ too: it matches "e_c" only
    assert store.list_conversations("e%c") == []
    assert store.list_conversations("nowhere") == []
    summary = store.list_conversations("snake")[0]
    assert (summary.title, summary.message_count, summary.model_id, summary.preview) == (
        "Other", 2, "default", "a snake_case name"
    )
    # A reasoning reply is previewed by its answer, or by its reasoning, untagged, where that is all there is.
    assert chat_store._collapse("<think>\nHmm.\n</think>\n\nA bicycle for two.") == "A bicycle for two."
    assert chat_store._collapse("<think>\nThey ask about a kind of") == "They ask about a kind of"

    conv = store.load_conversation(trip)
    conv.append_user("More")
    store.save_message(conv.id, 1, conv.messages[1])  # a change moves it to the top
    assert store.list_conversations()[0].id == trip


def test_rename(store: ChatStore) -> None:
    conv = build_conversation()
    store.save_conversation(conv)
    store.rename(conv.id, "Kyoto")
    assert store.load_conversation(conv.id).title == "Kyoto"
    assert store.list_conversations()[0].title == "Kyoto"
    with pytest.raises(UnknownConversationError, match="no saved conversation"):
        store.rename("f" * 32, "x")


def test_delete_undelete_and_purge(store: ChatStore) -> None:
    keep, drop = build_conversation("keep"), build_conversation("drop")
    store.save_conversation(keep)
    store.save_conversation(drop)
    store.delete(drop.id)
    assert [s.id for s in store.list_conversations()] == [keep.id]
    assert [s.id for s in store.list_conversations(deleted=True)] == [drop.id]
    assert store.is_deleted(drop.id)
    store.undelete(drop.id)
    assert {s.id for s in store.list_conversations()} == {keep.id, drop.id}

    store.delete(drop.id)
    assert store.purge_deleted() == 1
    with pytest.raises(UnknownConversationError):
        store.load_conversation(drop.id)
    assert rows(store.path, f"SELECT count(*) FROM messages WHERE conversation_id = '{drop.id}'") == [(0,)]
    assert_same(keep, store.load_conversation(keep.id))


def test_layout(store: ChatStore) -> None:
    assert store.load_layout() == []
    a, b = build_conversation("a"), build_conversation("b")
    store.save_conversation(a)
    store.save_conversation(b)
    panes = [
        PaneLayout(a.id, "Pane 1", width=640),
        PaneLayout(b.id, "Remote", "http://localhost:8080/v1", "llama-3", "sk-secret", None),
    ]
    store.save_layout(panes)
    store = reopen(store)
    assert store.load_layout() == panes
    assert "sk-secret" not in repr(panes[1])
    store.save_layout(panes[1:])
    assert store.load_layout() == panes[1:]
    store.close()


def test_clean_exit_flag(path: Path) -> None:
    with ChatStore.open(path) as store:
        assert not store.crashed_last_time
        store.mark_session_start()
    with ChatStore.open(path) as store:
        assert store.crashed_last_time  # started, never marked clean
        store.mark_session_start()
        store.mark_clean_exit()
    with ChatStore.open(path) as store:
        assert not store.crashed_last_time


def test_a_killed_process_leaves_its_last_checkpoint(path: Path) -> None:
    """SIGKILL right after a checkpoint: the next open says it crashed and has the reply as interrupted."""
    # Records rather than a Conversation: the child then starts without torch.
    script = textwrap.dedent(
        f"""
        import os, signal, time
        from app.store.chat_store import ChatStore, HeaderRecord, MessageRecord, pack_ids
        store = ChatStore.open({str(path)!r})
        store.mark_session_start()
        header = HeaderRecord("k" * 32, "killed", time.time(), "", "{{}}", "default", "stop", b"")
        user = MessageRecord(0, "user", "Count to ten", b"", "complete", None, None, None, None, time.time(), None)
        store.write_conversation(header, [user])
        reply = MessageRecord(1, "assistant", "one two three", pack_ids([5, 6, 7]), "streaming", "default",
                              None, None, None, time.time(), None)
        store.write_message(header.id, reply)  # the checkpoint
        print(header.id, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == -9, done.stderr
    conv_id = done.stdout.strip()
    with ChatStore.open(path) as store:
        assert store.crashed_last_time and store.open_warning is None
        conv = store.load_conversation(conv_id)
        assert [(m.text, m.state) for m in conv.messages] == [
            ("Count to ten", "complete"), ("one two three", "interrupted")
        ]
        assert store._conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]


def test_migration_from_version_1(tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"
    shutil.copyfile(FIXTURES / "chats_v1.sqlite3", path)
    assert rows(path, "PRAGMA user_version") == [(1,)]
    with ChatStore.open(path) as store:
        assert store.schema_version == SCHEMA_VERSION == 8 and store.open_warning is None
        assert store.crashed_last_time  # the v1 session flag is kept
        summaries = store.list_conversations()
        assert [(s.title, s.message_count) for s in summaries] == [("Café ünïcode 100%_test", 2), ("Paris trip", 4)]

        paris = store.load_conversation("a1b2c3d4e5f60718293a4b5c6d7e8f90")
        assert paris.system_prompt == "You are a concise travel guide." and paris.model_id == "smollm-folder"
        assert paris.params.stop == ("\n\nUser:",) and paris.params.top_k == 40 and paris.params.seed == 7
        assert paris.context_policy == "stop"
        assert [(m.role, m.text, m.state) for m in paris.messages] == [
            ("user", "What should I see in Paris?", "complete"),
            ("assistant", "The Louvre first.", "complete"),
            ("user", "And after that?", "complete"),
            ("assistant", "Walk along the Se", "interrupted"),  # v1 crashed mid-reply
        ]
        reply = paris.messages[1]
        assert reply.token_ids == [1116, 2, 3, 2] and reply.model_id == "smollm-folder" and reply.params is None
        assert reply.stats is not None and reply.stats.generated_tokens == 4 and reply.stats.ttft_s == 0.125
        assert paris.messages[0].model_id is None
        assert reply.system_prompt is None  # v1 kept the conversation's last prompt only: not known for a reply
        assert paris.turn_marks == [None, 11, None, None]
        assert paris.kept_ids == [1, 9690, 198, 2683, 4, 1116, 2, 1, 520, 9531, 198]
        assert paris.messages[1].created_at == 1_767_225_602.0

        cafe = store.load_conversation("0f1e2d3c4b5a69788796a5b4c3d2e1f0")
        assert cafe.messages[0].text == "Dis bonjour en français ☕"
        assert (cafe.messages[1].state, cafe.messages[1].error) == ("error", "The model ran out of memory.")

        # v2 features work on the migrated data.
        store.delete(cafe.id)
        store.save_layout([PaneLayout(paris.id, "Paris")])
        paris.append_user("Merci")
        store.save_conversation(paris)
    assert rows(path, "PRAGMA integrity_check") == [("ok",)]
    assert rows(path, "SELECT typeof(kept_ids) FROM conversations") == [("blob",), ("blob",)]
    assert rows(path, "PRAGMA foreign_key_check") == []


def test_failed_migration_changes_nothing(tmp_path: Path) -> None:
    """The migration is one transaction: if any step fails the file stays version 1 with its data."""
    path = tmp_path / "chats.sqlite3"
    shutil.copyfile(FIXTURES / "chats_v1.sqlite3", path)
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE conversations_v2 (x)")  # the table the migration creates: it will fail there
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="could not be used"):
        ChatStore.open(path)
    assert rows(path, "PRAGMA user_version") == [(1,)]
    assert rows(path, "SELECT count(*) FROM messages") == [(6,)]
    assert rows(path, "SELECT typeof(token_ids) FROM messages LIMIT 1") == [("text",)]


def _assert_kept_aside(path: Path, store: ChatStore, original: bytes) -> None:
    assert store.open_warning is not None and "kept aside" in store.open_warning
    aside = [p for p in path.parent.iterdir() if p.name.startswith("chats.sqlite3.corrupt-")]
    assert len(aside) == 1 and aside[0].read_bytes() == original
    assert str(aside[0]) in store.open_warning
    assert store.list_conversations() == []
    conv = build_conversation()
    store.save_conversation(conv)  # the new store works
    assert_same(conv, store.load_conversation(conv.id))


def test_garbage_file_is_kept_aside(path: Path) -> None:
    path.parent.mkdir(parents=True)
    garbage = os.urandom(3000)
    path.write_bytes(garbage)
    with ChatStore.open(path) as store:
        _assert_kept_aside(path, store, garbage)
        assert "not a database" in (store.open_warning or "")


def test_truncated_database_is_kept_aside(path: Path) -> None:
    with ChatStore.open(path) as store:
        for n in range(30):
            conv = Conversation(title=f"chat {n}")
            conv.append_user(f"message {n} " + "lorem ipsum " * 300)
            store.save_conversation(conv)
    assert not path.with_name("chats.sqlite3-wal").exists()  # closing checkpointed everything into the file
    data = path.read_bytes()
    assert len(data) > 40_000
    cut = data[: len(data) // 2]
    path.write_bytes(cut)
    with ChatStore.open(path) as store:
        _assert_kept_aside(path, store, cut)


def test_foreign_sqlite_file_is_kept_aside(path: Path) -> None:
    path.parent.mkdir(parents=True)
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (x)")
    conn.commit()
    conn.close()
    original = path.read_bytes()
    with ChatStore.open(path) as store:
        _assert_kept_aside(path, store, original)
        assert "not a Tandem chat store" in (store.open_warning or "")


def test_damaged_store_is_not_moved_without_recover(path: Path) -> None:
    path.parent.mkdir(parents=True)
    path.write_bytes(b"x" * 2000)
    with pytest.raises(StoreError, match="damaged"):
        ChatStore.open(path, recover=False)
    assert path.read_bytes() == b"x" * 2000 and len(list(path.parent.iterdir())) == 1


def test_newer_schema_is_refused_and_untouched(path: Path) -> None:
    with ChatStore.open(path) as store:
        store.save_conversation(build_conversation())
        store._conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(NewerStoreError, match="newer version of Tandem") as info:
        ChatStore.open(path)
    assert info.value.version == SCHEMA_VERSION + 1 and "left untouched" in str(info.value)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    assert not [p for p in path.parent.iterdir() if ".corrupt-" in p.name]


def test_full_disk(store: ChatStore) -> None:
    """SQLite itself reports SQLITE_FULL once the file may not grow; the conversation in memory stays exportable."""
    saved = build_conversation("saved")
    store.save_conversation(saved)
    pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
    store._conn.execute(f"PRAGMA max_page_count = {pages}")
    conv = build_conversation("too big")
    conv.append_user("x" * 200_000)
    with pytest.raises(DiskFullError) as info:
        store.save_conversation(conv)
    message = str(info.value)
    assert message.startswith("The disk is full")
    assert "Your chats are still open; free some space or export them." in message
    # Nothing half-written, the earlier chat intact, the new one still in memory and exportable.
    assert [s.title for s in store.list_conversations()] == ["saved"]
    assert_same(saved, store.load_conversation(saved.id))
    assert "x" * 1000 in chat_export.to_markdown(conv)
    assert_same(conv, chat_export.from_json(chat_export.to_json(conv)), same_id=False, token_ids=False)
    # The disk has room again: the same write goes through.
    store._conn.execute(f"PRAGMA max_page_count = {pages * 1000}")
    store.save_conversation(conv)
    assert_same(conv, store.load_conversation(conv.id))


def test_read_only_connection_reports_read_only(store: ChatStore) -> None:
    conv = build_conversation()
    store.save_conversation(conv)
    store._conn.execute("PRAGMA query_only = ON")  # SQLite refuses every write with SQLITE_READONLY
    with pytest.raises(ReadOnlyStoreError, match="read-only"):
        store.rename(conv.id, "new")
    assert store.load_conversation(conv.id).title == conv.title


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder the unprivileged child can reach (pytest's tmp_path is private to its user)."""
    folder = Path(tempfile.mkdtemp(prefix="tandem-ro-"))
    folder.chmod(0o755)
    yield folder
    for p in [folder, *folder.rglob("*")]:
        if p.is_dir():
            p.chmod(0o755)
    shutil.rmtree(folder)


def test_read_only_data_directory(shared_dir: Path) -> None:
    empty = shared_dir / "empty"
    empty.mkdir()
    existing = shared_dir / "existing"
    existing.mkdir()
    conv = build_conversation()
    with ChatStore.open(existing / "chats.sqlite3") as store:
        store.save_conversation(conv)
    for folder in (empty, existing):
        folder.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)

    def attempt(path: Path) -> tuple[str, str]:
        try:
            ChatStore.open(path).close()
        except StoreError as exc:
            return type(exc).__name__, str(exc)
        return "opened", ""

    for folder in (empty, existing):
        kind, message = run_unprivileged(lambda: attempt(folder / "chats.sqlite3"))
        assert kind == ReadOnlyStoreError.__name__, message
        assert "read-only" in message and "export them" in message
    assert not (empty / "chats.sqlite3").exists()
    # Nothing was lost: the conversation in memory exports as before.
    assert "Temples and tea." in chat_export.to_markdown(conv)


def test_read_only_file_in_writable_folder(shared_dir: Path) -> None:
    """The store opens (the chats can be read and exported); the first write says it is read-only."""
    path = shared_dir / "chats.sqlite3"
    conv = build_conversation()
    with ChatStore.open(path) as store:
        store.save_conversation(conv)
    path.chmod(0o444)
    shared_dir.chmod(0o777)

    def attempt() -> tuple[str, str, str]:
        store = ChatStore.open(path)
        text = chat_export.to_markdown(store.load_conversation(conv.id))
        try:
            store.mark_session_start()
        except StoreError as exc:
            return type(exc).__name__, str(exc), text
        finally:
            store.close()
        return "written", "", text

    kind, message, text = run_unprivileged(attempt)
    assert kind == ReadOnlyStoreError.__name__ and "read-only" in message
    assert "Temples and tea." in text


def test_updated_is_the_newest_message_not_the_last_write(store: ChatStore) -> None:
    """A conversation's update time (the sidebar's and `tandem chats list`'s)
    is its newest message's: the writes that change no message (a model
    that loads saves every open pane's header, a chat opened into a pane is
    saved whole again) neither change it nor move the chat up the list."""
    from unittest import mock

    older, newer = Conversation(title="Older"), Conversation(title="Newer")
    for conv, when in ((older, 1_000.0), (newer, 2_000.0)):
        conv.created_at = when - 10
        conv.append_user("Hello")
        conv.begin_reply([1])
        conv.add_reply_delta("Hi", [2])
        conv.end_reply("complete")
        for message in conv.messages:
            message.created_at = when
        with mock.patch("app.store.chat_store.time.time", return_value=when + 5):
            store.save_conversation(conv)
    assert [(s.title, s.updated_at) for s in store.list_conversations()] == [("Newer", 2_000.0), ("Older", 1_000.0)]

    with mock.patch("app.store.chat_store.time.time", return_value=9_000.0):
        store.save_header(older)  # what a model load does to every open pane's conversation
        store.save_conversation(older)  # what opening it into a pane does
    assert [(s.title, s.updated_at) for s in store.list_conversations()] == [("Newer", 2_000.0), ("Older", 1_000.0)]

    older.append_user("Still there?")
    older.messages[-1].created_at = 3_000.0
    with mock.patch("app.store.chat_store.time.time", return_value=9_100.0):
        store.save_message(older.id, len(older.messages) - 1, older.messages[-1])
    assert [(s.title, s.updated_at) for s in store.list_conversations()] == [("Older", 3_000.0), ("Newer", 2_000.0)]

    empty = Conversation(title="Empty")
    empty.created_at = 2_500.0
    store.save_header(empty)
    assert [s.updated_at for s in store.list_conversations()] == [3_000.0, 2_500.0, 2_000.0]  # no message: its creation

    fork = Conversation(title="Fork")  # made at 4000 from copies of older messages: new, at the top
    fork.created_at = 4_000.0
    fork.messages = [dataclasses.replace(m) for m in newer.messages]
    store.save_conversation(fork)
    assert [(s.title, s.updated_at) for s in store.list_conversations()][0] == ("Fork", 4_000.0)
