"""Models → Serve…: the server panel over the real window, a real tiny model
and a real server on loopback, called by the official `openai` client with
the model's name as the window shows it."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.ui.conftest import on_loop, wait_until


@pytest.fixture(autouse=True)
def _secrets_in_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TANDEM_SECRETS", "file")  # never the developer's keyring


def _settings(engine_dir: Path) -> Any:
    from app.settings import Settings
    from engine.params import SamplingParams

    settings = Settings(model=str(engine_dir), device="cpu", dtype="float32", threads=1, kv_cache_mb=16)
    settings.default_params = SamplingParams(temperature=0.0, max_tokens=8)
    return settings


def _window(settings: Any, *, save: bool = False) -> Any:
    from app.workspace.workspace import Workspace
    from ui.window.main_window import MainWindow

    workspace = Workspace(settings)
    workspace.add_pane()
    window = MainWindow(workspace, settings, version="test", save_settings=save)
    window.resize(1200, 800)
    window.show()
    return window


async def _close(window: Any) -> None:
    closed = asyncio.Event()
    window.closed.connect(closed.set)
    window.close()
    await asyncio.wait_for(closed.wait(), 30)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def _ask(url: str, key: str | None, model: str) -> Any:
    def call() -> Any:
        with openai.OpenAI(base_url=url, api_key=key or "none", max_retries=0, timeout=60) as client:
            return client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "Hello"}], temperature=0, max_tokens=4)

    return await asyncio.to_thread(call)


@on_loop()
async def test_the_panel_serves_with_a_port_and_a_key_and_logs_each_request(
    loop: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from app.secrets import SERVER_API_KEY, default_secrets

    window = _window(_settings(tiny_model_dir))
    try:
        await wait_until(lambda: window.server_control.indicator is not None, what="the indicator")
        window.load_engine()
        await wait_until(lambda: window.workspace.engine_state == "ready", what="the model")
        control = window.server_control
        control.open_panel()
        panel = control.panel
        assert panel is not None and panel.isVisible() and not panel.isModal()
        assert panel.start_button.text() == "&Start" and not control.indicator.isVisible()

        # The port, and a key made on request: kept in the secrets, shown, copyable.
        port = _free_port()
        panel.port_box.setValue(port)
        panel.generate_key_button.click()
        key = default_secrets().get(SERVER_API_KEY)
        assert key and key.startswith("tandem-") and panel.key_edit.text() == key
        assert key not in json.dumps(window.settings.ui_state)
        panel.copy_key_button.click()
        from PySide6.QtGui import QGuiApplication

        assert QGuiApplication.clipboard().text() == key

        panel.start_button.click()
        assert control.serving and control.server.port == port
        url = f"http://127.0.0.1:{port}/v1"
        assert panel.url_edit.text() == url and panel.start_button.text() == "&Stop"
        assert not panel.port_box.isEnabled()  # changed only while stopped
        assert control.indicator.isVisible() and f":{port}" in control.indicator.text()
        assert window.serve_action.isChecked()

        # The name the window shows reaches the model; its slug is what is listed.
        shown = window.models.name(window.workspace.default_model)
        reply = await _ask(url, key, shown)
        assert reply.choices[0].message.content
        with pytest.raises(openai.AuthenticationError):
            await _ask(url, "wrong", shown)
        await wait_until(lambda: len(panel.log_lines()) == 2, what="two log lines", timeout=10)
        answered, refused = panel.log_lines()
        assert answered[1] == shown and answered[3] == "200"
        assert answered[2] == f"{reply.usage.prompt_tokens} → {reply.usage.completion_tokens}"
        assert "POST /v1/chat/completions" in answered[4]
        assert refused[3] == "401"
        assert panel.models_label.text().startswith(control.model_ids()[0])
        assert control.model_ids() == [shown.lower()]

        # Stop from the panel: the indicator goes, the menu's checkmark follows.
        panel.start_button.click()
        await wait_until(lambda: not control.serving, what="the server to stop")
        assert not control.indicator.isVisible() and not window.serve_action.isChecked()
        assert window.settings.ui_state["server"] == {"on": False, "port": port, "mode": "loopback"}
        panel.close()
    finally:
        await _close(window)


@on_loop()
async def test_the_local_network_needs_a_key(loop: Any, tiny_model_dir: Path) -> None:
    window = _window(_settings(tiny_model_dir))
    try:
        control = window.server_control
        window.menu_actions["server_panel"].trigger()  # Models → Serve…
        panel = control.panel
        assert panel is not None and panel.isVisible()
        control.open_panel()  # again: the same panel, raised
        assert control.panel is panel
        panel.network_radio.setChecked(True)
        assert control.choices.mode == "network"
        panel.port_box.setValue(0)
        panel.start_button.click()
        assert not control.serving
        assert panel.error_label.isVisible() and "API key" in panel.error_label.text()
        panel.close()
    finally:
        await _close(window)


@on_loop()
async def test_serving_is_restored_after_a_restart(loop: Any, tiny_model_dir: Path) -> None:
    from app.settings import Settings

    port = _free_port()
    settings = _settings(tiny_model_dir)
    settings.save()
    window = _window(settings, save=True)
    try:
        window.serve_port = port
        window.serve_action.setChecked(True)
        assert window.server_control.serving
    finally:
        await _close(window)  # closing stops the server but remembers it was on
    assert Settings.load().ui_state["server"] == {"on": True, "port": port, "mode": "loopback"}

    again = _window(Settings.load(), save=True)
    try:
        control = again.server_control
        await wait_until(lambda: control.serving, what="the server to start again", timeout=10)
        assert control.server.port == port and again.serve_action.isChecked()
        assert control.indicator.isVisible()
        again.serve_action.setChecked(False)  # off is remembered too
        await wait_until(lambda: not control.serving, what="the server to stop")
    finally:
        await _close(again)
    assert Settings.load().ui_state["server"]["on"] is False
