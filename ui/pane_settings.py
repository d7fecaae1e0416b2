"""A pane's sampling parameters and system prompt, in a compact popover."""

from __future__ import annotations

import dataclasses
import html
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QCheckBox,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)


def describe_params(model_name: str, params: Any) -> str:
    """The pane header: 'SmolLM2-135M-Instruct · t=0.7 · seed 7'."""
    parts = [model_name]
    parts.append("greedy" if params.temperature < 1e-5 else f"t={params.temperature:g}")
    if params.top_p < 1.0:
        parts.append(f"top-p {params.top_p:g}")
    if params.top_k:
        parts.append(f"top-k {params.top_k}")
    if params.min_p:
        parts.append(f"min-p {params.min_p:g}")
    if params.repetition_penalty != 1.0:
        parts.append(f"rep {params.repetition_penalty:g}")
    if params.seed is not None:
        parts.append(f"seed {params.seed}")
    return " · ".join(parts)


class PaneSettingsPopover(QFrame):
    """Edits a copy of the pane's settings; `applied` carries the result.

    A popup: a click outside or Esc closes it without applying.
    """

    applied = Signal(object, str)  # (SamplingParams, system prompt)

    def __init__(
        self, params: Any, system_prompt: str, max_context: int, parent: QWidget | None = None, title: str = ""
    ) -> None:
        super().__init__(parent, Qt.WindowType.Popup)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self._params = params
        layout = QVBoxLayout(self)
        if title:
            heading = QLabel(f"<b>{html.escape(title)}</b> · applies from the next reply", self)
            layout.addWidget(heading)
        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)

        self.temperature = self._double(0.0, 5.0, 0.05, 2, params.temperature, "0 = greedy")
        self.top_p = self._double(0.01, 1.0, 0.05, 2, params.top_p, "1 = off")
        self.top_k = QSpinBox(self)
        self.top_k.setRange(0, 100_000)
        self.top_k.setSpecialValueText("off")
        self.top_k.setValue(params.top_k)
        self.min_p = self._double(0.0, 0.99, 0.01, 2, params.min_p, "0 = off")
        self.repetition_penalty = self._double(0.5, 3.0, 0.05, 2, params.repetition_penalty, "1 = off")
        self.max_tokens = QSpinBox(self)
        self.max_tokens.setRange(1, max(1, max_context))
        self.max_tokens.setValue(min(params.max_tokens, max(1, max_context)))
        seed_row = QHBoxLayout()
        self.fixed_seed = QCheckBox("fixed", self)
        self.fixed_seed.setToolTip("Same seed and prompt give the same reply")
        self.seed = QSpinBox(self)
        self.seed.setRange(0, 2**31 - 1)
        self.fixed_seed.setChecked(params.seed is not None)
        self.seed.setValue(params.seed or 0)
        self.seed.setEnabled(params.seed is not None)
        self.fixed_seed.toggled.connect(self.seed.setEnabled)
        seed_row.addWidget(self.fixed_seed)
        seed_row.addWidget(self.seed, 1)

        form.addRow("&Temperature", self.temperature)
        form.addRow("Top-&p", self.top_p)
        form.addRow("Top-&k", self.top_k)
        form.addRow("&Min-p", self.min_p)
        form.addRow("&Repetition penalty", self.repetition_penalty)
        form.addRow("Max &tokens", self.max_tokens)
        seed_label = QLabel("&Seed", self)
        seed_label.setBuddy(self.fixed_seed)
        form.addRow(seed_label, seed_row)
        layout.addLayout(form)
        label = QLabel("S&ystem prompt", self)
        self.system_prompt = QPlainTextEdit(self)
        self.system_prompt.setPlainText(system_prompt)
        self.system_prompt.setTabChangesFocus(True)
        lines = self.system_prompt.fontMetrics().lineSpacing()
        self.system_prompt.setFixedHeight(lines * 4 + 12)
        label.setBuddy(self.system_prompt)
        layout.addWidget(label)
        layout.addWidget(self.system_prompt)
        self.error_label = QLabel(self)
        self.error_label.setWordWrap(True)
        self.error_label.hide()
        layout.addWidget(self.error_label)
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Apply | QDialogButtonBox.StandardButton.Cancel, self
        )
        self.apply_button = buttons.button(QDialogButtonBox.StandardButton.Apply)
        self.apply_button.setDefault(True)
        self.apply_button.clicked.connect(self.apply)
        buttons.rejected.connect(self.close)
        layout.addWidget(buttons)
        QShortcut(QKeySequence("Ctrl+Return"), self, activated=self.apply)
        self.setMinimumWidth(self.fontMetrics().averageCharWidth() * 40)

    def _double(self, lo: float, hi: float, step: float, decimals: int, value: float, tip: str) -> QDoubleSpinBox:
        box = QDoubleSpinBox(self)
        box.setRange(lo, hi)
        box.setSingleStep(step)
        box.setDecimals(decimals)
        box.setValue(value)
        box.setToolTip(tip)
        return box

    def values(self) -> Any:
        return dataclasses.replace(
            self._params,
            temperature=round(self.temperature.value(), 4),
            top_p=round(self.top_p.value(), 4),
            top_k=self.top_k.value(),
            min_p=round(self.min_p.value(), 4),
            repetition_penalty=round(self.repetition_penalty.value(), 4),
            max_tokens=self.max_tokens.value(),
            seed=self.seed.value() if self.fixed_seed.isChecked() else None,
        )

    def apply(self) -> None:
        try:
            params = self.values()
        except ValueError as exc:  # InvalidSamplingParams is a ValueError
            self.error_label.setText(str(exc))
            self.error_label.show()
            return
        self.applied.emit(params, self.system_prompt.toPlainText())
        self.close()
