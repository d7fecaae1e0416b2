"""Issue 29, item 4: the window's shortcuts against the text boxes' own keys.

Ctrl+K is "delete to the end of the line" in every Qt text box on Linux: it
erased the draft while Search chats never got the key. The offscreen test
platform uses another key scheme, so `LinuxBinding` gives a box the Linux
binding of a key (it claims the key and does what the box does with it), and
the window must still win without the draft losing a character.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtGui import QKeyEvent, QKeySequence
from PySide6.QtWidgets import QLineEdit, QPlainTextEdit, QWidget

from tests.ui.conftest import run
from ui.window.actions import ACTIONS, TEXT_BOX_KEYS, WINDOW_WINS, ActionSpec, text_box_clashes

DRAFT = "hello world, a draft that must survive"


class LinuxBinding(QObject):
    """Makes a text box claim `key` (accept its ShortcutOverride) and, when the
    key reaches it, wipe the text from the cursor on, as Ctrl+K does on Linux."""

    def __init__(self, box: QWidget, key: str) -> None:
        super().__init__(box)
        self.key = QKeySequence(key)
        box.installEventFilter(self)

    def _is_key(self, event: QEvent) -> bool:
        return isinstance(event, QKeyEvent) and QKeySequence(event.keyCombination()) == self.key

    def eventFilter(self, box: QObject, event: QEvent) -> bool:  # noqa: N802
        if event.type() == QEvent.Type.ShortcutOverride and self._is_key(event):
            event.accept()
            return True
        if event.type() == QEvent.Type.KeyPress and self._is_key(event):
            if isinstance(box, QPlainTextEdit):
                cursor = box.textCursor()
                cursor.movePosition(cursor.MoveOperation.End, cursor.MoveMode.KeepAnchor)
                cursor.removeSelectedText()
            elif isinstance(box, QLineEdit):
                box.setText(box.text()[: box.cursorPosition()])
            return True
        return False


@pytest.fixture
def window(loop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path) -> Iterator[Any]:
    """A window with the chats sidebar (a real SQLite file) and one pane, no engine."""
    from app.settings import Settings
    from app.store.session import ChatSession
    from app.workspace.workspace import Workspace
    from ui.window.main_window import MainWindow

    settings = Settings()
    workspace = Workspace(settings)
    session = ChatSession.open(tmp_path / "chats.sqlite3")
    session.restore(workspace, default_panes=1)
    made = MainWindow(workspace, settings, version="test", save_settings=False, session=session)
    made.resize(1024, 700)
    made.show()
    made.activateWindow()
    for _ in range(5):
        qapp.processEvents()
    yield made
    closed = asyncio.Event()
    made.closed.connect(closed.set)
    made.close()
    run(loop, closed.wait(), timeout=30)


def _press(qtbot: Any, box: QWidget, key: str) -> None:
    combination = QKeySequence(key)[0]
    qtbot.keyClick(box, combination.key(), combination.keyboardModifiers())


def _draft_at_start(window: Any, qapp: Any) -> QPlainTextEdit:
    edit = window.composer.edit
    edit.setPlainText(DRAFT)
    cursor = edit.textCursor()
    cursor.movePosition(cursor.MoveOperation.Start)
    edit.setTextCursor(cursor)
    edit.setFocus()
    qapp.processEvents()
    return edit


def test_every_window_key_a_text_box_also_binds_is_decided() -> None:
    # A new shortcut that a text box binds too fails here until WINDOW_WINS says why the window takes it.
    clashes = text_box_clashes()
    assert set(clashes) == set(WINDOW_WINS), {key: (action, TEXT_BOX_KEYS.get(key)) for key, action in clashes.items()}
    assert clashes["Ctrl+K"] == "search_chats" and clashes["Ctrl+E"] == "edit_last"


def test_the_audit_sees_a_clash_it_is_shown() -> None:
    extra = ActionSpec("undo_all", "Undo everything", "&Edit", "stop_all", ("Ctrl+Z",))
    assert text_box_clashes((*ACTIONS, extra))["Ctrl+Z"] == "undo_all"


def test_ctrl_k_in_the_draft_searches_and_keeps_the_draft(window: Any, qapp: Any, qtbot: Any) -> None:
    LinuxBinding(window.composer.edit, "Ctrl+K")
    edit = _draft_at_start(window, qapp)
    assert edit.hasFocus()
    _press(qtbot, edit, "Ctrl+K")
    qapp.processEvents()
    assert edit.toPlainText() == DRAFT
    assert window.sidebar.search.hasFocus()


@pytest.mark.parametrize("key", sorted(WINDOW_WINS))
def test_each_clashing_key_reaches_its_action_from_every_text_box(window: Any, qapp: Any, qtbot: Any, key: str) -> None:
    action = window.menu_actions[text_box_clashes()[key]]
    fired: list[bool] = []
    action.triggered.connect(lambda *_: fired.append(True))
    # Both kinds of box: the message box and the sidebar's one-line search.
    search = window.sidebar.search
    window.sidebar_dock.show()
    for box in (window.composer.edit, search):
        LinuxBinding(box, key)
    edit = _draft_at_start(window, qapp)
    _press(qtbot, edit, key)
    assert edit.toPlainText() == DRAFT and len(fired) == 1
    for dialog in qapp.topLevelWidgets():  # Edit last message may open its dialog: not part of this test
        if dialog is not window and dialog.isVisible() and dialog.isModal():
            dialog.close()
    search.setText("capital")
    search.setCursorPosition(0)
    search.setFocus()
    qapp.processEvents()
    _press(qtbot, search, key)
    assert search.text() == "capital" and len(fired) == 2


def test_a_key_the_window_does_not_use_stays_the_text_boxs(window: Any, qapp: Any, qtbot: Any) -> None:
    # Ctrl+U (delete the line on Linux) is no window shortcut: the box keeps doing what it does.
    LinuxBinding(window.composer.edit, "Ctrl+U")
    edit = _draft_at_start(window, qapp)
    _press(qtbot, edit, "Ctrl+U")
    assert edit.toPlainText() == ""


def test_ctrl_k_from_a_floating_sidebars_search_is_still_the_windows(window: Any, qapp: Any, qtbot: Any) -> None:
    dock = window.sidebar_dock
    dock.show()
    dock.setFloating(True)
    qapp.processEvents()
    search = window.sidebar.search
    LinuxBinding(search, "Ctrl+K")
    search.setText("capital")
    search.setCursorPosition(0)
    dock.activateWindow()
    search.setFocus()
    qapp.processEvents()
    fired: list[bool] = []
    window.menu_actions["search_chats"].triggered.connect(lambda *_: fired.append(True))
    _press(qtbot, search, "Ctrl+K")
    assert search.text() == "capital" and fired == [True]
