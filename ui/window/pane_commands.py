"""What the user does to panes and their messages: send, stop, regenerate,
edit and resend, fork, copy, add, close, move, focus, and the pane's
settings popover. Each forwards to the workspace; a coroutine runs as a task
on the qasync loop and an error the user can act on shows in the window.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox
import shiboken6

from engine.structured import check_constraint as check_without_model

from app.errors import AppError
from ui.dialogs.shortcuts import EditMessageDialog
from ui.panes.pane_settings import PaneSettingsPopover

if TYPE_CHECKING:
    from engine.params import SamplingParams
    from engine.structured import Constraint
    from ui.window.main_window import MainWindow


class PaneCommands:
    def __init__(self, window: MainWindow) -> None:
        self._window = window

    def _current(self) -> int | None:
        return self._window.current_pane_id

    # -- messages ----------------------------------------------------------------------

    def send(self, text: str, targets: list[int]) -> None:
        window = self._window
        composer = window.composer
        attachments = window.attachments
        if attachments.reading:
            composer.show_notice(f"{_listed(attachments.reading)} {'is' if len(attachments.reading) == 1 else 'are'} "
                                 "still being read; send once the chips show their tokens.")
            return
        documents = attachments.documents()
        if not text.strip() and not documents:
            composer.show_notice("The message is empty. Type something to send.")
            return
        if not targets:
            composer.show_notice("No pane is selected to receive the message. Select at least one pane above.")
            return
        if window.arena.on:
            if documents:
                composer.show_notice("The arena sends text only: remove the attached documents, or leave the arena.")
                return
            window.arena.send(text)
            return
        composer.set_sending(True)
        first_part = attachments.first_part_panes()

        async def go() -> None:
            turn = await window.workspace.send(text, targets, skip_busy=True, documents=documents,
                                               first_part=first_part)
            composer.clear()
            attachments.clear()
            sent = [window.workspace.pane(pid).title for pid in turn.pane_ids]
            notes = [skipped_notice(sent, [pane.title for pane in turn.skipped])] if turn.skipped else []
            notes += [f"{why} It was not sent there." for _pane, why in turn.refused]
            if notes:
                composer.show_notice(" ".join(notes), 15.0)

        window.run_task(go(), "Sending", on_done=lambda: composer.set_sending(False))

    def use_in_all_panes(self, pane_id: int, index: int) -> None:
        """The reply becomes every other pane's answer to the same message (app.workspace.carry_forward)."""
        window = self._window
        if window.arena.hiding:
            window.report_error("Using the reply in all panes", AppError(
                "Vote first: the arena hides who wrote each reply until then."))
            return
        try:
            result = window.workspace.use_in_all_panes(pane_id, index)
        except Exception as exc:
            window.report_error("Using the reply in all panes", exc)
            return
        titles = {pid: view.pane.title for pid, view in window.panes.items()}
        window.statusBar().showMessage(result.summary(titles), 12000)

    def use_current_in_all_panes(self) -> None:
        view = self._window.current_view()
        if view is None:
            return
        index = view.last_reply_index()
        if index is None:
            self._window.report_error("Using the reply in all panes", AppError(
                f"{view.pane.title} has no reply yet: send a message first."))
            return
        self.use_in_all_panes(view.pane_id, index)

    def stop_current(self) -> None:
        if self._current() is not None:
            self._window.workspace.stop(self._current())

    def regenerate(self, pane_id: int, _index: int | None = None) -> None:
        self._window.run_task(self._window.workspace.regenerate(pane_id), "Regenerating")

    def regenerate_current(self) -> None:
        if self._current() is not None:
            self.regenerate(self._current())

    def edit_message(self, pane_id: int, index: int) -> None:
        window = self._window
        view = window.panes.get(pane_id)
        if view is None:
            return
        messages = view.pane.conversation.messages
        if index >= len(messages) or messages[index].role != "user":
            return
        if view.pane.busy:
            window.report_error("Editing", RuntimeError(f"{view.pane.title} is still replying; stop it first."))
            return
        dialog = EditMessageDialog(messages[index].text, len(messages) - index - 1, window)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        window.edit_dialog = dialog

        def accepted() -> None:
            text = dialog.text()
            if text.strip():
                window.run_task(window.workspace.edit_and_resend(pane_id, index, text), "Edit and resend")

        def finished(_result: int) -> None:
            window.edit_dialog = None

        dialog.accepted.connect(accepted)
        dialog.finished.connect(finished)
        dialog.open()

    def edit_current(self) -> None:
        view = self._window.current_view()
        if view is not None and view.last_user_index() is not None:
            self.edit_message(view.pane_id, view.last_user_index())

    def fork(self, pane_id: int, index: int) -> None:
        window = self._window
        try:
            pane = window.workspace.fork_pane(pane_id, index)
        except Exception as exc:
            window.report_error("Forking", exc)
            return
        window.set_current_pane(pane.id)

    def fork_current(self) -> None:
        view = self._window.current_view()
        if view is None:
            return
        index = len(view.pane.conversation.messages) - 1
        if view.pane.busy:
            index = (view.pane.conversation.streaming_index or 0) - 1
        if index >= 0:
            self.fork(view.pane_id, index)

    def copy_current(self) -> None:
        view = self._window.current_view()
        if view is not None and view.last_reply_index() is not None:
            view.messages[view.last_reply_index()].copy_text()

    # -- panes -------------------------------------------------------------------------

    def add_pane(self) -> None:
        window = self._window
        try:
            pane = window.workspace.add_pane(after=window.current_pane_id)
        except Exception as exc:
            window.report_error("Adding a pane", exc)
            return
        window.set_current_pane(pane.id)

    def new_chat(self) -> None:
        """Start a new conversation in the current pane; the old one stays in the sidebar."""
        window = self._window
        view = window.current_view()
        if view is None:
            self.add_pane()
            return
        if not view.pane.conversation.messages:
            window.composer.edit.setFocus()
            return
        try:
            pane = window.workspace.add_pane(after=view.pane_id)
            if view.pane.remote is None:
                window.workspace.set_model(pane.id, view.pane.conversation.model_id)
            window.workspace.close_pane(view.pane_id)
        except Exception as exc:
            window.report_error("Starting a new chat", exc)
            return
        window.set_current_pane(pane.id)
        window.composer.edit.setFocus()

    def close_current_pane(self) -> None:
        if self._current() is not None:
            self.close_pane(self._current())

    def close_pane(self, pane_id: int) -> None:
        window = self._window
        view = window.panes.get(pane_id)
        if view is None:
            return
        if len(window.panes) <= 1:
            window.report_error("Closing", RuntimeError("The window needs at least one pane."))
            return
        if not view.pane.conversation.messages or window.session is not None:
            # A saved chat is not lost by closing its pane: the sidebar reopens it.
            self.close_pane_now(pane_id)
            if view.pane.conversation.messages:
                window.statusBar().showMessage(f"{view.pane.title} closed; its chat stays in the Chats sidebar.", 8000)
            return
        box = QMessageBox(
            QMessageBox.Icon.Question,
            "Close pane",
            f"Close {view.pane.title}? Its conversation will be discarded.",
            QMessageBox.StandardButton.Close | QMessageBox.StandardButton.Cancel,
            window,
        )
        box.setDefaultButton(QMessageBox.StandardButton.Cancel)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        window.confirm_box = box

        def finished(result: int) -> None:
            window.confirm_box = None
            if result == QMessageBox.StandardButton.Close:
                self.close_pane_now(pane_id)

        box.finished.connect(finished)
        box.open()

    def close_pane_now(self, pane_id: int) -> None:
        try:
            self._window.workspace.close_pane(pane_id)
        except Exception as exc:
            self._window.report_error("Closing the pane", exc)

    def move_current(self, step: int) -> None:
        window = self._window
        if window.current_pane_id is None:
            return
        order = window.pane_order()
        position = order.index(window.current_pane_id) + step
        if 0 <= position < len(order):
            window.workspace.move_pane(window.current_pane_id, position)

    def focus_neighbour(self, step: int) -> None:
        window = self._window
        order = window.pane_order()
        if not order:
            return
        position = order.index(window.current_pane_id) if window.current_pane_id in order else 0
        window.set_current_pane(order[(position + step) % len(order)])

    def target_all(self) -> None:
        self._window.composer.set_targets(self._window.pane_order())

    # -- the pane's settings -----------------------------------------------------------

    def open_current_settings(self) -> None:
        if self._current() is not None:
            self.open_settings(self._current())

    def open_settings(self, pane_id: int) -> None:
        window = self._window
        workspace = window.workspace
        view = window.panes.get(pane_id)
        if view is None:
            return
        if view.arena_hidden:
            window.report_error("Pane settings", AppError(
                "The arena hides this pane's settings until you vote (or leave the arena with Ctrl+Shift+A)."))
            return
        conv = view.pane.conversation

        def check_constraint(constraint: Constraint) -> None:
            # The pane's own model when it is loaded (its compile is then cached for the replies);
            # else, as for a remote pane, whether any model could follow it.
            engine = workspace.engine_for(conv.model_id) if view.pane.remote is None else None
            (engine.check_constraint if engine is not None else check_without_model)(constraint)

        popover = PaneSettingsPopover(
            conv.params,
            conv.system_prompt,
            window.models.current_max_context(),
            window,
            title=view.pane.title,
            remote=view.pane.remote,
            set_remote=lambda url, model, key: workspace.set_remote(pane_id, url, model, key),
            set_local=lambda: workspace.set_local(pane_id),
            context_policy=conv.context_policy,
            thinking=conv.thinking if workspace.has_thinking_switch(pane_id) else None,
            saved_schemas=window.saved_schemas,
            check_constraint=check_constraint,
        )
        popover.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        # Only while it is the one open: an earlier popover deleted late must not forget this one.
        popover.destroyed.connect(lambda: window.popover is popover and setattr(window, "popover", None))
        # A schema saved or deleted there changes how other panes' summaries name theirs.
        popover.destroyed.connect(self.refresh_headers)
        window.popover = popover

        def applied(params: SamplingParams, system_prompt: str) -> None:
            try:
                workspace.set_params(pane_id, params)
                if system_prompt != conv.system_prompt:
                    workspace.set_system_prompt(pane_id, system_prompt)
                policy = popover.context_policy.currentData()
                if policy != conv.context_policy:
                    workspace.set_context_policy(pane_id, policy)
                think = popover.think_before_answering
                if think is not None and think.isChecked() != conv.thinking:
                    workspace.set_thinking(pane_id, think.isChecked())
            except Exception as exc:
                window.report_error("Changing the settings", exc)

        popover.applied.connect(applied)
        button = view.settings_button
        anchor = button.mapToGlobal(button.rect().bottomRight())
        popover.adjustSize()
        x = anchor.x() - popover.width()
        screen = window.screen().availableGeometry() if window.screen() is not None else None
        if screen is not None:  # the leftmost pane's button is nearer the edge than the popover is wide
            x = max(screen.left(), min(x, screen.right() + 1 - popover.width()))
        popover.move(x, anchor.y())
        popover.show()
        popover.temperature.setFocus()


    def refresh_headers(self) -> None:
        for view in list(self._window.panes.values()):
            if shiboken6.isValid(view):
                view.refresh_header()


def skipped_notice(sent: list[str], skipped: list[str]) -> str:
    """One sentence: where a broadcast went and which targets it left out because they were still replying."""
    one = len(skipped) == 1
    return (f"Sent to {_listed(sent)}; {_listed(skipped)} {'was' if one else 'were'} skipped "
            f"because {'it is' if one else 'they are'} still replying.")


def _listed(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" and {names[-1]}"
