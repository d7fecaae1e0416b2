"""One run of the app against its chat store: open, restore, record, end.

`ChatSession.open()` opens the store (a damaged file is kept aside and a new
one started, which `warning` says), learns whether the previous run ended
cleanly, and marks this run as started. `restore(workspace)` reopens the
panes that were open, with their conversations. `close()` (after the
workspace has shut down, so every reply has had its final save queued)
writes the layout, marks the run as ended cleanly and waits for the writer.

A crash (or a kill) never reaches `close()`: the next `open()` then reports
`crashed_last_time`, and the replies that were streaming come back
"interrupted" with the text of their last checkpoint.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from app.store.recorder import ChatRecorder, post_errors
from app.store.chat_store import ChatStore
from app.store.errors import StoreError, UnknownConversationError
from app.workspace.conversation import Conversation
from app.remote.remote_pane import RemoteBackend
from app.store.writer import StoreWriter
from app.workspace.workspace import Pane, Workspace

log = logging.getLogger(__name__)


class ChatSession:
    """The store (read on the loop's thread), its writer thread, and the recorder once attached."""

    def __init__(self, store: ChatStore, writer: StoreWriter) -> None:
        self.store = store
        self.writer = writer
        self.recorder: ChatRecorder | None = None
        self.crashed_last_time = store.crashed_last_time
        self.warning = store.open_warning
        self._error_listeners: list[Callable[[StoreError], None]] = []
        self._closed = False

    @classmethod
    def open(cls, path: str | Path | None = None) -> ChatSession:
        """Open the store and start the writer; raises StoreError when the store cannot be used at all."""
        store = ChatStore.open(path)
        loop = asyncio.get_event_loop()
        session: ChatSession
        writer = StoreWriter(store.path, on_error=post_errors(loop, lambda error: session._report(error)))
        session = cls(store, writer)
        writer.mark_session_start()
        # Chats deleted last time (their undo is over) and panes closed unused.
        writer.submit(lambda store: store.purge_deleted())
        writer.submit(lambda store: store.purge_empty())
        return session

    # -- errors -------------------------------------------------------------------

    def on_error(self, listener: Callable[[StoreError], None]) -> None:
        """Call `listener(error)` on the loop's thread when a write fails."""
        self._error_listeners.append(listener)

    def _report(self, error: StoreError) -> None:
        log.warning("chat store: %s", error)
        for listener in list(self._error_listeners):
            try:
                listener(error)
            except Exception:
                log.exception("chat store error listener failed")

    # -- restoring and recording ---------------------------------------------------------

    def restore(self, workspace: Workspace, *, default_panes: int = 2) -> list[Pane]:
        """Reopen the panes of the last run (or `default_panes` new ones when
        there were none), then start recording. Returns the panes opened."""
        panes: list[Pane] = []
        try:
            layout = self.store.load_layout()
        except StoreError as exc:
            self._report(exc)
            layout = []
        for entry in layout:
            conversation = self._load(entry.conversation_id)
            if conversation is None:
                continue
            remote = None
            if entry.remote_base_url and entry.remote_model:
                try:
                    remote = RemoteBackend.create(
                        entry.remote_base_url, entry.remote_model, entry.remote_api_key, key_id=entry.remote_key_id
                    )
                except ValueError as exc:
                    log.warning("a saved remote pane's server is not usable: %s", exc)
            if remote is not None:
                conversation.model_id = remote.model
            panes.append(workspace.open_conversation(conversation, title=entry.title or None, remote=remote))
        if not panes:
            panes = [workspace.add_pane() for _ in range(default_panes)]
        self.recorder = ChatRecorder(workspace, self.writer)
        return panes

    def _load(self, conversation_id: str) -> Conversation | None:
        try:
            if self.store.is_deleted(conversation_id):
                return None
            return self.store.load_conversation(conversation_id)
        except UnknownConversationError:
            return None
        except StoreError as exc:
            self._report(exc)
            return None

    def load_conversation(self, conversation_id: str) -> Conversation:
        return self.store.load_conversation(conversation_id)

    # -- ending ---------------------------------------------------------------------------

    def close(self, timeout: float = 5.0) -> bool:
        """Save the layout, mark a clean exit, and wait (up to `timeout`) for
        the writer to finish. Blocks: `aclose` is the loop-friendly twin."""
        if not self._begin_close():
            return True
        done = self.writer.close(timeout)
        self.store.close()
        return done

    async def aclose(self, timeout: float = 5.0) -> bool:
        """`close` without blocking the loop while the writer finishes."""
        if not self._begin_close():
            return True
        done = await asyncio.to_thread(self.writer.close, timeout)
        self.store.close()  # on this thread: the connection belongs to it
        return done

    def _begin_close(self) -> bool:
        if self._closed:
            return False
        self._closed = True
        if self.recorder is not None:
            self.recorder.save_layout_now()
            self.recorder.detach()
        self.writer.mark_clean_exit()
        return True
