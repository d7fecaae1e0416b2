"""The turn summary: each pane's reply to the last broadcast message, its
length, speed, time to first token and the words it shares with the others;
copied as Markdown or exported (Markdown or CSV) beside the side-by-side
comparison. The window computes the figures off the GUI thread."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.files import write_text_atomically
from app.workspace.turn_summary import TEXT_COLUMNS, ReplyFigures, header, json_valid_count, rows, to_csv, to_markdown
from ui.widgets.file_folders import remember, start_path


class TurnSummaryDialog(QDialog):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Turn summary")
        self.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        layout = QVBoxLayout(self)
        self.status = QLabel("Comparing the replies…", self)
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.status)
        self.table = QTableWidget(0, 0, self)
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        layout.addWidget(self.table, 1)
        note = QLabel("Shared with a pane: the share of a reply's words that the word diff (Ctrl+D) finds in that pane's reply.", self)
        note.setWordWrap(True)
        layout.addWidget(note)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close, self)
        self.copy_button = buttons.addButton("&Copy as Markdown", QDialogButtonBox.ButtonRole.ActionRole)
        self.copy_button.clicked.connect(self.copy)
        self.export_buttons: dict[str, QPushButton] = {}
        for fmt, text in (("md", "Export &Markdown…"), ("csv", "Export CS&V…")):
            button = buttons.addButton(text, QDialogButtonBox.ButtonRole.ActionRole)
            button.clicked.connect(lambda _checked=False, fmt=fmt: self.export(fmt))
            self.export_buttons[fmt] = button
        for button in (self.copy_button, *self.export_buttons.values()):
            button.setEnabled(False)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        self.message = ""
        self.figures: list[ReplyFigures] = []
        em = self.fontMetrics().averageCharWidth()
        self.resize(em * 110, self.fontMetrics().lineSpacing() * 16)

    def show_figures(self, message: str, figures: Sequence[ReplyFigures]) -> None:
        self.message, self.figures = message, list(figures)
        head = header(self.figures)
        self.table.setColumnCount(len(head))
        self.table.setHorizontalHeaderLabels(head)
        cells = rows(self.figures)
        self.table.setRowCount(len(cells))
        for r, row in enumerate(cells):
            for c, text in enumerate(row):
                item = QTableWidgetItem(text)
                item.setToolTip(text)  # a long cell (the JSON verdict, a title) may be wider than its column
                if c >= 2 and head[c] not in TEXT_COLUMNS:
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                self.table.setItem(r, c, item)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.resizeColumnsToContents()
        # Wide enough for every column where the screen allows; beyond that the table scrolls sideways.
        wanted = sum(self.table.columnWidth(c) for c in range(len(head))) + 60
        screen = self.screen().availableGeometry() if self.screen() else None
        limit = screen.width() - 40 if screen is not None else wanted
        self.resize(max(self.width(), min(wanted, limit)), self.height())
        first = message.strip().splitlines()[0] if message.strip() else ""
        counted = json_valid_count(self.figures)
        valid = f" JSON valid in {counted[0]} of {counted[1]}." if counted is not None else ""
        self.status.setText(f"The replies of {len(self.figures)} panes to “{first[:80]}”.{valid}")
        for button in (self.copy_button, *self.export_buttons.values()):
            button.setEnabled(True)

    def show_problem(self, text: str) -> None:
        self.status.setText(text)

    def markdown(self) -> str:
        return to_markdown(self.message, self.figures)

    def copy(self) -> None:
        QGuiApplication.clipboard().setText(self.markdown())
        self.status.setText("Copied the table as Markdown.")

    def export(self, fmt: str, path: str | None = None) -> Path | None:
        if path is None:
            from PySide6.QtWidgets import QFileDialog

            name, filters = ("turn-summary.md", "Markdown (*.md)") if fmt == "md" else ("turn-summary.csv", "CSV (*.csv)")
            path, _ = QFileDialog.getSaveFileName(self, "Export turn summary", start_path(name), filters)
            if not path:
                return None
            remember(path)
        try:
            written = write_text_atomically(path, self.markdown() if fmt == "md" else to_csv(self.figures))
        except Exception as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            self.status.setText(f"{path} could not be written: {reason}")
            return None
        self.status.setText(f"Saved {written}")
        return Path(written)
