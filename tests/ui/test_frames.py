"""What a frame of the window shows while replies stream: the text at every
frame, the stats line and context meter every few, and fewer frames while
several panes stream (the GUI thread shares the engine's cores and GIL)."""

from __future__ import annotations

from typing import Any

from tests.ui.conftest import on_loop, wait_until
from tests.ui.test_window import all_idle, send


@on_loop()
async def test_frames_show_text_always_and_details_every_few_frames(loop: Any, make_window: Any) -> None:
    from ui.panes.message_view import format_stats
    from ui.window.main_window import BUSY_FRAME_INTERVAL_MS, FRAME_INTERVAL_MS, LIVE_DETAILS_EVERY_FRAMES

    window = make_window(panes=2, max_tokens=1500, ignore_eos=True)
    # The test turns the frames itself: no frame timer in between.
    window.repaint_soon = lambda: None
    window._frame_timer.stop()
    ws = window.workspace
    send(window, "Write a very long story.")
    pane = ws.panes[0]
    view = window.panes[pane.id]

    def tokens() -> int:
        msgs = pane.conversation.messages
        return len(msgs[1].token_ids) if len(msgs) == 2 else 0

    await wait_until(lambda: tokens() >= 3, what="tokens")
    window.flush_panes()  # everything shown, the details included
    message = view.messages[1]
    stats_before = message.stats_label.text()
    meter_before = view.context_meter.value()
    assert "generated" in stats_before

    seen = tokens()
    await wait_until(lambda: tokens() > seen + 2 and view.dirty, what="more tokens")
    window._frames = 0  # the next frame is not one for the details
    window.render_frame()
    reply = pane.conversation.messages[1]
    assert message.body.markdown() == reply.text  # the text is current ...
    assert message.stats_label.text() == stats_before  # ... the stats line and meter as they were
    assert view.context_meter.value() == meter_before
    assert window.frame_interval_ms == BUSY_FRAME_INTERVAL_MS  # two panes stream

    seen = tokens()
    await wait_until(lambda: tokens() > seen + 2 and view.dirty, what="more tokens")
    window._frames = LIVE_DETAILS_EVERY_FRAMES - 1  # the next frame is one for the details
    window.render_frame()
    reply = pane.conversation.messages[1]
    assert message.body.markdown() == reply.text
    assert message.stats_label.text() == format_stats(view._live_stats[1], streaming=True) != stats_before
    assert view.context_meter.value() > meter_before

    ws.stop(ws.panes[1].id)
    await wait_until(lambda: ws.panes[1].conversation.messages[1].state == "stopped", what="one pane to stop")
    await wait_until(lambda: view.dirty, what="more tokens")
    window._frames = 0
    window.render_frame()
    assert window.frame_interval_ms == FRAME_INTERVAL_MS  # one pane streams

    window.composer.stop_button.click()
    await wait_until(lambda: all_idle(window), what="the replies to stop")
    # A finished reply is shown whole at once, whatever the frame.
    reply = pane.conversation.messages[1]
    assert message.state_label.text() == "stopped"
    assert message.stats_label.text() == format_stats(reply.stats)
    assert view.context_meter.value() == pane.conversation.context_used
    window._frame_timer.start()
    window.render_frame()  # nothing changed, nothing streams: the frames stop
    assert not window._frame_timer.isActive()


@on_loop()
async def test_the_window_loads_the_code_lexer_while_idle(loop: Any, make_window: Any) -> None:
    from ui.panes import code_highlight
    from ui.window.main_window import WARM_UP_CODE_AFTER_MS

    code_highlight.line_spans.cache_clear()
    make_window(panes=1)
    await wait_until(lambda: code_highlight.line_spans.cache_info().currsize > 0,
                     timeout=WARM_UP_CODE_AFTER_MS / 1000 + 30, what="the warm-up")
