"""The arena's leaderboard: one row per model-and-settings, best first, with
its votes, win rate, Bradley–Terry rating and 95% interval; exported as CSV or
JSON (the leaderboard) or the votes as JSON. The window computes the rows off
the GUI thread and hands them in (`show_rows`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt
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
from ui.widgets.file_folders import remember, start_path

if TYPE_CHECKING:
    from app.arena.leaderboard import LeaderboardRow
    from app.arena.votes import ArenaVote

COLUMNS = ("#", "Model and settings", "Rating", "95% interval", "Votes", "Win rate", "Wins", "Losses", "Ties")
# The export buttons: what they write, the file they suggest, the filter.
EXPORTS = {
    "csv": ("Export leaderboard as &CSV…", "arena-leaderboard.csv", "CSV (*.csv)"),
    "json": ("Export leaderboard as &JSON…", "arena-leaderboard.json", "JSON (*.json)"),
    "votes": ("Export &votes as JSON…", "arena-votes.json", "JSON (*.json)"),
}


class LeaderboardDialog(QDialog):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Arena leaderboard")
        self.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        layout = QVBoxLayout(self)
        self.status = QLabel("Rating the votes…", self)
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.status)
        self.table = QTableWidget(0, len(COLUMNS), self)
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setWordWrap(True)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        layout.addWidget(self.table, 1)
        self.note = QLabel(
            "Rating: Bradley–Terry on every vote, as the LMSYS arena computes it (1000 is the average contender); "
            "the interval is the middle 95% of 1000 resamples of the votes. A tie and “both bad” count as a tie.", self)
        self.note.setWordWrap(True)
        layout.addWidget(self.note)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close, self)
        self.export_buttons: dict[str, QPushButton] = {}
        for kind, (text, _name, _filters) in EXPORTS.items():
            button = buttons.addButton(text, QDialogButtonBox.ButtonRole.ActionRole)
            button.setEnabled(False)
            button.clicked.connect(lambda _checked=False, kind=kind: self.export(kind))
            self.export_buttons[kind] = button
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        self.rows: list[LeaderboardRow] = []
        self.votes: list[ArenaVote] = []
        em = self.fontMetrics().averageCharWidth()
        self.resize(em * 120, self.fontMetrics().lineSpacing() * 24)

    def show_rows(self, rows: Sequence[LeaderboardRow], votes: Sequence[ArenaVote], problems: Sequence[str] = ()) -> None:
        from app.arena.leaderboard import count_text, interval_text

        self.rows, self.votes = list(rows), list(votes)
        self.table.setRowCount(len(rows))
        for r, row in enumerate(rows):
            cells = [str(r + 1), row.name, f"{row.rating:.0f}", interval_text(row), str(row.votes),
                     f"{row.win_rate:.0%}", str(row.wins), str(row.losses), str(row.ties + row.both_bad)]
            for c, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if c != 1:
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                else:
                    item.setToolTip(row.contender)
                self.table.setItem(r, c, item)
        self.table.resizeRowsToContents()
        if not votes:
            text = "No votes yet. Start the arena (View → Arena), send a message and vote on the replies."
        else:
            text = f"{count_text(len(votes), 'vote')} on {len(rows)} models and settings."
        if problems:
            text += f" {len(problems)} stored vote(s) could not be read and are left out: {problems[0]}"
        self.status.setText(text)
        for kind, button in self.export_buttons.items():
            button.setEnabled(bool(votes))

    def show_problem(self, message: str) -> None:
        self.status.setText(message)

    def export_text(self, kind: str) -> str:
        from app.arena.export import leaderboard_csv, leaderboard_json, votes_json

        if kind == "csv":
            return leaderboard_csv(self.rows)
        if kind == "json":
            return leaderboard_json(self.rows)
        return votes_json(self.votes)

    def export(self, kind: str, path: str | None = None) -> Path | None:
        """Write the leaderboard (or the votes) to a file the user chooses; a failure is said in the dialog."""
        _text, name, filters = EXPORTS[kind]
        if path is None:
            from PySide6.QtWidgets import QFileDialog

            path, _ = QFileDialog.getSaveFileName(self, "Export", start_path(name), filters)
            if not path:
                return None
            remember(path)
        try:
            written = write_text_atomically(path, self.export_text(kind))
        except Exception as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            self.status.setText(f"{path} could not be written: {reason}")
            return None
        self.status.setText(f"Saved {written}")
        return Path(written)
