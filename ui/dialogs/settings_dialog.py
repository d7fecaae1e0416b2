"""The preferences dialog: engine options, reply defaults, appearance.

It edits a copy: `result_settings()` builds a new Settings from the fields
and the caller decides what to do with it (save it, apply the theme, reload
the model). Values a person can type freely (page size, threads, KV budget,
seed) are checked as they are typed, with the reason under the field, using
the same rules as the settings file (`app.settings.check_value`); OK refuses
to close while one is invalid. Open it with `open()`, not `exec()`: a nested
loop would stall the asyncio callbacks qasync runs on Qt's loop.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.settings import (
    DEVICES,
    DTYPES,
    PAGE_SIZES,
    THEMES,
    InvalidSettingsError,
    SettingProblem,
    Settings,
    check_value,
)
from engine.inspect import available_cores
from engine.params import InvalidSamplingParams
from ui.theme import is_dark
from ui.widgets.sampling_form import SamplingForm

DEVICE_LABELS = {
    "auto": "Automatic (a CUDA GPU when there is one)",
    "cpu": "CPU",
    "cuda": "CUDA GPU",
}
DTYPE_LABELS = {
    "auto": "Automatic (bfloat16 where the hardware has it)",
    "float32": "float32 (exact, twice the memory)",
    "bfloat16": "bfloat16",
    "float16": "float16",
}
POLICY_LABELS = {
    "stop": "Stop with a message",
    "drop_oldest": "Drop the oldest turns (the system prompt stays)",
}
THEME_LABELS = {"system": "Follow the system", "light": "Light", "dark": "Dark"}
ENGINE_DEFAULT = "Engine default"
AUTOMATIC = "Automatic"
KV_PRESETS_MB = (256, 512, 1024, 2048, 4096, 8192)
NO_CUDA = "PyTorch sees no CUDA GPU on this computer (or this is a CPU-only build of torch)."

# Which fields apply when: shown in the dialog and used for its change note.
ENGINE_FIELDS = {
    "device": "device",
    "dtype": "data type",
    "kv_cache_mb": "KV cache budget",
    "page_size": "page size",
    "threads": "CPU threads",
}
DEFAULT_FIELDS = {
    "default_params": "sampling defaults",
    "default_system_prompt": "system prompt",
    "context_policy": "context policy",
}


def machine_memory_bytes(device: str, cuda_available: bool) -> int | None:
    """Total memory of what `device` ("auto" | "cpu" | "cuda") runs on; None if unknown.

    A KV cache budget above this can never be allocated, so the dialog refuses it.
    """
    if device == "cuda" or (device == "auto" and cuda_available):
        if not cuda_available:
            return None
        import torch

        return int(torch.cuda.get_device_properties(0).total_memory)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not a POSIX system
        return None


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


class _Field(QWidget):
    """An input with its error line underneath (hidden while the value is fine)."""

    def __init__(self, editor: QWidget, parent: QWidget, suffix: str = "", hint: str = "") -> None:
        super().__init__(parent)
        self.editor = editor
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(editor, 1)
        if suffix:
            row.addWidget(QLabel(suffix, self))
        layout.addLayout(row)
        self.hint = QLabel(hint, self)
        self.hint.setWordWrap(True)
        self.hint.setVisible(bool(hint))
        self.hint.setProperty("role", "hint")
        layout.addWidget(self.hint)
        self.error = QLabel(self)
        self.error.setWordWrap(True)
        self.error.setProperty("role", "error")
        self.error.hide()
        layout.addWidget(self.error)
        # Word-wrapped labels can be given more height than they use: keep the
        # spare space below them, not between the input and its message.
        layout.addStretch(1)

    def set_error(self, message: str | None) -> None:
        self.error.setText(message or "")
        self.error.setVisible(bool(message))
        # Once there is an error the hint is noise: the error says what is allowed.
        self.hint.setVisible(not message and bool(self.hint.text()))


class SettingsDialog(QDialog):
    """Edit a copy of `settings`; accepted only when every value is valid."""

    # Emitted with the new Settings when the user presses OK (also `accepted`).
    settings_accepted = Signal(object)

    def __init__(
        self,
        settings: Settings,
        parent: QWidget | None = None,
        *,
        cuda_available: bool | None = None,
        cpu_cores: int | None = None,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Tandem settings")
        self._original = settings
        self._cuda_available = _cuda_available() if cuda_available is None else cuda_available
        self._cores = cpu_cores if cpu_cores is not None else available_cores()
        self._fields: dict[str, _Field] = {}

        layout = QVBoxLayout(self)
        self.tabs = QTabWidget(self)
        self.tabs.addTab(self._engine_tab(), "&Engine")
        self.tabs.addTab(self._replies_tab(), "&Replies")
        self.tabs.addTab(self._appearance_tab(), "&Appearance")
        layout.addWidget(self.tabs, 1)

        self.changes_note = QLabel(self)
        self.changes_note.setWordWrap(True)
        self.changes_note.setProperty("role", "hint")
        layout.addWidget(self.changes_note)

        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok
            | QDialogButtonBox.StandardButton.Cancel
            | QDialogButtonBox.StandardButton.RestoreDefaults,
            self,
        )
        self.ok_button = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        self.ok_button.setDefault(True)
        self.restore_button = self.buttons.button(QDialogButtonBox.StandardButton.RestoreDefaults)
        self.restore_button.setText("Restore defa&ults")
        self.restore_button.setAutoDefault(False)
        self.restore_button.setToolTip("Put every field on every tab back to its default (OK still has to save them)")
        self.restore_button.clicked.connect(self.restore_defaults)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout.addWidget(self.buttons)

        self._show(settings)
        self._connect_checks()
        self._restyle()
        self._check_all()
        em = self.fontMetrics().averageCharWidth()
        self.resize(max(self.sizeHint().width(), em * 88), self.sizeHint().height())

    # -- building ----------------------------------------------------------------

    def _form(self, page: QWidget) -> QFormLayout:
        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        form.setLabelAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignTop)
        form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.DontWrapRows)
        outer = QVBoxLayout(page)
        outer.addLayout(form)
        outer.addStretch(1)
        return form

    def _row(self, form: QFormLayout, label: str, key: str, editor: QWidget, *, suffix: str = "", hint: str = "", tip: str = "") -> _Field:
        field = _Field(editor, form.parentWidget() or self, suffix, hint)
        caption = QLabel(label, field.parentWidget())
        caption.setBuddy(editor)
        if tip:
            editor.setToolTip(tip)
            caption.setToolTip(tip)
        form.addRow(caption, field)
        self._fields[key] = field
        return field

    def _note(self, page: QWidget, text: str) -> None:
        note = QLabel(text, page)
        note.setWordWrap(True)
        note.setProperty("role", "hint")
        outer = page.layout()
        outer.insertWidget(outer.count() - 1, note)  # under the form, above the stretch

    def _engine_tab(self) -> QWidget:
        page = QWidget(self)
        form = self._form(page)

        self.device = QComboBox(page)
        for value in DEVICES:
            self.device.addItem(DEVICE_LABELS[value], value)
        if not self._cuda_available:
            item = self.device.model().item(DEVICES.index("cuda"))  # type: ignore[attr-defined]
            item.setEnabled(False)
            item.setToolTip(NO_CUDA)
        self._row(form, "&Device", "device", self.device, tip="Where the model runs")

        self.dtype = QComboBox(page)
        for value in DTYPES:
            self.dtype.addItem(DTYPE_LABELS[value], value)
        self._row(form, "Data t&ype", "dtype", self.dtype, tip="The number format of the model's weights and KV cache")

        self.kv_cache = self._editable_combo(page, [ENGINE_DEFAULT, *map(str, KV_PRESETS_MB)])
        self._row(
            form, "&KV cache budget", "kv_cache_mb", self.kv_cache, suffix="MB",
            hint="Memory for the attention cache: more lets longer chats and more panes run at once. "
            "The engine's default is 1 GB on the CPU and what is free on a GPU.",
            tip="Megabytes, or “Engine default”",
        )

        self.page_size = self._editable_combo(page, [str(size) for size in PAGE_SIZES])
        self._row(
            form, "Pa&ge size", "page_size", self.page_size, suffix="tokens",
            hint="Tokens per cache page. Smaller pages let more of a shared prompt be reused; 16 suits most models.",
            tip="A power of two from 1 to 256",
        )

        self.threads = self._editable_combo(page, [AUTOMATIC, *map(str, range(1, self._cores + 1))])
        self._row(
            form, "CPU &threads", "threads", self.threads,
            hint=f"“Automatic” adapts to the load and leaves a core for the window. This computer has {self._cores}.",
            tip="A whole number, or “Automatic”",
        )
        self._note(page, "These apply the next time a model is loaded.")
        return page

    def _replies_tab(self) -> QWidget:
        page = QWidget(self)
        form = self._form(page)
        self.sampling = SamplingForm(
            page, lambda label, key, editor, tip: self._row(form, label, key, editor, tip=tip)
        )
        self.temperature = self.sampling.temperature
        self.top_p = self.sampling.top_p
        self.top_k = self.sampling.top_k
        self.min_p = self.sampling.min_p
        self.repetition_penalty = self.sampling.repetition_penalty
        self.max_tokens = self.sampling.max_tokens
        self.seed = QLineEdit(page)
        self.seed.setPlaceholderText("random")
        self._row(form, "&Seed", "seed", self.seed, tip="A whole number makes replies repeatable; empty draws a new seed each time")
        self.system_prompt = QPlainTextEdit(page)
        self.system_prompt.setTabChangesFocus(True)
        self.system_prompt.setPlaceholderText("none")
        self.system_prompt.setFixedHeight(self.system_prompt.fontMetrics().lineSpacing() * 4 + 12)
        self._row(form, "S&ystem prompt", "default_system_prompt", self.system_prompt, tip="The system prompt new panes start with")
        self.context_policy = QComboBox(page)
        for value, label in POLICY_LABELS.items():
            self.context_policy.addItem(label, value)
        self._row(
            form, "&When the context is full", "context_policy", self.context_policy,
            tip="What a pane does when its conversation no longer fits the model's context",
        )
        self._note(page, "These are the defaults for panes opened from now on; open panes keep their own.")
        return page

    def _appearance_tab(self) -> QWidget:
        page = QWidget(self)
        form = self._form(page)
        self.theme = QComboBox(page)
        for value in THEMES:
            self.theme.addItem(THEME_LABELS[value], value)
        self._row(form, "T&heme", "theme", self.theme, tip="Light, dark, or whatever the desktop uses")
        self._note(page, "The theme applies at once.")
        return page

    def _editable_combo(self, parent: QWidget, items: list[str]) -> QComboBox:
        combo = QComboBox(parent)
        combo.setEditable(True)
        # Enter confirms the dialog; it must not add what was typed to the list.
        combo.setInsertPolicy(QComboBox.InsertPolicy.NoInsert)
        combo.addItems(items)
        return combo

    # -- showing values --------------------------------------------------------

    def _show(self, settings: Settings) -> None:
        self.device.setCurrentIndex(DEVICES.index(settings.device))
        self.dtype.setCurrentIndex(DTYPES.index(settings.dtype))
        self.kv_cache.setCurrentText(ENGINE_DEFAULT if settings.kv_cache_mb is None else str(settings.kv_cache_mb))
        self.page_size.setCurrentText(str(settings.page_size))
        self.threads.setCurrentText(AUTOMATIC if settings.threads is None else str(settings.threads))
        params = settings.default_params
        self.sampling.show(params)
        self.seed.setText("" if params.seed is None else str(params.seed))
        self.system_prompt.setPlainText(settings.default_system_prompt)
        self.context_policy.setCurrentIndex(self.context_policy.findData(settings.context_policy))
        self.theme.setCurrentIndex(THEMES.index(settings.theme))

    def restore_defaults(self) -> None:
        """Every field back to its default; the model and window state are not fields here."""
        self._show(Settings())
        self._check_all()

    # -- checking ------------------------------------------------------------------

    def _connect_checks(self) -> None:
        for combo in (self.kv_cache, self.page_size, self.threads):
            combo.currentTextChanged.connect(self._check_all)
        self.seed.textChanged.connect(self._check_all)
        for combo in (self.device, self.dtype, self.context_policy, self.theme):
            combo.currentIndexChanged.connect(self._check_all)
        self.sampling.on_change(self._check_all)
        self.system_prompt.textChanged.connect(self._check_all)

    def _values(self) -> tuple[dict[str, Any], list[SettingProblem]]:
        """What the fields hold, and why each value that cannot be used is refused."""
        values: dict[str, Any] = {}
        problems: list[SettingProblem] = []

        def parse(key: str, text: str, *, none_word: str | None, label: str) -> None:
            text = text.strip()
            if none_word is not None and (not text or text.casefold() == none_word.casefold()):
                values[key] = None
                return
            try:
                value = int(text.replace(",", "").replace("_", ""))
            except ValueError:
                allowed = f"a whole number or “{none_word}”" if none_word else "a whole number"
                problems.append(SettingProblem(key, f"{label} must be {allowed}, not “{text}”."))
                return
            reason = check_value(key, value)
            if reason is not None:
                problems.append(SettingProblem(key, reason))
            else:
                values[key] = value

        values["device"] = self.device.currentData()
        values["dtype"] = self.dtype.currentData()
        parse("kv_cache_mb", self.kv_cache.currentText(), none_word=ENGINE_DEFAULT, label="The KV cache budget")
        parse("page_size", self.page_size.currentText(), none_word=None, label="The page size")
        parse("threads", self.threads.currentText(), none_word=AUTOMATIC, label="CPU threads")
        kv = values.get("kv_cache_mb")
        if kv is not None:
            total = machine_memory_bytes(values["device"], self._cuda_available)
            if total is not None and kv * (1 << 20) > total:
                where = "this GPU" if values["device"] == "cuda" or (values["device"] == "auto" and self._cuda_available) else "this computer"
                problems.append(
                    SettingProblem("kv_cache_mb", f"The KV cache budget ({kv:,} MB) is more than {where} has ({total >> 20:,} MB in all).")
                )
                del values["kv_cache_mb"]

        seed_text = self.seed.text().strip()
        seed: int | None = None
        if seed_text:
            try:
                seed = int(seed_text)
            except ValueError:
                problems.append(SettingProblem("seed", f"The seed must be a whole number, or empty for a random one, not “{seed_text}”."))
        try:
            values["default_params"] = self.sampling.replace_in(self._original.default_params, seed=seed)
        except InvalidSamplingParams as exc:  # the spin boxes' ranges should prevent it; say so if not
            problems.append(SettingProblem("default_params", str(exc)))
        values["default_system_prompt"] = self.system_prompt.toPlainText()
        values["context_policy"] = self.context_policy.currentData()
        values["theme"] = self.theme.currentData()
        return values, problems

    def problems(self) -> list[SettingProblem]:
        """Why the dialog would refuse OK now (empty: it would accept)."""
        return self._values()[1]

    def _check_all(self) -> None:
        values, problems = self._values()
        by_key: dict[str, list[str]] = {}
        for problem in problems:
            by_key.setdefault(problem.key, []).append(problem.message)
        for key, field in self._fields.items():
            messages = by_key.get(key, [])
            if key == "threads" and not messages and (values.get("threads") or 0) > self._cores:
                messages = [f"More threads than this computer's {self._cores} cores usually slows the model down."]
            if key == "device" and values["device"] == "cuda" and not self._cuda_available:
                messages = [NO_CUDA + " Loading the model will fail until there is one."]
            field.set_error(" ".join(messages) or None)
        general = by_key.get("default_params")
        self._fields["temperature"].set_error(" ".join(general) if general else None)
        self._update_changes_note(values)

    def _update_changes_note(self, values: dict[str, Any]) -> None:
        def changed(names: dict[str, str]) -> list[str]:
            return [label for key, label in names.items() if key in values and values[key] != getattr(self._original, key)]

        parts = []
        engine = changed(ENGINE_FIELDS)
        if engine:
            parts.append(f"{_sentence(engine)}: from the next model load.")
        defaults = changed(DEFAULT_FIELDS)
        if defaults:
            parts.append(f"{_sentence(defaults)}: for new panes.")
        if values["theme"] != self._original.theme:
            parts.append("Theme: at once.")
        self.changes_note.setText(" ".join(parts))
        self.changes_note.setVisible(bool(parts))

    def result_settings(self) -> Settings:
        """New Settings from the fields; raises InvalidSettingsError if any is refused.

        The model and the window's saved state are not edited here and are
        carried over from the settings the dialog was opened with.
        """
        values, problems = self._values()
        if problems:
            raise InvalidSettingsError(problems)
        result = Settings(
            model=self._original.model,
            ui_state=dict(self._original.ui_state),
            **values,
        )
        result.validate()
        return result

    def accept(self) -> None:
        """OK: close only when every value is valid; otherwise show why and go to the first bad field."""
        self._check_all()
        try:
            settings = self.result_settings()
        except InvalidSettingsError as exc:
            self._focus_problem(exc.problems[0].key)
            return
        super().accept()
        self.settings_accepted.emit(settings)

    def _focus_problem(self, key: str) -> None:
        field = self._fields.get(key) or self._fields["temperature"]
        for index in range(self.tabs.count()):
            if self.tabs.widget(index).isAncestorOf(field):
                self.tabs.setCurrentIndex(index)
                break
        field.editor.setFocus(Qt.FocusReason.OtherFocusReason)
        if isinstance(field.editor, QComboBox) and field.editor.lineEdit() is not None:
            field.editor.lineEdit().selectAll()
        elif isinstance(field.editor, QLineEdit):
            field.editor.selectAll()

    # -- look ----------------------------------------------------------------------

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            self._restyle()

    def _restyle(self) -> None:
        """Hints muted and errors red, readable on the light and the dark palette."""
        palette = self.palette()
        muted = secondary_text_color(palette).name()
        error = "#ff8080" if is_dark(palette) else "#b00020"
        style = f'QLabel[role="hint"] {{ color: {muted}; }} QLabel[role="error"] {{ color: {error}; }}'
        if self.styleSheet() != style:
            self.setStyleSheet(style)


def secondary_text_color(palette: QPalette) -> QColor:
    """Text between the window's text and its background: clearly secondary, still readable.

    (The palette's PlaceholderText is no use here: the standard light palette
    makes it black with half alpha, and a style sheet drops the alpha.)
    """
    text, window = palette.color(QPalette.ColorRole.WindowText), palette.color(QPalette.ColorRole.Window)
    t = 0.42
    return QColor(
        round(text.red() * (1 - t) + window.red() * t),
        round(text.green() * (1 - t) + window.green() * t),
        round(text.blue() * (1 - t) + window.blue() * t),
    )


def _sentence(words: list[str]) -> str:
    """['KV cache budget', 'page size'] -> 'KV cache budget and page size', first letter capital."""
    text = words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]
    return text[:1].upper() + text[1:]


def open_settings_dialog(
    settings: Settings, parent: QWidget | None, on_accepted: Callable[[Settings], None]
) -> SettingsDialog:
    """Open the dialog window-modal without a nested loop; `on_accepted(new)` on OK."""
    dialog = SettingsDialog(settings, parent)
    dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    dialog.settings_accepted.connect(on_accepted)
    dialog.open()
    return dialog


