"""The model manager dialog and the pane's model picker, offscreen, on a real registry."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtWidgets import QLabel, QMessageBox, QPushButton

from app.models.registry import ModelEntry, ModelRegistry
from engine.progress import LoadProgress
from tests.engine.test_gguf_import import TinyModel, write_gguf
from ui.dialogs.model_manager import ModelManagerDialog, format_parameters
from ui.widgets.model_picker import ModelPicker
from ui.theme import apply_theme, muted_text_color


@pytest.fixture(autouse=True)
def _event_loop(loop: Any) -> None:
    """The window's event loop, set for this thread: the dialogs' jobs push their reports through it."""


class GatedRegistry(ModelRegistry):
    """The real registry, whose imports wait at their first written tensor
    until the test opens `gate`: a tiny file would otherwise be imported
    before the dialog could show any progress."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.gate = threading.Event()

    def import_gguf(self, path: Any, on_progress: Any = None, cancel: Any = None) -> ModelEntry:
        def gated(report: LoadProgress) -> None:
            if on_progress is not None:
                on_progress(report)
            if report.done > 0:
                self.gate.wait(30)

        return super().import_gguf(path, gated, cancel)


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> GatedRegistry:
    monkeypatch.setenv("TANDEM_DATA_DIR", str(tmp_path / "data"))
    return GatedRegistry(tmp_path / "data" / "models.json")


@pytest.fixture
def dialog(qapp: Any, qtbot: Any, registry: ModelRegistry) -> ModelManagerDialog:
    apply_theme(qapp, "light")
    dialog = ModelManagerDialog(registry)
    qtbot.addWidget(dialog)
    dialog.show()
    return dialog


@pytest.fixture
def model_folder(tiny_model_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_model_dir, tmp_path / "tiny-llama"))


def rows(dialog: ModelManagerDialog) -> list[list[str]]:
    tree = dialog.model_list
    return [[tree.topLevelItem(i).text(c) for c in range(3)] for i in range(tree.topLevelItemCount())]


def test_lists_the_default_with_its_details(dialog: ModelManagerDialog) -> None:
    assert rows(dialog) == [["SmolLM2-135M-Instruct", "Built in", "98 MB"]]
    assert dialog.selected_id() == "default"
    labels = dialog.detail_labels
    assert labels["architecture"].text() == "Llama (llama)"
    assert labels["parameters"].text() == "135M"
    assert labels["context"].text() == "8,192 tokens"
    assert labels["dtype"].text() == "Q4_1 (GGUF)"
    assert dialog.location_field.text() == "Imported on first use"
    assert labels["memory"].text().startswith("about ")
    assert not dialog.remove_button.isEnabled()  # the built-in model stays


def test_adding_a_folder_lists_it_and_announces_the_change(
    dialog: ModelManagerDialog, registry: ModelRegistry, model_folder: Path, qtbot: Any
) -> None:
    with qtbot.waitSignal(dialog.models_changed, timeout=5000):
        entry = dialog.add_folder(model_folder)
    assert entry is not None and entry.id == "tiny-llama"
    assert [r[:2] for r in rows(dialog)] == [["SmolLM2-135M-Instruct", "Built in"], ["tiny-llama", "Folder"]]
    assert dialog.selected_id() == "tiny-llama"  # the new model is shown
    assert dialog.detail_labels["architecture"].text() == "Llama (llama)"
    assert dialog.location_field.text() == str(model_folder.resolve())
    assert dialog.remove_button.isEnabled()
    assert dialog.error_box is None


def test_a_bad_folder_shows_the_reason_and_registers_nothing(
    dialog: ModelManagerDialog, registry: ModelRegistry, model_folder: Path, qtbot: Any
) -> None:
    (model_folder / "tokenizer.json").unlink()
    with qtbot.assertNotEmitted(dialog.models_changed):
        assert dialog.add_folder(model_folder) is None
    box = dialog.error_box
    assert box is not None and box.isVisible()
    assert box.windowTitle() == "The folder was not added"
    assert "has no tokenizer.json" in box.text()
    assert [e.id for e in registry.models()] == ["default"]
    assert len(rows(dialog)) == 1
    box.accept()
    assert dialog.error_box is None


