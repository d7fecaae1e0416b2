"""A message body: Markdown split into blocks, fenced code with a copy button.

Streaming replies are re-rendered many times a second, so the text is cut
into blocks (fenced code, and prose paragraphs that stand alone) and only the
blocks whose text changed are re-rendered: while a reply streams that is the
last block, whatever the length of the reply.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from PySide6.QtCore import QCoreApplication, QEvent, QSize, Qt, Signal
from PySide6.QtGui import QFontDatabase, QGuiApplication, QPalette, QTextCursor, QTextOption
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QSizePolicy,
    QTextBrowser,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from ui.panes.code_highlight import CodeHighlighter, knows_language
from ui.theme import diff_highlight_color, is_dark


@dataclass(slots=True, frozen=True)
class Block:
    kind: str  # "text" | "code"
    text: str  # for code: the code without its fences
    lang: str = ""
    closed: bool = True  # a code block whose closing fence has not arrived yet is open


_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)[^`]*$")
# A paragraph break is a safe block boundary unless the next line continues a
# list or an indented block (then splitting would change how it renders).
_CONTINUATION = re.compile(r"^(\s|[-*+]\s|\d{1,9}[.)]\s|>|\|)")


def split_blocks(text: str) -> list[Block]:
    """Cut Markdown into blocks that render the same on their own as together."""
    blocks: list[Block] = []
    prose: list[str] = []

    def flush_prose() -> None:
        while prose and not prose[-1].strip():
            prose.pop()
        if prose:
            blocks.append(Block("text", "\n".join(prose)))
        prose.clear()

    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = _FENCE.match(line)
        if fence:
            flush_prose()
            marker, lang = fence.group(1), fence.group(2)
            code: list[str] = []
            i += 1
            closed = False
            while i < len(lines):
                stripped = lines[i].strip()
                if stripped.startswith(marker[0] * len(marker)) and set(stripped) <= {marker[0]}:
                    closed = True
                    i += 1
                    break
                code.append(lines[i])
                i += 1
            blocks.append(Block("code", "\n".join(code), lang, closed))
            continue
        if not line.strip() and prose:
            nxt = lines[i + 1] if i + 1 < len(lines) else ""
            if nxt.strip() and not _CONTINUATION.match(nxt) and not _FENCE.match(nxt):
                flush_prose()
                i += 1
                continue
        if prose or line.strip():
            prose.append(line)
        i += 1
    flush_prose()
    return blocks


# Prose that Markdown shows exactly as written: letters, digits, single spaces
# and punctuation that starts no Markdown (no emphasis, code, links, HTML,
# escapes, entities, autolinks, tables or line breaks).
_PLAIN_PROSE = re.compile(r"(?:[^\W_]|[ ,.;:?!'\"()%\-’‘“”—–…])*")


def appends_as_plain_text(shown: str, added: str) -> bool:
    """Whether Markdown `shown + added` renders as `shown` with `added` typed
    at its end, so a streaming paragraph can grow without being parsed again.

    True only when both are plain prose on one line: `shown` starts with a
    letter (no list, heading or indented code), neither has two spaces in a
    row nor ends in a space (Markdown drops trailing spaces), and no "www."
    (an autolink) appears."""
    if not shown or not added or not shown[0].isalpha():
        return False
    if shown[-1] == " " or added[-1] == " " or "  " in shown[-1] + added:
        return False
    if _PLAIN_PROSE.fullmatch(added) is None or _PLAIN_PROSE.fullmatch(shown) is None:
        return False
    return "www." not in (shown + added).lower()


# Levels of nesting between a text block and the pane's scroll area (code
# text, code block, Markdown view, Thinking section, message, the list, the
# scroll area), with room to spare.
LAYOUT_PASSES = 8


def settle_layouts() -> None:
    """Run the layouts that text changes asked for, now, up to the pane's scroll area.

    A block's new height reaches the blocks and messages below it through
    layouts that run from posted events, one level of nesting per pass (Qt
    keeps events posted while it sends them for its next pass). A paint
    between two passes showed a paragraph over the next one (issue 29), so a
    pane is laid out whole before it can be painted."""
    for _ in range(LAYOUT_PASSES):
        QCoreApplication.sendPostedEvents(None, QEvent.Type.LayoutRequest)


class AutoHeightText(QTextBrowser):
    """A read-only rich text view exactly as tall as its content.

    It wraps at the width it is given (anywhere, if a word is too long), so a
    long URL or line of code never widens the pane.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setWordWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)
        self.setOpenExternalLinks(True)
        # Selectable with the mouse, but not a Tab stop: a long chat would
        # otherwise put dozens of stops between the pane's buttons.
        self.setFocusPolicy(Qt.FocusPolicy.ClickFocus)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.viewport().setAutoFillBackground(False)
        self.document().setDocumentMargin(2)
        self.document().documentLayout().documentSizeChanged.connect(self._fit)
        self._shown_markdown: str | None = None  # what show_markdown rendered last
        self._content_height = 1
        self._fit()

    def _fit(self, *_: object) -> None:
        self._set_content_height(math.ceil(self.document().size().height()) + 2 * self.frameWidth())

    def _set_content_height(self, height: int) -> None:
        # The height goes to the layout as a size hint, never to the widget directly:
        # a block that resized itself at once covered the block below it until the
        # layout moved that one, a pass later (issue 29). The layout moves both at once.
        height = max(height, 1)
        if height != self._content_height:
            self._content_height = height
            self.updateGeometry()

    def show_markdown(self, text: str) -> None:
        """Render Markdown `text`. A paragraph that grew by plain words (a
        streaming reply) gets them appended instead of being parsed and laid
        out again from its first word."""
        shown, self._shown_markdown = self._shown_markdown, text
        if shown is not None and text.startswith(shown) and appends_as_plain_text(shown, text[len(shown):]):
            cursor = QTextCursor(self.document())
            cursor.movePosition(QTextCursor.MoveOperation.End)
            cursor.insertText(text[len(shown):])
        else:
            self.setMarkdown(text)

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt naming)
        super().resizeEvent(event)
        self._fit()

    def minimumSizeHint(self) -> QSize:  # noqa: N802
        return QSize(40, self._content_height)

    def sizeHint(self) -> QSize:  # noqa: N802
        return QSize(200, self._content_height)

    def wheelEvent(self, event) -> None:  # noqa: N802
        # Nothing to scroll here: let the pane's scroll area have it.
        event.ignore()


