"""The store writer: writes off the caller's thread, snapshots, errors reported and survived."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.store.chat_store import ChatStore, DiskFullError, StoreError, StoreIOError
from app.workspace.conversation import Conversation
from app.store.writer import StoreWriter
from tests.app.fixtures.chats import assert_same, build_conversation


class Errors:
    """on_error that records each error and the thread it was called on."""

    def __init__(self) -> None:
        self.errors: list[StoreError] = []
        self.threads: set[str] = set()

    def __call__(self, error: StoreError) -> None:
        self.errors.append(error)
        self.threads.add(threading.current_thread().name)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    with ChatStore.open(tmp_path / "chats.sqlite3"):
        pass  # the app's own open creates the store; the writer opens it after
    return tmp_path / "chats.sqlite3"


@pytest.fixture
def errors() -> Errors:
    return Errors()


@pytest.fixture
def writer(path: Path, errors: Errors) -> Iterator[StoreWriter]:
    w = StoreWriter(path, errors)
    yield w
    assert w.close(10)


def load(path: Path, conversation_id: str) -> Conversation:
    with ChatStore.open(path, recover=False) as store:
        return store.load_conversation(conversation_id)


def test_writes_run_on_the_writer_thread(writer: StoreWriter, path: Path, errors: Errors) -> None:
    seen: list[str] = []
    conv = build_conversation()
    assert writer.save_conversation(conv)
    assert writer.submit(lambda store: seen.append(threading.current_thread().name))
    assert writer.flush(10)
    assert seen == ["tandem-store-writer"]
    assert_same(conv, load(path, conv.id))
    assert errors.errors == []


def test_submit_never_waits_for_the_disk(writer: StoreWriter, path: Path) -> None:
    """Another connection holds the write lock: queuing still returns at once, the writes land once it is free."""
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    conv = Conversation(title="busy")
    conv.append_user("hello")
    started = time.perf_counter()
    writer.save_conversation(conv)
    index = conv.begin_reply([1, 2])
    for n in range(200):  # checkpoints of a streaming reply
        conv.add_reply_delta(f" {n}", [n])
        writer.save_message(conv, index)
    queued = time.perf_counter() - started
    assert queued < 1.0  # 201 snapshots; writing them would wait for the lock (5 s timeout)
    assert not writer.flush(0.2)  # still waiting for the lock
    blocker.execute("ROLLBACK")
    blocker.close()
    assert writer.flush(10)
    stored = load(path, conv.id)
    assert stored.messages[index].text == conv.messages[index].text
    assert stored.messages[index].state == "interrupted"  # saved while streaming


def test_a_write_is_a_snapshot(writer: StoreWriter, path: Path) -> None:
    """What is written is the conversation as it was at the call, not as the GUI changed it since."""
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # keep the writer from writing until the changes below are made
    conv = Conversation(title="snap")
    conv.append_user("first")
    writer.save_conversation(conv)
    index = conv.begin_reply([1])
    conv.add_reply_delta("partial", [5])
    writer.save_message(conv, index)
    conv.add_reply_delta(" and more", [6])
    conv.title = "changed"
    blocker.execute("ROLLBACK")
    blocker.close()
    assert writer.flush(10)
    stored = load(path, conv.id)
    assert (stored.title, stored.messages[index].text, stored.messages[index].token_ids) == ("snap", "partial", [5])

    conv.end_reply("stopped", text="partial and more", token_ids=[5, 6])
    writer.save_message(conv, index)  # the finished reply with its kept ids, one transaction
    assert writer.flush(10)
    assert_same(conv, load(path, conv.id))


def test_disk_full_is_reported_once_and_caught_up(writer: StoreWriter, path: Path, errors: Errors) -> None:
    first = build_conversation("first")
    writer.save_conversation(first)

    def fill(store: ChatStore) -> None:
        # The file may not grow: SQLite reports SQLITE_FULL, as for a full disk.
        pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
        store._conn.execute(f"PRAGMA max_page_count = {pages}")

    writer.submit(fill)
    conv = Conversation(title="while full")
    conv.append_user("y" * 100_000)
    writer.save_conversation(conv)
    conv.append_user("z" * 100_000)
    writer.save_message(conv, 1)
    assert writer.flush(10)
    assert len(errors.errors) == 1 and isinstance(errors.errors[0], DiskFullError)  # once, not per write
    assert "free some space or export them" in str(errors.errors[0])
    assert errors.threads == {"tandem-store-writer"}
    assert writer.failures == 2 and writer.needs_full_save(conv.id)

    # Space again: the next write for the conversation saves all of it, including what failed.
    writer.submit(lambda store: store._conn.execute("PRAGMA max_page_count = 1073741823"))
    conv.append_user("after")
    writer.save_message(conv, 2)
    assert writer.flush(10)
    assert not writer.needs_full_save(conv.id)
    assert_same(conv, load(path, conv.id))
    assert_same(first, load(path, first.id))
    assert len(errors.errors) == 1


def test_writer_survives_a_failing_job(writer: StoreWriter, path: Path, errors: Errors) -> None:
    def broken(store: ChatStore) -> None:
        raise ValueError("a bug")

    writer.submit(broken)
    conv = build_conversation()
    writer.save_conversation(conv)
    assert writer.flush(10)
    assert len(errors.errors) == 1 and "unexpectedly" in str(errors.errors[0])
    assert_same(conv, load(path, conv.id))


def test_store_that_cannot_be_opened_is_retried(tmp_path: Path, errors: Errors) -> None:
    blocked = tmp_path / "data"
    blocked.write_text("a file where the data folder should be")
    writer = StoreWriter(blocked / "chats.sqlite3", errors)
    conv = build_conversation()
    writer.save_conversation(conv)
    assert writer.flush(10)
    assert len(errors.errors) == 1 and isinstance(errors.errors[0], StoreIOError)
    blocked.unlink()  # the user fixed it
    writer.save_message(conv, 0)  # upgraded to a full save: the first one failed
    assert writer.close(10)
    assert_same(conv, load(blocked / "chats.sqlite3", conv.id))


def test_close_drains_the_queue(path: Path) -> None:
    writer = StoreWriter(path)
    convs = [build_conversation(f"c{n}") for n in range(5)]
    for conv in convs:
        writer.save_conversation(conv)
    writer.mark_clean_exit()
    assert writer.close(10)
    assert not writer.submit(lambda store: None)  # closed: nothing is queued
    assert not writer.save_conversation(convs[0])
    assert writer.flush(1)
    with ChatStore.open(path) as store:
        assert {s.title for s in store.list_conversations()} == {f"c{n}" for n in range(5)}
        assert not store.crashed_last_time


def test_conversation_operations(writer: StoreWriter, path: Path) -> None:
    conv = build_conversation()
    writer.save_conversation(conv)
    conv.truncate(2)
    writer.truncate(conv)
    conv.title = "renamed by header"
    writer.save_header(conv)
    writer.rename(conv.id, "renamed")
    writer.delete(conv.id)
    assert writer.flush(10)
    with ChatStore.open(path) as store:
        assert store.is_deleted(conv.id)
        stored = store.load_conversation(conv.id)
    assert stored.title == "renamed"
    conv.title = "renamed"
    assert_same(conv, stored)
    writer.undelete(conv.id)
    assert writer.flush(10)
    with ChatStore.open(path) as store:
        assert [s.id for s in store.list_conversations()] == [conv.id]