def test_an_import_shows_progress_and_can_be_cancelled(
    dialog: ModelManagerDialog, registry: GatedRegistry, tmp_path: Path, qtbot: Any
) -> None:
    gguf = tmp_path / "tiny.gguf"
    write_gguf(gguf, TinyModel(layers=3))
    dialog.import_gguf(gguf)
    assert dialog.importing
    assert not dialog.import_button.isEnabled() and not dialog.add_button.isEnabled()
    qtbot.waitUntil(lambda: 0 < dialog.progress_bar.value() < 1000, timeout=10_000)
    assert dialog.import_row.isVisible()
    assert "Importing tiny.gguf" in dialog.import_label.text()
    # The GUI thread stays free while the import waits: it handles the click.
    qtbot.mouseClick(dialog.cancel_button, Qt.MouseButton.LeftButton)
    registry.gate.set()
    qtbot.waitUntil(lambda: not dialog.importing, timeout=10_000)
    assert not dialog.import_row.isVisible()
    assert dialog.status_label.text() == "The import of tiny.gguf was cancelled; nothing was kept."
    assert dialog.error_box is None  # a cancel is not an error
    assert [e.id for e in registry.models()] == ["default"]
    assert list(registry.imports_dir.iterdir()) == []
    assert dialog.import_button.isEnabled()


def test_import_progress_is_pushed_to_the_dialog_with_no_timer_polling(
    dialog: ModelManagerDialog, registry: GatedRegistry, tmp_path: Path, qtbot: Any
) -> None:
    from PySide6.QtCore import QTimer

    gguf = tmp_path / "tiny.gguf"
    write_gguf(gguf, TinyModel(layers=3))
    dialog.import_gguf(gguf)
    # The import waits at the gate after its first tensor: what the bar shows is that report, pushed.
    qtbot.waitUntil(lambda: 0 < dialog.progress_bar.value() < 1000, timeout=10_000)
    assert "Importing tiny.gguf" in dialog.import_label.text()
    assert [timer for timer in dialog.findChildren(QTimer) if timer.isActive()] == []
    registry.gate.set()
    qtbot.waitUntil(lambda: not dialog.importing, timeout=10_000)
    assert dialog.status_label.text().startswith("Imported tiny.gguf as")


def test_a_finished_import_is_listed_and_selected(
    dialog: ModelManagerDialog, registry: GatedRegistry, tmp_path: Path, qtbot: Any
) -> None:
    registry.gate.set()
    gguf = tmp_path / "Tiny-Chat.gguf"
    write_gguf(gguf)
    with qtbot.waitSignal(dialog.models_changed, timeout=10_000):
        dialog.import_gguf(gguf)
    assert not dialog.importing
    assert rows(dialog)[1][:2] == ["Tiny-Chat", "Imported GGUF"]
    assert dialog.selected_id() == "tiny-chat"
    assert dialog.detail_labels["source"].text() == f"Imported from {gguf}"
    assert dialog.status_label.text() == "Imported Tiny-Chat.gguf as “Tiny-Chat”."


def test_a_corrupt_gguf_shows_the_reason(
    dialog: ModelManagerDialog, registry: GatedRegistry, tmp_path: Path, qtbot: Any
) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x07" * 300)
    dialog.import_gguf(bad)
    qtbot.waitUntil(lambda: dialog.error_box is not None, timeout=10_000)
    assert dialog.error_box.windowTitle() == "broken.gguf was not imported"
    assert "Download it again" in dialog.error_box.text()
    assert [e.id for e in registry.models()] == ["default"]
    assert not registry.imports_dir.exists() or list(registry.imports_dir.iterdir()) == []


