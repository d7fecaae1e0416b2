"""The sampling form: one editor per numeric sampling field, for the pane's
settings popover and the Preferences dialog alike.

Ranges, labels, steps and tooltips come from `engine.params.SAMPLING_FIELDS`
(the table SamplingParams checks against), so the form offers exactly what
the engine accepts. The seed is not here: the two places show it
differently (a "fixed" box and a number, or a text field that may be empty).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtWidgets import QDoubleSpinBox, QSpinBox, QWidget

from engine.params import SAMPLING_FIELDS, SamplingField

if TYPE_CHECKING:
    from engine.params import SamplingParams

# Where the engine sets no upper bound a spin box still needs one: the most
# anyone asks for in practice.
FORM_CEILING: dict[str, float] = {
    "temperature": 5.0,
    "top_k": 100_000,
    "repetition_penalty": 3.0,
    "max_tokens": 1_000_000,
}

# The keyboard mnemonic of each field's label (the letter Alt+ jumps to).
MNEMONIC: dict[str, str] = {
    "temperature": "T",
    "top_p": "p",
    "top_k": "k",
    "min_p": "M",
    "repetition_penalty": "n",
    "max_tokens": "x",
}

# Shown instead of the number when the value turns the field off.
OFF_TEXT: dict[str, str] = {"top_k": "off"}

# A row adder: (label with its mnemonic, field name, editor, tooltip).
AddRow = Callable[[str, str, QWidget, str], None]

Editor = QSpinBox | QDoubleSpinBox


def label_with_mnemonic(field: SamplingField) -> str:
    """'Repetitio&n penalty': the table's label with `MNEMONIC`'s letter marked."""
    letter = MNEMONIC.get(field.name)
    index = field.label.find(letter) if letter else -1
    if index < 0:
        return field.label
    return field.label[:index] + "&" + field.label[index:]


def editor_for(field: SamplingField, parent: QWidget, maximum: float | None = None) -> Editor:
    """A spin box for `field`: its range (capped at `maximum` when given), step, decimals and help."""
    top = field.form_maximum if field.form_maximum is not None else FORM_CEILING[field.name]
    if maximum is not None:
        top = min(top, maximum)
    box: Editor
    if field.kind is int:
        box = QSpinBox(parent)
        box.setRange(int(field.form_minimum), max(int(field.form_minimum), int(top)))
        box.setSingleStep(max(1, int(field.step)))
    else:
        box = QDoubleSpinBox(parent)
        box.setDecimals(field.decimals)
        box.setRange(field.form_minimum, top)
        box.setSingleStep(field.step)
    if field.name in OFF_TEXT:
        box.setSpecialValueText(OFF_TEXT[field.name])
    box.setToolTip(field.help)
    return box


class SamplingForm:
    """The editors of SAMPLING_FIELDS, added in the table's order through `add_row`.

    `max_tokens_limit` caps the reply length (a pane's model context).
    """

    def __init__(self, parent: QWidget, add_row: AddRow, *, max_tokens_limit: int | None = None) -> None:
        self.editors: dict[str, Editor] = {}
        for field in SAMPLING_FIELDS:
            limit = max(1, max_tokens_limit) if field.name == "max_tokens" and max_tokens_limit is not None else None
            editor = editor_for(field, parent, limit)
            self.editors[field.name] = editor
            add_row(label_with_mnemonic(field), field.name, editor, field.help)
        self.temperature = self.editors["temperature"]
        self.top_p = self.editors["top_p"]
        self.top_k = self.editors["top_k"]
        self.min_p = self.editors["min_p"]
        self.repetition_penalty = self.editors["repetition_penalty"]
        self.max_tokens = self.editors["max_tokens"]

    def show(self, params: SamplingParams) -> None:
        """Show `params`' values (a value beyond a field's range shows at its bound)."""
        for name, editor in self.editors.items():
            editor.setValue(getattr(params, name))

    def values(self) -> dict[str, int | float]:
        """The fields' values by SamplingParams field name; floats rounded past the spin boxes' noise."""
        return {
            name: editor.value() if isinstance(editor, QSpinBox) else round(editor.value(), 4)
            for name, editor in self.editors.items()
        }

    def replace_in(self, params: SamplingParams, **others: object) -> SamplingParams:
        """`params` with the form's values (and `others`, e.g. the seed); raises InvalidSamplingParams."""
        return dataclasses.replace(params, **self.values(), **others)

    def on_change(self, callback: Callable[[], None]) -> None:
        for editor in self.editors.values():
            editor.valueChanged.connect(callback)
