"""The Get models dialog, offscreen, against the local stand-in for Hugging
Face (tests/app/hf_server.py) and a real registry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt

from app.models import download as download_module
from app.models.download import download_folder
from app.models.registry import ModelRegistry
from tests.app.hf_server import FakeHub
from tests.app import test_hub
from tests.app.test_hub import FOLDER_REPO, GGUF_REPO, online
from ui.dialogs.get_models import GetModelsDialog, format_count
from ui.dialogs.model_manager import ModelManagerDialog
from ui.theme import apply_theme

# The local Hub and its tiny models, as tests/app/test_hub.py serves them.
model_files = test_hub.model_files
hub = test_hub.hub


@pytest.fixture(autouse=True)
def _event_loop(loop: Any) -> None:
    """The window's event loop, set for this thread: the dialogs' jobs push their reports through it."""


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModelRegistry:
    monkeypatch.setenv("TANDEM_DATA_DIR", str(tmp_path / "data"))
    return ModelRegistry(tmp_path / "data" / "models.json")


@pytest.fixture
def dialog(qapp: Any, qtbot: Any, registry: ModelRegistry, hub: FakeHub) -> GetModelsDialog:
    apply_theme(qapp, "light")
    dialog = GetModelsDialog(registry, device="cpu")
    qtbot.addWidget(dialog)
    dialog.show()
    yield dialog
    if dialog._control is not None:
        dialog._control.cancel.set()
    dialog.wait_idle(10)


def search(qtbot: Any, dialog: GetModelsDialog, text: str) -> None:
    dialog.search_field.setText(text)
    qtbot.keyClick(dialog.search_field, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not dialog.busy() and dialog.files.topLevelItemCount() > 0, timeout=30_000)


def test_search_choose_and_download(qtbot: Any, dialog: GetModelsDialog, registry: ModelRegistry) -> None:
    search(qtbot, dialog, "tiny")
    rows = [dialog.results.topLevelItem(i).text(0) for i in range(dialog.results.topLevelItemCount())]
    assert rows == [GGUF_REPO, FOLDER_REPO]
    assert "2 models" in dialog.status_label.text()
    marks = [dialog.files.topLevelItem(i).text(3) for i in range(dialog.files.topLevelItemCount())]
    assert marks[0] == "✓ fits — recommended" and marks[1].startswith("✓ fits")
    assert dialog.selected_fit().choice.label == "Q8_0"  # the recommended one is selected
    assert dialog.download_button.isEnabled()
    added: list[str] = []
    dialog.model_added.connect(added.append)
    qtbot.mouseClick(dialog.download_button, Qt.MouseButton.LeftButton)
    assert dialog.downloading and dialog.progress_row.isVisible()
    qtbot.waitUntil(lambda: not dialog.downloading, timeout=60_000)
    assert added and registry.get(added[0]).downloaded
    assert "it is in the model list" in dialog.status_label.text()
    assert not dialog.progress_row.isVisible()


def test_pause_resume_and_cancel(qtbot: Any, dialog: GetModelsDialog, registry: ModelRegistry,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(download_module, "_CHUNK", 1024)
    pausing = {"on": True}
    real_write = download_module._write

    def slow_write(out: Any, chunk: bytes) -> None:
        real_write(out, chunk)
        if pausing["on"] and dialog._control is not None:
            dialog._control.pause.wait(0.05)  # slow enough for the test to press Pause

    monkeypatch.setattr(download_module, "_write", slow_write)
    search(qtbot, dialog, "tiny")
    dialog.download()
    qtbot.waitUntil(lambda: dialog.progress_bar.maximum() == 1000 and dialog.progress_bar.value() > 0, timeout=30_000)
    assert "Downloading tiny-llama-Q8_0.gguf" in dialog.progress_label.text()
    dialog.toggle_pause()
    qtbot.waitUntil(lambda: not dialog.downloading, timeout=30_000)
    assert dialog.pause_button.text() == "&Resume" and "Paused" in dialog.progress_label.text()
    listing = dialog._listing
    assert download_folder(registry.imports_dir, listing).exists()
    assert [e.id for e in registry.models()] == ["default"]
    # Resume, then cancel: nothing is kept.
    dialog.toggle_pause()
    assert dialog.downloading
    assert "Resuming" in dialog.progress_label.text() or "Downloading" in dialog.progress_label.text()
    dialog.cancel_download()
    qtbot.waitUntil(lambda: not dialog.downloading, timeout=30_000)
    assert "cancelled" in dialog.status_label.text()
    assert not download_folder(registry.imports_dir, listing).exists()
    assert [e.id for e in registry.models()] == ["default"]


def test_a_lost_connection_offers_resume(qtbot: Any, dialog: GetModelsDialog, registry: ModelRegistry,
                                         hub: FakeHub) -> None:
    search(qtbot, dialog, "Tiny-Llama-GGUF")
    hub.drop_after["tiny-llama-Q8_0.gguf"] = 20_000
    dialog.download()
    qtbot.waitUntil(lambda: not dialog.downloading, timeout=30_000)
    assert "connection to Hugging Face was lost" in dialog.status_label.text()
    assert dialog.pause_button.text() == "&Resume" and dialog.progress_row.isVisible()
    assert [e.id for e in registry.models()] == ["default"]
    dialog.toggle_pause()
    assert "Resuming Q8_0 from 20 KB" in dialog.progress_label.text()
    qtbot.waitUntil(lambda: not dialog.downloading, timeout=30_000)
    assert "it is in the model list" in dialog.status_label.text()
    assert len(registry.models()) == 2


def test_offline_is_one_line(qapp: Any, qtbot: Any, registry: ModelRegistry, monkeypatch: pytest.MonkeyPatch,
                             tmp_path: Path) -> None:
    closed = FakeHub()
    monkeypatch.setenv("HF_ENDPOINT", closed.endpoint)
    closed.server_close()
    online(monkeypatch, tmp_path)
    dialog = GetModelsDialog(registry, device="cpu")
    qtbot.addWidget(dialog)
    dialog.show()
    dialog.search_field.setText("llama")
    dialog.search()
    qtbot.waitUntil(lambda: not dialog.busy(), timeout=30_000)
    text = dialog.status_label.text()
    assert "offline" in text and "\n" not in text
    assert dialog.results.topLevelItemCount() == 0


def test_the_model_manager_opens_get_models_and_lists_the_download(
    qapp: Any, qtbot: Any, registry: ModelRegistry, hub: FakeHub
) -> None:
    manager = ModelManagerDialog(registry)
    qtbot.addWidget(manager)
    manager.show()
    changed: list[bool] = []
    manager.models_changed.connect(lambda: changed.append(True))
    assert manager.get_button.text() == "&Get models…"  # Alt+G, and in the Tab order
    assert manager.get_button.focusPolicy() & Qt.FocusPolicy.TabFocus
    manager.get_button.setFocus()
    qtbot.keyClick(manager.get_button, Qt.Key.Key_Space)
    get = manager.get_models
    assert get is not None and get.isVisible()
    search(qtbot, get, "Tiny-Llama-GGUF")
    get.download()
    qtbot.waitUntil(lambda: not get.downloading, timeout=60_000)
    ids = [manager.model_list.topLevelItem(i).data(0, Qt.ItemDataRole.UserRole)
           for i in range(manager.model_list.topLevelItemCount())]
    assert changed and len(ids) == 2
    assert manager.selected_id() == ids[1]
    assert manager.model_list.currentItem().text(1) == "Downloaded GGUF"


def test_format_count() -> None:
    assert [format_count(n) for n in (None, 12, 1_234, 56_000, 1_234_567, 7_000_000_000)] == [
        "—", "12", "1.2K", "56K", "1.2M", "7.0B"]
