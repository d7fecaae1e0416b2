"""The conversations sidebar on a real chat store (a SQLite file in tmp_path), offscreen."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication, QLineEdit, QMessageBox

from app.store.chat_store import ChatStore
from app.workspace.conversation import Conversation
from ui.widgets.sidebar import ChatSidebar, clean_title, relative_time
from ui.theme import apply_theme

NOW = dt.datetime(2026, 11, 30, 16, 20).timestamp()
HOUR = 3600.0
DAY = 24 * HOUR

# (minutes ago, first question, reply)
CHATS = [
    (38, "How does a prefix cache work in an LLM server?", "It keeps the KV entries of prompts already seen."),
    (5 * 60, "Write a haiku about autumn in Kyoto", "Maple leaves drifting over the temple's still pond."),
    (26 * 60, "Explain the asyncio event loop", "Think of a single waiter serving many tables."),
    (3 * 24 * 60, "Compare SQLite WAL mode with a rollback journal", "In WAL mode readers never block the writer."),
]


def save_chat(store: ChatStore, when: float, question: str, reply: str, turns: int = 1) -> Conversation:
    conversation = Conversation()
    for turn in range(turns):
        conversation.append_user(question if turn == 0 else "Tell me more.")
        conversation.begin_reply([1, 2, 3])
        conversation.add_reply_delta(reply, [4, 5])
        conversation.end_reply("complete")
    conversation.created_at = when  # a chat last updated at `when`: its messages' time
    for message in conversation.messages:
        message.created_at = when
    with mock.patch("app.store.chat_store.time.time", return_value=when):
        store.save_conversation(conversation)
    return conversation


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ChatStore]:
    store = ChatStore.open(tmp_path / "chats.sqlite3")
    yield store
    store.close()


@pytest.fixture
def chats(store: ChatStore) -> list[Conversation]:
    """The saved conversations, newest first."""
    saved = [save_chat(store, NOW - minutes * 60, q, a, turns=i + 1) for i, (minutes, q, a) in enumerate(CHATS)]
    return saved


@pytest.fixture
def sidebar(qtbot: Any, qapp: Any, store: ChatStore, chats: list[Conversation]) -> ChatSidebar:
    apply_theme(qapp, "light")
    widget = ChatSidebar(store, undo_seconds=10.0, clock=lambda: NOW)
    qtbot.addWidget(widget)
    widget.resize(340, 480)
    widget.show()
    qtbot.waitExposed(widget)
    return widget


def titles(sidebar: ChatSidebar) -> list[str]:
    return [s.title for s in sidebar.summaries()]


def focus_row(sidebar: ChatSidebar, row: int) -> None:
    sidebar.activateWindow()
    sidebar.list.setFocus()
    sidebar.list.setCurrentRow(row)


def test_lists_the_stored_conversations(sidebar: ChatSidebar, chats: list[Conversation]) -> None:
    assert [s.id for s in sidebar.summaries()] == [c.id for c in chats]
    assert titles(sidebar) == [q for _, q, _ in CHATS]  # automatic titles from the first message
    assert [s.message_count for s in sidebar.summaries()] == [2, 4, 6, 8]
    item = sidebar.list.item(0)
    assert "2 messages" in item.toolTip() and "KV entries" in item.toolTip()
    assert not sidebar.empty_label.isVisible()


def test_relative_time() -> None:
    assert relative_time(NOW - 38 * 60, NOW) == "Today 15:42"
    assert relative_time(NOW - 20 * HOUR, NOW) == "Yesterday 20:20"
    assert relative_time(NOW - 3 * DAY, NOW) == "Fri 16:20"
    assert relative_time(NOW - 9 * DAY, NOW) == "21 Nov"
    assert relative_time(NOW - 400 * DAY, NOW) == "26 Oct 2025"
    assert clean_title("  two\n lines\t here ") == "two lines here"


def test_search_filters_by_message_text_after_a_pause(qtbot: Any, sidebar: ChatSidebar, chats: list[Conversation]) -> None:
    sidebar.search.setFocus()
    # Only in a reply, not in any title; typed in mixed case.
    QTest.keyClicks(sidebar.search, "ReaDERS never")
    assert len(sidebar.summaries()) == 4  # debounced: not on every key
    qtbot.waitUntil(lambda: len(sidebar.summaries()) == 1, timeout=2000)
    assert sidebar.summaries()[0].id == chats[3].id
    # Nothing matches: the list says so.
    sidebar.search.setText("no such words anywhere")
    qtbot.waitUntil(lambda: sidebar.empty_label.isVisible(), timeout=2000)
    assert "no such words anywhere" in sidebar.empty_label.text()
    # Esc clears the search and everything is back.
    QTest.keyClick(sidebar.search, Qt.Key.Key_Escape)
    assert sidebar.search.text() == "" and len(sidebar.summaries()) == 4


def test_search_field_keys(qtbot: Any, sidebar: ChatSidebar, chats: list[Conversation]) -> None:
    opened: list[str] = []
    sidebar.open_requested.connect(opened.append)
    sidebar.activateWindow()
    sidebar.search.setFocus()
    QTest.keyClicks(sidebar.search, "haiku")
    QTest.keyClick(sidebar.search, Qt.Key.Key_Return)  # no wait for the pause: Enter searches at once
    assert opened == [chats[1].id]
    QTest.keyClick(sidebar.search, Qt.Key.Key_Down)
    assert sidebar.list.hasFocus() and sidebar.selected_id() == chats[1].id


def test_enter_and_double_click_open_with_the_id(qtbot: Any, sidebar: ChatSidebar, chats: list[Conversation]) -> None:
    opened: list[str] = []
    sidebar.open_requested.connect(opened.append)
    focus_row(sidebar, 2)
    QTest.keyClick(sidebar.list, Qt.Key.Key_Return)
    rect = sidebar.list.visualItemRect(sidebar.list.item(0))
    # A real double click: press, release, then the double-click event.
    QTest.mouseClick(sidebar.list.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    QTest.mouseDClick(sidebar.list.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert opened == [chats[2].id, chats[0].id]
    new: list[bool] = []
    sidebar.new_requested.connect(lambda: new.append(True))
    sidebar.new_button.click()
    assert new == [True]


def test_rename_in_place_persists(qtbot: Any, sidebar: ChatSidebar, store: ChatStore, chats: list[Conversation], tmp_path: Path) -> None:
    renamed: list[tuple[str, str]] = []
    sidebar.renamed.connect(lambda i, t: renamed.append((i, t)))
    focus_row(sidebar, 1)
    QTest.keyClick(sidebar.list, Qt.Key.Key_F2)
    editor = sidebar.list.viewport().findChild(QLineEdit)
    assert editor is not None and editor.text() == CHATS[1][1]
    editor.selectAll()
    QTest.keyClicks(editor, "  Kyoto   haiku ")
    QTest.keyClick(editor, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: renamed != [], timeout=2000)
    assert renamed == [(chats[1].id, "Kyoto haiku")]
    assert titles(sidebar)[1] == "Kyoto haiku"
    assert sidebar.selected_id() == chats[1].id
    # In the file, for the next start.
    with ChatStore.open(tmp_path / "chats.sqlite3", recover=False) as again:
        assert {s.id: s.title for s in again.list_conversations()}[chats[1].id] == "Kyoto haiku"
    # Esc leaves the title as it was.
    QTest.keyClick(sidebar.list, Qt.Key.Key_F2)
    editor = sidebar.list.viewport().findChild(QLineEdit)
    QTest.keyClicks(editor, "discarded")
    QTest.keyClick(editor, Qt.Key.Key_Escape)
    qtbot.wait(50)
    assert titles(sidebar)[1] == "Kyoto haiku"
    assert len(renamed) == 1


def confirmation(qtbot: Any, sidebar: ChatSidebar) -> QMessageBox:
    qtbot.waitUntil(lambda: sidebar.confirmation is not None and sidebar.confirmation.isVisible(), timeout=2000)
    box = sidebar.confirmation
    assert box is not None
    return box


def test_delete_asks_then_undo_restores(qtbot: Any, sidebar: ChatSidebar, store: ChatStore, chats: list[Conversation]) -> None:
    victim = chats[2]
    focus_row(sidebar, 2)
    QTest.keyClick(sidebar.list, Qt.Key.Key_Delete)
    box = confirmation(qtbot, sidebar)
    assert CHATS[2][1] in box.text() and "undo" in box.informativeText()
    # Cancel: nothing happens.
    box.button(QMessageBox.StandardButton.Cancel).click()
    assert victim.id in [s.id for s in store.list_conversations()]
    assert len(sidebar.summaries()) == 4 and sidebar.bar.isHidden()

    QTest.keyClick(sidebar.list, Qt.Key.Key_Delete)
    box = confirmation(qtbot, sidebar)
    deleted: list[str] = []
    sidebar.deleted.connect(deleted.append)
    box.defaultButton().click()  # Delete is the default: Delete, Enter deletes
    assert deleted == [victim.id]
    assert victim.id not in [s.id for s in sidebar.summaries()]
    assert victim.id not in [s.id for s in store.list_conversations()]
    assert victim.id in [s.id for s in store.list_conversations(deleted=True)]  # soft: still in the file
    assert sidebar.bar_text == f"Deleted “{CHATS[2][1]}”."
    assert sidebar.undo_button.isVisible()

    restored: list[str] = []
    sidebar.restored.connect(restored.append)
    sidebar.undo_button.click()
    assert restored == [victim.id]
    assert [s.id for s in sidebar.summaries()] == [c.id for c in chats]
    assert [s.id for s in store.list_conversations()] == [c.id for c in chats]
    assert sidebar.selected_id() == victim.id
    assert sidebar.bar.isHidden()


def test_undo_covers_several_deletes_until_it_expires(qtbot: Any, qapp: Any, store: ChatStore, chats: list[Conversation]) -> None:
    sidebar = ChatSidebar(store, undo_seconds=0.3, clock=lambda: NOW)
    qtbot.addWidget(sidebar)
    sidebar.show()
    assert sidebar.delete(chats[0].id) and sidebar.delete(chats[1].id)
    assert sidebar.bar_text == "Deleted 2 chats."
    assert sidebar.undo_pending == [chats[0].id, chats[1].id]
    qtbot.waitUntil(lambda: sidebar.bar.isHidden(), timeout=3000)
    assert sidebar.undo_pending == []
    # Expired: they stay deleted (purging them is the store's business).
    assert [s.id for s in store.list_conversations()] == [chats[2].id, chats[3].id]
    assert {s.id for s in store.list_conversations(deleted=True)} == {chats[0].id, chats[1].id}


def test_a_store_error_is_shown_and_nothing_breaks(qtbot: Any, sidebar: ChatSidebar, tmp_path: Path, chats: list[Conversation]) -> None:
    # Another connection (the CLI, say) removes a chat for good behind the sidebar's back.
    with ChatStore.open(tmp_path / "chats.sqlite3", recover=False) as other:
        other.delete(chats[0].id)
        assert other.purge_deleted() == 1
    assert not sidebar.rename(chats[0].id, "Renamed")
    assert "could not be renamed" in sidebar.bar_text
    assert sidebar.dismiss_button.isVisible() and not sidebar.undo_button.isVisible()
    assert len(sidebar.summaries()) == 4  # the list was left alone
    sidebar.refresh()  # and it still works
    assert len(sidebar.summaries()) == 3
    sidebar.dismiss_button.click()
    assert sidebar.bar.isHidden()


def test_open_conversations_are_marked(qtbot: Any, sidebar: ChatSidebar, chats: list[Conversation]) -> None:
    def row_image(row: int) -> Any:
        rect = sidebar.list.visualItemRect(sidebar.list.item(row))
        return sidebar.list.viewport().grab(rect).toImage()

    before = [row_image(row) for row in range(4)]
    sidebar.set_open([chats[1].id])
    QApplication.processEvents()
    after = [row_image(row) for row in range(4)]
    assert sidebar.open_ids == {chats[1].id}
    assert [b == a for b, a in zip(before, after)] == [True, False, True, True]


def test_context_menu_offers_the_actions(qtbot: Any, sidebar: ChatSidebar) -> None:
    actions = {a.text(): a.shortcuts() for a in sidebar.list.actions()}
    assert set(actions) == {"&Open", "&Rename", "&Delete…"}
    assert [k.toString() for k in actions["&Rename"]] == ["F2"]
    assert "Del" in [k.toString() for k in actions["&Delete…"]]


def test_empty_store(qtbot: Any, qapp: Any, tmp_path: Path) -> None:
    with ChatStore.open(tmp_path / "empty.sqlite3") as empty:
        sidebar = ChatSidebar(empty)
        qtbot.addWidget(sidebar)
        sidebar.show()
        assert sidebar.summaries() == []
        assert sidebar.empty_label.isVisible() and "No saved chats yet" in sidebar.empty_label.text()
        focus = sidebar.list
        QTest.keyClick(focus, Qt.Key.Key_Delete)  # nothing selected: nothing happens
        assert sidebar.confirmation is None


def test_the_sidebar_and_tandem_chats_list_show_the_same_update_time(
    qtbot: Any, qapp: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same chat, the same time in both: its last message's, not the
    time of a later write that changed nothing (here a model load that
    saves every open pane's header, an hour and a half on)."""
    import io

    from app.store.cli import main as chats_cli

    monkeypatch.setenv("TANDEM_DATA_DIR", str(tmp_path / "data"))
    last_message = NOW - 38 * 60 - 25  # 15:41:35: both cut it to 15:41
    with ChatStore.open(tmp_path / "data" / "chats.sqlite3") as store:
        conversation = save_chat(store, last_message, "Explain the asyncio event loop", "A single waiter.", turns=2)
        with mock.patch("app.store.chat_store.time.time", return_value=NOW - 2 * 60):
            store.save_header(conversation)
    out = io.StringIO()
    assert chats_cli(["list"], stdout=out) == 0
    row = next(line for line in out.getvalue().splitlines() if line.startswith(conversation.id[:8]))
    shown_by_cli = dt.datetime.fromtimestamp(last_message).strftime("%Y-%m-%d %H:%M")
    assert shown_by_cli in row.split("  ")

    store = ChatStore.open(tmp_path / "data" / "chats.sqlite3")
    try:
        widget = ChatSidebar(store, clock=lambda: NOW)
        qtbot.addWidget(widget)
        [summary] = widget.summaries()
        assert relative_time(summary.updated_at, widget.now()) == "Today " + shown_by_cli[-5:] == "Today 15:41"
        assert f"updated {shown_by_cli}" in widget.list.item(0).toolTip()
    finally:
        store.close()
