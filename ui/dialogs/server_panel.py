"""Models → Serve…: the window's OpenAI-compatible server at a glance.

Start and stop; the port; this computer only or the local network (which
needs the API key); the key (generated on request, copyable, kept in the OS
keyring or the private secrets file, never in the settings); the URL to give
a client; the model ids it serves; and a live log of its requests (time,
model, tokens, status). The panel only shows and forwards: the server and
its choices are ui.window.server_control.ServerControl's. Not modal: the
window stays usable while it is open.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QButtonGroup,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QRadioButton,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

if TYPE_CHECKING:
    from app.remote.local_server import RequestRecord
    from ui.window.server_control import ServerControl

LOG_COLUMNS = ("Time", "Model", "Tokens", "Status", "Request")


def log_cells(record: RequestRecord) -> tuple[str, str, str, str, str]:
    """One log line: '16:31:07', 'smollm2-135m-instruct', '12 → 48', '200', 'POST /v1/chat/completions · 0.84 s'."""
    when = time.strftime("%H:%M:%S", time.localtime(record.started))
    model = record.model or "—"
    if record.completion_tokens is None:
        tokens = "—"
    else:
        out = f"{'' if record.tokens_exact else '~'}{record.completion_tokens}"
        tokens = f"{record.prompt_tokens} → {out}" if record.prompt_tokens is not None else f"→ {out}"
    return when, model, tokens, str(record.status or "—"), f"{record.method} {record.path} · {record.duration_s:.2f} s"


class ServerPanel(QDialog):
    def __init__(self, control: ServerControl, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        from ui.window.server_control import LOOPBACK, NETWORK

        self._control = control
        self.setWindowTitle("Serve models (OpenAI API)")
        self.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.resize(720, 560)
        column = QVBoxLayout(self)

        top = QHBoxLayout()
        self.state_label = QLabel(self)
        self.state_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.state_label.setWordWrap(True)
        top.addWidget(self.state_label, 1)
        self.start_button = QPushButton(self)
        self.start_button.clicked.connect(self._start_or_stop)
        top.addWidget(self.start_button)
        column.addLayout(top)

        form = QFormLayout()
        self.port_box = QSpinBox(self)
        self.port_box.setRange(0, 65535)
        self.port_box.setSpecialValueText("any free port")
        self.port_box.setValue(control.choices.port)
        # Saved once typed (editingFinished), used at once (a Start right after typing).
        self.port_box.valueChanged.connect(lambda port: setattr(control, "port", port))
        self.port_box.editingFinished.connect(lambda: control.set_port(self.port_box.value()))
        form.addRow("&Port:", self.port_box)

        access = QWidget(self)
        access_column = QVBoxLayout(access)
        access_column.setContentsMargins(0, 0, 0, 0)
        self.loopback_radio = QRadioButton("This &computer only (127.0.0.1)", access)
        self.network_radio = QRadioButton("The local &network too (needs the API key)", access)
        self._modes = QButtonGroup(self)
        for radio, mode in ((self.loopback_radio, LOOPBACK), (self.network_radio, NETWORK)):
            self._modes.addButton(radio)
            access_column.addWidget(radio)
            radio.setChecked(control.choices.mode == mode)
            radio.toggled.connect(lambda on, mode=mode: on and self._set_mode(mode))
        form.addRow("Access:", access)

        key_row = QHBoxLayout()
        self.key_edit = QLineEdit(self)
        self.key_edit.setReadOnly(True)
        self.key_edit.setEchoMode(QLineEdit.EchoMode.Password)
        # Short: beside four buttons a sentence was cut; the hint below says what no key means.
        self.key_edit.setPlaceholderText("no key")
        self.key_edit.setMinimumWidth(self.key_edit.fontMetrics().horizontalAdvance("no key") * 3)
        key_row.addWidget(self.key_edit, 1)
        self.show_key_button = QPushButton("Show", self)
        self.show_key_button.setCheckable(True)
        self.show_key_button.toggled.connect(self._show_key)
        self.generate_key_button = QPushButton("&Generate", self)
        self.generate_key_button.clicked.connect(self._generate_key)
        self.copy_key_button = QPushButton("Copy", self)
        self.copy_key_button.clicked.connect(lambda: self._copy(self.key_edit.text(), "The API key"))
        self.remove_key_button = QPushButton("Remove", self)
        self.remove_key_button.clicked.connect(self._remove_key)
        for button in (self.show_key_button, self.generate_key_button, self.copy_key_button, self.remove_key_button):
            key_row.addWidget(button)
        form.addRow(self._buddy("API &key:", self.key_edit), key_row)

        url_row = QHBoxLayout()
        self.url_edit = QLineEdit(self)
        self.url_edit.setReadOnly(True)
        self.url_edit.setPlaceholderText("shown while serving")
        url_row.addWidget(self.url_edit, 1)
        self.copy_url_button = QPushButton("Copy", self)
        self.copy_url_button.clicked.connect(lambda: self._copy(self.url_edit.text(), "The URL"))
        url_row.addWidget(self.copy_url_button)
        form.addRow(self._buddy("&URL:", self.url_edit), url_row)
        hint = QLabel("Without a key, any program on this computer may call the server. An OpenAI client "
                      "takes the URL as its base URL and the key as its API key (any text when there is no key).",
                      self)
        hint.setWordWrap(True)
        hint.setEnabled(False)  # a note, in the theme's muted colour
        form.addRow("", hint)
        self.models_label = QLabel(self)
        self.models_label.setWordWrap(True)
        self.models_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        form.addRow("Model ids:", self.models_label)
        column.addLayout(form)

        self.error_label = QLabel(self)
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet("color: #c62828;")
        self.error_label.hide()
        column.addWidget(self.error_label)

        column.addWidget(QLabel("Requests:", self))
        self.log_table = QTableWidget(0, len(LOG_COLUMNS), self)
        self.log_table.setHorizontalHeaderLabels(LOG_COLUMNS)
        self.log_table.verticalHeader().hide()
        self.log_table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.log_table.setSelectionBehavior(QTableWidget.SelectionBehavior.SelectRows)
        header = self.log_table.horizontalHeader()
        for index in range(len(LOG_COLUMNS) - 1):
            header.setSectionResizeMode(index, QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(True)
        column.addWidget(self.log_table, 1)
        for record in control.log:
            self._add_line(record)

        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close, self)
        buttons.rejected.connect(self.reject)
        column.addWidget(buttons)

        self._unsubscribe = control.subscribe(self.refresh, self._add_line)
        self.finished.connect(lambda _result: self._unsubscribe())
        self.refresh()

    def _buddy(self, text: str, widget: QWidget) -> QLabel:
        label = QLabel(text, self)
        label.setBuddy(widget)
        return label

    # -- showing --------------------------------------------------------------------------

    def refresh(self) -> None:
        control = self._control
        serving = control.serving
        key = control.api_key() or ""
        if self.key_edit.text() != key:
            self.key_edit.setText(key)
        self.copy_key_button.setEnabled(bool(key))
        self.remove_key_button.setEnabled(bool(key))
        self.show_key_button.setEnabled(bool(key))
        for widget in (self.port_box, self.loopback_radio, self.network_radio):
            widget.setEnabled(not serving)
            widget.setToolTip("Stop the server to change this." if serving else "")
        if serving:
            server = control.server
            assert server is not None
            url = control.share_url() or ""
            where = "this computer and the local network" if control.choices.mode == "network" else "this computer"
            need = "; the API key is required" if server.api_key_required else ""
            self.state_label.setText(f"<b>Serving</b> on port {server.port} to {where}{need}.")
            self.start_button.setText("&Stop")
            self.url_edit.setText(url)
            ids = control.model_ids()
            self.models_label.setText(
                ", ".join(ids) + " — the names as shown work too, and 'default' reaches the first."
                if ids else "None loaded yet: models are served as they load.")
        else:
            self.state_label.setText("<b>Not serving.</b> Start to let other programs use the loaded models.")
            self.start_button.setText("&Start")
            self.url_edit.clear()
            self.models_label.setText("The loaded models, by the names the window shows (as slugs).")
        self.copy_url_button.setEnabled(serving)

    def _add_line(self, record: RequestRecord) -> None:
        table = self.log_table
        from ui.window.server_control import LOG_LIMIT

        if table.rowCount() >= LOG_LIMIT:
            table.removeRow(0)
        row = table.rowCount()
        table.insertRow(row)
        for column, text in enumerate(log_cells(record)):
            table.setItem(row, column, QTableWidgetItem(text))
        table.scrollToBottom()

    def log_lines(self) -> list[tuple[str, ...]]:
        """The log as shown, one tuple of cell texts a row."""
        table = self.log_table
        return [tuple(table.item(r, c).text() for c in range(table.columnCount())) for r in range(table.rowCount())]

    def show_error(self, message: str) -> None:
        self.error_label.setText(message)
        self.error_label.setVisible(bool(message))

    # -- what the user does ---------------------------------------------------------------

    def _start_or_stop(self) -> None:
        self.show_error("")
        if self._control.serving:
            self._control.stop_serving()
            return
        try:
            self._control.start()
        except Exception as exc:  # LocalServerError says what to change
            self.show_error(str(exc))
            self.refresh()

    def _set_mode(self, mode: str) -> None:
        self._control.set_mode(mode)
        self.show_error("")

    def _generate_key(self) -> None:
        try:
            self._control.generate_key()
        except Exception as exc:  # the keyring and the secrets file both refused
            self.show_error(f"The key could not be saved: {exc}")
            return
        note = " Restart the server to use it." if self._control.serving else ""
        self.show_error("")
        self.state_label.setText(self.state_label.text() + f" A new key was made.{note}")

    def _remove_key(self) -> None:
        try:
            self._control.clear_key()
        except Exception as exc:
            self.show_error(f"The key could not be removed: {exc}")

    def _show_key(self, shown: bool) -> None:
        self.key_edit.setEchoMode(QLineEdit.EchoMode.Normal if shown else QLineEdit.EchoMode.Password)
        self.show_key_button.setText("Hide" if shown else "Show")

    def _copy(self, text: str, what: str) -> None:
        if text:
            QGuiApplication.clipboard().setText(text)
            self.state_label.setToolTip(f"{what} was copied.")
