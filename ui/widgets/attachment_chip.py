"""A document as a chip: its name, pages and tokens; a click opens its text.

The composer shows one per pending attachment (with a remove button, and
"reading…" until its text is extracted); a sent message shows one per
document it carries. `dropped_files` reads the local files out of a drop or
a paste, for every widget that takes files.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import QMimeData, QPointF, QRectF, QSize, Qt, Signal
from PySide6.QtGui import QColor, QIcon, QPainter, QPainterPath, QPen, QPixmap, QResizeEvent
from PySide6.QtWidgets import QFrame, QHBoxLayout, QSizePolicy, QToolButton, QWidget

if TYPE_CHECKING:
    from engine.documents import Document

# A chip shows at most this much of a file's name (the whole name in its tooltip).
NAME_CHARS = 28


def dropped_files(mime: QMimeData) -> list[str]:
    """The local files a drop or a paste carries (a browser's links are not files)."""
    if not mime.hasUrls():
        return []
    return [url.toLocalFile() for url in mime.urls() if url.isLocalFile() and url.toLocalFile()]


def paperclip_icon(color: QColor, size: int = 32) -> QIcon:
    """A paperclip, drawn: no icon theme or emoji font is needed to show it."""
    pixmap = QPixmap(size, size)
    pixmap.fill(Qt.GlobalColor.transparent)
    painter = QPainter(pixmap)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setPen(QPen(color, size / 14, Qt.PenStyle.SolidLine, Qt.PenCapStyle.RoundCap))
    s = size / 32
    path = QPainterPath(QPointF(20 * s, 10 * s))
    path.lineTo(20 * s, 23 * s)
    path.arcTo(QRectF(12 * s, 19 * s, 8 * s, 8 * s), 0, -180)
    path.lineTo(12 * s, 7 * s)
    path.arcTo(QRectF(12 * s, 2 * s, 12 * s, 10 * s), 180, -180)
    path.lineTo(24 * s, 24 * s)
    path.arcTo(QRectF(8 * s, 16 * s, 16 * s, 14 * s), 0, -180)
    path.lineTo(8 * s, 12 * s)
    painter.drawPath(path)
    painter.end()
    return QIcon(pixmap)


class ElidedToolButton(QToolButton):
    """A tool button whose text ends in "…" when it is given less room than the whole text needs."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._full = ""
        self.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)

    def full_text(self) -> str:
        return self._full

    def set_full_text(self, text: str) -> None:
        self._full = text
        self.setText(text)
        self.updateGeometry()
        self._elide()

    def _padding(self) -> int:
        """What the button takes beside its text (icon, margins), as the style lays it out."""
        return super().sizeHint().width() - self.fontMetrics().horizontalAdvance(self.text())

    def sizeHint(self) -> QSize:  # noqa: N802
        hint = super().sizeHint()
        return QSize(self.fontMetrics().horizontalAdvance(self._full) + self._padding(), hint.height())

    def minimumSizeHint(self) -> QSize:  # noqa: N802
        return QSize(self.fontMetrics().averageCharWidth() * 8 + self._padding(), super().minimumSizeHint().height())

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        room = self.width() - self._padding()
        # Whole when it has the room it asked for (elidedText's own measure rounds differently).
        whole = room >= self.fontMetrics().horizontalAdvance(self._full)
        text = self._full if whole else self.fontMetrics().elidedText(self._full, Qt.TextElideMode.ElideRight, room)
        if text != self.text():
            self.setText(text)


def short_name(name: str) -> str:
    return name if len(name) <= NAME_CHARS else name[: NAME_CHARS - 1] + "…"


def chip_text(document: Document, tokens: int | None, note: str = "") -> str:
    """'report.pdf · 3 pages · 1,204 tokens · first part'."""
    parts = [short_name(document.name)]
    if document.pages is not None:
        parts.append(f"{document.pages} page{'s' if document.pages != 1 else ''}")
    if tokens is not None:
        parts.append(f"{tokens:,} tokens")
    if not document.complete:
        parts.append("first part")
    if note:
        parts.append(note)
    return " · ".join(parts)


class AttachmentChip(QFrame):
    """One attached document. `set_document` fills it in once the text is read."""

    open_requested = Signal()
    remove_requested = Signal()

    def __init__(self, name: str, parent: QWidget | None = None, *, removable: bool = False) -> None:
        super().__init__(parent)
        self.name = name
        self.document: Document | None = None
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        row = QHBoxLayout(self)
        row.setContentsMargins(2, 0, 2, 0)
        row.setSpacing(0)
        self.label = ElidedToolButton(self)
        self.label.setIcon(paperclip_icon(self.palette().windowText().color()))
        self.label.setAutoRaise(True)
        self.label.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.label.clicked.connect(self._open)
        row.addWidget(self.label, 1)
        self.remove_button: QToolButton | None = None
        if removable:
            self.remove_button = QToolButton(self)
            self.remove_button.setText("✕")
            self.remove_button.setAutoRaise(True)
            self.remove_button.setToolTip(f"Remove {name}")
            self.remove_button.setAccessibleName(f"Remove {name}")
            self.remove_button.clicked.connect(self.remove_requested)
            row.addWidget(self.remove_button)
        self.set_reading()

    def set_reading(self) -> None:
        self.label.set_full_text(f"{short_name(self.name)} · reading…")
        self.label.setToolTip(f"Reading the text of {self.name}; removing it stops the reading")

    def set_document(self, document: Document, tokens: int | None, note: str = "") -> None:
        self.document = document
        self.label.set_full_text(chip_text(document, tokens, note))
        whole = "" if document.complete else " Only its first part is sent."
        self.label.setToolTip(f"{document.name}: {len(document.text):,} characters of text.{whole} "
                              "Click to read the text the model gets.")

    def _open(self) -> None:
        if self.document is not None:
            self.open_requested.emit()
