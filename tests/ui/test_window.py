"""The window driven through its widgets, on the real engine (tiny random model:
what the text says does not matter here, only where it goes)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QMessageBox

from tests.ui.conftest import on_loop, wait_until

# Top-k, top-p and min-p off: a hot draw from the random model needs its whole range to differ by seed.
WIDE = dict(top_k=0, top_p=1.0, min_p=0.0)


def send(window: Any, text: str) -> None:
    """Type into the message box and press Ctrl+Enter, as a user would."""
    from pytestqt.qtbot import QtBot

    window.composer.edit.setPlainText(text)
    window.composer.edit.setFocus()
    QtBot.keyClick(window.composer.edit, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)


def all_idle(window: Any) -> bool:
    return not any(view.pane.busy for view in window.panes.values())


def replies_done(window: Any, count: int = 1) -> bool:
    """Every pane holds `count` finished replies."""
    for view in window.panes.values():
        msgs = view.pane.conversation.messages
        if sum(1 for m in msgs if m.role == "assistant") < count or view.pane.busy:
            return False
    return True


@on_loop()
async def test_broadcast_streams_into_the_right_panes(loop: Any, make_window: Any) -> None:
    from engine.params import SamplingParams

    window = make_window(panes=3)
    ws = window.workspace
    # Three seeds, hot: three different replies (even from a random model), so
    # a reply in the wrong pane shows.
    for seed, pane in zip((1, 2, 3), ws.panes):
        ws.set_params(pane.id, SamplingParams(temperature=5.0, max_tokens=12, ignore_eos=True, seed=seed, **WIDE))
    assert all(f"seed {s}" in window.panes[p.id].summary_label.full_text() for s, p in zip((1, 2, 3), ws.panes))

    send(window, "Name three colours.")
    await wait_until(lambda: replies_done(window), what="three replies")
    window.flush_panes()

    texts = []
    for pane in ws.panes:
        view = window.panes[pane.id]
        user, reply = pane.conversation.messages
        assert user.text == "Name three colours."
        assert reply.state == "complete" and len(reply.token_ids) == 12
        # The pane's view shows exactly its own reply ...
        assert view.messages[1].body.markdown() == reply.text
        assert "prompt" in view.messages[1].stats_label.text()
        # ... which is what the engine gives for that prompt and seed without streaming.
        prompt = pane.conversation.kept_ids[: -len(reply.token_ids)]
        expected = ws.engine.generate_outputs([prompt], params=pane.conversation.params)[0]
        assert reply.token_ids == expected.token_ids
        texts.append(reply.text)
    assert len(set(texts)) == 3
    assert window.composer.edit.toPlainText() == ""  # sent, so cleared


@on_loop()
async def test_stop_mid_stream_keeps_the_partial_reply(loop: Any, make_window: Any) -> None:
    window = make_window(panes=2, max_tokens=1500, ignore_eos=True)
    ws = window.workspace
    send(window, "Write a very long story.")
    first = window.panes[ws.panes[0].id]
    await wait_until(lambda: len(first.pane.conversation.messages) == 2
                         and len(first.pane.conversation.messages[1].token_ids) >= 5, what="tokens")
    assert window.composer.stop_button.isEnabled()
    window.composer.stop_button.click()
    await wait_until(lambda: all_idle(window), what="replies to stop")
    window.flush_panes()
    for view in window.panes.values():
        reply = view.pane.conversation.messages[1]
        assert reply.state == "stopped"
        assert 0 < len(reply.token_ids) < 1500
        assert view.messages[1].body.markdown() == reply.text
        assert view.messages[1].state_label.text() == "stopped"
    await wait_until(lambda: ws.stats().pages_used == 0, what="pages to be freed")
    assert not window.composer.stop_button.isEnabled()


@on_loop()
async def test_pane_stop_button_stops_only_that_pane(loop: Any, make_window: Any) -> None:
    window = make_window(panes=2, max_tokens=48, ignore_eos=True)
    ws = window.workspace
    ws.set_params(ws.panes[0].id, ws.panes[0].conversation.params.__class__(max_tokens=1500, ignore_eos=True, temperature=0.0))
    send(window, "Go.")
    left, right = (window.panes[p.id] for p in ws.panes)
    await wait_until(lambda: len(left.pane.conversation.messages) == 2
                         and len(left.pane.conversation.messages[1].token_ids) >= 3, what="tokens")
    left.stop_button.click()
    await wait_until(lambda: all_idle(window), what="replies to end")
    assert left.pane.conversation.messages[1].state == "stopped"
    assert right.pane.conversation.messages[1].state == "complete"
    assert len(right.pane.conversation.messages[1].token_ids) == 48


@on_loop()
async def test_a_busy_pane_refuses_visibly_and_a_broadcast_skips_it(loop: Any, make_window: Any) -> None:
    window = make_window(panes=2, max_tokens=1500, ignore_eos=True)
    ws = window.workspace
    first, second = ws.panes
    window.composer.set_targets([first.id])
    send(window, "Keep going.")
    await wait_until(lambda: first.busy, what="pane 1 to start")
    send(window, "Second message")
    await wait_until(lambda: window.composer.notice.isVisible(), what="the refusal")
    assert "still replying" in window.composer.notice.text()
    assert first.title in window.composer.notice.text()
    assert window.composer.edit.toPlainText() == "Second message"  # kept for resending
    # Sent to every pane, the message goes to the idle one, and the window says which was skipped.
    window.composer.notice.hide()
    window.composer.set_targets([first.id, second.id])
    send(window, "Second message")
    await wait_until(lambda: window.composer.notice.isVisible(), what="the skipped note")
    assert window.composer.notice.text() == (
        f"Sent to {second.title}; {first.title} was skipped because it is still replying.")
    assert window.composer.edit.toPlainText() == ""
    assert [m.text for m in second.conversation.messages if m.role == "user"] == ["Second message"]
    assert [m.text for m in first.conversation.messages if m.role == "user"] == ["Keep going."]
    window.stop_action.trigger()  # Esc
    await wait_until(lambda: all_idle(window), what="the stop")


@on_loop()
async def test_regenerate_edit_and_fork_through_the_widgets(loop: Any, make_window: Any) -> None:
    window = make_window(panes=1, temperature=1.0, max_tokens=10, ignore_eos=True)
    ws = window.workspace
    pane = ws.panes[0]
    view = window.panes[pane.id]
    send(window, "Tell me a fact about the sea that most people have never heard of.")
    await wait_until(lambda: replies_done(window), what="the reply")

    # Regenerate: the last reply is replaced, the conversation keeps two messages.
    finished: list[int] = []
    window.workspace.subscribe(lambda e: finished.append(e.index) if type(e).__name__ == "ReplyFinished" else None)
    regenerate = view.messages[1].regenerate_button
    assert regenerate.isVisible()
    regenerate.click()
    await wait_until(lambda: finished and not pane.busy, what="the new reply")
    assert len(pane.conversation.messages) == 2 and finished == [1]
    assert pane.conversation.messages[1].state == "complete"

    # Edit and resend: a dialog says later messages are replaced; accepting replaces them.
    view.messages[0].edit_button.click()
    dialog = window.edit_dialog
    assert dialog is not None and dialog.isVisible()
    assert "1 later message" in dialog.warning_label.text()
    dialog.editor.setPlainText("Tell me a fact about mountains that most people have never heard of.")
    dialog.resend_button.click()
    await wait_until(lambda: len(finished) == 2 and not pane.busy, what="the edited turn's reply")
    msgs = pane.conversation.messages
    assert [m.role for m in msgs] == ["user", "assistant"]
    assert msgs[0].text.startswith("Tell me a fact about mountains")
    window.flush_panes()
    assert view.messages[0].body.markdown() == msgs[0].text
    assert set(view.messages) == {0, 1}

    # Fork from the reply: a new pane right of the source holding both messages,
    # whose next turn starts from the source's cached pages.
    view.messages[1].fork_button.click()
    assert len(ws.panes) == 2
    fork = ws.panes[1]
    fork_view = window.panes[fork.id]
    assert window.pane_order() == [pane.id, fork.id]
    assert [m.text for m in fork.conversation.messages] == [m.text for m in msgs]
    assert set(fork_view.messages) == {0, 1}
    assert window.current_pane_id == fork.id
    window.composer.set_targets([fork.id])
    send(window, "And another one?")
    await wait_until(lambda: len(fork.conversation.messages) == 4 and not fork.busy, what="the fork's reply")
    stats = fork.conversation.messages[3].stats
    shared = len(fork.conversation.kept_ids_for(2))
    page = ws.stats().page_size
    assert stats.cached_prompt_tokens >= (shared // page) * page > 0
    window.flush_panes()
    assert f"{stats.cached_prompt_tokens} from cache" in fork_view.messages[3].stats_label.text()
    assert len(pane.conversation.messages) == 2  # the source pane did not receive it


@on_loop()
async def test_panes_add_close_and_reorder_by_keyboard(loop: Any, make_window: Any, qtbot: Any) -> None:
    window = make_window(panes=2)
    ws = window.workspace
    before = [p.id for p in ws.panes]
    window.set_current_pane(before[0])
    window.new_pane_action.trigger()  # Ctrl+T
    assert len(ws.panes) == 3 and len(window.panes) == 3
    third = ws.panes[1].id  # right of the current pane
    assert third not in before
    assert window.pane_order() == [before[0], third, before[1]]
    assert window.current_pane_id == third
    assert third in window.composer.targets()  # a new pane receives the next message

    # Move the current pane left twice: it is first, in the workspace and on screen.
    move_left = next(a for a in window.actions() if a.text() == "Move pane &left")
    move_left.trigger()
    move_left.trigger()  # already first: stays
    assert [p.id for p in ws.panes][0] == third
    assert window.pane_order() == [p.id for p in ws.panes]

    # An empty pane closes at once; one holding a conversation asks first.
    window.close_pane_action.trigger()  # Ctrl+W on the current (empty) pane
    assert third not in window.panes and len(ws.panes) == 2
    target = ws.panes[0]
    target.conversation.append_user("something worth keeping")
    window.close_pane(target.id)
    box = window.confirm_box
    assert box is not None and box.isVisible()
    box.button(QMessageBox.StandardButton.Cancel).click()
    assert target.id in window.panes
    window.close_pane(target.id)
    window.confirm_box.button(QMessageBox.StandardButton.Close).click()
    assert target.id not in window.panes and len(ws.panes) == 1
    # The last pane stays, with a reason.
    window.close_pane(ws.panes[0].id)
    assert len(ws.panes) == 1
    assert "at least one pane" in window.composer.notice.text()


@on_loop()
async def test_settings_popover_changes_the_pane(loop: Any, make_window: Any) -> None:
    window = make_window(panes=2)
    ws = window.workspace
    pane = ws.panes[1]
    view = window.panes[pane.id]
    # The header says whose settings a new pane runs with (make_window sets defaults as Preferences would).
    assert "Sampling: your defaults from Preferences" in view.summary_label.toolTip()
    view.settings_button.click()
    popover = window.popover
    assert popover is not None and popover.isVisible()
    popover.temperature.setValue(1.3)
    popover.top_k.setValue(40)
    popover.fixed_seed.setChecked(True)
    popover.seed.setValue(11)
    popover.system_prompt.setPlainText("You answer like a pirate.")
    popover.apply_button.click()
    params = pane.conversation.params
    assert (params.temperature, params.top_k, params.seed) == (1.3, 40, 11)
    assert pane.conversation.system_prompt == "You answer like a pirate."
    header = view.summary_label.full_text()
    assert "t=1.3" in header and "top-k 40" in header and "seed 11" in header
    assert "Sampling:" not in view.summary_label.toolTip()  # now the user's own
    assert ws.panes[0].conversation.params.temperature == 0.0  # the other pane is untouched


@on_loop()
async def test_compare_highlights_word_differences(loop: Any, make_window: Any) -> None:
    from engine.params import SamplingParams

    window = make_window(panes=2)
    ws = window.workspace
    for seed, pane in zip((5, 6), ws.panes):
        ws.set_params(pane.id, SamplingParams(temperature=5.0, max_tokens=12, ignore_eos=True, seed=seed, **WIDE))
    send(window, "Describe the weather.")
    await wait_until(lambda: replies_done(window), what="replies")
    window.compare_action.trigger()  # Ctrl+D
    assert window.compare_bar.isVisible()
    a, b = (window.panes[p.id].messages[1].body for p in ws.panes)
    assert "background-color" in a.highlighted_html() and "background-color" in b.highlighted_html()
    assert "differ" in window.compare_bar.summary.text()
    window.compare_action.trigger()
    assert not window.compare_bar.isVisible()
    assert a.highlighted_html() == "" and a.markdown() == ws.panes[0].conversation.messages[1].text


@on_loop()
async def test_gui_thread_keeps_ticking_during_a_three_pane_stream(loop: Any, make_window: Any) -> None:
    window = make_window(panes=3, max_tokens=200, ignore_eos=True)
    ticks_while_streaming = 0

    def tick() -> None:
        nonlocal ticks_while_streaming
        if not all_idle(window):
            ticks_while_streaming += 1

    timer = QTimer()
    timer.setInterval(10)
    timer.timeout.connect(tick)
    timer.start()
    send(window, "Count to a thousand.")
    await wait_until(lambda: replies_done(window), timeout=300, what="three replies")
    timer.stop()
    for view in window.panes.values():
        assert len(view.pane.conversation.messages[1].token_ids) == 200
    # The timer fired again and again while the engine streamed 600 tokens:
    # the GUI thread never waited on the engine.
    assert ticks_while_streaming >= 10


@on_loop()
async def test_closing_the_window_mid_stream_exits_cleanly(loop: Any, make_window: Any, caplog: Any) -> None:
    window = make_window(panes=3, max_tokens=2000, ignore_eos=True)
    ws = window.workspace
    send(window, "Write forever.")
    await wait_until(lambda: all(len(p.conversation.messages) == 2 and p.conversation.messages[1].token_ids
                                     for p in ws.panes), what="streams")
    closed = asyncio.Event()
    window.closed.connect(closed.set)
    with caplog.at_level(logging.WARNING):
        window.close()
        assert not window.isVisible()  # gone at once, finishing in the background
        await asyncio.wait_for(closed.wait(), 10)
    assert window.shut_down
    assert ws.engine_state == "closed"
    for pane in ws.panes:
        assert pane.conversation.messages[1].state == "stopped"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@on_loop()
async def test_help_lists_the_shortcuts_and_about_names_the_model(loop: Any, make_window: Any) -> None:
    window = make_window(panes=1)
    rows = dict(window.shortcuts())
    for action in ("New pane", "Close pane", "Send", "Stop all replies", "Compare replies",
                   "Move pane left", "Regenerate last reply", "Fork pane at last message"):
        assert rows.get(action), action
    window.show_shortcuts()
    window.show_about()
    from PySide6.QtWidgets import QApplication

    boxes = [w for w in QApplication.topLevelWidgets() if isinstance(w, QMessageBox) and w.isVisible()]
    assert boxes and "cpu" in boxes[-1].text() and "test" in boxes[-1].text()
    for w in boxes:
        w.close()


@on_loop()
async def test_view_follows_the_stream_unless_scrolled_up(loop: Any, make_window: Any) -> None:
    # Hot sampling: the random model then writes words (greedy, it writes newlines).
    window = make_window(panes=1, max_tokens=1500, ignore_eos=True, temperature=5.0, seed=1)
    window.resize(1280, 400)
    view = next(iter(window.panes.values()))
    bar = view.scroll.verticalScrollBar()
    send(window, "Write a long poem.")
    await wait_until(lambda: bar.maximum() > 10 * view.fontMetrics().height(), what="the reply to outgrow the pane")
    await wait_until(lambda: bar.value() == bar.maximum(), what="the view to follow")
    bar.setValue(0)  # the user scrolls up to reread
    assert not view.following
    grown = bar.maximum()
    await wait_until(lambda: bar.maximum() > grown, what="more text")
    assert bar.value() == 0  # left where the user put it
    bar.setValue(bar.maximum())  # back to the bottom: following again
    assert view.following
    grown = bar.maximum()
    await wait_until(lambda: bar.maximum() > grown, what="more text")
    assert bar.value() == bar.maximum()
    window.stop_all()
    await wait_until(lambda: all_idle(window), what="the stop")


@on_loop()
async def test_window_shows_loading_then_becomes_usable(loop: Any, tiny_model_dir: Any) -> None:
    from app.settings import Settings
    from app.workspace.workspace import Workspace
    from ui.window.main_window import MainWindow

    settings = Settings(model=str(tiny_model_dir), device="cpu", threads=1)
    workspace = Workspace(settings)
    workspace.add_pane()
    window = MainWindow(workspace, settings, version="test", save_settings=False)
    window.show()
    try:
        # Before the model is there: the loading state is visible and nothing can be sent.
        assert window.banner.isVisible()
        assert window.banner.label.text().startswith("Loading tiny-model")
        # Typing is allowed (nothing is lost), sending is not.
        assert not window.composer.edit.isReadOnly() and not window.composer.send_button.isEnabled()
        window.load_engine()
        send(window, "too early")
        assert "loading" in window.composer.notice.text()
        await wait_until(lambda: workspace.engine_state == "ready", what="the model to load")
        assert not window.banner.isVisible()
        assert not window.composer.edit.isReadOnly() and window.composer.send_button.isEnabled()
        assert "cpu" in window.status_label.text() and "KV pages" in window.status_label.text()

        # A model that cannot load says why, with a way to try again.
        window.engine_settings.model = str(tiny_model_dir / "missing")
        window.load_engine()
        await wait_until(lambda: workspace.engine_state == "error", what="the load to fail")
        assert window.banner.isVisible() and window.banner.retry.isVisible()
        assert "missing" in window.banner.label.text()
    finally:
        closed = asyncio.Event()
        window.closed.connect(closed.set)
        window.close()
        await asyncio.wait_for(closed.wait(), 10)


@on_loop()
async def test_narrow_panes_wrap_their_text_and_fold_the_actions(loop: Any, make_window: Any) -> None:
    window = make_window(panes=4, max_tokens=12, ignore_eos=True)
    window.resize(1024, 700)
    send(window, "Tell me about the sea.")
    await wait_until(lambda: replies_done(window), what="four replies")
    window.flush_panes()
    await asyncio.sleep(0.1)  # the layouts settle
    for view in window.panes.values():
        reply = view.messages[1]
        # Nothing is wider than the pane: the messages wrap, the actions fold into "⋯".
        assert view.scroll.widget().width() <= view.scroll.viewport().width()
        assert reply.more_button.isVisible() and not reply.actions.isVisible()
        reply.more_button.menu().aboutToShow.emit()
        assert "Regenerate" in [a.text() for a in reply.more_button.menu().actions()]
    window.resize(1800, 800)  # room again: the buttons come back
    await asyncio.sleep(0.1)
    reply = next(iter(window.panes.values())).messages[1]
    await wait_until(lambda: reply.regenerate_button.isVisible(), what="the buttons")
    assert not reply.more_button.isVisible()
