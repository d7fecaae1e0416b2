"""A pane set to an OpenAI-compatible server through its settings popover:
here Tandem's own server over loopback, on an engine of its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ui.conftest import on_loop, wait_until
from tests.ui.test_window import replies_done, send

KEY = "sk-ui-k3y"


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[Any]:
    from engine import Engine
    from engine.entrypoints.openai.server import serve_in_thread

    with Engine(tiny_model_dir, device="cpu", dtype="float32", threads=1) as engine:
        with serve_in_thread(engine, "tiny", api_key=KEY) as srv:
            yield srv


@on_loop()
async def test_a_pane_set_remote_through_the_popover(loop: Any, make_window: Any, server: Any) -> None:
    window = make_window(panes=2)
    local, remote = window.workspace.panes
    view = window.panes[remote.id]
    view.settings_button.click()
    popover = window.popover
    assert popover is not None and popover.local_choice.isChecked()
    assert not popover.remote_fields.isEnabled()

    popover.remote_choice.setChecked(True)
    popover.base_url.setText(server.base_url)
    popover.remote_model.setText("gpt-4o")
    popover.api_key.setText(KEY)
    popover.model_button.click()
    await wait_until(lambda: popover.model_button.isEnabled(), what="the server check")
    # A model the server does not serve: said inline, and the pane stays local.
    assert "does not serve the model 'gpt-4o'" in popover.model_status.text()
    assert remote.remote is None

    popover.remote_model.setText("tiny")
    popover.model_button.click()
    await wait_until(lambda: remote.remote is not None, what="the pane to go remote")
    await wait_until(lambda: popover.model_button.isEnabled(), what="the check to finish")
    host = server.base_url.split("/")[2]
    assert popover.model_status.text() == f"Connected: tiny @ {host}."
    assert f"tiny @ {host}" in view.summary_label.full_text()
    assert KEY not in view.summary_label.toolTip()
    popover.close()

    send(window, "Hello there")
    await wait_until(lambda: replies_done(window), what="both replies")
    remote_reply = remote.conversation.messages[-1]
    local_reply = local.conversation.messages[-1]
    assert remote_reply.state == "complete" and local_reply.state == "complete"
    # Greedy on the same model: the server's reply is the local one, and the
    # pane shows it like any other.
    assert remote_reply.text == local_reply.text
    window.panes[remote.id].flush()
    assert remote_reply.stats is not None and remote_reply.stats.ttft_s is not None

    # Back to local through the same popover.
    view.settings_button.click()
    popover = window.popover
    assert popover.remote_choice.isChecked() and popover.remote_model.text() == "tiny"
    popover.local_choice.setChecked(True)
    popover.model_button.click()
    assert remote.remote is None and f"tiny @ {host}" not in view.summary_label.full_text()
    popover.close()


@on_loop()
async def test_a_refused_check_says_why_and_keeps_the_popover_whole(loop: Any, make_window: Any, server: Any) -> None:
    window = make_window(panes=1)
    pane = window.workspace.panes[0]
    window.panes[pane.id].settings_button.click()
    popover = window.popover
    field_height = popover.temperature.height()
    popover.remote_choice.setChecked(True)
    popover.base_url.setText(server.base_url)
    popover.remote_model.setText("tiny")

    for key, words in ((None, "needs an API key"), ("wrong", "refused the API key given")):
        popover.api_key.setText(key or "")
        popover.model_button.click()
        await wait_until(lambda: popover.model_button.isEnabled(), what="the server check")
        message = popover.model_status.text()
        assert words in message, message
        # No curl placeholder, no doubled period.
        assert "YOUR_KEY" not in message and ".." not in message
        assert pane.remote is None
        # The fields keep their height; the message wraps across the popover and shows whole.
        assert popover.temperature.height() >= field_height
        status = popover.model_status
        assert status.width() >= popover.width() * 0.8
        assert status.height() >= status.heightForWidth(status.width())
        assert status.geometry().bottom() < popover.height()
    popover.close()
