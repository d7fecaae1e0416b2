"""Zoom (Ctrl+= / Ctrl+- / Ctrl+0, saved, every pane), and the window's texts
that must say what is true now: the context meter, the loading banner, the
status bar after a crash, the remote pane's Base URL hint; dark check boxes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from PySide6.QtGui import QColor, QImage, QPalette

from app.settings import Settings
from tests.ui.conftest import run
from tests.ui.layout_probe import build_window


@pytest.fixture
def window_of(loop: asyncio.AbstractEventLoop, qapp: Any) -> Iterator[Callable[..., Any]]:
    windows: list[Any] = []

    def make(panes: int = 2, width: int = 1280, height: int = 800) -> Any:
        window = build_window(width, height, panes)
        windows.append(window)
        qapp.processEvents()
        return window

    yield make
    for window in windows:
        closed = asyncio.Event()
        window.closed.connect(closed.set)
        window.close()
        run(loop, closed.wait(), timeout=30)


def _body_size(view: Any) -> float:
    return view._content.font().pointSizeF()


def test_zoom_keys_resize_every_panes_text_and_are_saved(window_of: Any, qapp: Any, tmp_path: Any) -> None:
    window = window_of(panes=2)
    shortcuts = {key: window.menu_actions[key].shortcut().toString() for key in ("zoom_in", "zoom_out", "zoom_reset")}
    assert shortcuts == {"zoom_in": "Ctrl+=", "zoom_out": "Ctrl+-", "zoom_reset": "Ctrl+0"}
    assert any("Zoom in" in action for action, _keys in window.shortcuts())
    views = list(window.panes.values())
    normal = _body_size(views[0])
    window.preferences._save = True  # this window writes its settings (to the test's own config folder)
    window.settings.save(tmp_path / "settings.json")
    window.settings.save()

    window.menu_actions["zoom_in"].trigger()
    assert window.settings.text_zoom == 110
    assert all(_body_size(v) == pytest.approx(normal * 1.1) for v in views)
    assert Settings.load().text_zoom == 110  # saved
    window.menu_actions["zoom_in"].trigger()
    assert window.settings.text_zoom == 125
    # A pane opened now starts at the zoom.
    window.add_pane()
    qapp.processEvents()
    newest = [v for v in window.panes.values() if v not in views]
    assert newest and _body_size(newest[0]) == pytest.approx(normal * 1.25)
    window.menu_actions["zoom_out"].trigger()
    assert window.settings.text_zoom == 110
    window.menu_actions["zoom_reset"].trigger()
    assert window.settings.text_zoom == 100 and _body_size(views[0]) == pytest.approx(normal)
    assert Settings.load().text_zoom == 100
    for _ in range(20):
        window.menu_actions["zoom_out"].trigger()
    assert window.settings.text_zoom == 50  # the smallest step, not below


def test_zoom_reaches_the_message_text_and_its_code(window_of: Any, qapp: Any) -> None:
    from app import events as ev

    window = window_of(panes=1)
    view = next(iter(window.panes.values()))
    conv = view.pane.conversation
    window.events(ev.MessageAppended(view.pane_id, conv.append_user("show code")))
    index = conv.begin_reply([1])
    conv.add_reply_delta("Text.\n\n```python\nx = 1\n```", [1])
    conv.end_reply("complete")
    window.events(ev.MessageAppended(view.pane_id, index))
    reply = view.messages[index]
    before_text = reply.body.block_widgets()[0].font().pointSizeF()
    before_code = reply.body.code_blocks()[0].code.font().pointSizeF()
    window.preferences.set_zoom(150)
    qapp.processEvents()
    assert reply.body.block_widgets()[0].font().pointSizeF() == pytest.approx(before_text * 1.5)
    assert reply.body.code_blocks()[0].code.font().pointSizeF() == pytest.approx(before_code * 1.5)
    assert reply.body.code_blocks()[0].code.font().fixedPitch() or "mono" in reply.body.code_blocks()[0].code.font().family().lower()


def test_text_zoom_setting_is_checked() -> None:
    settings, problems = Settings.from_dict({"text_zoom": 125})
    assert settings.text_zoom == 125 and problems == []
    settings, problems = Settings.from_dict({"text_zoom": 1000})
    assert settings.text_zoom == 100 and problems and "text_zoom" in problems[0]
    assert Settings().to_dict()["text_zoom"] == 100


def test_context_meter_without_a_known_size_is_not_a_full_bar(window_of: Any) -> None:
    window = window_of(panes=1)
    view = next(iter(window.panes.values()))
    conv = view.pane.conversation
    conv.context_limit = 0
    conv._kept_ids = list(range(77))
    view.refresh_context()
    assert view.context_meter.text().startswith("77 tokens") and "?" not in view.context_meter.text()
    assert view.context_meter.value() <= view.context_meter.minimum()


def test_a_remote_panes_meter_counts_what_the_server_reported(window_of: Any) -> None:
    from app.remote.remote_pane import RemoteBackend
    from app.workspace.messages import ReplyStats

    window = window_of(panes=1)
    view = next(iter(window.panes.values()))
    view.pane.remote = RemoteBackend("http://127.0.0.1:9/v1", "tiny")
    conv = view.pane.conversation
    conv.context_limit = 0
    view.refresh_context()
    assert view.context_meter.text().startswith("0 tokens")  # nothing asked yet: nothing used
    conv.append_user("hello")
    conv.begin_reply([])
    conv.end_reply("complete", text="hi", stats=ReplyStats(20, 10.0, 0.1, 415, 0, "stop", 2.0))
    view.refresh_context()
    assert view.context_meter.text().startswith("435 tokens"), view.context_meter.text()
    assert "0 / ?" not in view.context_meter.text()


def test_the_loading_banner_names_each_stage_once() -> None:
    from engine.progress import LoadProgress
    from ui.window.banner import loading_text

    assert loading_text("M", LoadProgress("import", 0, 9, "Importing model.gguf…")) == "Loading M: importing model.gguf…"
    assert loading_text("M", LoadProgress("warmup", 0, 2, "Warming up")) == "Loading M: warming up…"
    assert loading_text("M", LoadProgress("warmup", 0, 2, "")) == "Loading M: warming up…"
    assert loading_text("M", None) == "Loading M: starting the engine…"
    assert loading_text("M", LoadProgress("import", 9, 9, "Importing model.gguf…")) == (
        "Loading M: the one-time import is done; preparing the kernels and the weights…")


def test_the_status_bar_says_loading_only_while_a_model_loads(qtbot: Any) -> None:
    from ui.window.status_bar import WindowStatusBar

    bar = WindowStatusBar()
    qtbot.addWidget(bar)
    assert "Loading" not in bar.engine_label.text()  # nothing claimed before the window knows
    bar.show_model_state("loading")
    assert bar.engine_label.text() == "Loading model…"
    bar.show_model_state("unloaded")  # after a crash nothing loads by itself
    assert bar.engine_label.text() == "No model loaded"


def test_the_base_url_hint_reads_as_an_example_and_an_empty_url_is_explained(qtbot: Any) -> None:
    from engine.params import SamplingParams
    from ui.panes.pane_settings import PaneSettingsPopover

    asked: list[str] = []

    async def set_remote(url: str, model: str, key: str | None) -> Any:
        asked.append(url)
        raise AssertionError("not asked with an empty URL")

    popover = PaneSettingsPopover(SamplingParams(), "", 2048, None, set_remote=set_remote, set_local=lambda: None)
    qtbot.addWidget(popover)
    assert popover.base_url.placeholderText().startswith("e.g. ")
    popover.remote_choice.setChecked(True)
    popover.remote_model.setText("tiny")
    popover.apply_model()
    assert asked == []
    assert "base URL" in popover.model_status.text() and "''" not in popover.model_status.text()


def _pixels_differ(image: QImage, a: QColor, threshold: int = 60) -> int:
    count = 0
    for y in range(image.height()):
        for x in range(image.width()):
            c = image.pixelColor(x, y)
            if abs(c.red() - a.red()) + abs(c.green() - a.green()) + abs(c.blue() - a.blue()) > threshold:
                count += 1
    return count


def test_dark_check_boxes_and_radio_buttons_stand_out(qapp: Any, qtbot: Any) -> None:
    from PySide6.QtWidgets import QCheckBox, QRadioButton, QStyle, QStyleOptionButton

    from ui.theme import apply_theme

    try:
        apply_theme(qapp, "dark")
        for kind, element in ((QCheckBox, QStyle.PrimitiveElement.PE_IndicatorCheckBox),
                              (QRadioButton, QStyle.PrimitiveElement.PE_IndicatorRadioButton)):
            widget = kind("unchecked")
            qtbot.addWidget(widget)
            option = QStyleOptionButton()
            option.initFrom(widget)
            option.state |= QStyle.StateFlag.State_Off
            option.rect.setRect(0, 0, 16, 16)
            image = QImage(16, 16, QImage.Format.Format_RGB32)
            window = qapp.palette().color(QPalette.ColorRole.Window)
            image.fill(window)
            from PySide6.QtGui import QPainter

            painter = QPainter(image)
            qapp.style().drawPrimitive(element, option, painter, widget)
            painter.end()
            # An outline clearly apart from the window around it (Fusion's own is within a few shades).
            assert _pixels_differ(image, window) >= 20, kind.__name__
    finally:
        apply_theme(qapp, "light")


def test_the_send_error_names_the_model_as_shown_and_the_load_button(window_of: Any) -> None:
    from app.errors import EngineNotReadyError

    window = window_of(panes=1)
    window.report_error("Sending", EngineNotReadyError("unloaded", model="default"))
    text = window.composer.notice.text()
    assert window.models.name("default") in text and "model default" not in text
    assert "Load button" in text


def test_esc_clears_a_note_that_a_pane_was_busy(window_of: Any) -> None:
    window = window_of(panes=1)
    window.composer.show_notice("Pane 1 is still replying; the message was not sent.")
    assert window.composer.notice.isVisible()
    window.menu_actions["stop_all"].trigger()
    assert not window.composer.notice.isVisible()


def test_the_message_box_says_loading_only_while_a_model_loads(window_of: Any) -> None:
    window = window_of(panes=1)
    # A model on its way (the window's state before load_engine finishes) ...
    window.composer.set_ready(False, loading=True)
    assert "loading" in window.composer.edit.placeholderText()
    # ... and none at all (after a crash nothing loads until the user asks).
    window.crash_recovery = True
    window.apply_engine_state("unloaded", None, None)
    text = window.composer.edit.placeholderText()
    assert "loading" not in text and f"press {window.banner.retry.text()} above the panes" in text
