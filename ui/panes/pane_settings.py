"""A pane's model, sampling parameters and system prompt, in a compact popover."""

from __future__ import annotations

import asyncio
import html
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QComboBox,
    QButtonGroup,
    QCheckBox,
    QDialogButtonBox,
    QFormLayout,
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QRadioButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)
import shiboken6

from engine.params import SamplingParams
from engine.structured import Constraint, InvalidConstraint

from app.workspace.json_reply import schema_label
from app.workspace.saved_schemas import SavedSchemas
from ui.widgets.json_reply_form import JsonReplyForm
from ui.widgets.sampling_form import SamplingForm

if TYPE_CHECKING:
    from app.remote.remote_pane import RemoteBackend


def describe_params(model_name: str, params: SamplingParams, schema_name: str | None = None) -> str:
    """The pane header: 'SmolLM2-135M-Instruct · t=0.7 · seed 7 · JSON: movie'.

    `schema_name`: the saved name of the pane's JSON schema, if it has one."""
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
    if params.constraint is not None:
        parts.append(schema_label(params.constraint, schema_name))
    return " · ".join(parts)


# What the Base URL field's hint shows: a local OpenAI-compatible server's usual address.
EXAMPLE_BASE_URL = "http://127.0.0.1:8000/v1"

# set_remote(base_url, model, api_key) -> the backend; raises the RemoteError
SetRemote = Callable[[str, str, str | None], Awaitable["RemoteBackend"]]


