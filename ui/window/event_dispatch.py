"""What each workspace event does to the window: one handler per event type.

The workspace (app/) reports every change as an event on the GUI thread;
`WorkspaceEventRouter` looks the handler up by the event's type. A handler
that fails is logged and the next event is still shown: a view bug must
not break the workspace's event delivery.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt

from app import events as ev
from ui.panes.pane_view import PaneView

if TYPE_CHECKING:
    from app.workspace.workspace import Pane
    from ui.window.main_window import MainWindow

log = logging.getLogger(__name__)


class WorkspaceEventRouter:
    """Subscribe it to the workspace: `workspace.subscribe(router)`."""

    def __init__(self, window: MainWindow) -> None:
        self._window = window
        self._handlers: dict[type, Callable[[Any], None]] = {
            ev.ReplyDelta: self._reply_delta,
            ev.ReplyFinished: self._reply_finished,
            ev.MessageAppended: self._message_appended,
            ev.MessagesTruncated: self._messages_truncated,
            ev.ReplyVersionShown: self._reply_version_shown,
            ev.PaneUpdated: self._pane_updated,
            ev.PaneAdded: self._pane_added,
            ev.PaneClosed: self._pane_closed,
            ev.PanesReordered: self._panes_reordered,
            ev.EngineStateChanged: self._engine_state_changed,
        }

    def __call__(self, event: ev.WorkspaceEvent) -> None:
        handler = self._handlers.get(type(event))
        if handler is None:
            log.debug("window ignores %r", event)
            return
        try:
            handler(event)
        except Exception:  # a view bug must not break the workspace's event delivery
            log.exception("window failed to show %r", event)

    # -- the messages of a pane ------------------------------------------------------

    def _reply_delta(self, event: ev.ReplyDelta) -> None:
        window = self._window
        view = window.panes.get(event.pane_id)
        if view is not None:
            view.reply_delta(event.index, event.stats)
            window.repaint_soon()

    def _reply_finished(self, event: ev.ReplyFinished) -> None:
        window = self._window
        view = window.panes.get(event.pane_id)
        if view is not None:
            view.reply_finished(event.index)
        window.chats.changed()
        window.update_streaming()
        window.compare.refresh()
        window.arena.replies_changed()

    def _message_appended(self, event: ev.MessageAppended) -> None:
        view = self._window.panes.get(event.pane_id)
        if view is not None:
            view.message_appended(event.index)
            self.wire_versions(view)
        self._window.chats.changed()

    def _reply_version_shown(self, event: ev.ReplyVersionShown) -> None:
        """Another version of a reply: redraw from the user message it answers on."""
        window = self._window
        view = window.panes.get(event.pane_id)
        if view is not None:
            for index, message in view.messages.items():
                if index >= event.first:
                    message.hide()  # at once: the view deletes it at the next loop turn
            view.messages_truncated(event.first)
            for index in range(event.first, len(view.pane.conversation.messages)):
                view.message_appended(index)
                if index in view.messages:
                    view.messages[index].show()  # now, not at the next loop turn: the focus goes to it below
            self.wire_versions(view)
            reply = view.messages.get(event.index)
            if reply is not None:
                # Keep the keyboard on the switcher (its old view is gone), so Alt+Left goes on working.
                view.flush()
                view.scroll.ensureWidgetVisible(reply)
                buttons = (reply.versions.previous_button, reply.versions.next_button)
                target = next((b for b in buttons if b.isEnabled()), reply.versions.next_button)
                target.setFocus(Qt.FocusReason.OtherFocusReason)
        window.chats.changed()
        window.compare.refresh()

    def wire_versions(self, view: PaneView) -> None:
        """Each message's "‹ 2/3 ›" switcher asks the workspace for the version.

        Connected here, once a message's view exists: the pane view makes
        them, the window decides what a switch does."""
        window = self._window
        pane_id = view.pane_id
        for message in view.messages.values():
            if message.property("versionsWired"):
                continue
            message.setProperty("versionsWired", True)

            def show(index: int, version: int) -> None:
                try:
                    window.workspace.show_version(pane_id, index, version)
                except Exception as exc:
                    window.report_error("Showing another version", exc)

            message.version_requested.connect(show)

    def _messages_truncated(self, event: ev.MessagesTruncated) -> None:
        view = self._window.panes.get(event.pane_id)
        if view is not None:
            view.messages_truncated(event.length)
        self._window.compare.refresh()

    # -- the panes -------------------------------------------------------------------

    def _pane_updated(self, event: ev.PaneUpdated) -> None:
        window = self._window
        view = window.panes.get(event.pane_id)
        if view is not None:
            view.model_state = window.workspace.pane_model_state(event.pane_id)
            view.refresh_header()
            view.refresh_context()
        window.attachments.refresh_fit_soon()  # its model, settings or history changed what fits
        window.update_streaming()
        window.sync_pane_lists()
        window.refresh_ready()

    def _pane_added(self, event: ev.PaneAdded) -> None:
        self.add_pane_view(event.pane, event.index)
        self._window.refresh_ready()

    def add_pane_view(self, pane: Pane, index: int) -> None:
        window = self._window
        if pane.id in window.panes:
            return
        view = PaneView(pane, window.models.name(), window.splitter)
        view.stop_requested.connect(window.stop_pane)
        view.close_requested.connect(window.close_pane)
        view.settings_requested.connect(window.commands.open_settings)
        view.regenerate_requested.connect(window.commands.regenerate)
        view.edit_requested.connect(window.commands.edit_message)
        view.fork_requested.connect(window.fork)
        view.carry_requested.connect(window.commands.use_in_all_panes)
        view.sweep_requested.connect(window.sweeps.open_for)
        view.activated.connect(window.set_current_pane)
        view.model_chosen.connect(window.models.choose)
        view.files_dropped.connect(window.attachments.attach_paths)
        view.count_document_tokens = lambda document: window.attachments.tokens(pane.conversation.model_id, document)
        view.schema_name = window.saved_schemas.name_of
        view.json_checked.connect(lambda _pane_id: window.compare.refresh())  # "JSON valid in 2 of 3"
        if window.registry is not None:
            view.set_model_entries(window.models.entries())
        view.model_state = window.workspace.pane_model_state(pane.id)
        view.refresh_header()
        window.panes[pane.id] = view
        self.wire_versions(view)
        window.splitter.insertWidget(index, view)
        window.splitter.setSizes([1000] * window.splitter.count())
        window.sync_pane_lists()
        if window.current_pane_id is None:
            window.set_current_pane(pane.id)

    def _pane_closed(self, event: ev.PaneClosed) -> None:
        window = self._window
        view = window.panes.pop(event.pane_id, None)
        if view is not None:
            view.hide()
            view.setParent(None)
            view.deleteLater()
            if window.current_pane_id == event.pane_id:
                window.current_pane_id = None
                order = window.pane_order()
                if order:
                    window.set_current_pane(order[0])
            window.sync_pane_lists()
            window.update_streaming()
            window.arena.panes_changed()
        window.refresh_ready()

    def _panes_reordered(self, event: ev.PanesReordered) -> None:
        window = self._window
        for position, pid in enumerate(event.order):
            view = window.panes.get(pid)
            if view is not None and window.splitter.indexOf(view) != position:
                window.splitter.insertWidget(position, view)
        window.sync_pane_lists()

    # -- the models ------------------------------------------------------------------

    def _engine_state_changed(self, event: ev.EngineStateChanged) -> None:
        self._window.apply_engine_state(event.state, event.progress, event.error)
        self._window.server_control.engines_changed()
