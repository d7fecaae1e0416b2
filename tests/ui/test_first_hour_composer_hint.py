"""Issue 29, item 10: the message box's hint says what is true in each state.

It said "No model is loaded: use the Load button above the panes" while the
model loaded and after it was ready; no such button was on screen. Each state
here is reached the way the app reaches it (a real workspace loading the tiny
model, a model folder that is not there, a start after a crash), and the
control the hint names is checked to be on screen.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.ui.conftest import on_loop, wait_until


def _make(model: str) -> Any:
    from app.settings import Settings
    from app.workspace.workspace import Workspace
    from ui.window.main_window import MainWindow

    settings = Settings(model=model, device="cpu", dtype="float32", threads=1, kv_cache_mb=16)
    workspace = Workspace(settings)
    workspace.add_pane()
    window = MainWindow(workspace, settings, version="test", save_settings=False)
    window.resize(1024, 700)
    window.show()
    return window


async def _close(window: Any) -> None:
    closed = asyncio.Event()
    window.closed.connect(closed.set)
    window.close()
    await asyncio.wait_for(closed.wait(), 30)


def _hint(window: Any) -> str:
    return window.composer.edit.placeholderText()


@on_loop()
async def test_loading_then_ready_says_what_is_happening_then_how_to_send(loop: Any, tiny_model_dir: Path) -> None:
    window = _make(str(tiny_model_dir))
    seen: list[str] = []
    original = window.composer.set_model_state
    window.composer.set_model_state = lambda state, name="": (seen.append(state), original(state, name))[1]
    try:
        # Up, the load about to start (the banner already says "Loading …"): never "no model".
        assert window.banner.isVisible() and "Loading" in window.banner.label.text()
        assert "is loading" in _hint(window) and "No model" not in _hint(window)
        assert not window.composer.send_button.isEnabled()
        window.load_engine()
        await wait_until(lambda: window.workspace.engine_state == "ready", what="the model")
        assert "loading" in seen and seen[-1] == "ready"
        assert _hint(window) == "Message every selected pane…  (Ctrl+Enter sends)"
        assert "Load" not in _hint(window) and window.composer.send_button.isEnabled()
        # Adding a pane asks again and stays true.
        window.commands.add_pane()
        await asyncio.sleep(0)
        assert "Ctrl+Enter sends" in _hint(window)
    finally:
        await _close(window)


@on_loop()
async def test_a_failed_load_names_try_again_which_is_on_screen(loop: Any, tmp_path: Path) -> None:
    window = _make(str(tmp_path / "no-such-model"))
    try:
        window.load_engine()
        await wait_until(lambda: window.workspace.engine_state == "error", what="the failure")
        await wait_until(lambda: window.composer.model_state == "failed", what="the hint")
        assert "could not be loaded" in _hint(window) and "Try again" in _hint(window)
        assert window.banner.retry.isVisible() and window.banner.retry.text() == "Try again"
    finally:
        await _close(window)


@on_loop()
async def test_after_a_crash_the_hint_names_the_banners_load_button_and_a_refused_send_says_why(
    loop: Any, tmp_path: Path, qtbot: Any
) -> None:
    window = _make(str(tmp_path / "model"))
    try:
        window.crash_recovery = True  # as ui/main.py: after a crash nothing loads until the user asks
        window.apply_engine_state("unloaded", None, None)
        button = window.banner.retry
        assert button.isVisible() and button.text().startswith("Load ")
        assert "No model is loaded" in _hint(window)
        assert f"press {button.text()} above the panes" in _hint(window)
        assert "Load this pane's model (Ctrl+Shift+L)" in _hint(window)
        assert window.menu_actions["load_pane_model"].shortcut().toString() == "Ctrl+Shift+L"
        # Ctrl+Enter with a draft: refused with the reason, the draft kept.
        window.composer.edit.setPlainText("hello")
        window.composer.send()
        notice = window.composer.notice.text()
        assert notice.startswith("No model is loaded, so the message was not sent") and "loading" not in notice
        assert window.composer.edit.toPlainText() == "hello"
    finally:
        await _close(window)
