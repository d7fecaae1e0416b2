"""Sweep…: which setting to sweep and its values; wrong values are said here, the dialog stays open."""

from __future__ import annotations

from collections.abc import Mapping

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QPlainTextEdit,
    QVBoxLayout,
    QWidget,
)

from engine.params import SamplingParams

from app.errors import SweepError
from app.workspace.json_reply import schema_label
from app.workspace.sweep import SWEEP_PARAMETERS, parse_values
from ui.theme import warning_color


class SweepDialog(QDialog):
    """Accepted only with values that `parse_values` took: read them from `parameter` and `values`."""

    def __init__(
        self, pane_title: str, params: SamplingParams, system_prompt: str, models: Mapping[str, str],
        *, can_reply_again: bool, parent: QWidget | None = None, schema_name: str | None = None,
    ) -> None:
        """`schema_name`: the saved name of the pane's JSON schema, when it replies as JSON."""
        super().__init__(parent)
        self.setWindowTitle(f"Sweep {pane_title}")
        self._params = params
        self._models = dict(models)
        self._suggestions = {
            "temperature": "0.2, 0.7, 1.2",
            "top_p": "0.5, 0.9, 1",
            "min_p": "0, 0.05, 0.1",
            "seed": "1-4",
            "system_prompt": (system_prompt + "\n" if system_prompt else "") + "Answer in one sentence.",
            "model": "\n".join(self._models.values()),
        }
        layout = QVBoxLayout(self)
        intro = QLabel(
            f"Open one new pane per value, right of {pane_title}, each a fork of its conversation with "
            "that setting (the rest as it is). The forks start from the same cached pages.", self)
        intro.setWordWrap(True)
        layout.addWidget(intro)
        form = QFormLayout()
        self.parameter = QComboBox(self)
        for swept in SWEEP_PARAMETERS:
            self.parameter.addItem(swept.label, swept.name)
        self.parameter.setCurrentIndex(self.parameter.findData("seed"))
        form.addRow("&Setting:", self.parameter)
        self.values_edit = QPlainTextEdit(self)
        self.values_edit.setTabChangesFocus(True)
        self.values_edit.setAccessibleName("Values")
        self.values_edit.setMaximumHeight(self.fontMetrics().lineSpacing() * 6)
        values_label = QLabel("&Values:", self)
        values_label.setBuddy(self.values_edit)
        form.addRow(values_label, self.values_edit)
        layout.addLayout(form)
        self.hint = QLabel(self)
        self.hint.setWordWrap(True)
        layout.addWidget(self.hint)
        self.reply_again = QCheckBox("&Reply again to the last message in each new pane", self)
        self.reply_again.setToolTip("Each new pane answers the last message anew with its setting, at once")
        self.reply_again.setEnabled(can_reply_again)
        self.reply_again.setChecked(can_reply_again)
        layout.addWidget(self.reply_again)
        # Only for a pane that replies as JSON: each fork keeps it unless this is unticked.
        self.keep_json = QCheckBox(self)
        if params.constraint is not None:
            self.keep_json.setText(f"&Keep “Reply as JSON” ({schema_label(params.constraint, schema_name)}) in each new pane")
            self.keep_json.setToolTip("Each new pane's replies are held to the same JSON as this pane's, "
                                      "so their validity can be compared")
        self.keep_json.setChecked(True)
        self.keep_json.setVisible(params.constraint is not None)
        layout.addWidget(self.keep_json)
        self.error = QLabel(self)
        self.error.setWordWrap(True)
        self.error.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        palette = self.error.palette()
        palette.setColor(self.error.foregroundRole(), warning_color(self.palette()))
        self.error.setPalette(palette)
        self.error.hide()
        layout.addWidget(self.error)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel, self)
        self.open_button = buttons.addButton("&Open panes", QDialogButtonBox.ButtonRole.AcceptRole)
        self.open_button.setDefault(True)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        self.parameter.currentIndexChanged.connect(lambda _i: self._parameter_changed())
        self._parameter_changed()
        self.values: list[object] = []
        em = self.fontMetrics().averageCharWidth()
        self.resize(em * 64, self.sizeHint().height())

    @property
    def chosen(self) -> str:
        return str(self.parameter.currentData())

    def _parameter_changed(self) -> None:
        swept = next(p for p in SWEEP_PARAMETERS if p.name == self.chosen)
        self.hint.setText(swept.hint)
        self.values_edit.setPlainText(self._suggestions[swept.name])
        self.error.hide()

    def accept(self) -> None:
        try:
            self.values = parse_values(self.chosen, self.values_edit.toPlainText(), self._params, self._models)
        except SweepError as exc:
            self.error.setText(str(exc))
            self.error.show()
            self.values_edit.setFocus()
            return
        super().accept()
