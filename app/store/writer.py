"""The chat store's writer: one background thread that does every write.

The GUI thread never waits for the disk: it takes a snapshot of what to
save (plain records, copied in microseconds) and queues it; the writer
thread, which owns its own connection to the store, writes the snapshots
in order. The snapshot matters: the writer must never read a Conversation
the GUI thread is still appending a reply to.

A failed write (disk full, read-only folder, locked file) is reported
through `on_error` and the writer carries on: a full disk is usually
temporary, and the next write for the same conversation saves all of it,
so what failed is caught up as soon as the disk has room again.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from app.store.chat_store import ChatStore
from app.store.errors import StoreError
from app.store.records import HeaderRecord, MessageRecord, PaneLayout, header_record, message_record, message_records

if TYPE_CHECKING:
    from app.workspace.conversation import Conversation

_log = logging.getLogger(__name__)

ErrorCallback = Callable[[StoreError], None]


@dataclass(slots=True)
class _Job:
    fn: Callable[[ChatStore], object]
    # The conversation the job writes, if any: a failure marks it as needing
    # a full save, which the next write for it does instead.
    conversation_id: str | None = None
    full_save: bool = False


@dataclass(slots=True)
class _Flush:
    done: threading.Event


_STOP = object()


class StoreWriter:
    """Writes to the chat store at `store_path` on a thread of its own.

    `submit(fn)` queues fn(store) and returns at once. The save_* methods
    snapshot a conversation on the calling thread and queue its write;
    use them from the thread that owns the conversation.

    `on_error(StoreError)` is called on the writer thread (post it to the
    GUI loop from there). The same error is reported once, not once a
    write, until a write succeeds again.
    """

    def __init__(self, store_path: str | os.PathLike[str] | None = None, on_error: ErrorCallback | None = None) -> None:
        self.path = Path(store_path) if store_path is not None else None
        self._on_error = on_error
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._dirty: set[str] = set()  # conversations whose last write failed
        self._last_error: str | None = None
        self._failures = 0
        self._thread = threading.Thread(target=self._run, name="tandem-store-writer", daemon=True)
        self._thread.start()

    # -- the caller's side -----------------------------------------------------

    def submit(self, fn: Callable[[ChatStore], object]) -> bool:
        """Queue fn(store) for the writer thread; False (nothing queued) once the writer is closed."""
        return self._put(_Job(fn))

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything queued so far was written (or failed); False on timeout."""
        done = threading.Event()
        if not self._put(_Flush(done)):
            return not self._thread.is_alive()
        return done.wait(timeout)

    def close(self, timeout: float | None = 10.0) -> bool:
        """Write what is queued, then close the connection and end the thread; False if it did not end in time."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._queue.put(_STOP)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def failures(self) -> int:
        """How many jobs failed so far (for tests and diagnostics)."""
        return self._failures

    def needs_full_save(self, conversation_id: str) -> bool:
        with self._lock:
            return conversation_id in self._dirty

    def _put(self, item: object) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._queue.put(item)
            return True

    # -- snapshots of a conversation ------------------------------------------

    def save_conversation(self, conversation: Conversation) -> bool:
        """The whole conversation (header and every message) in one transaction."""
        return self._put_full(conversation)

    def save_message(self, conversation: Conversation, index: int) -> bool:
        """Message `index` with the conversation's header, in one transaction.

        For a streaming reply's checkpoints and for a finished or stopped
        reply (whose kept ids and turn mark the header carries). The header
        makes each write whole on its own: the first one creates the
        conversation's row.
        """
        if self.needs_full_save(conversation.id):
            return self._put_full(conversation)
        marks = conversation.turn_marks
        header = header_record(conversation)
        record = message_record(conversation.messages[index], index, marks[index] if index < len(marks) else None)
        return self._put(_Job(lambda store: store.write_reply(header, record), conversation.id))

    def save_header(self, conversation: Conversation) -> bool:
        """Title, system prompt, sampling, model, policy and kept ids."""
        if self.needs_full_save(conversation.id):
            return self._put_full(conversation)
        header = header_record(conversation)
        return self._put(_Job(lambda store: store.write_header(header), conversation.id))

    def truncate(self, conversation: Conversation) -> bool:
        """After Conversation.truncate: drop the stored messages past its end, and save its kept ids."""
        if self.needs_full_save(conversation.id):
            return self._put_full(conversation)
        header = header_record(conversation)
        length = len(conversation.messages)
        return self._put(_Job(lambda store: store.truncate(header.id, length, header=header), conversation.id))

    def rename(self, conversation_id: str, title: str) -> bool:
        return self.submit(lambda store: store.rename(conversation_id, title))

    def delete(self, conversation_id: str) -> bool:
        return self.submit(lambda store: store.delete(conversation_id))

    def undelete(self, conversation_id: str) -> bool:
        return self.submit(lambda store: store.undelete(conversation_id))

    def save_layout(self, panes: Sequence[PaneLayout]) -> bool:
        panes = list(panes)
        return self.submit(lambda store: store.save_layout(panes))

    def mark_session_start(self) -> bool:
        return self.submit(lambda store: store.mark_session_start())

    def mark_clean_exit(self) -> bool:
        return self.submit(lambda store: store.mark_clean_exit())

    def _put_full(self, conversation: Conversation) -> bool:
        header: HeaderRecord = header_record(conversation)
        records: list[MessageRecord] = message_records(conversation)
        return self._put(
            _Job(lambda store: store.write_conversation(header, records), conversation.id, full_save=True)
        )

    # -- the writer thread ------------------------------------------------------

    def _run(self) -> None:
        store: ChatStore | None = None
        try:
            while True:
                item = self._queue.get()
                if item is _STOP:
                    return
                if isinstance(item, _Flush):
                    item.done.set()
                    continue
                assert isinstance(item, _Job)
                try:
                    if store is None:
                        # Opened here so the connection belongs to this thread;
                        # retried at the next job after a failure. Never moves a
                        # file aside: the app's own open did any recovering.
                        store = ChatStore.open(self.path, recover=False)
                    item.fn(store)
                except StoreError as exc:
                    self._failed(item, exc)
                except Exception as exc:  # a bug in a job must not end the writer
                    _log.exception("chat store write failed")
                    message = f"Saving a chat failed unexpectedly ({exc!r}); your chats are still open."
                    self._failed(item, StoreError(message))
                else:
                    self._succeeded(item)
        finally:
            if store is not None:
                store.close()

    def _succeeded(self, job: _Job) -> None:
        with self._lock:
            self._last_error = None
            if job.conversation_id is not None and job.full_save:
                self._dirty.discard(job.conversation_id)

    def _failed(self, job: _Job, error: StoreError) -> None:
        with self._lock:
            self._failures += 1
            if job.conversation_id is not None:
                self._dirty.add(job.conversation_id)
            repeat = self._last_error == str(error)
            self._last_error = str(error)
        if repeat or self._on_error is None:
            _log.warning("chat store: %s", error)
            return
        try:
            self._on_error(error)
        except Exception:
            _log.exception("chat store error callback failed")
