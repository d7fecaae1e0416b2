"""The comparison features through the real window (tiny model, a real chat
store): the blind arena with its vote keys, reveal, saved votes and
leaderboard export; Use in all panes; Sweep…; the turn summary."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtTest import QTest

from tests.ui.conftest import on_loop, wait_until

# Top-k, top-p and min-p off: a hot draw from the random model needs its whole range to differ by seed.
WIDE = dict(top_k=0, top_p=1.0, min_p=0.0)


def _make(tmp_path: Path, engine_dir: Path, panes: int = 2, **params: Any) -> Any:
    from app.settings import Settings
    from app.store.session import ChatSession
    from app.workspace.workspace import Workspace
    from engine.params import SamplingParams
    from ui.window.main_window import MainWindow

    settings = Settings(model=str(engine_dir), device="cpu", dtype="float32", threads=1, kv_cache_mb=16)
    settings.default_params = SamplingParams(**{"temperature": 0.0, "max_tokens": 8, "ignore_eos": True, **WIDE, **params})
    workspace = Workspace(settings)
    session = ChatSession.open(tmp_path / "chats.sqlite3")
    session.restore(workspace, default_panes=panes)
    window = MainWindow(workspace, settings, version="test", save_settings=False, session=session)
    window.resize(1280, 800)
    window.show()
    return window


async def _ready(window: Any) -> None:
    window.load_engine()
    await wait_until(lambda: window.workspace.engine_state == "ready", what="the model")


async def _close(window: Any) -> None:
    closed = asyncio.Event()
    window.closed.connect(closed.set)
    window.close()
    await asyncio.wait_for(closed.wait(), 30)


def _idle(window: Any) -> bool:
    return not any(view.pane.busy for view in window.panes.values())


async def _send(window: Any, text: str) -> None:
    before = sum(len(v.pane.conversation.messages) for v in window.panes.values())
    window.composer.edit.setPlainText(text)
    window.composer.edit.setFocus()
    QTest.keyClick(window.composer.edit, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    await wait_until(lambda: sum(len(v.pane.conversation.messages) for v in window.panes.values()) > before,
                     what="the send")
    await wait_until(lambda: _idle(window), what="the replies")
    window.flush_panes()


@on_loop()
async def test_the_blind_arena_hides_votes_by_key_reveals_and_rates(loop: Any, tiny_model_dir: Path, tmp_path: Path) -> None:
    from engine.params import SamplingParams

    window = _make(tmp_path, tiny_model_dir, panes=1)
    try:
        await _ready(window)
        action = window.menu_actions["arena"]
        # One pane is no arena: a clear message, and the toggle stays off.
        action.trigger()
        assert not action.isChecked() and not window.arena.on
        assert "two or more panes" in window.composer.notice.text()

        window.add_pane()
        ws = window.workspace
        first, second = ws.panes
        ws.set_params(second.id, SamplingParams(temperature=0.0, max_tokens=1500, ignore_eos=True))
        ws.set_system_prompt(second.id, "Be brief.")
        action.trigger()
        assert action.isChecked() and window.arena_bar.isVisible()
        assert [b.text() for b in window.arena_bar.buttons] == [
            "1  A is better", "2  B is better", "3  Tie", "4  Both are bad"]

        window.composer.edit.setPlainText("Which is the largest planet?")
        window.composer.send()
        await wait_until(lambda: ws.pane(second.id).busy and window.arena.arena.turn.sent, what="streaming")
        # While a reply streams the vote is closed, and a key says why.
        window.arena_bar.setFocus()
        QTest.keyClick(window.arena_bar, Qt.Key.Key_1)
        assert "still being written" in window.composer.notice.text()
        assert window.arena.arena.turn.vote is None
        for view in window.panes.values():
            assert view.title_label.full_text() in ("A", "B")
            assert "hidden until you vote" in view.summary_label.full_text()
            assert not view.model_picker.isVisible() and not view.settings_button.isEnabled()
        # The chats sidebar's tooltips do not name the models either.
        blind = {v.pane.conversation.id for v in window.panes.values()}
        assert window.sidebar.blind_ids == blind
        window.menu_actions["pane_settings"].trigger()  # Ctrl+, would show them: refused
        assert window.popover is None and "hides this pane's settings" in window.composer.notice.text()
        window.menu_actions["sweep"].trigger()
        assert window.sweeps.dialog is None
        chips = [window.composer.chip(pid).text() for pid in window.pane_order()]
        assert not any("Pane" in chip for chip in chips), chips
        window.stop_all()
        await wait_until(lambda: _idle(window) and window.arena_bar.voting, what="the vote to open")
        window.flush_panes()
        for view in window.panes.values():
            reply = view.messages[1]
            assert reply.stats_label.text() and not reply.stats_label.isVisible()  # the stats wait for the vote
        labels = window.arena.arena.turn.labels
        # Seated in label order: A is the left pane.
        assert window.pane_order() == list(labels.values())

        assert window.focusWidget() is window.arena_bar or window.arena_bar.isAncestorOf(window.focusWidget())
        QTest.keyClick(window.arena_bar, Qt.Key.Key_2)
        vote = window.arena.last_vote
        assert vote is not None and (vote.outcome, vote.winner) == ("win", "B")
        b_pane = ws.pane(labels["B"])
        assert window.sidebar.blind_ids == set()
        assert "You chose B." in window.arena_bar.status.text()
        assert f"B was {vote.side('B').model}" in window.arena_bar.status.text()
        assert vote.side("B").settings["system_prompt"] == b_pane.conversation.system_prompt
        for label, pid in labels.items():
            view = window.panes[pid]
            assert view.title_label.full_text() == f"{label} = {view.pane.title}"
            assert view.messages[1].stats_label.isVisible()
        window.menu_actions["arena_vote"].trigger()  # Ctrl+Shift+V: back to the bar
        QTest.keyClick(window.arena_bar, Qt.Key.Key_3)
        assert "has its vote" in window.composer.notice.text()

        # The leaderboard rates the saved vote; exports write files, a bad path says why.
        window.menu_actions["arena_leaderboard"].trigger()
        dialog = window.arena.leaderboard
        await wait_until(lambda: dialog.table.rowCount() == 2, what="the leaderboard")
        assert "1 vote on 2 models and settings" in dialog.status.text()
        names = {dialog.table.item(r, 1).text() for r in range(2)}
        assert any("Be brief" in name for name in names)
        written = dialog.export("csv", str(tmp_path / "board.csv"))
        assert written is not None and written.read_text().startswith("rank,name,rating")
        assert dialog.export("votes", str(tmp_path / "votes.json")) is not None
        assert "Which is the largest planet?" in (tmp_path / "votes.json").read_text()
        assert dialog.export("json", str(tmp_path)) is None
        assert "could not be written" in dialog.status.text()
        dialog.close()

        action.trigger()  # leave the arena: everything shows again
        assert not window.arena.on and not window.arena_bar.isVisible()
        assert all(v.title_label.full_text() == v.pane.title for v in window.panes.values())

        # New arena in the Chats sidebar: a new chat in every pane, on its model and settings, and the arena on.
        settings = {pid: (v.pane.conversation.params, v.pane.conversation.system_prompt) for pid, v in window.panes.items()}
        old_chats = {v.pane.conversation.id for v in window.panes.values()}
        window.sidebar.arena_button.click()
        assert window.arena.on and action.isChecked()
        assert all(not v.pane.conversation.messages for v in window.panes.values())
        assert not old_chats & {v.pane.conversation.id for v in window.panes.values()}
        assert sorted((v.pane.conversation.params.temperature, v.pane.conversation.system_prompt)
                      for v in window.panes.values()) == sorted((p.temperature, sp) for p, sp in settings.values())
    finally:
        await _close(window)


@on_loop()
async def test_use_in_all_panes_sweep_and_turn_summary(loop: Any, tiny_model_dir: Path, tmp_path: Path) -> None:
    window = _make(tmp_path, tiny_model_dir, panes=2, temperature=5.0, seed=1)
    try:
        await _ready(window)
        ws = window.workspace
        first, second = ws.panes
        from engine.params import SamplingParams

        ws.set_params(second.id, SamplingParams(temperature=5.0, seed=2, max_tokens=8, ignore_eos=True, top_k=0, top_p=1.0, min_p=0.0))
        await _send(window, "Name a colour.")
        reply = first.conversation.messages[1]

        # Use in all panes, from the reply's own button.
        button = window.panes[first.id].messages[1].carry_button
        assert button.isVisibleTo(window.panes[first.id].messages[1].actions)
        button.click()
        await wait_until(lambda: second.conversation.messages[1].text == reply.text, what="the carried reply")
        assert second.conversation.kept_ids == first.conversation.kept_ids
        assert second.conversation.messages[1].versions.count == 2
        assert "earlier versions" in window.statusBar().currentMessage()
        window.flush_panes()
        assert window.panes[second.id].messages[1].body.markdown() == reply.text

        # The turn summary of the last turn, copied as Markdown.
        window.menu_actions["turn_summary"].trigger()
        dialog = window.compare.summary_dialog
        await wait_until(lambda: dialog.table.rowCount() == 2, what="the summary")
        assert dialog.table.item(0, 3).text() == str(first.conversation.messages[1].stats.generated_tokens)
        dialog.copy()
        assert QGuiApplication.clipboard().text().startswith("**Turn summary**")
        assert dialog.export("csv", str(tmp_path / "summary.csv")) is not None
        dialog.close()

        # Sweep…: a wrong list is said in the dialog, which stays open; a right one opens a pane per value.
        window.set_current_pane(first.id)
        window.menu_actions["sweep"].trigger()
        sweep = window.sweeps.dialog
        assert sweep is not None and sweep.isVisible()
        sweep.parameter.setCurrentIndex(sweep.parameter.findData("temperature"))
        sweep.values_edit.setPlainText("0.5, hot")
        sweep.reply_again.setChecked(False)
        sweep.open_button.click()
        assert sweep.isVisible() and "'hot' is not a number" in sweep.error.text()
        sweep.values_edit.setPlainText("")
        sweep.open_button.click()
        assert "at least one value" in sweep.error.text()
        sweep.parameter.setCurrentIndex(sweep.parameter.findData("seed"))
        assert sweep.values_edit.toPlainText() == "1-4"
        sweep.values_edit.setPlainText("7-9")
        sweep.reply_again.setChecked(True)
        sweep.open_button.click()
        await wait_until(lambda: len(ws.panes) == 5, what="three sweep panes")
        swept = ws.panes[1:4]
        assert [p.conversation.params.seed for p in swept] == [7, 8, 9]
        assert [window.panes[p.id].title_label.full_text() for p in swept] == ["seed 7", "seed 8", "seed 9"]
        assert sorted(window.composer.targets()) == sorted(p.id for p in swept)
        # Each answers the last message again; the fork's reply stays the earlier version.
        await wait_until(lambda: all(p.conversation.messages[1].versions is not None for p in swept) and _idle(window),
                         what="the sweep's replies")
        for pane in swept:
            assert pane.conversation.messages[1].stats.cached_prompt_tokens > 0
    finally:
        await _close(window)


@on_loop()
async def test_every_new_action_is_in_the_shortcuts_list(loop: Any, make_window: Any) -> None:
    window = make_window(panes=2)
    listed = dict(window.shortcuts())
    for text in ("Use last reply in all panes", "Sweep this pane", "Turn summary", "Arena (blind vote)",
                 "Vote in the arena", "Arena leaderboard", "Export turn summary"):
        assert text in listed, text
    assert any(keys.startswith("1 … N") for keys in listed.values())


@on_loop()
async def test_the_arena_bar_fits_a_small_window(loop: Any, make_window: Any) -> None:
    window = make_window(panes=7)
    window.resize(800, 600)
    before = window.minimumSizeHint().width()
    window.menu_actions["arena"].trigger()
    assert window.arena.on
    await asyncio.sleep(0.3)
    bar = window.arena_bar
    # Nine choices do not widen the window: they shorten to key and label, each readable and inside the bar.
    assert window.minimumSizeHint().width() <= before
    assert [b.text() for b in bar.buttons][-3:] == ["7 G", "8 Tie", "9 Bad"]
    for button in bar.buttons:
        assert button.width() >= button.fontMetrics().horizontalAdvance(button.text())
        assert button.mapTo(bar, button.rect().topRight()).x() <= bar.width()
    window.resize(1600, 800)
    await asyncio.sleep(0.3)
    assert bar.buttons[0].text() == "1  A is better"


@on_loop()
async def test_the_arena_refuses_panes_with_different_histories_and_compare_picks_the_same_question(
    loop: Any, make_window: Any
) -> None:
    window = make_window(panes=3)
    first, second, third = (window.panes[pid].pane for pid in window.pane_order())
    for pane, question in ((first, "Tell me a joke"), (second, "Name a colour"), (third, "Name a colour")):
        await (await window.workspace.send(question, targets=[pane.id])).wait()
    await wait_until(lambda: _idle(window), what="the replies")
    window.flush_panes()
    # Each pane's own history would give away which is which: the arena says so and stays off.
    window.menu_actions["arena"].trigger()
    assert not window.arena.on and not window.menu_actions["arena"].isChecked()
    assert "different conversations" in window.composer.notice.text()
    assert "New arena" in window.composer.notice.text()
    assert not window.arena_bar.isVisible()
    # Compare opens on the two panes that were asked the same thing, not on the leftmost pair.
    window.menu_actions["compare"].trigger()
    assert window.compare_bar.chosen() == (second.id, third.id)
    window.menu_actions["compare"].trigger()
    # New arena gives every pane a new chat: nothing to give away, and the arena starts.
    window.arena.new_arena()
    assert window.arena.on and all(not window.panes[pid].pane.conversation.messages for pid in window.pane_order())
