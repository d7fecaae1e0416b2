"""The saved chats beside the panes: the Chats sidebar over the chat store.

Reads run on the GUI thread's own connection (quick); writes are queued for
the store's writer thread, and the sidebar refreshes once they are in, so
the GUI thread never waits for a transaction in progress.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QAbstractItemView, QDockWidget, QWidget

from ui.widgets.sidebar import ChatSidebar
from ui.window.chat_files import count_tokens_of_text

if TYPE_CHECKING:
    from app.store.chat_store import ChatStore, ConversationSummary
    from app.remote.remote_pane import RemoteBackend
    from app.store.session import ChatSession
    from app.workspace.conversation import Conversation
    from ui.window.main_window import MainWindow


@dataclass(slots=True)
class _ClosedPane:
    """Where a deleted chat's pane was, so that Undo can put it back."""

    conversation: Conversation
    position: int
    name: str
    remote: RemoteBackend | None
    current: bool
    replaced_by: int | None = None  # the new pane opened because it was the last one


class SidebarStore:
    """The sidebar's view of the chat store; `written()` is called once a
    queued write is in, to refresh the list."""

    def __init__(self, session: ChatSession, written: Callable[[], None]) -> None:
        self._session = session
        self._written = written

    def list_conversations(self, search: str | None = None) -> list[ConversationSummary]:
        # Empty chats (a pane nobody wrote in yet) are not worth listing.
        return [c for c in self._session.store.list_conversations(search) if c.message_count]

    def rename(self, conversation_id: str, title: str) -> None:
        self._write(lambda store: store.rename(conversation_id, title))

    def delete(self, conversation_id: str) -> None:
        self._write(lambda store: store.delete(conversation_id))

    def undelete(self, conversation_id: str) -> None:
        self._write(lambda store: store.undelete(conversation_id))

    def _write(self, fn: Callable[[ChatStore], None]) -> None:
        self._session.writer.submit(fn)
        self._written()


