"""An attached document's extracted text, read-only: what the model is given."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Qt
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QPlainTextEdit, QVBoxLayout, QWidget

if TYPE_CHECKING:
    from engine.documents import Document


def document_summary(document: Document) -> str:
    """'PDF · 3 pages · 48,210 bytes · 12,004 characters · first part only'."""
    parts = [document.kind.upper() if len(document.kind) <= 4 else document.kind]
    if document.pages is not None:
        parts.append(f"{document.pages} page{'s' if document.pages != 1 else ''}")
    parts += [f"{document.size:,} bytes", f"{len(document.text):,} characters"]
    if not document.complete:
        parts.append("first part only")
    return " · ".join(parts)


class DocumentViewer(QDialog):
    """The text as extracted (and, for a first part, as sent); closes with Esc."""

    def __init__(self, document: Document, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle(document.name)
        self.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        layout = QVBoxLayout(self)
        self.summary = QLabel(document_summary(document), self)
        self.summary.setWordWrap(True)
        self.summary.setToolTip(f"SHA-256 of the file: {document.sha256}")
        layout.addWidget(self.summary)
        self.text = QPlainTextEdit(self)
        self.text.setReadOnly(True)
        self.text.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.text.setPlainText(document.text)
        layout.addWidget(self.text, 1)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close, self)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        self.resize(720, 560)


def show_document(parent: QWidget, document: Document) -> DocumentViewer:
    viewer = DocumentViewer(document, parent.window())
    viewer.open()
    return viewer
