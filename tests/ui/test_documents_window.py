"""Documents in the window (tiny random model): files dropped and chosen are read off the
GUI thread into chips, the fit line refuses a pane they do not fit, a broadcast gives every
pane the same user turn, the first-part choice sends what fits and says so."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any

import pytest

from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QApplication

import app.workspace.attachments as attachments_module
from app.workspace.attachments import fit_documents
from engine.documents import user_message_with_documents
from ui.dialogs.document_viewer import DocumentViewer
from tests.ui.conftest import on_loop, wait_until
from tests.ui.test_window import send


def write_files(folder: Path) -> tuple[Path, Path]:
    notes = folder / "notes.md"
    notes.write_text("\n\n".join(f"Paragraph {i}: the lantern festival in Kyoto starts at dusk, "
                                 f"and the temples along the river stay open late." for i in range(40)))
    table = folder / "table.csv"
    table.write_text("city,visits\nKyoto,3\nNara,1\n")
    return notes, table


def drop_files(widget: Any, paths: list[Path]) -> None:
    """Drag files onto `widget` and drop them, as from a file manager: their URLs."""
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    enter = QDragEnterEvent(QPoint(5, 5), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                            Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(widget, enter)
    assert enter.isAccepted()
    drop = QDropEvent(QPointF(5, 5), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                      Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(widget, drop)


def read(window: Any, count: int):
    return wait_until(lambda: not window.attachments.reading and len(window.attachments.documents()) == count
                      and not window.attachments.counting, what="the files to be read and counted")


def counted(window: Any):
    return wait_until(lambda: not window.attachments.counting, what="the fit to be counted")


@on_loop()
async def test_documents_attach_fit_send_and_show_as_chips(
    loop: Any, make_window: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    window = make_window(panes=3)
    planners: list[str] = []  # the threads that plan a send with documents: never the window's
    plan = attachments_module.plan_send

    def plan_send(*args: Any) -> Any:
        planners.append(threading.current_thread().name)
        return plan(*args)

    monkeypatch.setattr(attachments_module, "plan_send", plan_send)
    workspace, composer, attachments = window.workspace, window.composer, window.attachments
    first, second, small = (workspace.pane(pid) for pid in window.pane_order())
    # Pane 3 keeps most of its context for the reply: the notes do not fit it.
    limit = small.conversation.context_limit
    workspace.set_params(small.id, dataclasses.replace(small.conversation.params, max_tokens=limit - 200))
    notes, table = write_files(tmp_path)

    assert window.menu_actions["attach"].shortcut().toString() == "Ctrl+Shift+O"
    drop_files(composer, [notes, table])
    await read(window, 2)
    assert [item.chip.name for item in attachments.pending] == ["notes.md", "table.csv"]
    assert composer.attachments.isVisible()
    assert "tokens" in attachments.pending[0].chip.label.full_text()
    composer.edit.setPlainText("When does it start?")
    attachments.refresh_fit()
    await counted(window)
    fits = {fit.pane_id: fit for fit in attachments.fits}
    assert fits[first.id].fits and fits[second.id].fits and not fits[small.id].fits
    assert "notes.md and table.csv do not fit Pane 3" in composer.fit_label.text()
    assert composer.first_part_button.isVisible()

    # A chip opens the text the model gets.
    attachments.pending[0].chip.label.click()
    viewer = window.findChild(DocumentViewer)
    assert viewer is not None and viewer.text.toPlainText() == notes.read_text()
    viewer.close()

    # Sent as it stands: panes 1 and 2 get the same user turn, pane 3 is refused with the line.
    send(window, "When does it start?")
    await wait_until(lambda: all(len(p.conversation.messages) == 2 and not p.busy for p in (first, second)),
                     what="the replies")
    assert small.conversation.messages == []
    assert planners and threading.main_thread().name not in planners
    assert "not sent there" in composer.notice.text() and "Pane 3" in composer.notice.text()
    assert attachments.pending == [] and not composer.attachments.isVisible()
    turn = [p.conversation.chat_messages()[-2]["content"] for p in (first, second)]
    documents = first.conversation.messages[0].attachments
    assert turn[0] == turn[1] == user_message_with_documents("When does it start?", documents)
    assert [d.name for d in documents] == ["notes.md", "table.csv"] and all(d.complete for d in documents)
    assert first.conversation.kept_ids[:20] == second.conversation.kept_ids[:20]
    stats = [p.conversation.messages[1].stats for p in (first, second)]
    assert stats[0].prompt_tokens == stats[1].prompt_tokens > 200
    # Computed once: the two panes together computed little more than one prompt (the rest was shared).
    computed = sum(x.prompt_tokens - x.cached_prompt_tokens for x in stats)
    assert computed < 1.1 * stats[0].prompt_tokens
    # The message shows the question, and the documents as chips.
    message = window.panes[first.id].messages[0]
    assert message.body.markdown() == "When does it start?"
    assert [chip.document.name for chip in message.attachment_chips] == ["notes.md", "table.csv"]
    assert "tokens" in message.attachment_chips[0].label.full_text()

    # Chosen by the file dialog, to pane 3 only, with the first-part choice: what fits, marked so.
    attachments.attach_paths([str(notes)])
    await read(window, 1)
    composer.set_targets([small.id])
    composer.first_part_button.setChecked(True)
    await counted(window)
    assert "first" in attachments.pending[0].chip.label.full_text() and "in Pane 3" in attachments.pending[0].chip.label.full_text()
    send(window, "When?")
    # Its reply may run to the long length it is allowed: stopped once it has begun.
    await wait_until(lambda: len(small.conversation.messages) == 2 and small.conversation.messages[1].token_ids,
                     what="pane 3's reply")
    workspace.stop(small.id)
    await wait_until(lambda: not small.busy, what="pane 3 to stop")
    [part] = small.conversation.messages[0].attachments
    assert not part.complete and 200 <= len(part.text) < len(notes.read_text())
    assert notes.read_text().startswith(part.text)
    prompt = small.conversation.messages[1].stats.prompt_tokens
    assert prompt + small.conversation.params.max_tokens <= limit
    assert "first part" in window.panes[small.id].messages[0].attachment_chips[0].label.full_text()


@on_loop()
async def test_a_file_that_cannot_be_read_gets_one_line_and_no_chip(loop: Any, make_window: Any, tmp_path: Path) -> None:
    window = make_window(panes=1)
    junk = tmp_path / "junk.txt"
    junk.write_bytes(bytes(range(256)) * 64)
    # Binary data named .txt dropped on a pane, and a file gone by the time it is read, pasted.
    drop_files(window.panes[window.pane_order()[0]], [junk])
    await wait_until(lambda: not window.attachments.pending, what="junk.txt to be refused")
    assert "junk.txt" in window.composer.notice.text() and window.composer.notice.isVisible()
    pasted = QMimeData()
    pasted.setUrls([QUrl.fromLocalFile(str(tmp_path / "gone.md"))])
    window.composer.edit.insertFromMimeData(pasted)
    assert window.composer.edit.toPlainText() == ""  # attached, not typed in as a path
    await wait_until(lambda: not window.attachments.pending, what="gone.md to be refused")
    assert "gone.md is no longer there" in window.composer.notice.text()
    assert window.attachments.documents() == [] and not window.composer.fit_bar.isVisible()


@on_loop()
async def test_the_fit_is_counted_off_the_gui_thread_and_a_change_during_the_count_wins(
    loop: Any, make_window: Any, tmp_path: Path
) -> None:
    window = make_window(panes=2)
    workspace, composer, attachments = window.workspace, window.composer, window.attachments
    # Long enough that counting it (encodes of the whole prompt, a bisection for the first part) takes a while.
    long = tmp_path / "long.md"
    long.write_text("\n\n".join(f"Section {i}: the harbour at Nagasaki took in ships from many ports, "
                                f"and each ledger line {i} names a cargo, a captain and a date." for i in range(3000)))
    attachments.attach_paths([str(long)])
    await read(window, 1)
    threads: list[str] = []
    count = attachments._count

    def on_which_thread(*args: Any) -> Any:
        threads.append(threading.current_thread().name)
        return count(*args)

    attachments._count = on_which_thread
    composer.edit.setPlainText("Short?")
    attachments.refresh_fit()
    assert attachments.counting  # the call returned before its count
    composer.edit.setPlainText("A much longer question about the ledgers, the captains and the cargo of every ship?")
    attachments.refresh_fit()
    await counted(window)
    assert threads and all(name == "tandem-count-fit" for name in threads)
    # What is shown is the count of the message as it is now, not of the one it was.
    targets = composer.targets()
    expected = fit_documents(workspace, composer.edit.toPlainText(), attachments.documents(), targets)
    assert attachments.fits == expected
    assert f"{expected[0].prompt_tokens:,}" in composer.fit_label.text()
    # Taking the document off while it is counted leaves no fit line behind.
    composer.edit.setPlainText("Again?")
    attachments.refresh_fit()
    attachments.remove(attachments.pending[0])
    await counted(window)
    assert attachments.fits == [] and composer.fit_label.text() == ""
