"""A reasoning model's reply in a pane: its think block in a collapsed, muted
"Thinking" section above the answer, opened by mouse or keyboard; the answer
alone is what the reply's Copy takes. And while replies stream, nothing in a
pane overlaps (issue 29)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtGui import QGuiApplication

from tests.ui.conftest import on_loop, run, wait_until
from tests.ui.layout_probe import build_window

REASONING = ("The user asks for the capital of Australia. Many guess Sydney, the largest city, but the capital "
             "is Canberra, chosen in 1908 as a compromise.\n\nI should answer briefly.")
ANSWER = ("The capital of Australia is **Canberra**. It is often mistaken for Sydney, its largest city, "
          "and for Melbourne, which was the seat of government until 1927.\n\n") * 3
# Long enough that the pane's scroll bar appears mid-reply and every paragraph wraps again.
PARAGRAPHS = ("The first paragraph says something reasonably long so that it wraps over a few lines "
              "in a narrow pane. " * 3 + "\n\n") * 6
THINKING_REPLY = REASONING + "\n</think>\n\n" + ANSWER  # as the R1 distills write it: the prompt opened the block


@pytest.fixture
def window(loop: asyncio.AbstractEventLoop, qapp: Any) -> Iterator[Any]:
    shown = build_window(1024, 700, 2)
    settle(qapp)
    yield shown
    closed = asyncio.Event()
    shown.closed.connect(closed.set)
    shown.close()
    run(loop, closed.wait(), timeout=30)


def settle(qapp: Any) -> None:
    for _ in range(5):
        qapp.processEvents()


def stream(window: Any, texts: list[str], after_flush: Callable[[], None], chunk: int = 7) -> None:
    """Pane i: a question, then texts[i] in `chunk`-character deltas, a frame after each round."""
    from app import events as ev
    from app.workspace.messages import ReplyStats

    views = list(window.panes.values())
    for view, text in zip(views, texts):
        conversation = view.pane.conversation
        window.events(ev.MessageAppended(view.pane_id, conversation.append_user("What is the capital of Australia?")))
        index = conversation.begin_reply([1, 2, 3], opens_reasoning=text is THINKING_REPLY)
        window.events(ev.MessageAppended(view.pane_id, index))
    for start in range(0, max(map(len, texts)), chunk):
        for view, text in zip(views, texts):
            piece = text[start:start + chunk]
            if piece:
                stats = ReplyStats(start // 4 + 1, 40.0, 0.05, 812, 800, None, 0.05 + start / 400)
                view.pane.conversation.add_reply_delta(piece, [1], stats)
                window.events(ev.ReplyDelta(view.pane_id, 1, piece, stats))
        window.render_frame()
        after_flush()
        QGuiApplication.processEvents()
    for view, text in zip(views, texts):
        view.pane.conversation.end_reply("complete", stats=ReplyStats(len(text) // 4, 40.0, 0.05, 812, 800, "stop",
                                                                       0.05 + len(text) / 400))
        window.events(ev.ReplyFinished(view.pane_id, 1))


def overlaps(window: Any, *, covered: bool) -> list[str]:
    """Every pair of neighbours in a pane that overlap (messages; a message's
    parts; a Markdown view's blocks); with `covered`, every text shorter than its document."""
    found: list[str] = []

    def check(name: str, widgets: list[Any]) -> None:
        shown = [w for w in widgets if w.isVisibleTo(w.parentWidget())]
        for a, b in zip(shown, shown[1:]):
            if a.geometry().bottom() >= b.geometry().top():
                found.append(f"{name}: {a.objectName() or type(a).__name__} {a.geometry()} over {b.geometry()}")

    for pane_id, view in window.panes.items():
        check(f"pane {pane_id}", [view.messages[i] for i in sorted(view.messages)])
        for index, message in view.messages.items():
            where = f"pane {pane_id} message {index}"
            check(where, [message.thinking, message.body, message.stats_label])
            for body in (message.body, message.thinking.body):
                blocks = body.block_widgets()
                check(where, blocks)
                if covered and body.isVisibleTo(message):
                    if blocks and blocks[-1].geometry().bottom() >= body.height():
                        found.append(f"{where}: the blocks run past their view")
                    for block in blocks:
                        if block.height() < math.ceil(block.document().size().height()):
                            found.append(f"{where}: a block shorter than its text")
    return found


class _AtEveryPaint(QObject):
    def __init__(self, window: Any) -> None:
        super().__init__()
        self.window = window
        self.found: list[str] = []

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802
        if event.type() == QEvent.Type.Paint:
            self.found += overlaps(self.window, covered=False)
        return False


def test_nothing_in_a_pane_overlaps_while_replies_stream(window: Any, qapp: Any) -> None:
    window._frame_timer.stop()
    window.repaint_soon = lambda: None  # the test turns the frames
    painted = _AtEveryPaint(window)
    for view in window.panes.values():
        view.scroll.widget().installEventFilter(painted)
    after_frames: list[str] = []
    stream(window, [THINKING_REPLY, PARAGRAPHS], lambda: after_frames.extend(overlaps(window, covered=True)))
    settle(qapp)
    assert after_frames == []  # each frame is laid out before anything is painted
    assert painted.found == []
    assert overlaps(window, covered=True) == []
    reply = window.panes[window.workspace.panes[0].id].messages[1]
    assert reply.body.markdown() == ANSWER and reply.thinking.reasoning() == REASONING


def test_the_thinking_section_is_collapsed_and_opens_by_mouse_and_keyboard(window: Any, qapp: Any, qtbot: Any) -> None:
    titles: list[str] = []
    first = window.panes[window.workspace.panes[0].id]

    def title_shown() -> None:
        shown = first.messages[1].thinking
        if shown.isVisible():
            titles.append(shown.toggle_button.text())

    stream(window, [THINKING_REPLY, ANSWER], title_shown)
    window.flush_panes()
    settle(qapp)
    reply, plain = first.messages[1], window.panes[window.workspace.panes[1].id].messages[1]
    # Live while it thinks, then how long it took; the plain reply has no section.
    assert titles[0].startswith("Thinking…") and "tokens" in titles[-1]
    section = reply.thinking
    assert section.toggle_button.text().startswith("Thought for ") and section.toggle_button.text().endswith(" tokens")
    assert section.isVisible() and not plain.thinking.isVisible()
    # Collapsed: one line above the answer; the reasoning is not on screen.
    assert not section.expanded and not section.body.isVisible()
    assert section.geometry().bottom() < reply.body.geometry().top()
    qtbot.mouseClick(section.toggle_button, Qt.MouseButton.LeftButton)
    assert overlaps(window, covered=True) == []  # laid out before the first paint
    settle(qapp)
    assert section.expanded and section.body.isVisible() and section.body.markdown() == REASONING
    assert section.geometry().bottom() < reply.body.geometry().top()  # the answer moved down below it
    # Muted: not the answer's colour.
    text_color = section.body.block_widgets()[0].palette().color(section.body.block_widgets()[0].foregroundRole())
    assert text_color != reply.body.block_widgets()[0].palette().color(reply.body.block_widgets()[0].foregroundRole())
    section.toggle_button.setFocus()
    qtbot.keyClick(section.toggle_button, Qt.Key.Key_Space)
    assert not section.expanded and not section.body.isVisible()
    qtbot.keyClick(section.toggle_button, Qt.Key.Key_Return)
    assert section.expanded
    # Copy takes the answer; the section's own Copy the reasoning.
    reply.copy_button.click()
    assert QGuiApplication.clipboard().text() == ANSWER
    section.copy_button.click()
    assert QGuiApplication.clipboard().text() == REASONING


def test_compare_weighs_the_answers_alone(window: Any, qapp: Any) -> None:
    stream(window, [THINKING_REPLY, ANSWER], lambda: None)
    window.flush_panes()
    window.menu_actions["compare"].trigger()  # Ctrl+D
    assert window.compare_bar.summary.text() == "The replies are identical word for word."
    reply = window.panes[window.workspace.panes[0].id].messages[1]
    assert reply.thinking.isVisible() and "Canberra" in reply.body.highlighted_html()
    window.menu_actions["compare"].trigger()


def test_a_reply_that_never_stops_thinking_says_so(window: Any, qapp: Any) -> None:
    from app import events as ev

    view = window.panes[window.workspace.panes[0].id]
    conversation = view.pane.conversation
    window.events(ev.MessageAppended(view.pane_id, conversation.append_user("Think hard")))
    window.events(ev.MessageAppended(view.pane_id, conversation.begin_reply([1], opens_reasoning=False)))
    conversation.add_reply_delta("<think>\nHmm, let me see", [1])
    conversation.end_reply("stopped")
    window.events(ev.ReplyFinished(view.pane_id, 1))
    reply = view.messages[1]
    assert reply.thinking.toggle_button.text().startswith("Thinking, unfinished")
    assert reply.thinking.reasoning() == "Hmm, let me see" and not reply.body.isVisibleTo(reply)


@on_loop()
async def test_think_before_answering_is_offered_where_the_template_has_the_switch(
    loop: Any, make_window: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    window = make_window(panes=2)
    workspace = window.workspace
    first, second = workspace.panes
    await wait_until(lambda: workspace.engine_for(first.conversation.model_id) is not None, what="the model")
    assert not workspace.has_thinking_switch(first.id)
    window.panes[first.id].settings_button.click()
    assert window.popover is not None and window.popover.think_before_answering is None  # no switch: no box
    window.popover.close()
    tokenizer = workspace.engine_for(first.conversation.model_id).tokenizer
    switch = "{% if enable_thinking is false %}<think></think>{% endif %}"
    monkeypatch.setattr(tokenizer, "chat_template_source", switch)
    window.panes[first.id].settings_button.click()
    box = window.popover.think_before_answering
    assert box is not None and box.isChecked()  # on by default
    box.setChecked(False)
    window.popover.apply()
    assert first.conversation.thinking is False and second.conversation.thinking is True
