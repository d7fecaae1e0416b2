"""Reply versions and pane numbers in the window, on the tiny model: the
"‹ 2/3 ›" switcher on a regenerated reply (buttons and Alt+Left/Alt+Right),
and chips that read Pane 1..N left to right with Alt+n toggling the n-th."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt

from tests.ui.conftest import on_loop, wait_until
from tests.ui.test_window import all_idle, send


@on_loop()
async def test_regenerate_offers_the_earlier_reply_as_a_version(loop: Any, make_window: Any, tmp_path: Any) -> None:
    from pytestqt.qtbot import QtBot

    from engine.params import SamplingParams

    window = make_window(panes=1, max_tokens=8, ignore_eos=True)
    ws = window.workspace
    (pane,) = ws.panes
    view = window.panes[pane.id]
    send(window, "Name a colour.")
    await wait_until(lambda: len(pane.conversation.messages) == 2 and all_idle(window), what="the reply")
    first = pane.conversation.messages[1].text
    assert not view.messages[1].versions.isVisibleTo(view.messages[1])  # one version: no switcher

    ws.set_params(pane.id, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    view.messages[1].regenerate_button.click()
    await wait_until(lambda: pane.conversation.messages[1].versions is not None and all_idle(window),
                     what="the second version")
    window.flush_panes()
    second = pane.conversation.messages[1].text
    switcher = view.messages[1].versions
    assert switcher.isVisibleTo(view.messages[1]) and switcher.label.text() == "2/2"
    assert switcher.previous_button.accessibleName() == "Previous version"
    assert switcher.next_button.accessibleName() == "Next version"
    assert switcher.previous_button.isEnabled() and not switcher.next_button.isEnabled()
    window.grab().save(str(tmp_path / "versions.png"))

    # The button shows version 1: its text in the pane, its ids in the conversation.
    switcher.previous_button.click()
    window.flush_panes()
    assert pane.conversation.messages[1].text == first
    assert view.messages[1].body.markdown() == first
    assert view.messages[1].versions.label.text() == "1/2"
    # The keyboard: Alt+Right from the reply goes to version 2.
    reply = view.messages[1]
    window.activateWindow()  # shortcuts go to the active window
    await wait_until(lambda: window.isActiveWindow(), what="the window to be active")
    assert reply.versions.previous_button.hasFocus() or reply.versions.next_button.hasFocus()  # kept on the switcher
    QtBot.keyClick(reply.versions.next_button, Qt.Key.Key_Right, Qt.KeyboardModifier.AltModifier)
    window.flush_panes()
    assert pane.conversation.messages[1].text == second
    assert view.messages[1].versions.label.text() == "2/2"
    QtBot.keyClick(view.messages[1].body, Qt.Key.Key_Left, Qt.KeyboardModifier.AltModifier)
    window.flush_panes()
    assert pane.conversation.messages[1].text == first

    # The conversation goes on from the version shown, hitting the prefix cache.
    kept = pane.conversation.kept_ids
    send(window, "And another?")
    await wait_until(lambda: len(pane.conversation.messages) == 4 and all_idle(window), what="the next turn")
    assert pane.conversation.kept_ids[: len(kept)] == kept
    assert pane.conversation.messages[3].stats.cached_prompt_tokens > 0


@on_loop()
async def test_chips_follow_the_panes_on_screen_and_alt_n_toggles_the_nth(loop: Any, make_window: Any) -> None:
    from pytestqt.qtbot import QtBot

    window = make_window(panes=2)
    ws = window.workspace
    first, second = ws.panes
    window.set_current_pane(first.id)
    window.add_pane()  # "+ Pane": beside the current one
    await wait_until(lambda: len(window.panes) == 3, what="the new pane")
    order = window.pane_order()
    assert order[0] == first.id and order[2] == second.id
    chips = [window.composer.chip(pid).text() for pid in order]
    assert chips == ["✓ Pane 1", "✓ Pane 2", "✓ Pane 3"]
    assert [window.panes[pid].title_label.text() for pid in order] == ["Pane 1", "Pane 2", "Pane 3"]

    # Alt+2 toggles the second chip on screen: the new pane beside the first.
    window.activateWindow()
    await wait_until(lambda: window.isActiveWindow(), what="the window to be active")
    window.composer.edit.setFocus()
    QtBot.keyClick(window.composer.edit, Qt.Key.Key_2, Qt.KeyboardModifier.AltModifier)
    assert window.composer.targets() == [order[0], order[2]]
    assert window.composer.chip(order[1]).text() == "Pane 2"

    # Close the middle pane: numbers come back, no "Pane 4" with three open.
    ws.close_pane(order[1])
    ws.add_pane()
    await wait_until(lambda: len(window.panes) == 3, what="another pane")
    assert [window.composer.chip(pid).text().lstrip("✓ ") for pid in window.pane_order()] == [
        "Pane 1", "Pane 2", "Pane 3"
    ]
