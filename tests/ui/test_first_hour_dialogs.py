"""Issue 29's first-hour defects in the window's chats and dialogs: an
imported chat listed at once and counted by the context meter; file dialogs
that open where the last file was; the Serve panel's key field shown whole."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.ui.conftest import on_loop, wait_until
from tests.ui.test_window_chats import _close, _make


def _chat_file(tmp_path: Path, model_id: str, turns: int = 5) -> Path:
    from app.store.export import to_json
    from app.workspace.conversation import Conversation
    from app.workspace.messages import Message

    conversation = Conversation(title="Trams of Lisbon", model_id=model_id)
    for n in range(turns):
        conversation.messages.append(Message("user", f"Which tram goes to the castle, question {n}?"))
        conversation.messages.append(Message("assistant", f"Tram 28 climbs to the castle, answer {n}."))
    path = tmp_path / "trams.json"
    path.write_text(json.dumps(to_json(conversation)))
    return path


@pytest.fixture
def fresh_folders(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from ui.widgets import file_folders

    monkeypatch.setattr(file_folders, "_last_folder", None)  # no earlier test's folder
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()


@on_loop()
async def test_an_imported_chat_is_listed_at_once_and_counted(
    loop: Any, tiny_model_dir: Path, tmp_path: Path, fresh_folders: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from PySide6.QtWidgets import QFileDialog

    window = _make(tmp_path, tiny_model_dir, panes=1)
    try:
        window.load_engine()
        await wait_until(lambda: window.workspace.engine_state == "ready", what="the model")
        chats = tmp_path / "chats"
        chats.mkdir()
        chat_file = _chat_file(chats, window.workspace.default_model)
        opened_in: list[str] = []

        def choose(_parent: Any, _caption: str, folder: str, _filters: str) -> tuple[str, str]:
            opened_in.append(folder)
            return str(chat_file), ""

        # Ctrl+O as a user takes it: the dialog starts at home, and the file is picked there.
        monkeypatch.setattr(QFileDialog, "getOpenFileName", choose)
        window.import_chat()
        assert opened_in == [str(tmp_path / "home")]
        view = window.current_view()
        assert len(view.pane.conversation.messages) == 10
        # Listed by itself once its save is in: no typing in the search box.
        await wait_until(lambda: "Trams of Lisbon" in [s.title for s in window.sidebar.summaries()], timeout=10,
                         what="the import in the sidebar")
        assert window.sidebar.search.text() == ""
        # Ten messages are not "0 / 2.0k": the meter counts the chat's text.
        used = view.context_tokens()
        assert used is not None and used > 50
        assert view.context_meter.value() == used
        assert not view.context_meter.text().startswith("0 ")
    finally:
        await _close(window)


@on_loop()
async def test_file_dialogs_open_where_the_last_file_was(
    loop: Any, tiny_model_dir: Path, tmp_path: Path, fresh_folders: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from PySide6.QtWidgets import QFileDialog

    window = _make(tmp_path, tiny_model_dir, panes=1)
    try:
        (tmp_path / "chats").mkdir()
        chat_file = _chat_file(tmp_path / "chats", window.workspace.default_model)
        starts: list[str] = []

        def choose(_parent: Any, _caption: str, start: str, _filters: str) -> tuple[str, str]:
            starts.append(start)
            return str(chat_file), ""

        monkeypatch.setattr(QFileDialog, "getOpenFileName", choose)
        window.import_chat()
        # The export after it suggests the import's folder, not home.
        monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a: (starts.append(a[2]), ("", ""))[1])
        window.export_current("md")
        assert starts[0] == str(tmp_path / "home")
        assert Path(starts[1]).parent == tmp_path / "chats" and starts[1].endswith(".md")
        # The model manager's file dialogs too.
        from app.models.registry import ModelRegistry
        from ui.dialogs.model_manager import ModelManagerDialog

        monkeypatch.setenv("TANDEM_DATA_DIR", str(tmp_path / "data"))
        manager = ModelManagerDialog(ModelRegistry(tmp_path / "data" / "models.json"), window)
        for choose_file in (manager.choose_gguf, manager.choose_folder):
            choose_file()
            assert Path(manager.file_dialog.directory().absolutePath()) == tmp_path / "chats"
            manager.file_dialog.reject()
        manager.close()
    finally:
        await _close(window)


@on_loop()
async def test_the_serve_panels_key_field_shows_its_placeholder_whole(
    loop: Any, qapp: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from ui.theme import apply_theme

    window = _make(tmp_path, tiny_model_dir, panes=1)
    try:
        for size in ((1024, 700), (1440, 900)):
            window.resize(*size)
            window.menu_actions["server_panel"].trigger()
            panel = window.server_control.panel
            qapp.processEvents()
            field = panel.key_edit
            assert field.text() == ""
            needed = field.fontMetrics().horizontalAdvance(field.placeholderText())
            margins = field.textMargins()
            # The line edit's own frame and padding take a few pixels either side.
            assert field.width() - margins.left() - margins.right() - 12 >= needed
            assert "any program on this computer may call" in " ".join(
                label.text() for label in panel.findChildren(type(panel.state_label)))
            panel.close()
            qapp.processEvents()
    finally:
        apply_theme(qapp, "light")
        await _close(window)