class ChatsLink:
    """The sidebar and its dock (none without a chat store), kept in step with the panes."""

    def __init__(self, window: MainWindow, session: ChatSession | None) -> None:
        self._window = window
        self._session = session
        self._refresh_pending = False
        # Panes a delete closed, by conversation id, until Undo brings them back.
        self._closed: dict[str, _ClosedPane] = {}
        self.sidebar: ChatSidebar | None = None
        self.dock: QDockWidget | None = None
        if session is None:
            return
        self.sidebar = ChatSidebar(SidebarStore(session, self.changed), window)
        self.sidebar.open_requested.connect(self.open)
        self.sidebar.new_requested.connect(window.new_chat)
        self.sidebar.arena_requested.connect(lambda: window.arena.new_arena())
        self.sidebar.renamed.connect(self._renamed)
        self.sidebar.deleted.connect(self._deleted)
        self.sidebar.restored.connect(self._restored)
        self.dock = QDockWidget("Chats", window)
        self.dock.setObjectName("chatsDock")
        self.dock.setWidget(self.sidebar)
        self.dock.setTitleBarWidget(QWidget())  # the sidebar has its own heading; Ctrl+B hides it
        self.dock.setFeatures(QDockWidget.DockWidgetFeature.DockWidgetClosable)
        self.dock.setAllowedAreas(Qt.DockWidgetArea.LeftDockWidgetArea)
        window.addDockWidget(Qt.DockWidgetArea.LeftDockWidgetArea, self.dock)
        window.resizeDocks([self.dock], [window.fontMetrics().averageCharWidth() * 40], Qt.Orientation.Horizontal)

    def set_open(self, conversation_ids: list[str]) -> None:
        """Mark the chats open in a pane."""
        if self.sidebar is not None:
            self.sidebar.set_open(conversation_ids)

    def open(self, conversation_id: str) -> None:
        """Show a saved conversation: focus its pane when it is open, else open it in a new pane."""
        window = self._window
        for view in window.panes.values():
            if view.pane.conversation.id == conversation_id:
                window.set_current_pane(view.pane_id)
                view.setFocus()
                return
        if self._session is None:
            return
        try:
            conversation = self._session.load_conversation(conversation_id)
            pane = window.workspace.open_conversation(conversation, after=window.current_pane_id)
        except Exception as exc:
            window.report_error("Opening the chat", exc)
            return
        view = window.panes.get(pane.id)
        if view is not None:  # a chat imported earlier is saved without kept ids
            count_tokens_of_text(window, view)
        window.set_current_pane(pane.id)
        window.apply_engine_state(window.workspace.pane_model_state(pane.id), None, None)

    def changed(self) -> None:
        """Refresh the sidebar once the writes queued so far are in the store:
        a marker job behind them posts the refresh back to this thread. A
        marker that finds a refresh already posted (and not yet run) posts
        none: that refresh reads the store after this marker's writes too."""
        if self.sidebar is None or self._session is None or self._window.shutdown_started:
            return
        loop = asyncio.get_event_loop()

        def written(_store: ChatStore) -> None:  # on the writer thread
            if self._refresh_pending:
                return
            self._refresh_pending = True
            try:
                loop.call_soon_threadsafe(self._refresh)
            except RuntimeError:  # the loop has closed
                pass

        self._session.writer.submit(written)

    def _refresh(self) -> None:
        self._refresh_pending = False  # before reading: a later marker posts again
        if self.sidebar is None or self._window.shut_down:
            return
        if self.sidebar.list.state() == QAbstractItemView.State.EditingState:
            QTimer.singleShot(1000, self.changed)  # not under a rename being typed
            return
        self.sidebar.refresh()

    def search(self) -> None:
        if self.sidebar is None or self.dock is None:
            return
        self.dock.show()
        self.sidebar.focus_search()

    def _renamed(self, conversation_id: str, title: str) -> None:
        for view in self._window.panes.values():
            if view.pane.conversation.id == conversation_id:
                view.pane.conversation.title = title
                view.refresh_header()

    def _deleted(self, conversation_id: str) -> None:
        """A deleted chat leaves its pane (the last pane starts a new chat instead);
        Undo brings the pane back where it was (`_restored`)."""
        window = self._window
        workspace = window.workspace
        if self.sidebar is not None:  # panes whose Undo is over are not coming back
            pending = set(self.sidebar.undo_pending)
            self._closed = {cid: closed for cid, closed in self._closed.items() if cid in pending}
        for view in list(window.panes.values()):
            if view.pane.conversation.id != conversation_id:
                continue
            pane = view.pane
            closed = _ClosedPane(
                conversation=pane.conversation,
                position=workspace.panes.index(pane),
                name=pane.name,
                remote=pane.remote.copy() if pane.remote is not None else None,
                current=window.current_pane_id == pane.id,
            )
            workspace.stop(view.pane_id)
            if len(window.panes) > 1:
                window.close_pane_now(view.pane_id)
            else:
                fresh = workspace.add_pane()
                closed.replaced_by = fresh.id
                window.close_pane_now(view.pane_id)
                window.set_current_pane(fresh.id)
            if pane not in workspace.panes:
                self._closed[conversation_id] = closed

    def _restored(self, conversation_id: str) -> None:
        """Undo of a delete: the chat's pane comes back where it was, with its
        model or server; a new empty pane that stood in for it goes."""
        closed = self._closed.pop(conversation_id, None)
        window = self._window
        workspace = window.workspace
        if closed is None or window.shutdown_started:
            return
        if any(p.conversation.id == conversation_id for p in workspace.panes):
            return
        try:
            position = min(closed.position, len(workspace.panes))
            after = workspace.panes[position - 1].id if position > 0 else None
            pane = workspace.open_conversation(
                closed.conversation, after=after, title=closed.name or None, remote=closed.remote
            )
            if position == 0:
                workspace.move_pane(pane.id, 0)
            stand_in = next((p for p in workspace.panes if p.id == closed.replaced_by), None)
            if stand_in is not None and not stand_in.conversation.messages and not stand_in.busy:
                workspace.close_pane(stand_in.id)
        except Exception as exc:
            window.report_error("Bringing the chat's pane back", exc)
            return
        if closed.current or window.current_pane_id is None:
            window.set_current_pane(pane.id)
        window.apply_engine_state(workspace.pane_model_state(pane.id), None, None)