def test_remove_asks_first(dialog: ModelManagerDialog, registry: ModelRegistry, model_folder: Path, qtbot: Any) -> None:
    dialog.add_folder(model_folder)
    dialog.model_list.setFocus()
    qtbot.keyClick(dialog.model_list, Qt.Key.Key_Delete)  # the Delete key asks too
    box = dialog.confirm_box
    assert box is not None and box.isVisible()
    assert "The folder" in box.text() and "itself is not deleted" in box.text()
    box.button(QMessageBox.StandardButton.Cancel).click()
    assert [e.id for e in registry.models()] == ["default", "tiny-llama"]

    dialog.remove_button.click()
    remove = next(b for b in dialog.confirm_box.buttons() if b.text() == "&Remove")
    with qtbot.waitSignal(dialog.models_changed, timeout=5000):
        remove.click()
    assert [e.id for e in registry.models()] == ["default"]
    assert dialog.selected_id() == "default"
    assert model_folder.is_dir()


def test_keyboard_use(dialog: ModelManagerDialog, model_folder: Path, qtbot: Any) -> None:
    buttons = dialog.findChildren(QPushButton)
    assert buttons and all("&" in b.text() for b in buttons), [b.text() for b in buttons]
    mnemonics = [b.text()[b.text().index("&") + 1].lower() for b in buttons]
    assert len(set(mnemonics)) == len(mnemonics)

    dialog.add_folder(model_folder)
    dialog.model_list.setFocus()
    qtbot.keyClick(dialog.model_list, Qt.Key.Key_Up)
    assert dialog.selected_id() == "default"
    qtbot.keyClick(dialog.model_list, Qt.Key.Key_Down)
    assert dialog.selected_id() == "tiny-llama"
    qtbot.keyClick(dialog, Qt.Key.Key_Escape)
    assert not dialog.isVisible()


def test_closing_the_dialog_cancels_its_import(
    dialog: ModelManagerDialog, registry: GatedRegistry, tmp_path: Path, qtbot: Any
) -> None:
    gguf = tmp_path / "tiny.gguf"
    write_gguf(gguf)
    dialog.import_gguf(gguf)
    qtbot.waitUntil(lambda: dialog.progress_bar.value() > 0, timeout=10_000)
    dialog.close()
    registry.gate.set()
    assert dialog.wait_for_import(10)
    qtbot.waitUntil(lambda: not dialog.importing, timeout=5000)
    assert [e.id for e in registry.models()] == ["default"]


def test_the_muted_status_follows_the_theme(qapp: Any, dialog: ModelManagerDialog) -> None:
    from PySide6.QtGui import QPalette

    try:
        apply_theme(qapp, "dark")
        qapp.processEvents()
        color = dialog.status_label.palette().color(QPalette.ColorRole.WindowText)
        assert color == muted_text_color(dialog.palette())
        assert dialog.palette().color(QPalette.ColorRole.Window).lightness() < 128
    finally:
        apply_theme(qapp, "light")


def test_model_picker_reports_only_what_the_user_picks(
    qtbot: Any, registry: ModelRegistry, model_folder: Path, tmp_path: Path
) -> None:
    registry.add_folder(model_folder)
    gone = registry.add_folder(shutil.copytree(model_folder, tmp_path / "gone"))
    shutil.rmtree(tmp_path / "gone")
    picker = ModelPicker()
    qtbot.addWidget(picker)
    chosen: list[str] = []
    picker.model_chosen.connect(chosen.append)
    picker.set_models(registry.models(), "default")
    assert [picker.itemText(i) for i in range(picker.count())] == ["SmolLM2-135M-Instruct", "tiny-llama", "gone (missing)"]
    assert picker.current_id() == "default" and chosen == []  # setting the list is not a choice
    assert not picker.model().item(2).isEnabled()

    picker.show()
    picker.setFocus()
    qtbot.keyClick(picker, Qt.Key.Key_Down)
    assert chosen == ["tiny-llama"] and picker.current_id() == "tiny-llama"
    qtbot.keyClick(picker, Qt.Key.Key_Down)  # the missing model cannot be picked
    assert chosen == ["tiny-llama"]
    picker.set_models(registry.models(), gone.id)
    assert picker.current_id() == gone.id


