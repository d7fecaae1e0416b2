"""The pane settings' "Reply as JSON": off, any JSON object, or JSON that
follows a schema pasted here or picked from the saved ones (Save / Delete).

The form only reads and shows: whether the engine can follow a schema is
checked by the popover when it is applied, off the GUI thread."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from engine.structured import Constraint, InvalidConstraint

from app.errors import AppError
from app.workspace.json_reply import JSON_KINDS
from app.workspace.saved_schemas import SavedSchemas, spec_problem
from ui.theme import warning_color

# The mode box's entries: (text, constraint kind or "" for off).
MODES = (("Off", ""), ("Any JSON object", "json_object"), ("JSON schema", "json_schema"))
# A pane whose grammar came from elsewhere (a regex or Lark grammar): kept as it is unless changed here.
OTHER = "other"
SCHEMA_LINES = 5


class JsonReplyForm(QWidget):
    """`constraint()` is what the form asks for; `mode` is a form row of its own
    (its label "Reply as &JSON" is the caller's), the rest sits below it."""

    def __init__(self, constraint: Constraint | None, saved: SavedSchemas, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._saved = saved
        self._other = constraint if constraint is not None and constraint.kind not in JSON_KINDS else None
        self.mode = QComboBox(parent)
        for text, kind in MODES:
            self.mode.addItem(text, kind)
        if self._other is not None:
            self.mode.addItem(f"Keep its {self._other.described[4:]}", OTHER)
        self.mode.setToolTip("Hold the model's replies to JSON: any JSON object, or JSON that follows a schema. "
                             "Each reply shows whether it is valid.")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(3)
        picked = QHBoxLayout()
        self.saved_box = QComboBox(self)
        self.saved_box.setToolTip("Put a saved schema in the box below")
        self.saved_box.setAccessibleName("Saved schemas")
        self.delete_button = QPushButton("Delet&e", self)
        self.delete_button.setAutoDefault(False)
        self.delete_button.setToolTip("Delete the chosen saved schema")
        picked.addWidget(self.saved_box, 1)
        picked.addWidget(self.delete_button)
        layout.addLayout(picked)
        self.schema_edit = QPlainTextEdit(self)
        self.schema_edit.setTabChangesFocus(True)
        self.schema_edit.setAccessibleName("JSON schema")
        self.schema_edit.setPlaceholderText('Paste a JSON schema, e.g. {"type": "object", "properties": '
                                            '{"answer": {"type": "string"}}, "required": ["answer"]}')
        self.schema_edit.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.schema_edit.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)
        lines = self.schema_edit.fontMetrics().lineSpacing()
        self.schema_edit.setFixedHeight(lines * SCHEMA_LINES + 12)
        layout.addWidget(self.schema_edit)
        save_row = QHBoxLayout()
        self.save_name = QLineEdit(self)
        self.save_name.setPlaceholderText("a name to save it under")
        self.save_name.setAccessibleName("Name to save the schema under")
        self.save_button = QPushButton("Save &as", self)
        self.save_button.setAutoDefault(False)
        self.save_button.setToolTip("Save the schema above under this name, for any pane")
        save_row.addWidget(self.save_name, 1)
        save_row.addWidget(self.save_button)
        layout.addLayout(save_row)
        self.message = QLabel(self)
        self.message.setWordWrap(True)
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.message.hide()
        layout.addWidget(self.message)

        self._fill_saved()
        kind = constraint.kind if constraint is not None else ""
        self.mode.setCurrentIndex(max(0, self.mode.findData(OTHER if self._other is not None else kind)))
        if constraint is not None and constraint.kind == "json_schema":
            self.schema_edit.setPlainText(constraint.spec)
            name = saved.name_of(constraint.spec)
            if name is not None:
                self.saved_box.setCurrentIndex(self.saved_box.findText(name))
                self.save_name.setText(name)
        self.mode.currentIndexChanged.connect(lambda _i: self._mode_changed())
        self.saved_box.activated.connect(self._pick)
        self.delete_button.clicked.connect(self._delete)
        self.save_button.clicked.connect(self._save)
        self.save_name.returnPressed.connect(self._save)
        self._mode_changed()

    @property
    def kind(self) -> str:
        return str(self.mode.currentData())

    def constraint(self) -> Constraint | None:
        """The constraint the form asks for; raises InvalidConstraint (one line) for a schema it cannot be."""
        if self.kind == OTHER:
            return self._other
        if not self.kind:
            return None
        if self.kind == "json_object":
            return Constraint("json_object")
        spec = self.schema_edit.toPlainText()
        if not spec.strip():
            raise InvalidConstraint("Paste a JSON schema, pick a saved one, or choose Any JSON object.")
        problem = spec_problem(spec)
        if problem is not None:
            raise InvalidConstraint(problem)
        return Constraint("json_schema", spec)

    def show_message(self, text: str, *, error: bool) -> None:
        self.message.setText(text)
        palette = self.message.palette()
        color = warning_color(self.palette()) if error else self.palette().color(self.foregroundRole())
        palette.setColor(self.message.foregroundRole(), color)
        self.message.setPalette(palette)
        self.message.setProperty("error", error)
        self.message.setVisible(bool(text))

    def _mode_changed(self) -> None:
        schema = self.kind == "json_schema"
        for widget in (self.saved_box, self.delete_button, self.schema_edit, self.save_name, self.save_button):
            widget.setVisible(schema)
        self.show_message("", error=False)

    def _fill_saved(self) -> None:
        self.saved_box.clear()
        names = self._saved.names()
        self.saved_box.addItem("(none saved)" if not names else "Pick a saved schema…", None)
        for name in names:
            self.saved_box.addItem(name, name)
        self.saved_box.setEnabled(bool(names))
        self.delete_button.setEnabled(bool(names))

    def _pick(self, index: int) -> None:
        name = self.saved_box.itemData(index)
        if name is None:
            return
        self.schema_edit.setPlainText(self._saved.schemas.get(name, ""))
        self.save_name.setText(name)
        self.show_message("", error=False)

    def _save(self) -> None:
        name = self.save_name.text().strip()
        try:
            self._saved.save_as(name, self.schema_edit.toPlainText())
        except AppError as exc:
            self.show_message(str(exc), error=True)
            return
        self._fill_saved()
        self.saved_box.setCurrentIndex(self.saved_box.findData(name))
        self.show_message(f"Saved as “{name}”.", error=False)

    def _delete(self) -> None:
        name = self.saved_box.currentData()
        if name is None:
            self.show_message("Pick the saved schema to delete first.", error=True)
            return
        try:
            self._saved.delete(name)
        except AppError as exc:
            self.show_message(str(exc), error=True)
            return
        self._fill_saved()
        self.show_message(f"Deleted “{name}” (the text stays in the box).", error=False)
