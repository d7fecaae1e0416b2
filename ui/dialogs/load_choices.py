"""What a model loads with, in the model manager's details: "Quantize at
load" and "Context length", kept per model by the registry and applied at
the model's next load ("Reload now" applies them at once to a loaded model).

A float checkpoint offers Off / int8 / int4; a folder stored quantized
already (an imported GGUF file) shows its formats instead. The context
length is the model's own (its trained context) or a cap below it: a smaller
context means a smaller KV pool, so less memory, which the details' memory
estimate shows.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import shiboken6

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QComboBox, QFormLayout, QHBoxLayout, QLabel, QPushButton, QSpinBox, QWidget

from app.models.memory_estimate import MemoryEstimate
from app.models.registry import QUANTIZE_CHOICES, ModelDetails, ModelEntry, ModelError
from engine.errors import EngineError
from engine.progress import format_bytes

if TYPE_CHECKING:
    from ui.dialogs.model_manager import ModelManagerDialog

log = logging.getLogger(__name__)

# The "Quantize at load" choices: (label, registry value).
QUANTIZE_ITEMS: tuple[tuple[str, str | None], ...] = (
    ("Off", None),
    ("int8 (8-bit)", "int8"),
    ("int4 (4-bit)", "int4"),
)
assert {value for _, value in QUANTIZE_ITEMS} - {None} == set(QUANTIZE_CHOICES)
# What each choice does to a float checkpoint (engine/formats/loader.py quantized_copy).
_QUANTIZE_MEANING = {
    None: "Runs the weights as stored.",
    "int8": "Layers as 8-bit blocks (q8_0, ~1.06 bytes a weight): nearly identical replies, faster on the CPU.",
    "int4": (
        "Layers as 4-bit blocks (q4_1, ~0.6 bytes a weight; embedding and head at 8 bits): "
        "smallest and fastest on the CPU, slightly less accurate."
    ),
}
# The context spin box's value that stands for "the model's own context" (no cap).
_OWN_CONTEXT = 0
_CONTEXT_STEP = 256


class ContextSpinBox(QSpinBox):
    """The context length: "Model's own" stands for the largest value, so the
    arrows treat it as the top of the range (↑ there does nothing, ↓ leaves it
    for the next step below the trained context) and never wrap past it."""

    def _trained(self) -> int:
        return self.maximum()

    def stepBy(self, steps: int) -> None:  # noqa: N802 (Qt's name)
        trained = self._trained()
        current = trained if self.value() == _OWN_CONTEXT else self.value()
        if steps < 0 and current == trained:
            # 8,192 -> 7,936: the step below, on the step's grid.
            target = (trained - 1) // _CONTEXT_STEP * _CONTEXT_STEP + (steps + 1) * _CONTEXT_STEP
        else:
            target = current + steps * _CONTEXT_STEP
        if target >= trained:
            target = _OWN_CONTEXT
        else:
            target = max(target, min(_CONTEXT_STEP, trained))
        self.setValue(target)
        self.editingFinished.emit()

    def stepEnabled(self) -> QSpinBox.StepEnabledFlag:  # noqa: N802 (Qt's name)
        flags = QSpinBox.StepEnabledFlag.StepNone
        if not self.isEnabled():
            return flags
        lowest = min(_CONTEXT_STEP, self._trained())
        if self.value() == _OWN_CONTEXT or self.value() > lowest:
            flags |= QSpinBox.StepEnabledFlag.StepDownEnabled
        if self.value() != _OWN_CONTEXT:
            flags |= QSpinBox.StepEnabledFlag.StepUpEnabled
        return flags

# estimate(details, quantize, max_context) -> the memory estimate, or why there is none
Estimate = Callable[[ModelDetails, "str | None", "int | None"], "MemoryEstimate | EngineError"]


class LoadChoices:
    """The two rows in the details form, and what choosing in them does."""

    def __init__(self, dialog: ModelManagerDialog, form: QFormLayout, estimate: Estimate) -> None:
        self._dialog = dialog
        self._estimate = estimate
        # Models whose load choices changed while they were loaded.
        self.pending_reload: set[str] = set()
        parent = dialog.details_box
        em = dialog.fontMetrics().averageCharWidth()

        # Each note is a field of its own row: QFormLayout gives a wrapped label
        # its full height only when it is the field itself, not nested in a row
        # widget (there the last lines were cut after a change of text).
        self._form = form
        self.quantize_line = QWidget(parent)
        choice_line = QHBoxLayout(self.quantize_line)
        choice_line.setContentsMargins(0, 0, 0, 0)
        self.quantize_choice = QComboBox(self.quantize_line)
        self.quantize_choice.setAccessibleName("Quantize at load")
        for label, value in QUANTIZE_ITEMS:
            self.quantize_choice.addItem(label, value)
        self.quantize_choice.activated.connect(self._on_quantize_chosen)
        self.reload_button = QPushButton("Re&load now", parent)
        self.reload_button.setAutoDefault(False)
        self.reload_button.setToolTip("Load the model again with the new choices (its replies in progress stop)")
        self.reload_button.clicked.connect(self.reload_selected)
        self.reload_button.hide()
        choice_line.addWidget(self.quantize_choice)
        choice_line.addStretch(1)
        quantize_label = QLabel("&Quantize at load:", parent)
        quantize_label.setBuddy(self.quantize_choice)
        form.addRow(quantize_label, self.quantize_line)
        self.quantize_note = _note(parent, em)
        # Says "Quantize at load:" when the choice row is hidden (a model stored quantized).
        self.quantize_note_label = QLabel(parent)
        form.addRow(self.quantize_note_label, self.quantize_note)

        context_line_widget = QWidget(parent)
        context_line = QHBoxLayout(context_line_widget)
        context_line.setContentsMargins(0, 0, 0, 0)
        self.context_length = ContextSpinBox(context_line_widget)
        self.context_length.setAccessibleName("Context length")
        self.context_length.setSuffix(" tokens")
        self.context_length.setGroupSeparatorShown(True)
        self.context_length.setSingleStep(_CONTEXT_STEP)
        self.context_length.setToolTip(
            "The most tokens a conversation with this model may hold. Less than the model's own context "
            "means a smaller KV cache, so less memory; it applies at the model's next load."
        )
        self.context_length.editingFinished.connect(self._on_context_chosen)
        context_line.addWidget(self.context_length)
        context_line.addStretch(1)
        context_label = QLabel("Conte&xt length:", parent)
        context_label.setBuddy(self.context_length)
        form.addRow(context_label, context_line_widget)
        self.context_note = _note(parent, em)
        form.addRow("", self.context_note)
        # A row of its own under both choices: it applies either, and beside the
        # quantize choice (hidden for a model stored quantized) it read as that row's label.
        reload_row = QWidget(parent)
        reload_line = QHBoxLayout(reload_row)
        reload_line.setContentsMargins(0, 0, 0, 0)
        reload_line.addWidget(self.reload_button)
        reload_line.addStretch(1)
        form.addRow("", reload_row)

    def tab_order(self) -> list[QWidget]:
        return [self.quantize_choice, self.context_length, self.reload_button]

    # -- showing ---------------------------------------------------------------------

    def show_unreadable(self) -> None:
        """The model's files cannot be read: nothing to choose."""
        self._form.setRowVisible(self.quantize_line, False)
        self.quantize_note_label.setText("Quantize at load:")
        self.quantize_choice.hide()
        self.reload_button.hide()
        self.quantize_note.setText("—")
        self.context_length.hide()
        self.context_note.setText("—")

    def show(self, model_id: str, entry: ModelEntry | None, details: ModelDetails,
             estimate: MemoryEstimate | EngineError) -> None:
        pending = model_id in self.pending_reload and self._dialog.is_loaded(model_id)
        self._show_quantize(details, entry, estimate, pending)
        self._show_context(details, entry)
        self.reload_button.setVisible(pending and self._dialog.can_reload)

    def _show_quantize(self, details: ModelDetails, entry: ModelEntry | None,
                       estimate: MemoryEstimate | EngineError, pending: bool) -> None:
        """The "Quantize at load" row: the choice and what it means, or the
        formats of a model stored quantized already."""
        note = self.quantize_note
        cap = entry.max_context if entry is not None else None
        self._form.setRowVisible(self.quantize_line, not details.quantized)
        self.quantize_note_label.setText("Quantize at load:" if details.quantized else "")
        if details.quantized:
            self.quantize_choice.hide()
            parts = [f"Not needed: stored as {' + '.join(details.stored.formats)} blocks, which stay "
                     "quantized in memory."]
        else:
            quantize = entry.quantize if entry is not None else None
            self.quantize_choice.show()
            self.quantize_choice.setCurrentIndex(max(0, self.quantize_choice.findData(quantize)))
            parts = [_QUANTIZE_MEANING[quantize]]
            if quantize is None:
                smaller = [(mode, self._estimate(details, mode, cap)) for mode in QUANTIZE_CHOICES]
                if all(isinstance(e, MemoryEstimate) for _, e in smaller) and isinstance(estimate, MemoryEstimate):
                    sizes = " and ".join(f"{format_bytes(e.weights_bytes)} in {mode}" for mode, e in smaller)  # type: ignore[union-attr]
                    parts.append(
                        f"Quantized, the weights would take {sizes} instead of "
                        f"{format_bytes(estimate.weights_bytes)}; computed once at the next load, then cached."
                    )
                else:
                    problem = next(e for _, e in [*smaller, (None, estimate)] if isinstance(e, EngineError))
                    parts.append(str(problem))
            elif isinstance(estimate, EngineError):
                parts.append(str(estimate))
            else:
                as_stored = self._estimate(details, None, cap)
                if isinstance(as_stored, MemoryEstimate):
                    parts.append(
                        f"Weights {format_bytes(estimate.weights_bytes)} instead of "
                        f"{format_bytes(as_stored.weights_bytes)};"
                    )
                parts.append("computed once at the first load, then cached.")
        if pending:
            parts.append("The loaded copy runs as before until the model loads again.")
        note.setText(" ".join(parts))

    def _show_context(self, details: ModelDetails, entry: ModelEntry | None) -> None:
        trained = details.context_length
        cap = entry.max_context if entry is not None else None
        box = self.context_length
        box.show()
        box.blockSignals(True)
        try:
            box.setRange(_OWN_CONTEXT, max(1, trained))
            box.setSpecialValueText(f"Model's own ({trained:,})")
            box.setValue(cap if cap is not None else _OWN_CONTEXT)
        finally:
            box.blockSignals(False)
        box.setEnabled(entry is not None)
        if cap is None:
            self.context_note.setText("All of the context the model was trained for. A smaller one needs less memory.")
        else:
            self.context_note.setText(
                f"Capped below the trained {trained:,} tokens: conversations stop (or drop their oldest "
                "turns) sooner, and the KV cache needs less memory."
            )

    # -- choosing --------------------------------------------------------------------

    def _on_quantize_chosen(self, index: int) -> None:
        dialog = self._dialog
        model_id = dialog.selected_id()
        if model_id is None:
            return
        mode = self.quantize_choice.itemData(index)
        try:
            entry = dialog.registry.set_quantize(model_id, mode)
        except ModelError as exc:
            dialog.show_error("The quantize choice was not changed", str(exc))
            dialog.show_selected()  # back to the choice that is saved
            return
        self._changed(model_id, f"“{entry.name}”: quantize at load set to {self.quantize_choice.itemText(index)}")

    def _on_context_chosen(self) -> None:
        dialog = self._dialog
        model_id = dialog.selected_id()
        if model_id is None or not self.context_length.isVisible():
            return
        value = self.context_length.value()
        cap = None if value == _OWN_CONTEXT else value
        try:
            if dialog.registry.get(model_id).max_context == cap:
                return
            entry = dialog.registry.set_max_context(model_id, cap)
        except ModelError as exc:
            dialog.show_error("The context length was not changed", str(exc))
            dialog.show_selected()  # back to the length that is saved
            return
        what = "the model's own" if cap is None else f"{cap:,} tokens"
        self._changed(model_id, f"“{entry.name}”: context length set to {what}")

    def _changed(self, model_id: str, what: str) -> None:
        """A load choice was saved: say when it applies, and offer to reload a loaded model."""
        dialog = self._dialog
        if dialog.is_loaded(model_id):
            self.pending_reload.add(model_id)
            when = "the next time it loads" + (" (or reload it now)" if dialog.can_reload else "")
            dialog.status_label.setText(f"{what}; it applies {when}.")
        else:
            dialog.status_label.setText(f"{what}; it applies when it loads.")
        dialog.show_selected()

    def reload_selected(self) -> None:
        """Reload the selected model so that its load choices apply now."""
        dialog = self._dialog
        model_id = dialog.selected_id()
        if model_id is None or not dialog.can_reload:
            return
        self.pending_reload.discard(model_id)
        try:
            task = dialog.reload_model(model_id)
        except Exception as exc:  # the window reports load failures itself; this is a bug
            log.exception("reloading %s", model_id)
            dialog.show_error("The model was not reloaded", str(exc))
            return
        name = dialog.registry.get(model_id).name
        if isinstance(task, asyncio.Future):
            dialog.status_label.setText(f"Reloading “{name}”…")
            task.add_done_callback(lambda done: self._reloaded(done, name))
        else:
            dialog.status_label.setText(f"“{name}” reloads with the new choices.")
        dialog.show_selected()

    def _reloaded(self, task: asyncio.Future[object], name: str) -> None:
        """The reload ended: say how, in place of "Reloading…"."""
        dialog = self._dialog
        if not shiboken6.isValid(dialog):  # closed meanwhile
            return
        if task.cancelled() or task.exception() is not None or task.result() is False:
            # The window says why in its own banner.
            text = f"“{name}” was not reloaded; the window says why."
        else:
            text = f"Reloaded “{name}”: its load choices apply now."
        dialog.status_label.setText(text)
        dialog.show_selected()


def _note(parent: QWidget, em: int) -> QLabel:
    note = QLabel(parent)
    note.setWordWrap(True)
    # A row the form makes taller than the text leaves its space below, not above.
    note.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop)
    note.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    note.setMinimumWidth(em * 30)
    return note