def test_parameter_counts_read_like_model_names() -> None:
    assert [format_parameters(n) for n in (134_515_008, 7_241_732_096, 1_500_000, 494_032_768, 12_000)] == [
        "135M", "7.2B", "1.5M", "494M", "12K",
    ]


# -- quantize at load ------------------------------------------------------------


def test_a_float_folder_offers_quantize_at_load_kept_per_model(
    qapp: Any, qtbot: Any, registry: ModelRegistry, model_folder: Path, tmp_path: Path
) -> None:
    dialog = ModelManagerDialog(registry)
    qtbot.addWidget(dialog)
    dialog.show()
    dialog.set_engine_settings(device="cpu", dtype="float32", kv_cache_mb=1)
    dialog.add_folder(model_folder)
    choice = dialog.quantize_choice
    assert choice.isVisible() and choice.currentText() == "Off"
    assert "computed once at the next load, then cached" in dialog.quantize_note.text()
    as_stored = dialog.detail_labels["memory"].text()
    assert "as float32" in as_stored

    # Keyboard only: Alt+Q reaches the choice, the arrow keys pick int4.
    with qtbot.waitActive(dialog):
        dialog.activateWindow()
    dialog.model_list.setFocus()
    qtbot.keyClick(dialog.model_list, Qt.Key.Key_Q, Qt.KeyboardModifier.AltModifier)
    qtbot.waitUntil(choice.hasFocus, timeout=2000)
    qtbot.keyClick(choice, Qt.Key.Key_Down)
    qtbot.keyClick(choice, Qt.Key.Key_Down)
    assert choice.currentData() == "int4"
    assert registry.get("tiny-llama").quantize == "int4"
    assert "it applies when it loads" in dialog.status_label.text()
    memory = dialog.detail_labels["memory"].text()
    assert "as q4_1+q8_0" in memory
    assert registry.estimate_memory("tiny-llama", "cpu", "float32", 1).weights_bytes < (
        registry.estimate_memory("tiny-llama", "cpu", "float32", 1, quantize=None).weights_bytes / 3
    )
    assert "then cached" in dialog.quantize_note.text() and "4-bit" in dialog.quantize_note.text()
    assert not dialog.reload_button.isVisible()  # not loaded: nothing to reload
    dialog.close()

    # A new registry on the same file, a new dialog: the choice is still there.
    reopened = ModelManagerDialog(ModelRegistry(registry.path))
    qtbot.addWidget(reopened)
    reopened.show()
    reopened.refresh(select_id="tiny-llama")
    assert reopened.quantize_choice.currentData() == "int4"


def test_a_model_stored_quantized_shows_its_formats_instead(dialog: ModelManagerDialog) -> None:
    assert dialog.selected_id() == "default"
    assert not dialog.quantize_choice.isVisible()
    assert dialog.quantize_note.text().startswith("Not needed: stored as q4_1 + q8_0 blocks")
    # Which arithmetic it will run, in words (the kernels where this machine has them).
    assert dialog.detail_labels["arithmetic"].text() in (
        "q4_1+q8_0 kernels, int8 activations", "float32, dequantized from q4_1+q8_0",
        "bfloat16, dequantized from q4_1+q8_0")


def test_changing_a_loaded_models_choice_applies_at_the_next_load_or_now(
    qapp: Any, qtbot: Any, registry: ModelRegistry, model_folder: Path
) -> None:
    reloaded: list[str] = []
    dialog = ModelManagerDialog(registry, is_loaded=lambda model_id: True, reload_model=reloaded.append)
    qtbot.addWidget(dialog)
    dialog.show()
    dialog.add_folder(model_folder)
    dialog.quantize_choice.setFocus()
    qtbot.keyClick(dialog.quantize_choice, Qt.Key.Key_Down)
    assert registry.get("tiny-llama").quantize == "int8"
    assert dialog.status_label.text() == (
        "“tiny-llama”: quantize at load set to int8 (8-bit); it applies the next time it loads "
        "(or reload it now)."
    )
    assert "runs as before until the model loads again" in dialog.quantize_note.text()
    assert dialog.reload_button.isVisible()
    # Tab from the last choice reaches the button, in its own row under both; Space presses it.
    with qtbot.waitActive(dialog):
        dialog.activateWindow()
    dialog.context_length.setFocus()
    qtbot.keyClick(dialog.context_length, Qt.Key.Key_Tab)
    assert dialog.reload_button.hasFocus()
    qtbot.keyClick(dialog.reload_button, Qt.Key.Key_Space)
    assert reloaded == ["tiny-llama"]
    assert not dialog.reload_button.isVisible()


