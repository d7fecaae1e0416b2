"""The model dropdown of a pane's header: the registry's models, a missing one greyed out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QPaintEvent
from PySide6.QtWidgets import QComboBox, QStyle, QStyleOptionComboBox, QStylePainter, QWidget

from engine.progress import display_path

if TYPE_CHECKING:
    from app.models.registry import ModelEntry


class ModelPicker(QComboBox):
    """The model dropdown of a pane's header; `model_chosen(id)` when the user picks one."""

    model_chosen = Signal(str)
    # The least of a model's name it shows in a narrow pane ("SmolLM2-135M…"), never "Sm".
    MIN_CHARS = 13

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAccessibleName("Model")
        self.setToolTip("The model this pane runs")
        self.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self._current: str | None = None
        self.activated.connect(self._on_activated)

    def set_models(self, entries: Sequence[ModelEntry], current_id: str | None) -> None:
        """Show `entries`, `current_id` selected; emits nothing."""
        self.blockSignals(True)
        try:
            self.clear()
            for entry in entries:
                available = entry.available()
                self.addItem(entry.name if available else f"{entry.name} (missing)", entry.id)
                index = self.count() - 1
                where = display_path(entry.path) if entry.path else "Built into Tandem"
                self.setItemData(index, f"{entry.kind_label}: {where}", Qt.ItemDataRole.ToolTipRole)
                if not available:
                    # Greyed out and not selectable: its files are gone.
                    self.model().item(index).setEnabled(False)  # type: ignore[attr-defined]
            index = self.findData(current_id) if current_id is not None else -1
            self.setCurrentIndex(index)
            self._current = current_id if index >= 0 else None
            # A narrow pane shows the start of a long name: the whole of it on hover.
            name = self.itemText(index) if index >= 0 else ""
            self.setToolTip(f"The model this pane runs: {name}" if name else "The model this pane runs")
        finally:
            self.blockSignals(False)

    def current_id(self) -> str | None:
        return self._current

    def _on_activated(self, index: int) -> None:
        model_id = self.itemData(index)
        if model_id is None or model_id == self._current:
            return
        self._current = model_id
        self.model_chosen.emit(model_id)

    def sizeHint(self) -> QSize:  # noqa: N802
        hint = super().sizeHint()
        return QSize(min(hint.width(), self.fontMetrics().averageCharWidth() * 36), hint.height())

    def minimumSizeHint(self) -> QSize:  # noqa: N802
        # The arrow and frame (the hint's width beyond its text) plus MIN_CHARS of the name.
        hint = self.sizeHint()
        text = max((self.fontMetrics().horizontalAdvance(self.itemText(i)) for i in range(self.count())), default=0)
        chrome = max(hint.width() - text, 0) if text else self.fontMetrics().averageCharWidth() * 4
        least = chrome + self.fontMetrics().averageCharWidth() * self.MIN_CHARS
        return QSize(min(hint.width(), least), hint.height())

    def shown_text(self) -> str:
        """The name as drawn: ending in "…" when the picker is narrower than it."""
        option = QStyleOptionComboBox()
        self.initStyleOption(option)
        field = self.style().subControlRect(QStyle.ComplexControl.CC_ComboBox, option,
                                            QStyle.SubControl.SC_ComboBoxEditField, self)
        return self.fontMetrics().elidedText(option.currentText, Qt.TextElideMode.ElideRight, max(field.width(), 1))

    def paintEvent(self, event: QPaintEvent) -> None:  # noqa: N802
        # The style draws the name cut mid-letter in a narrow pane; "…" says there is more.
        painter = QStylePainter(self)
        option = QStyleOptionComboBox()
        self.initStyleOption(option)
        painter.drawComplexControl(QStyle.ComplexControl.CC_ComboBox, option)
        option.currentText = self.shown_text()
        painter.drawControl(QStyle.ControlElement.CE_ComboBoxLabel, option)