class CodeText(AutoHeightText):
    """Code as written: lines never wrap; a line wider than the pane scrolls
    sideways inside the block (its own scroll bar), never widening the pane."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setLineWrapMode(QTextBrowser.LineWrapMode.NoWrap)
        self.setWordWrapMode(QTextOption.WrapMode.NoWrap)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        self.horizontalScrollBar().rangeChanged.connect(self._fit)

    def _fit(self, *_: object) -> None:
        height = math.ceil(self.document().size().height()) + 2 * self.frameWidth()
        bar = self.horizontalScrollBar()
        if bar.maximum() > 0:  # a line wider than the block: room for its scroll bar below the last line
            height += bar.sizeHint().height()
        self._set_content_height(height)

    def wheelEvent(self, event) -> None:  # noqa: N802
        # Sideways wheels scroll the code; up and down scroll the pane.
        delta = event.angleDelta()
        if abs(delta.x()) > abs(delta.y()) or event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            QTextBrowser.wheelEvent(self, event)
        else:
            event.ignore()


class CodeBlockView(QFrame):
    """A fenced code block: monospace, coloured by language, its language, and a Copy button."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("codeBlock")
        self._block: Block | None = None
        self._dark = is_dark(self.palette())
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setAutoFillBackground(True)
        self.setBackgroundRole(QPalette.ColorRole.AlternateBase)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 2, 6, 4)
        layout.setSpacing(0)
        top = QHBoxLayout()
        top.setContentsMargins(0, 0, 0, 0)
        self.lang_label = QLabel(self)
        self.lang_label.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        self.copy_button = QToolButton(self)
        self.copy_button.setText("Copy")
        self.copy_button.setToolTip("Copy this code")
        self.copy_button.setAutoRaise(True)
        self.copy_button.clicked.connect(self.copy)
        top.addWidget(self.lang_label)
        top.addStretch(1)
        top.addWidget(self.copy_button)
        layout.addLayout(top)
        self.code = CodeText(self)
        self._highlighter = CodeHighlighter(self.code.document(), dark=self._dark)
        self._fit_code_font()
        layout.addWidget(self.code)

    def set_block(self, block: Block) -> None:
        if block == self._block:
            return
        old, self._block = self._block, block
        self.lang_label.setText(block.lang or "code")
        if old is not None and block.text.startswith(old.text):
            # A growing block (a streaming reply): append what is new, so only
            # the lines that changed are laid out and coloured again.
            cursor = QTextCursor(self.code.document())
            cursor.movePosition(QTextCursor.MoveOperation.End)
            cursor.insertText(block.text[len(old.text):])
        else:
            self.code.setPlainText(block.text)
        # After the text: a new language colours the whole block once, the same one nothing more.
        self._highlighter.set_language(block.lang if knows_language(block.lang) else "", self._dark)

    def is_highlighted(self) -> bool:
        """Whether the code shows in colour (its language is one Pygments knows)."""
        return self._block is not None and knows_language(self._block.lang)

    def _fit_code_font(self) -> None:
        # Monospace at the size of the text around it (which follows the window's zoom).
        fixed = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
        size = self.font().pointSizeF()
        if size > 0:
            fixed.setPointSizeF(size)
        self.code.setFont(fixed)

    def changeEvent(self, event) -> None:  # noqa: N802
        super().changeEvent(event)
        if event.type() == QEvent.Type.FontChange:
            self._fit_code_font()
        elif event.type() == QEvent.Type.PaletteChange:
            dark = is_dark(self.palette())
            if dark != self._dark:
                self._dark = dark
                lang = self._block.lang if self._block is not None and knows_language(self._block.lang) else ""
                self._highlighter.set_language(lang, dark)

    def text(self) -> str:
        return self._block.text if self._block else ""

    def copy(self) -> None:
        QGuiApplication.clipboard().setText(self.text())
        self.copy_button.setText("Copied")


