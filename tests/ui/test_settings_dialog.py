"""The settings dialog, offscreen: shows the settings, refuses bad values with the reason, returns new Settings."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QPalette
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication, QComboBox, QDialog, QLabel, QWidget

from app.settings import InvalidSettingsError, Settings
from engine.params import SamplingParams
from ui.dialogs.settings_dialog import SettingsDialog, secondary_text_color
from ui.theme import apply_theme

CUSTOM = Settings(
    model="/models/qwen2.5-0.5b",
    device="cpu",
    dtype="bfloat16",
    threads=3,
    kv_cache_mb=512,
    page_size=32,
    context_policy="drop_oldest",
    default_params=SamplingParams(
        temperature=0.3, top_p=0.9, top_k=40, min_p=0.05, repetition_penalty=1.1, max_tokens=256, seed=7
    ),
    default_system_prompt="Answer in French.\nBe brief.",
    theme="dark",
    ui_state={"geometry": "abc"},
)


@pytest.fixture
def light(qapp: Any) -> Iterator[None]:
    apply_theme(qapp, "light")
    yield
    apply_theme(qapp, "light")


def make(qtbot: Any, settings: Settings = CUSTOM, **kwargs: Any) -> SettingsDialog:
    kwargs.setdefault("cuda_available", False)
    kwargs.setdefault("cpu_cores", 8)
    dialog = SettingsDialog(settings, **kwargs)
    qtbot.addWidget(dialog)
    dialog.show()
    return dialog


def test_fields_show_the_settings(qtbot: Any, light: None) -> None:
    d = make(qtbot)
    assert d.device.currentData() == "cpu"
    assert d.dtype.currentData() == "bfloat16"
    assert d.kv_cache.currentText() == "512"
    assert d.page_size.currentText() == "32"
    assert d.threads.currentText() == "3"
    assert d.temperature.value() == pytest.approx(0.3)
    assert d.top_p.value() == pytest.approx(0.9)
    assert d.top_k.value() == 40
    assert d.min_p.value() == pytest.approx(0.05)
    assert d.repetition_penalty.value() == pytest.approx(1.1)
    assert d.max_tokens.value() == 256
    assert d.seed.text() == "7"
    assert d.system_prompt.toPlainText() == "Answer in French.\nBe brief."
    assert d.context_policy.currentData() == "drop_oldest"
    assert d.theme.currentData() == "dark"
    assert d.problems() == []
    # Nothing changed yet: the dialog gives back what it got.
    assert d.result_settings() == CUSTOM
    assert not d.changes_note.isVisible()

    defaults = make(qtbot, Settings())
    assert defaults.kv_cache.currentText() == "Engine default"
    assert defaults.threads.currentText() == "Automatic"
    assert defaults.seed.text() == "" and defaults.seed.placeholderText() == "random"
    assert defaults.result_settings() == Settings()


def test_changed_fields_make_new_settings(qtbot: Any, light: None) -> None:
    d = make(qtbot)
    d.page_size.setCurrentText("64")
    d.threads.setCurrentText("Automatic")
    d.kv_cache.setCurrentText("2048")
    d.temperature.setValue(0.0)
    d.seed.setText("")
    d.max_tokens.setValue(1000)
    d.system_prompt.setPlainText("Be precise.")
    d.context_policy.setCurrentIndex(d.context_policy.findData("stop"))
    d.theme.setCurrentIndex(d.theme.findData("light"))
    result = d.result_settings()
    assert result is not CUSTOM
    assert result.page_size == 64 and result.threads is None and result.kv_cache_mb == 2048
    assert result.default_params == SamplingParams(
        temperature=0.0, top_p=0.9, top_k=40, min_p=0.05, repetition_penalty=1.1, max_tokens=1000, seed=None
    )
    assert result.default_system_prompt == "Be precise."
    assert result.context_policy == "stop" and result.theme == "light"
    # What the dialog does not edit is carried over; the original is untouched.
    assert result.model == CUSTOM.model and result.ui_state == CUSTOM.ui_state
    assert CUSTOM.page_size == 32
    # The note says when each kind of change applies.
    note = d.changes_note.text()
    assert d.changes_note.isVisible()
    assert "KV cache budget, page size and CPU threads: from the next model load." in note
    assert "Sampling defaults, system prompt and context policy: for new panes." in note
    assert "Theme: at once." in note


@pytest.mark.parametrize(
    ("field", "text", "reason"),
    [
        ("page_size", "24", "The page size must be a power of two from 1 to 256"),
        ("page_size", "sixteen", "The page size must be a whole number, not “sixteen”"),
        ("threads", "0", "CPU threads must be a whole number of at least 1"),
        ("kv_cache_mb", "lots", "The KV cache budget must be a whole number or “Engine default”"),
        ("kv_cache_mb", "999999999999", "The KV cache budget (999,999,999,999 MB) is more than this computer has"),
        ("seed", "1.5", "The seed must be a whole number, or empty for a random one"),
    ],
)
def test_invalid_value_is_refused_with_the_reason(qtbot: Any, light: None, field: str, text: str, reason: str) -> None:
    d = make(qtbot)
    d.tabs.setCurrentIndex(2)  # OK pressed from another tab must still lead to the field
    editor = {"page_size": d.page_size, "threads": d.threads, "kv_cache_mb": d.kv_cache, "seed": d.seed}[field]
    if isinstance(editor, QComboBox):
        editor.setCurrentText(text)
    else:
        editor.setText(text)
    # The reason shows under the field as it is typed.
    error = d._fields[field].error
    assert not error.isHidden()
    assert reason in error.text()
    assert [p.key for p in d.problems()] == [field]
    with pytest.raises(InvalidSettingsError, match=re.escape(reason)):
        d.result_settings()
    accepted: list[Settings] = []
    d.settings_accepted.connect(accepted.append)
    d.ok_button.click()
    # Refused: still open, nothing emitted, the bad field is shown and focused.
    assert d.isVisible() and d.result() != QDialog.DialogCode.Accepted and accepted == []
    assert d.tabs.currentWidget().isAncestorOf(editor)
    qtbot.waitUntil(lambda: editor.hasFocus() or editor.isAncestorOf(QApplication.focusWidget()))
    # Fixing it clears the message and OK goes through.
    if isinstance(editor, QComboBox):
        editor.setCurrentText("16" if field == "page_size" else "4")
    else:
        editor.setText("42")
    assert error.isHidden()
    d.ok_button.click()
    assert d.result() == QDialog.DialogCode.Accepted
    assert len(accepted) == 1 and accepted[0].problems() == []


def test_restore_defaults(qtbot: Any, light: None) -> None:
    d = make(qtbot)
    d.page_size.setCurrentText("24")  # even an invalid field goes back
    d.restore_button.click()
    assert d.problems() == []
    result = d.result_settings()
    expected = Settings(model=CUSTOM.model, ui_state=CUSTOM.ui_state)
    assert result == expected
    assert d.page_size.currentText() == "16" and d.theme.currentData() == "system"
    assert d._fields["page_size"].error.isHidden()
    assert d.isVisible()  # restoring does not close the dialog: OK still has to confirm


def test_cuda_choice_disabled_without_a_gpu(qtbot: Any, light: None) -> None:
    d = make(qtbot, cuda_available=False)
    item = d.device.model().item(d.device.findData("cuda"))
    assert not item.isEnabled()
    assert "no CUDA GPU" in item.toolTip()
    on_gpu = make(qtbot, cuda_available=True)
    assert on_gpu.device.model().item(on_gpu.device.findData("cuda")).isEnabled()
    # Settings that name CUDA on a machine without one say what will happen.
    saved_cuda = make(qtbot, Settings(device="cuda"), cuda_available=False)
    assert "Loading the model will fail" in saved_cuda._fields["device"].error.text()


def test_more_threads_than_cores_is_a_warning_not_a_refusal(qtbot: Any, light: None) -> None:
    d = make(qtbot, cpu_cores=4)
    d.threads.setCurrentText("16")
    assert "4 cores" in d._fields["threads"].error.text()
    assert d.problems() == []
    assert d.result_settings().threads == 16


def test_enter_accepts_and_escape_cancels(qtbot: Any, light: None) -> None:
    d = make(qtbot)
    d.activateWindow()
    d.tabs.setCurrentIndex(0)
    d.page_size.setFocus()
    d.page_size.setCurrentText("8")
    accepted: list[Settings] = []
    d.settings_accepted.connect(accepted.append)
    # Enter in the editable combo box confirms the dialog and adds nothing to its list.
    items = d.page_size.count()
    QTest.keyClick(d.page_size.lineEdit(), Qt.Key.Key_Return)
    assert d.result() == QDialog.DialogCode.Accepted
    assert [s.page_size for s in accepted] == [8]
    assert d.page_size.count() == items

    e = make(qtbot)
    e.tabs.setCurrentIndex(1)
    e.temperature.setFocus()
    QTest.keyClick(e.temperature, Qt.Key.Key_Escape)
    assert e.result() == QDialog.DialogCode.Rejected and not e.isVisible()


def _mnemonic(text: str) -> str | None:
    match = re.search(r"&([^&])", text)
    return match.group(1).lower() if match else None


def test_every_field_has_a_mnemonic_without_clashes(qtbot: Any, light: None) -> None:
    d = make(qtbot)
    shared = [_mnemonic(d.tabs.tabText(i)) for i in range(d.tabs.count())]
    shared += [_mnemonic(d.restore_button.text())]
    # Qt's own OK/Cancel may carry "&OK" / "&Cancel" on some platforms.
    shared += ["o", "c"]
    assert None not in shared and len(set(shared)) == len(shared)
    for i in range(d.tabs.count()):
        page = d.tabs.widget(i)
        labels = [
            label for label in page.findChildren(QLabel)
            if label.buddy() is not None
        ]
        editors = {id(field.editor) for field in d._fields.values() if page.isAncestorOf(field)}
        assert {id(label.buddy()) for label in labels} == editors, d.tabs.tabText(i)
        keys = [_mnemonic(label.text()) for label in labels]
        assert None not in keys, [label.text() for label in labels]
        assert len(set(keys)) == len(keys), keys
        assert not set(keys) & set(shared), (keys, shared)


def test_tab_order_follows_the_form(qtbot: Any, light: None) -> None:
    d = make(qtbot)
    d.activateWindow()
    d.tabs.setCurrentIndex(1)
    d.temperature.setFocus()
    order = []
    for _ in range(8):
        order.append(_owner(d, d.focusWidget()))
        d.focusNextChild()
    assert order == ["temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens", "seed", "default_system_prompt"]


def _owner(d: SettingsDialog, widget: QWidget | None) -> str | None:
    for key, field in d._fields.items():
        if widget is field.editor or (widget is not None and field.editor.isAncestorOf(widget)):
            return key
    return None


def _contrast(a: QColor, b: QColor) -> float:
    def luminance(c: QColor) -> float:
        def channel(v: int) -> float:
            s = v / 255
            return s / 12.92 if s <= 0.03928 else ((s + 0.055) / 1.055) ** 2.4

        return 0.2126 * channel(c.red()) + 0.7152 * channel(c.green()) + 0.0722 * channel(c.blue())

    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_hints_and_errors_are_readable_in_both_themes(qtbot: Any, qapp: Any, theme: str) -> None:
    apply_theme(qapp, theme)
    try:
        d = make(qtbot)
        d.page_size.setCurrentText("3")
        window = d.palette().color(QPalette.ColorRole.Window)
        error_color = QColor(re.search(r'role="error"\] \{ color: (#[0-9a-f]{6})', d.styleSheet()).group(1))
        assert _contrast(error_color, window) >= 4.5
        assert _contrast(secondary_text_color(d.palette()), window) >= 3.0
        # The hint is visibly quieter than the labels.
        assert _contrast(secondary_text_color(d.palette()), window) < _contrast(
            d.palette().color(QPalette.ColorRole.WindowText), window
        )
    finally:
        apply_theme(qapp, "light")
