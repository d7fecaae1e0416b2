"""Issue 29's smaller window defects at 1024x700: the status bar's message, the
context meter of a model whose context size is unknown, the pane header from
three panes up, and the stats line under zoom."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.ui.conftest import run
from tests.ui.layout_probe import build_window

MODEL_NAME = "SmolLM2-135M-Instruct"


class _Entry:
    def __init__(self, model_id: str, name: str) -> None:
        self.id, self.name, self.path, self.kind_label = model_id, name, None, "Built in"

    def available(self) -> bool:
        return True


def settle(qapp: Any) -> None:
    for _ in range(5):
        qapp.processEvents()


@pytest.fixture
def window_of(loop: asyncio.AbstractEventLoop, qapp: Any) -> Iterator[Callable[..., Any]]:
    windows: list[Any] = []

    def make(panes: int, width: int = 1024, height: int = 700) -> Any:
        window = build_window(width, height, panes)
        windows.append(window)
        for view in window.panes.values():
            view.set_model_entries([_Entry(view.pane.conversation.model_id, MODEL_NAME)])
        settle(qapp)
        return window

    yield make
    for window in windows:
        closed = asyncio.Event()
        window.closed.connect(closed.set)
        window.close()
        run(loop, closed.wait(), timeout=30)


def _reply(window: Any, view: Any, stats: Any = None) -> Any:
    from app import events as ev

    conv = view.pane.conversation
    window.events(ev.MessageAppended(view.pane_id, conv.append_user("What is the capital of France?")))
    index = conv.begin_reply([1, 2, 3])
    conv.add_reply_delta("Paris is the capital of France. " * 3, [4])
    conv.end_reply("complete", stats=stats)
    window.events(ev.MessageAppended(view.pane_id, index))
    return view.messages[index]


@pytest.mark.parametrize("panes", [3, 4])
def test_from_three_panes_the_header_keeps_the_summary_and_cuts_the_name_with_an_ellipsis(
        window_of: Any, qapp: Any, panes: int) -> None:
    window = window_of(panes)
    for view in window.panes.values():
        summary = view.summary_label
        # Not dropped: on a line of its own, whole ("t=0.8 · top-p 0.95 · …" says which sampling runs).
        # (At four panes a pane is at its least width, and the summary's end may be cut, with "…".)
        assert summary.isVisible() and view.summary_below
        assert summary.width() > 0 and (not summary.is_elided() or panes > 3), summary.text()
        assert "top-p" in summary.text()
        # The summary's line stays inside the header, the buttons on the first line at the right end.
        assert summary.mapTo(view, summary.rect().bottomRight()).x() <= view.width()
        assert view.close_button.mapTo(view, view.close_button.rect().topRight()).x() <= view.width()
        picker = view.model_picker
        shown = picker.shown_text()
        # The name is whole, or cut with "…", never mid-letter.
        assert shown == MODEL_NAME or (shown.endswith("…") and MODEL_NAME.startswith(shown[:-1]))
    # Room again: the summary goes back beside the model's name.
    window.resize(1024 * panes, 700)
    settle(qapp)
    view = next(iter(window.panes.values()))
    assert not view.summary_below and view.model_picker.shown_text() == MODEL_NAME
    assert view.summary_label.y() == view.title_label.y() or abs(
        view.summary_label.geometry().center().y() - view.title_label.geometry().center().y()) <= 2


def test_the_model_name_ends_in_an_ellipsis_when_cut(window_of: Any, qapp: Any) -> None:
    window = window_of(1)
    picker = next(iter(window.panes.values())).model_picker
    picker.setFixedWidth(picker.minimumSizeHint().width())
    settle(qapp)
    shown = picker.shown_text()
    assert shown.endswith("…") and MODEL_NAME.startswith(shown[:-1]) and len(shown) >= 6


def test_a_flashed_message_ends_in_an_ellipsis_short_of_the_permanent_text(window_of: Any, qapp: Any) -> None:
    window = window_of(2)
    bar = window.status_bar
    bar.engine_label.setText("cpu · q4_1+q8_0 · KV pages 0 used / 6 cached / 1450 free · prefix hits 40%")
    message = ("Saved the chat to /home/user/Documents/a-long-folder-name/What is the capital.md; "
               "press Ctrl+Z to undo or Esc to stop it, then carry on")
    bar.showMessage(message, 10000)
    settle(qapp)
    shown = bar.shown_message()
    assert shown.endswith("…") and message.startswith(shown[:-1])
    gap = bar.engine_label.x() - bar.message_rect().right()
    assert gap >= bar.fontMetrics().averageCharWidth() * 2
    assert bar.fontMetrics().horizontalAdvance(shown) <= bar.message_rect().width()
    # A short message is shown whole.
    bar.showMessage("Saved.", 10000)
    assert bar.shown_message() == "Saved."
    # The bar still paints (its own drawing path) without trouble.
    assert not bar.grab().isNull()


def test_an_unknown_context_size_fits_the_narrowest_meter(window_of: Any, qapp: Any) -> None:
    window = window_of(4)
    for view in window.panes.values():
        _reply(window, view)
        view.pane.conversation.context_limit = 0  # a model that does not say its context size
        view.refresh_context()
    settle(qapp)
    for view in window.panes.values():
        meter = view.context_meter
        text = meter.text()
        assert text == f"{view.pane.conversation.context_used} tokens"
        assert meter.fontMetrics().horizontalAdvance(text) < meter.width()
        assert "context size is unknown" in meter.toolTip()


def test_the_stats_line_follows_the_zoom_and_stays_smaller_than_the_text(window_of: Any, qapp: Any) -> None:
    from app.workspace.messages import ReplyStats

    window = window_of(1)
    view = next(iter(window.panes.values()))
    reply = _reply(window, view, ReplyStats(40, 41.2, 0.05, 812, 800, "stop", 1.0))
    settle(qapp)
    assert reply.stats_label.isVisible()

    def sizes() -> tuple[float, float]:
        return reply.stats_label.font().pointSizeF(), reply.body.block_widgets()[0].font().pointSizeF()

    stats_at_100, text_at_100 = sizes()
    assert stats_at_100 < text_at_100
    for percent in (50, 150):
        window.preferences.set_zoom(percent)
        settle(qapp)
        stats, text = sizes()
        assert stats < text, percent
        assert stats == pytest.approx(stats_at_100 * percent / 100, rel=0.1), percent