class PaneSettingsPopover(QFrame):
    """Edits a copy of the pane's settings; `applied` carries the result.

    A popup: a click outside or Esc closes it without applying. The Model
    section applies on its own button: `set_remote(base_url, model, api_key)`
    checks the server (its error shows inline), `set_local()` goes back to
    the local engine.
    """

    applied = Signal(object, str)  # (SamplingParams, system prompt)
    model_applied = Signal()  # the pane's model changed (remote or local)

    def __init__(
        self,
        params: SamplingParams,
        system_prompt: str,
        max_context: int,
        parent: QWidget | None = None,
        title: str = "",
        *,
        remote: RemoteBackend | None = None,
        set_remote: SetRemote | None = None,
        set_local: Callable[[], None] | None = None,
        context_policy: str = "stop",
        thinking: bool | None = None,
        saved_schemas: SavedSchemas | None = None,
        check_constraint: Callable[[Constraint], None] | None = None,
    ) -> None:
        """`thinking`: the pane's "Think before answering", for a model whose
        template has the switch (Qwen3); None leaves the box out.
        `check_constraint` raises InvalidConstraint for a "Reply as JSON" the
        pane's model cannot follow; it may block (a first compile), so it
        runs on a worker thread."""
        super().__init__(parent, Qt.WindowType.Popup)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self._params = params
        self._set_remote = set_remote
        self._set_local = set_local
        self._model_task: asyncio.Task[RemoteBackend] | None = None
        self._check_constraint = check_constraint
        self._check_task: asyncio.Future[None] | None = None
        layout = QVBoxLayout(self)
        if title:
            heading = QLabel(f"<b>{html.escape(title)}</b> · applies from the next reply", self)
            layout.addWidget(heading)
        if set_remote is not None and set_local is not None:
            self._add_model_section(layout, remote)
        # Below the model, two columns: its sampling; what the reply is (context, reasoning, JSON, system
        # prompt). One column of it all is taller than a 700-pixel screen.
        columns = QHBoxLayout()
        layout.addLayout(columns)
        left, right = QVBoxLayout(), QVBoxLayout()
        columns.addLayout(left, 1)
        columns.addSpacing(self.fontMetrics().averageCharWidth() * 2)
        columns.addLayout(right, 1)
        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)

        self.sampling = SamplingForm(
            self, lambda label, _name, editor, _tip: form.addRow(label, editor), max_tokens_limit=max_context
        )
        self.sampling.show(params)
        self.temperature = self.sampling.temperature
        self.top_p = self.sampling.top_p
        self.top_k = self.sampling.top_k
        self.min_p = self.sampling.min_p
        self.repetition_penalty = self.sampling.repetition_penalty
        self.max_tokens = self.sampling.max_tokens
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

        seed_label = QLabel("&Seed", self)
        seed_label.setBuddy(self.fixed_seed)
        form.addRow(seed_label, seed_row)
        left.addLayout(form)
        left.addStretch(1)
        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        self.context_policy = QComboBox(self)
        self.context_policy.addItem("Stop with a message", "stop")
        self.context_policy.addItem("Drop the oldest turns", "drop_oldest")
        self.context_policy.setCurrentIndex(max(0, self.context_policy.findData(context_policy)))
        self.context_policy.setToolTip(
            "What happens when the conversation no longer fits the model's context. Dropping keeps the "
            "system prompt and leaves the oldest turns out of what the model reads (they stay on screen)."
        )
        form.addRow("When the context is &full", self.context_policy)
        self.think_before_answering: QCheckBox | None = None
        if thinking is not None:
            self.think_before_answering = QCheckBox("&Think before answering", self)
            self.think_before_answering.setChecked(thinking)
            self.think_before_answering.setToolTip(
                "The model reasons first, in a Thinking section above its answer. Off, it answers at once "
                "(the model's own switch, enable_thinking)."
            )
            form.addRow("Reasoning", self.think_before_answering)
        self.json_form = JsonReplyForm(
            params.constraint, saved_schemas if saved_schemas is not None else SavedSchemas.load(), self)
        form.addRow("Reply as &JSON", self.json_form.mode)
        form.addRow(self.json_form)
        self.json_form.mode.currentIndexChanged.connect(lambda _i: self.refit())
        right.addLayout(form)
        label = QLabel("S&ystem prompt", self)
        self.system_prompt = QPlainTextEdit(self)
        self.system_prompt.setPlainText(system_prompt)
        self.system_prompt.setTabChangesFocus(True)
        lines = self.system_prompt.fontMetrics().lineSpacing()
        self.system_prompt.setFixedHeight(lines * 4 + 12)
        label.setBuddy(self.system_prompt)
        right.addWidget(label)
        right.addWidget(self.system_prompt)
        right.addStretch(1)
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
        self.setMinimumWidth(self.fontMetrics().averageCharWidth() * 104)

    def _add_model_section(self, layout: QVBoxLayout, remote: RemoteBackend | None) -> None:
        layout.addWidget(QLabel("<b>Model</b>", self))
        self.local_choice = QRadioButton("&Local (default model)", self)
        self.remote_choice = QRadioButton("&OpenAI-compatible server", self)
        group = QButtonGroup(self)
        group.addButton(self.local_choice)
        group.addButton(self.remote_choice)
        layout.addWidget(self.local_choice)
        layout.addWidget(self.remote_choice)
        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        self.base_url = QLineEdit(self)
        # "e.g.": a grey URL alone reads as one filled in.
        self.base_url.setPlaceholderText(f"e.g. {EXAMPLE_BASE_URL}")
        self.remote_model = QLineEdit(self)
        self.remote_model.setPlaceholderText("the model's name on the server")
        self.api_key = QLineEdit(self)
        self.api_key.setEchoMode(QLineEdit.EchoMode.Password)
        self.api_key.setPlaceholderText("none")
        if remote is not None:
            self.base_url.setText(remote.base_url)
            self.remote_model.setText(remote.model)
            self.api_key.setText(remote.api_key or "")
        form.addRow("Base &URL", self.base_url)
        form.addRow("Mo&del", self.remote_model)
        form.addRow("API &key", self.api_key)
        self.remote_fields = QWidget(self)
        self.remote_fields.setLayout(form)
        layout.addWidget(self.remote_fields)
        row = QHBoxLayout()
        self.model_status = QLabel(self)
        self.model_status.setWordWrap(True)
        self.model_status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.model_status.hide()
        self.model_button = QPushButton("Check && apply model", self)
        self.model_button.setAutoDefault(False)
        self.model_button.clicked.connect(self.apply_model)
        row.addStretch(1)
        row.addWidget(self.model_button)
        layout.addLayout(row)
        # A row of its own: beside the button, a long error wrapped into a narrow column.
        layout.addWidget(self.model_status)
        self.remote_choice.toggled.connect(self.remote_fields.setEnabled)
        (self.remote_choice if remote is not None else self.local_choice).setChecked(True)
        self.remote_fields.setEnabled(remote is not None)

    def apply_model(self) -> None:
        """Switch the pane's model now: check and use the server, or go back to local."""
        assert self._set_remote is not None and self._set_local is not None
        if self._model_task is not None and not self._model_task.done():
            return
        if self.local_choice.isChecked():
            try:
                self._set_local()
            except Exception as exc:  # e.g. the pane is busy
                self._show_model_result(str(exc), error=True)
                return
            self._show_model_result("Using the local model.", error=False)
            self.model_applied.emit()
            return
        if not self.base_url.text().strip():
            self._show_model_result(
                f"Type the server's base URL first, e.g. {EXAMPLE_BASE_URL} (a server on this computer).", error=True)
            self.base_url.setFocus()
            return
        self.model_button.setEnabled(False)
        self._show_model_result("Checking the server...", error=False)
        coro = self._set_remote(self.base_url.text(), self.remote_model.text(), self.api_key.text() or None)
        self._model_task = asyncio.ensure_future(coro)
        self._model_task.add_done_callback(self._model_checked)

    def _model_checked(self, task: asyncio.Task[RemoteBackend]) -> None:
        if not shiboken6.isValid(self):  # closed while the server was asked
            if not task.cancelled():
                task.exception()  # retrieved: nobody is left to show it
            return
        self.model_button.setEnabled(True)
        if task.cancelled():
            self._show_model_result("The check was cancelled.", error=True)
            return
        exc = task.exception()
        if exc is not None:
            self._show_model_result(str(exc), error=True)
            return
        backend = task.result()
        label = backend.label or self.remote_model.text()
        self._show_model_result(f"Connected: {label}.", error=False)
        self.model_applied.emit()

    def _show_model_result(self, text: str, *, error: bool) -> None:
        self.model_status.setText(text)
        self.model_status.setProperty("error", error)  # the theme's stylesheet may colour it
        self.model_status.show()
        self.refit()

    def refit(self) -> None:
        """Grow to hold a new message at the popover's width, on screen.

        A popup does not resize itself when its content grows: without this a
        long message squeezes the fields above it to half their height."""
        if not self.isVisible():
            return
        width = max(self.width(), self.minimumWidth())
        layout = self.layout()
        height = layout.heightForWidth(width) if layout.hasHeightForWidth() else layout.sizeHint().height()
        screen = self.screen().availableGeometry() if self.screen() is not None else None
        top = self.y()
        if screen is not None:
            height = min(height, screen.height())
            top = max(screen.top(), min(top, screen.bottom() + 1 - height))
        self.setGeometry(self.x(), top, width, height)

    def values(self) -> SamplingParams:
        """The pane's parameters with the form's values; raises InvalidSamplingParams or InvalidConstraint."""
        seed = self.seed.value() if self.fixed_seed.isChecked() else None
        return self.sampling.replace_in(self._params, seed=seed, constraint=self.json_form.constraint())

    def apply(self) -> None:
        if self._check_task is not None and not self._check_task.done():
            return
        try:
            params = self.values()
        except InvalidConstraint as exc:
            self.json_form.show_message(str(exc), error=True)
            self.refit()
            return
        except ValueError as exc:  # InvalidSamplingParams is a ValueError
            self.error_label.setText(str(exc))
            self.error_label.show()
            self.refit()
            return
        constraint = params.constraint
        if constraint is None or constraint == self._params.constraint or self._check_constraint is None:
            self._apply(params)
            return
        # A first compile can take seconds: on a worker thread, the window goes on meanwhile.
        self.apply_button.setEnabled(False)
        self.json_form.show_message("Checking that the model can follow it…", error=False)
        self._check_task = asyncio.ensure_future(asyncio.to_thread(self._check_constraint, constraint))
        self._check_task.add_done_callback(lambda task: self._constraint_checked(task, params))

    def _constraint_checked(self, task: asyncio.Future[None], params: SamplingParams) -> None:
        if not shiboken6.isValid(self):  # closed while it was checked
            if not task.cancelled():
                task.exception()
            return
        self.apply_button.setEnabled(True)
        exc = None if task.cancelled() else task.exception()
        if task.cancelled() or exc is not None:
            # The pane keeps its settings: nothing is applied until the schema is one the model can follow.
            self.json_form.show_message(str(exc) if exc is not None else "The check was cancelled.", error=True)
            self.refit()
            return
        self._apply(params)

    def _apply(self, params: SamplingParams) -> None:
        self.applied.emit(params, self.system_prompt.toPlainText())
        self.close()