def test_a_refused_choice_is_shown_and_the_saved_one_kept(
    dialog: ModelManagerDialog, registry: ModelRegistry, model_folder: Path, tmp_path: Path, qtbot: Any
) -> None:
    from engine.formats.loader import quantized_copy

    dialog.add_folder(model_folder)
    # The folder's files are replaced by a quantized copy behind the dialog's back.
    copy = quantized_copy(model_folder, "int4", cache_dir=tmp_path / "copies")
    shutil.rmtree(model_folder)
    shutil.copytree(copy, model_folder)
    dialog.quantize_choice.setFocus()
    qtbot.keyClick(dialog.quantize_choice, Qt.Key.Key_Down)
    box = dialog.error_box
    assert box is not None and box.isVisible()
    assert box.windowTitle() == "The quantize choice was not changed"
    assert "stored as q4_1 + q8_0 blocks already" in box.text()
    assert dialog.quantize_choice.currentText() == "Off"
    assert registry.get("tiny-llama").quantize is None
    box.accept()


def test_a_context_cap_is_kept_per_model_and_shrinks_the_memory_estimate(
    qapp: Any, qtbot: Any, registry: ModelRegistry, model_folder: Path
) -> None:
    dialog = ModelManagerDialog(registry)
    qtbot.addWidget(dialog)
    dialog.show()
    dialog.set_engine_settings(device="cpu", dtype="float32")  # the CPU's default KV budget: the context sizes the pool
    dialog.add_folder(model_folder)
    box = dialog.context_length
    assert box.isVisible() and box.text() == "Model's own (2,048)"
    assert box.maximum() == 2048  # the model's trained context bounds it
    uncapped = dialog.detail_labels["memory"].text()

    # Keyboard only: Alt+X reaches the field; typing 256 and Enter saves it.
    with qtbot.waitActive(dialog):
        dialog.activateWindow()
    dialog.model_list.setFocus()
    qtbot.keyClick(dialog.model_list, Qt.Key.Key_X, Qt.KeyboardModifier.AltModifier)
    qtbot.waitUntil(box.hasFocus, timeout=2000)
    box.lineEdit().selectAll()
    qtbot.keyClicks(box.lineEdit(), "256")
    qtbot.keyClick(box.lineEdit(), Qt.Key.Key_Return)
    assert registry.get("tiny-llama").max_context == 256
    assert registry.engine_options("tiny-llama")["max_context"] == 256
    assert dialog.status_label.text() == "“tiny-llama”: context length set to 256 tokens; it applies when it loads."
    capped = dialog.detail_labels["memory"].text()
    assert capped != uncapped
    assert registry.estimate_memory("tiny-llama", "cpu", "float32").kv_bytes < (
        registry.estimate_memory("tiny-llama", "cpu", "float32", max_context=None).kv_bytes
    )
    assert "Capped below the trained 2,048 tokens" in dialog.load_choices.context_note.text()

    # A new registry on the same file, a new dialog: the cap is still there.
    reopened = ModelManagerDialog(ModelRegistry(registry.path))
    qtbot.addWidget(reopened)
    reopened.show()
    reopened.set_engine_settings(device="cpu", dtype="float32")
    reopened.refresh(select_id="tiny-llama")
    assert reopened.context_length.value() == 256 and reopened.detail_labels["memory"].text() == capped

    # Back to the model's own context: no cap, the first estimate.
    box.setValue(box.minimum())
    box.editingFinished.emit()
    assert registry.get("tiny-llama").max_context is None
    assert "max_context" not in registry.engine_options("tiny-llama")
    assert dialog.detail_labels["memory"].text() == uncapped