class MarkdownView(QWidget):
    """Markdown as a column of blocks; `set_markdown` re-renders only what changed."""

    link_activated = Signal(str)

    def __init__(self, parent: QWidget | None = None, *, plain: bool = False) -> None:
        super().__init__(parent)
        self._plain = plain  # user messages are shown as typed, not as Markdown
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.setSpacing(4)
        self._blocks: list[Block] = []
        self._widgets: list[QWidget] = []
        self._text = ""
        self._highlight: tuple[Sequence[object], bool] | None = None
        self._highlight_view: AutoHeightText | None = None

    # -- content -------------------------------------------------------------

    def markdown(self) -> str:
        return self._text

    def set_markdown(self, text: str) -> None:
        if text == self._text and self._widgets:
            return
        self._text = text
        if self._highlight is not None:
            return  # shown again when the highlight is cleared
        blocks = [Block("text", text)] if self._plain else split_blocks(text)
        if not blocks:
            blocks = [Block("text", "")]
        for i, block in enumerate(blocks):
            if i < len(self._blocks) and self._blocks[i] == block:
                continue
            if i < len(self._widgets) and self._blocks[i].kind == block.kind:
                self._render(self._widgets[i], block)
            else:
                widget = self._make(block)
                if i < len(self._widgets):
                    old = self._widgets[i]
                    self._layout.replaceWidget(old, widget)
                    old.deleteLater()
                    self._widgets[i] = widget
                else:
                    self._layout.addWidget(widget)
                    self._widgets.append(widget)
                self._render(widget, block)
        for widget in self._widgets[len(blocks):]:
            self._layout.removeWidget(widget)
            widget.deleteLater()
        del self._widgets[len(blocks):]
        self._blocks = blocks

    def _make(self, block: Block) -> QWidget:
        if block.kind == "code":
            return CodeBlockView(self)
        return AutoHeightText(self)

    def _render(self, widget: QWidget, block: Block) -> None:
        if isinstance(widget, CodeBlockView):
            widget.set_block(block)
        elif isinstance(widget, AutoHeightText):
            if self._plain:
                widget.setPlainText(block.text)
            else:
                widget.show_markdown(block.text)

    def code_blocks(self) -> list[CodeBlockView]:
        return [w for w in self._widgets if isinstance(w, CodeBlockView)]

    def block_widgets(self) -> list[QWidget]:
        return list(self._widgets)

    # -- word-level comparison -------------------------------------------------

    def set_highlight(self, segments: Sequence[object] | None) -> None:
        """Show `segments` (objects with .text and .changed) with the changed
        words marked, or go back to the Markdown rendering with None."""
        if segments is None:
            if self._highlight is None:
                return
            self._highlight = None
            if self._highlight_view is not None:
                self._layout.removeWidget(self._highlight_view)
                self._highlight_view.deleteLater()
                self._highlight_view = None
            for w in self._widgets:
                w.show()
            text, self._text = self._text, ""
            self.set_markdown(text)
            return
        self._highlight = (list(segments), True)
        for w in self._widgets:
            w.hide()
        if self._highlight_view is None:
            self._highlight_view = AutoHeightText(self)
            self._layout.addWidget(self._highlight_view)
        self._render_highlight()

    def highlighted_html(self) -> str:
        return self._highlight_view.toHtml() if self._highlight_view else ""

    def _render_highlight(self) -> None:
        if self._highlight is None or self._highlight_view is None:
            return
        color = diff_highlight_color(self.palette()).name()
        parts = []
        for seg in self._highlight[0]:
            text = html.escape(seg.text).replace("\n", "<br>")
            if seg.changed and seg.text.strip():
                parts.append(f'<span style="background-color:{color}">{text}</span>')
            else:
                parts.append(text)
        self._highlight_view.setHtml("<div style='white-space:pre-wrap'>" + "".join(parts) + "</div>")

    def changeEvent(self, event) -> None:  # noqa: N802
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            self._render_highlight()
