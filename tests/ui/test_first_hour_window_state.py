"""Issue 29's window items: a quantized model's load said once and truthfully,
which arithmetic it runs, the Chats sidebar's visibility kept across a
restart, no size hints for Qt's offscreen platform to complain about, and
the Get models dialog's headings whole."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ui.conftest import on_loop, wait_until
from tests.ui.test_window_chats import _close


@pytest.fixture
def qt_warnings() -> Iterator[list[str]]:
    """Qt's warnings while the test runs."""
    from PySide6.QtCore import qInstallMessageHandler

    seen: list[str] = []
    previous = qInstallMessageHandler(lambda _kind, _context, message: seen.append(message))
    try:
        yield seen
    finally:
        qInstallMessageHandler(previous)


@on_loop()
async def test_a_quantized_models_load_names_each_stage_once_and_then_its_arithmetic(
    loop: Any, default_model_dir: Path  # makes "default" resolve to the test session's import
) -> None:
    from app.settings import Settings
    from app.workspace.workspace import Workspace
    from ui.window.main_window import MainWindow

    settings = Settings(threads=1)
    workspace = Workspace(settings)
    workspace.add_pane()
    window = MainWindow(workspace, settings, version="test", save_settings=False)
    window.resize(1024, 700)
    window.show()
    shown: list[str] = []
    window.workspace.subscribe(lambda _event: shown.append(window.banner.label.text()))
    try:
        window.load_engine()
        await wait_until(lambda: workspace.engine_state == "ready", what="the default model")
        during = [text for text in dict.fromkeys(shown) if text.startswith("Loading")]
        assert any("reading the weights" in text for text in during), during
        for text in during:
            assert text.count("Loading") == 1 and text.lower().count("weights") <= 1, text
            assert "float32" not in text, text  # its 4-bit weights stay 4-bit
        assert any("kept as q4_1+q8_0 for the quantized kernels" in text for text in during), during
        window.refresh_status()
        status = window.status_bar.engine_label
        assert "q4_1+q8_0 kernels, int8 activations" in status.text()
        assert "as llama.cpp does" in status.toolTip()
    finally:
        await _close(window)


def test_the_arithmetic_is_said_in_words() -> None:
    from ui.window.status_bar import describe_arithmetic

    assert describe_arithmetic("q4_1+q8_0 (kernel)", "float32") == "q4_1+q8_0 kernels, int8 activations"
    assert describe_arithmetic("float32 (dequantized from q4_1+q8_0)", "float32") == (
        "float32, dequantized from q4_1+q8_0")
    assert describe_arithmetic("", "bfloat16") == "bfloat16"


@on_loop()
async def test_a_chats_sidebar_hidden_with_ctrl_b_stays_hidden_after_a_restart(
    loop: Any, tmp_path: Path
) -> None:
    from app.settings import Settings
    from app.store.session import ChatSession
    from app.workspace.workspace import Workspace
    from ui.window.main_window import MainWindow

    def start() -> Any:
        settings = Settings.load()
        workspace = Workspace(settings)
        session = ChatSession.open(tmp_path / "chats.sqlite3")
        session.restore(workspace, default_panes=1)
        window = MainWindow(workspace, settings, version="test", session=session)
        window.resize(1024, 700)
        window.show()
        return window

    window = start()
    assert window.sidebar_dock.isVisible()
    window.menu_actions["chats_sidebar"].trigger()  # Ctrl+B
    assert not window.sidebar_dock.isVisible()
    await _close(window)
    assert Settings.load().ui_state["sidebar_shown"] is False

    window = start()
    try:
        assert not window.sidebar_dock.isVisible()
        assert not window.menu_actions["chats_sidebar"].isChecked()
        window.menu_actions["chats_sidebar"].trigger()  # and back: saved at once, not only at exit
        assert window.sidebar_dock.isVisible()
        assert Settings.load().ui_state["sidebar_shown"] is True
    finally:
        await _close(window)


@on_loop()
async def test_the_window_gives_qt_no_size_hints_to_pass_on(loop: Any, qapp: Any, qt_warnings: list[str]) -> None:
    """Its minimum size is set once: a banner shown or hidden does not change
    it, so Qt's offscreen platform has nothing to warn about. The loading
    sentence wraps whole at 1024x700 beside the Chats sidebar's width."""
    from engine.progress import LoadProgress
    from tests.ui.layout_probe import build_window
    from ui.startup import show_startup_frame

    frame = show_startup_frame(qapp, None, (1024, 700))
    window = build_window(1024, 700, 2)
    try:
        frame.hand_over(window)
        detail = "Reading the weights onto cpu, kept as q4_1+q8_0 for the quantized kernels"
        window.banner.show_progress(LoadProgress("weights", 1, 9, detail), "SmolLM2-135M-Instruct")
        window.banner.show()
        window.store_banner.show_problem("The chat store cannot be written. " * 4)
        window.resize(1024 - window.fontMetrics().averageCharWidth() * 40, 700)  # the sidebar's share
        await asyncio.sleep(0.05)  # the loop runs the layouts
        label = window.banner.label
        assert label.height() >= label.heightForWidth(label.width()), label.text()
        assert label.geometry().bottom() < window.banner.contentsRect().bottom() + 1
        window.banner.hide()
        window.store_banner.hide()
        await asyncio.sleep(0.05)
        assert [w for w in qt_warnings if "propagateSizeHints" in w] == []
    finally:
        await _close(window)


@pytest.mark.parametrize("screen", [(1024, 700), (1440, 900)])
def test_get_models_shows_every_heading_whole(qapp: Any, qtbot: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             screen: tuple[int, int]) -> None:
    from app.models.registry import ModelRegistry
    from ui.dialogs.get_models import GetModelsDialog

    monkeypatch.setenv("TANDEM_DATA_DIR", str(tmp_path / "data"))
    dialog = GetModelsDialog(ModelRegistry(tmp_path / "data" / "models.json"), device="cpu")
    qtbot.addWidget(dialog)
    dialog.resize(min(dialog.width(), screen[0]), min(dialog.height(), screen[1]))
    dialog.show()
    qapp.processEvents()
    for tree in (dialog.results, dialog.files):
        header = tree.header()
        for column in range(header.count()):
            heading = tree.headerItem().text(column)
            assert header.sectionSize(column) >= header.sectionSizeHint(column), heading
        assert header.length() <= tree.viewport().width()
