"""The "‹ 2/3 ›" switcher on a reply that regenerate or edit-and-resend made again."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import QHBoxLayout, QLabel, QToolButton, QWidget


class VersionSwitcher(QWidget):
    """‹ n/N ›: which version of the reply is shown, and buttons to the others.

    `switch_requested(version)` asks for version `version` (0-based). The
    buttons have accessible names and Alt+Left / Alt+Right reach them from
    anywhere in the message (`attach_shortcuts`).
    """

    switch_requested = Signal(int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("versionSwitcher")
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(0)
        self.previous_button = self._button(
            "‹", "Previous version", "Show the previous version of this reply (Alt+Left)"
        )
        self.label = QLabel(self)
        self.label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.next_button = self._button("›", "Next version", "Show the next version of this reply (Alt+Right)")
        row.addWidget(self.previous_button)
        row.addWidget(self.label)
        row.addWidget(self.next_button)
        self.previous_button.clicked.connect(self.show_previous)
        self.next_button.clicked.connect(self.show_next)
        self._current = 0
        self._count = 1
        self._enabled = True
        self.hide()

    def _button(self, text: str, name: str, tip: str) -> QToolButton:
        button = QToolButton(self)
        button.setText(text)
        button.setAccessibleName(name)
        button.setToolTip(tip)
        button.setAutoRaise(True)
        button.setFocusPolicy(Qt.FocusPolicy.TabFocus)
        return button

    def attach_shortcuts(self, owner: QWidget) -> None:
        """Alt+Left / Alt+Right switch versions while `owner` (the message) or a child of it has focus."""
        for keys, slot in (("Alt+Left", self.show_previous), ("Alt+Right", self.show_next)):
            shortcut = QShortcut(QKeySequence(keys), owner)
            shortcut.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
            shortcut.activated.connect(slot)

    @property
    def current(self) -> int:
        return self._current

    @property
    def count(self) -> int:
        return self._count

    def set_versions(self, current: int, count: int, enabled: bool = True) -> None:
        """Show version `current` (0-based) of `count`; hidden with one version.
        Not `enabled` while the reply streams: the conversation cannot change under it."""
        self._current, self._count, self._enabled = current, count, enabled
        self.label.setText(f"{current + 1}/{count}")
        self.label.setAccessibleName(f"Version {current + 1} of {count}")
        self.previous_button.setEnabled(enabled and current > 0)
        self.next_button.setEnabled(enabled and current < count - 1)
        self.setVisible(count > 1)

    def show_previous(self) -> None:
        if self._enabled and self._count > 1 and self._current > 0:
            self.switch_requested.emit(self._current - 1)

    def show_next(self) -> None:
        if self._enabled and self._count > 1 and self._current < self._count - 1:
            self.switch_requested.emit(self._current + 1)
