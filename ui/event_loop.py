"""The asyncio loop the window runs on: qasync's, with a hand-off from other
threads that never touches Qt off the GUI thread.

qasync's `call_soon_threadsafe` emits a Qt signal from the calling thread.
The engine thread calls it after every step (engine/core/batch.py), and the
model loader and the HTTP server's threads call it too; emitting Qt signals
from plain Python threads has crashed PySide6 6.8+, and our full test runs
died with a segfault on the GUI thread a few times in ten while replies
streamed. Here another thread only appends to a deque and writes one byte
to a socket; a socket notifier on the GUI thread (qasync's `add_reader`)
wakes the loop, which runs the queued callbacks. It is the self-pipe trick
asyncio's own loops use for the same call.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import socket
import threading
from typing import Any

import qasync


class TandemEventLoop(qasync.QEventLoop):
    def __init__(self, app: Any = None, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._handoff: collections.deque[asyncio.Handle] = collections.deque()
        self._handoff_lock = threading.Lock()
        self._wake_pending = False
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._wake_write.setblocking(False)
        self.add_reader(self._wake_read.fileno(), self._run_handed_off)

    def call_soon_threadsafe(
        self, callback: Any, *args: Any, context: contextvars.Context | None = None
    ) -> asyncio.Handle:
        handle = asyncio.Handle(callback, args, self, context)
        with self._handoff_lock:
            self._handoff.append(handle)
            if self._wake_pending:
                return handle  # one byte per batch of callbacks is enough
            self._wake_pending = True
        try:
            self._wake_write.send(b"\0")
        except (BlockingIOError, InterruptedError):
            pass  # the socket is full of wake-ups already
        except OSError:
            pass  # closed: the loop is gone and nothing will run the callback
        return handle

    def _run_handed_off(self) -> None:
        try:
            while self._wake_read.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        with self._handoff_lock:
            handles = list(self._handoff)
            self._handoff.clear()
            self._wake_pending = False
        for handle in handles:
            if not handle.cancelled():
                handle._run()

    def close(self) -> None:
        if not self.is_closed():
            self.remove_reader(self._wake_read.fileno())
            self._wake_read.close()
            self._wake_write.close()
        super().close()
