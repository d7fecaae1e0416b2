"""Keeps the chat store in step with the workspace, without ever waiting for the disk.

The recorder listens to the workspace's events on the loop's thread and
queues snapshots for the store's writer thread (app.store.writer):

- a message that was added, and a reply when it ends (complete, stopped or
  failed), each in one transaction together with the conversation's header
  (title, parameters, kept token ids);
- a streaming reply every `checkpoint_interval` seconds while it grows
  (the first time after half a second), so a crash loses at most that much of it (the next start shows it as
  "interrupted" with what the last checkpoint had);
- another version of a reply shown (its turn's messages and kept ids
  change): the whole conversation;
- the pane layout (which conversations are open, in which order, on which
  server) whenever it changes, coalesced to one write per loop turn.

Write failures (a full disk, a read-only folder) come back through
`on_error` on the loop's thread; nothing in memory is lost by them, and the
writer catches up with a full save of each affected conversation at its
next write.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from app import events as ev
from app.store.errors import StoreError
from app.store.records import PaneLayout
from app.store.writer import StoreWriter

if TYPE_CHECKING:
    from app.workspace.conversation import Conversation
    from app.workspace.workspace import Pane, Workspace

log = logging.getLogger(__name__)

CHECKPOINT_INTERVAL_S = 2.0
# A reply's first checkpoint comes sooner: the first seconds of a reply are
# the ones a crash at start-up (a model that fails on its first tokens) takes.
FIRST_CHECKPOINT_S = 0.5


class ChatRecorder:
    """Records one workspace into the store that `writer` writes to.

    Create it, and call every method, on the loop's thread.
    """

    def __init__(
        self,
        workspace: Workspace,
        writer: StoreWriter,
        *,
        checkpoint_interval: float = CHECKPOINT_INTERVAL_S,
    ) -> None:
        self.workspace = workspace
        self.writer = writer
        self.checkpoint_interval = checkpoint_interval
        self._loop = asyncio.get_event_loop()
        self._streaming: dict[str, int] = {}  # conversation id -> index of its streaming reply
        self._grown: set[str] = set()  # streaming replies with text the store does not have yet
        self._timer: asyncio.Handle | None = None
        self._timer_due = 0.0
        self._layout_pending = False
        self._unsubscribe: Callable[[], None] | None = workspace.subscribe(self._on_event)

    # -- what the workspace reports -------------------------------------------------

    def _on_event(self, event: ev.WorkspaceEvent) -> None:
        if isinstance(event, ev.ReplyDelta):
            conversation = self._conversation(event.pane_id)
            if conversation is not None:
                self._grown.add(conversation.id)
            return
        if isinstance(event, ev.MessageAppended):
            conversation = self._conversation(event.pane_id)
            if conversation is None:
                return
            if event.index == len(conversation.messages) - 1:
                self.writer.save_message(conversation, event.index)
            else:  # inserted before others (a notice): positions moved
                self.writer.save_conversation(conversation)
            if conversation.streaming_index == event.index:
                self._streaming[conversation.id] = event.index
                self._arm(min(FIRST_CHECKPOINT_S, self.checkpoint_interval))
        elif isinstance(event, ev.ReplyFinished):
            conversation = self._conversation(event.pane_id)
            if conversation is None:
                return
            self._streaming.pop(conversation.id, None)
            self._grown.discard(conversation.id)
            self.writer.save_message(conversation, event.index)
        elif isinstance(event, ev.MessagesTruncated):
            conversation = self._conversation(event.pane_id)
            if conversation is None:
                return
            if len(conversation.messages) == event.length:
                self.writer.truncate(conversation)
            else:  # messages were inserted, not cut: save them all in their new places
                self.writer.save_conversation(conversation)
        elif isinstance(event, ev.ReplyVersionShown):
            # Another version: the messages from its turn on, their kept ids and the versions all changed.
            conversation = self._conversation(event.pane_id)
            if conversation is not None:
                self.writer.save_conversation(conversation)
        elif isinstance(event, ev.PaneUpdated):
            conversation = self._conversation(event.pane_id)
            if conversation is not None and not conversation.streaming:
                self.writer.save_header(conversation)
            self._layout_changed()
        elif isinstance(event, ev.PaneAdded):
            conversation = event.pane.conversation
            if conversation.messages:
                self.writer.save_conversation(conversation)
            else:
                self.writer.save_header(conversation)
            self._layout_changed()
        elif isinstance(event, (ev.PaneClosed, ev.PanesReordered)):
            self._layout_changed()

    def _conversation(self, pane_id: int) -> Conversation | None:
        for pane in self.workspace.panes:
            if pane.id == pane_id:
                return pane.conversation
        return None

    # -- checkpoints -------------------------------------------------------------------

    def _arm(self, delay: float | None = None) -> None:
        delay = self.checkpoint_interval if delay is None else delay
        due = self._loop.time() + delay
        if self._timer is not None and self._timer_due > due:
            self._timer.cancel()  # a new reply wants its first checkpoint sooner
            self._timer = None
        if self._timer is None and self._streaming:
            self._timer = self._loop.call_later(delay, self._checkpoint)
            self._timer_due = due

    def _checkpoint(self) -> None:
        """Save every streaming reply that grew since its last save."""
        self._timer = None
        by_id = {pane.conversation.id: pane.conversation for pane in self.workspace.panes}
        for conversation_id, index in list(self._streaming.items()):
            conversation = by_id.get(conversation_id)
            if conversation is None or conversation.streaming_index != index:
                self._streaming.pop(conversation_id, None)
                continue
            if conversation_id in self._grown:
                self._grown.discard(conversation_id)
                self.writer.save_message(conversation, index)
        self._arm()

    def checkpoint_now(self) -> None:
        """Save the streaming replies' text at once (tests; before a risky step)."""
        if self._timer is not None:
            self._timer.cancel()
        self._checkpoint()

    # -- the layout --------------------------------------------------------------------

    def _layout_changed(self) -> None:
        if not self._layout_pending:
            self._layout_pending = True
            self._loop.call_soon(self._save_layout)

    def _save_layout(self) -> None:
        self._layout_pending = False
        self.writer.save_layout(layout_of(self.workspace.panes))

    def save_layout_now(self) -> None:
        self.writer.save_layout(layout_of(self.workspace.panes))

    # -- ending --------------------------------------------------------------------------

    def detach(self) -> None:
        """Stop listening (the last replies' final saves must have been queued already)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None


def layout_of(panes: list[Pane]) -> list[PaneLayout]:
    """The panes as the store keeps them, left to right."""
    out = []
    for pane in panes:
        remote = pane.remote
        out.append(
            PaneLayout(
                conversation_id=pane.conversation.id,
                title=pane.title,
                remote_base_url=remote.base_url if remote is not None else None,
                remote_model=remote.model if remote is not None else None,
                remote_api_key=remote.api_key if remote is not None else None,
                remote_key_id=remote.key_id if remote is not None else None,
            )
        )
    return out


def post_errors(loop: asyncio.AbstractEventLoop, report: Callable[[StoreError], None]) -> Callable[[StoreError], None]:
    """A writer `on_error` that hands each error to `report` on the loop's thread."""

    def on_error(error: StoreError) -> None:
        try:
            loop.call_soon_threadsafe(report, error)
        except RuntimeError:  # the loop has closed: the program is ending
            log.warning("chat store: %s", error)

    return on_error
