"""A reply's reasoning: a collapsed "Thinking" section above its answer.

The header says how long the model thought and how many tokens it took
("Thought for 3.2 s · 210 tokens", live while it thinks); a click, Space or
Enter on it opens the reasoning, shown muted so that it never reads as the
answer. The section has its own Copy; the message's Copy is the answer's.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtGui import QGuiApplication, QKeyEvent, QPalette
from PySide6.QtWidgets import QFrame, QHBoxLayout, QToolButton, QVBoxLayout, QWidget

from ui.panes.markdown_view import MarkdownView, settle_layouts
from ui.theme import muted_text_color


def thinking_title(tokens: int | None, seconds: float | None, *, thinking: bool, finished: bool) -> str:
    """'Thinking… 1.4 s · 52 tokens' while it thinks; 'Thought for 3.2 s · 210 tokens' after."""
    figures = []
    if seconds is not None:
        figures.append(f"{seconds:.1f} s")
    if tokens:
        figures.append(f"{tokens} token" + ("" if tokens == 1 else "s"))
    if thinking:
        return " · ".join(["Thinking…", *figures])
    if not finished:  # stopped, or out of tokens, before it answered
        return " · ".join(["Thinking, unfinished", *figures])
    if seconds is not None:
        return f"Thought for {' · '.join(figures)}"
    return " · ".join(["Thinking", *figures])


class ThinkingSection(QFrame):
    """The reasoning of one reply; `set_reasoning` refreshes it, `expanded` says whether it is open."""

    toggled = Signal(bool)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("thinking")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 2)
        layout.setSpacing(0)
        top = QHBoxLayout()
        top.setContentsMargins(0, 0, 0, 0)
        top.setSpacing(4)
        self.toggle_button = _Toggle(self)
        self.toggle_button.setCheckable(True)
        self.toggle_button.setAutoRaise(True)
        self.toggle_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.toggle_button.setArrowType(Qt.ArrowType.RightArrow)
        self.toggle_button.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.toggle_button.setToolTip("Show or hide how the model reasoned before it answered (Space)")
        self.toggle_button.toggled.connect(self._set_open)
        self.copy_button = QToolButton(self)
        self.copy_button.setText("Copy")
        self.copy_button.setToolTip("Copy the reasoning")
        self.copy_button.setAutoRaise(True)
        self.copy_button.setFocusPolicy(Qt.FocusPolicy.TabFocus)
        self.copy_button.clicked.connect(self.copy)
        self.copy_button.hide()
        top.addWidget(self.toggle_button)
        top.addStretch(1)
        top.addWidget(self.copy_button)
        layout.addLayout(top)
        self.body = MarkdownView(self)
        # Indented under the header's arrow: set apart from the answer below it.
        self.body.setContentsMargins(self.fontMetrics().averageCharWidth() * 2, 0, 0, 0)
        self.body.hide()
        layout.addWidget(self.body)
        self._reasoning = ""
        self._apply_colors()

    @property
    def expanded(self) -> bool:
        return self.toggle_button.isChecked()

    def set_expanded(self, expanded: bool) -> None:
        self.toggle_button.setChecked(expanded)

    def set_reasoning(self, text: str, title: str) -> None:
        self._reasoning = text
        self.toggle_button.setText(title)
        self.toggle_button.setAccessibleName(f"{title}: reasoning, {'shown' if self.expanded else 'hidden'}")
        if self.expanded:
            self.body.set_markdown(text)

    def reasoning(self) -> str:
        return self._reasoning

    def copy(self) -> None:
        QGuiApplication.clipboard().setText(self._reasoning)

    def _set_open(self, expanded: bool) -> None:
        self.toggle_button.setArrowType(Qt.ArrowType.DownArrow if expanded else Qt.ArrowType.RightArrow)
        if expanded:
            self.body.set_markdown(self._reasoning)  # rendered only when open: a long think costs nothing hidden
        self.body.setVisible(expanded)
        self.copy_button.setVisible(expanded)
        settle_layouts()  # the answer moves below the reasoning before either is painted
        self.toggled.emit(expanded)

    def _apply_colors(self) -> None:
        palette = self.parentWidget().palette() if self.parentWidget() else self.palette()
        muted = muted_text_color(palette)
        own = QPalette()
        for role in (QPalette.ColorRole.Text, QPalette.ColorRole.WindowText, QPalette.ColorRole.ButtonText):
            own.setColor(role, muted)
        self.setPalette(own)

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange and not getattr(self, "_coloring", False):
            self._coloring = True
            try:
                self._apply_colors()
            finally:
                self._coloring = False


class _Toggle(QToolButton):
    """The header: Space (as any button) or Enter opens and closes it."""

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            self.toggle()
            return
        super().keyPressEvent(event)
