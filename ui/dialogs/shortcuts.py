"""Small dialogs: edit-and-resend, keyboard shortcuts, About.

All of them are opened with `open()` (window-modal, not blocking): a nested
`exec()` loop would stall asyncio callbacks that qasync runs on Qt's loop.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QLabel,
    QPlainTextEdit,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
    QAbstractItemView,
)


class EditMessageDialog(QDialog):
    """Edit a user message; accepting asks for a new reply, and what followed stays as a version."""

    def __init__(self, text: str, later_messages: int, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Edit and resend")
        layout = QVBoxLayout(self)
        self.editor = QPlainTextEdit(self)
        self.editor.setPlainText(text)
        self.editor.setTabChangesFocus(True)
        layout.addWidget(self.editor)
        if later_messages:
            noun = "message" if later_messages == 1 else "messages"
            # Nothing is lost: the conversation keeps what followed as a version of this turn.
            warning = QLabel(
                f"Resending asks for a new reply. The {later_messages} later {noun} stay as the earlier "
                "version of this turn: switch back to them with ‹ › on the new reply.", self
            )
        else:
            warning = QLabel("Resending replaces this message and asks for a new reply.", self)
        warning.setWordWrap(True)
        self.warning_label = warning
        layout.addWidget(warning)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel, self)
        self.resend_button = buttons.addButton("&Resend", QDialogButtonBox.ButtonRole.AcceptRole)
        self.resend_button.setDefault(True)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        em = self.fontMetrics().averageCharWidth()
        self.resize(em * 70, self.fontMetrics().lineSpacing() * 14)

    def text(self) -> str:
        return self.editor.toPlainText()


class ShortcutsDialog(QDialog):
    def __init__(self, shortcuts: Sequence[tuple[str, str]], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Keyboard shortcuts")
        layout = QVBoxLayout(self)
        table = QTableWidget(len(shortcuts), 2, self)
        table.setHorizontalHeaderLabels(["Action", "Shortcut"])
        table.verticalHeader().hide()
        table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        for row, (action, keys) in enumerate(shortcuts):
            table.setItem(row, 0, QTableWidgetItem(action))
            table.setItem(row, 1, QTableWidgetItem(keys))
        table.resizeColumnsToContents()
        table.resizeRowsToContents()
        table.horizontalHeader().setStretchLastSection(True)
        self.table = table
        layout.addWidget(table)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close, self)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        # Big enough to show every row without scrolling, where the screen allows.
        width = table.verticalHeader().width() + sum(table.columnWidth(c) for c in range(2)) + 40
        height = table.horizontalHeader().height() + sum(table.rowHeight(r) for r in range(len(shortcuts))) + 80
        screen = self.screen().availableGeometry() if self.screen() else None
        if screen is not None:
            width, height = min(width, screen.width() - 40), min(height, screen.height() - 80)
        self.resize(max(width, self.fontMetrics().averageCharWidth() * 50), height)


def about_text(version: str, device: str, model: str, log_folder: Path | None = None) -> str:
    """The About box. `log_folder` (default: ui.crash_log.log_dir()) is where
    crash reports go: the place to look, and to attach from, after a problem."""
    if log_folder is None:
        from ui.crash_log import log_dir

        log_folder = log_dir()
    return (
        f"<h3>Tandem {html.escape(version)}</h3>"
        "<p>Local language models in several side-by-side conversations, "
        "served by one engine with a paged KV cache, a prefix cache and continuous batching.</p>"
        f"<p><b>Model:</b> {html.escape(model)}<br><b>Device:</b> {html.escape(device)}</p>"
        f"<p><b>Crash reports and logs:</b><br><a href='{log_folder.as_uri()}'>{html.escape(str(log_folder))}</a></p>"
        "<p>Apache-2.0</p>"
    )


def shortcut_text(keys: str) -> str:
    from PySide6.QtGui import QKeySequence

    return QKeySequence(keys).toString(QKeySequence.SequenceFormat.NativeText)