def test_capping_a_loaded_models_context_offers_a_reload(qapp: Any, qtbot: Any, registry: ModelRegistry, model_folder: Path) -> None:
    reloaded: list[str] = []
    dialog = ModelManagerDialog(registry, is_loaded=lambda model_id: True, reload_model=reloaded.append)
    qtbot.addWidget(dialog)
    dialog.show()
    dialog.add_folder(model_folder)
    dialog.context_length.setValue(512)
    dialog.context_length.editingFinished.emit()
    assert registry.get("tiny-llama").max_context == 512
    assert dialog.status_label.text() == (
        "“tiny-llama”: context length set to 512 tokens; it applies the next time it loads (or reload it now)."
    )
    assert dialog.reload_button.isVisible()
    dialog.reload_button.click()
    assert reloaded == ["tiny-llama"]
    assert not dialog.reload_button.isVisible()


def test_the_context_arrows_treat_the_models_own_as_the_top(
    qapp: Any, qtbot: Any, registry: ModelRegistry, model_folder: Path
) -> None:
    dialog = ModelManagerDialog(registry)
    qtbot.addWidget(dialog)
    dialog.show()
    dialog.add_folder(model_folder)
    box = dialog.context_length
    assert box.text() == "Model's own (2,048)"
    box.setFocus()
    qtbot.keyClick(box, Qt.Key.Key_Up)  # already the most: stays, no jump to 256
    assert box.text() == "Model's own (2,048)" and registry.get("tiny-llama").max_context is None
    qtbot.keyClick(box, Qt.Key.Key_Down)
    assert box.value() == 1792 and registry.get("tiny-llama").max_context == 1792
    qtbot.keyClick(box, Qt.Key.Key_Up)
    assert box.text() == "Model's own (2,048)" and registry.get("tiny-llama").max_context is None
    box.setValue(256)
    qtbot.keyClick(box, Qt.Key.Key_Down)  # the least: stays, no wrap to the model's own
    assert box.value() == 256


def test_after_a_context_cap_the_details_show_whole_and_say_when_reloaded(
    qapp: Any, qtbot: Any, registry: ModelRegistry, model_folder: Path
) -> None:
    import asyncio

    loop = asyncio.new_event_loop()
    reloads: list[asyncio.Future[bool]] = []

    def reload_model(model_id: str) -> asyncio.Future[bool]:
        reloads.append(loop.create_future())
        return reloads[-1]

    dialog = ModelManagerDialog(registry, is_loaded=lambda model_id: True, reload_model=reload_model)
    qtbot.addWidget(dialog)
    dialog.resize(dialog.width(), 360)  # shorter than the details: they scroll, they are not squeezed
    dialog.show()
    dialog.add_folder(model_folder)
    dialog.context_length.setValue(1024)
    dialog.context_length.editingFinished.emit()
    qapp.processEvents()
    assert dialog.reload_button.isVisible()
    box = dialog.details_box
    labels = [w for w in box.findChildren(QLabel) if w.isVisible()]
    for label in labels:
        if label.wordWrap() and label.text():
            assert label.height() >= label.heightForWidth(label.width()), label.text()
    reload_at = dialog.reload_button.geometry().translated(dialog.reload_button.parentWidget().mapTo(box, QPoint()))
    for label in labels:
        at = label.geometry().translated(label.parentWidget().mapTo(box, QPoint()))
        assert not at.intersects(reload_at), label.text()

    dialog.reload_button.click()
    assert dialog.status_label.text() == "Reloading “tiny-llama”…"
    reloads[-1].set_result(True)
    loop.run_until_complete(asyncio.sleep(0))
    assert dialog.status_label.text() == "Reloaded “tiny-llama”: its load choices apply now."
    loop.close()
