"""The arena bar: what to do next in the arena, the vote buttons with their keys, and who was who."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeySequence, QResizeEvent, QShortcut
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QSizePolicy, QToolButton, QVBoxLayout, QWidget

from app.workspace.arena import VoteChoice


class ArenaBar(QFrame):
    """`voted(outcome, winner)` when a choice is made (by click or its digit while the bar has the focus)."""

    voted = Signal(str, object)  # outcome, winner label or None
    leaderboard_requested = Signal()
    close_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("arenaBar")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        column = QVBoxLayout(self)
        column.setContentsMargins(6, 3, 6, 3)
        column.setSpacing(2)
        top = QHBoxLayout()
        title = QLabel("<b>Arena</b>", self)
        top.addWidget(title)
        self.status = QLabel(self)
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        top.addWidget(self.status, 1)
        self.leaderboard_button = QPushButton("&Leaderboard…", self)
        self.leaderboard_button.setToolTip("Votes, win rates and ratings of every model and settings (Ctrl+Shift+B)")
        self.leaderboard_button.clicked.connect(self.leaderboard_requested)
        top.addWidget(self.leaderboard_button)
        close = QToolButton(self)
        close.setText("✕")
        close.setAutoRaise(True)
        close.setToolTip("Leave the arena (Ctrl+Shift+A)")
        close.clicked.connect(self.close_requested)
        top.addWidget(close)
        column.addLayout(top)
        self.vote_row = QWidget(self)
        # The row never makes the window wider: narrow, its buttons say only key and label (resizeEvent).
        self.vote_row.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self._votes = QHBoxLayout(self.vote_row)
        self._votes.setContentsMargins(0, 0, 0, 0)
        self._votes.setSpacing(4)
        column.addWidget(self.vote_row)
        self.buttons: list[QPushButton] = []
        self._shortcuts: list[QShortcut] = []
        self._choices: list[VoteChoice] = []
        self._open = False

    def set_choices(self, choices: list[VoteChoice]) -> None:
        """The vote buttons, "1  A is better" …, each with its digit as a shortcut while the bar has the focus."""
        for button in self.buttons:
            self._votes.removeWidget(button)
            button.deleteLater()
        for shortcut in self._shortcuts:
            shortcut.setEnabled(False)
            shortcut.deleteLater()
        self.buttons, self._shortcuts, self._choices = [], [], list(choices)
        for choice in choices:
            button = QPushButton(f"{choice.key}  {choice.text}", self.vote_row)
            button.setToolTip(f"Vote: {choice.text} (key {choice.key} while the arena bar has the focus)")
            button.clicked.connect(lambda _checked=False, c=choice: self._cast(c))
            self._votes.addWidget(button)
            self.buttons.append(button)
            shortcut = QShortcut(QKeySequence(choice.key), self)
            shortcut.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
            shortcut.activated.connect(lambda c=choice: self._cast(c))
            self._shortcuts.append(shortcut)
        self._votes.addStretch(1)
        self.set_voting(self._open)
        self._fit_buttons()

    def set_voting(self, open_: bool) -> None:
        """Whether a vote can be cast now (the buttons stay visible, greyed, otherwise)."""
        self._open = open_
        for button in self.buttons:
            button.setEnabled(open_)

    @property
    def voting(self) -> bool:
        return self._open

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802
        super().resizeEvent(event)
        self._fit_buttons()

    def _fit_buttons(self) -> None:
        """"1  A is better" where the row has room, else "1 A" (the full text in the tooltip)."""
        full = [f"{c.key}  {c.text}" for c in self._choices]
        short = [f"{c.key} {c.winner or c.text.split()[0 if c.outcome == 'tie' else -1].capitalize()}" for c in self._choices]
        metrics = self.fontMetrics()
        spacing = self._votes.spacing()
        pad = self.style().pixelMetric(self.style().PixelMetric.PM_ButtonMargin) * 2 + metrics.averageCharWidth() * 4
        needed = sum(metrics.horizontalAdvance(text) + pad + spacing for text in full)
        margins = self.contentsMargins().left() + self.contentsMargins().right() + 12
        texts = full if needed <= self.width() - margins else short
        for button, text in zip(self.buttons, texts):
            if button.text() != text:
                button.setText(text)

    def _cast(self, choice: VoteChoice) -> None:
        # A digit pressed while the vote is closed still goes to the window, which says why it is not counted.
        self.voted.emit(choice.outcome, choice.winner)

    def choice_for_key(self, key: str) -> VoteChoice | None:
        return next((c for c in self._choices if c.key == key), None)
