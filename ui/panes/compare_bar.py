"""The compare bar: which two panes' last replies to diff, and how much differs."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QFrame, QHBoxLayout, QLabel, QToolButton, QWidget


class CompareBar(QFrame):
    changed = Signal()
    close_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(6, 2, 6, 2)
        self.left = QComboBox(self)
        self.right = QComboBox(self)
        self.left.setToolTip("First pane to compare")
        self.right.setToolTip("Second pane to compare")
        label_a = QLabel("Compare the last replies of", self)
        label_a.setBuddy(self.left)
        layout.addWidget(label_a)
        layout.addWidget(self.left)
        layout.addWidget(QLabel("and", self))
        layout.addWidget(self.right)
        self.summary = QLabel(self)
        layout.addWidget(self.summary, 1)
        close = QToolButton(self)
        close.setText("✕")
        close.setAutoRaise(True)
        close.setToolTip("Stop comparing (Ctrl+D)")
        close.clicked.connect(self.close_requested)
        layout.addWidget(close)
        self.left.currentIndexChanged.connect(lambda _: self.changed.emit())
        self.right.currentIndexChanged.connect(lambda _: self.changed.emit())

    def set_panes(self, panes: list[tuple[int, str]]) -> None:
        """Offer (pane id, title) in display order, keeping the choice where possible."""
        chosen = self.chosen()
        for box in (self.left, self.right):
            box.blockSignals(True)
            box.clear()
            for pid, title in panes:
                box.addItem(title, pid)
            box.blockSignals(False)
        ids = [pid for pid, _ in panes]
        a, b = chosen if chosen else (None, None)
        if a not in ids:
            a = ids[0] if ids else None
        if b not in ids or b == a:
            b = next((p for p in ids if p != a), None)
        self.set_chosen(a, b)
        self.changed.emit()

    def set_chosen(self, a: int | None, b: int | None) -> None:
        for box, pid in ((self.left, a), (self.right, b)):
            index = box.findData(pid)
            box.blockSignals(True)
            box.setCurrentIndex(index)
            box.blockSignals(False)

    def chosen(self) -> tuple[int, int] | None:
        a, b = self.left.currentData(), self.right.currentData()
        if a is None or b is None:
            return None
        return int(a), int(b)
