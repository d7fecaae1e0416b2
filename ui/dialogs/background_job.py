"""Work on a daemon thread whose progress and outcome are pushed to the GUI thread.

The dialogs' long jobs (a GGUF import, a Hugging Face search or download)
run on a thread that never touches Qt. Each report is handed to the GUI
thread through the window's event loop (`loop.call_soon_threadsafe`; in
ui/event_loop.py that writes a byte to a socket whose notifier wakes the
GUI thread), the one hand-off the app uses for every thread: emitting a Qt
signal from a plain Python thread has crashed PySide6 6.8+. Nothing polls.

Progress is coalesced: while one report waits for the GUI thread, a newer
one replaces it, so a fast download queues at most one callback at a time.
Once the job has ended, or its owner widget has been deleted, no callback
runs.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import shiboken6
from PySide6.QtCore import QObject

P = TypeVar("P")

_NOTHING = object()


def gui_loop() -> asyncio.AbstractEventLoop:
    """The event loop of the GUI thread, called from the GUI thread."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # outside the loop's callbacks (a dialog built before it runs, a test)
        return asyncio.get_event_loop_policy().get_event_loop()


class BackgroundJob(Generic[P]):
    """`work(report)` on a daemon thread named tandem-`name`; on the GUI thread,
    `on_progress(p)` for what it reports and `on_done(result, error)` once."""

    def __init__(
        self,
        owner: QObject,
        name: str,
        work: Callable[[Callable[[P], None]], Any],
        on_done: Callable[[Any, BaseException | None], None],
        on_progress: Callable[[P], None] | None = None,
    ) -> None:
        self._owner = owner
        self._work = work
        self._on_done = on_done
        self._on_progress = on_progress
        self._loop = gui_loop()
        self._lock = threading.Lock()
        self._pending: Any = _NOTHING  # the newest report the GUI thread has not shown yet
        self.finished = False
        self.thread = threading.Thread(target=self._run, name=f"tandem-{name}", daemon=True)

    def start(self) -> BackgroundJob[P]:
        self.thread.start()
        return self

    def join(self, timeout: float) -> bool:
        """Wait for the thread to end (tests, shutdown); whether it has."""
        self.thread.join(timeout)
        return not self.thread.is_alive()

    # -- on the worker thread ----------------------------------------------------------

    def _run(self) -> None:
        try:
            result = self._work(self._report)
        except BaseException as exc:  # reported on the GUI thread
            self._post(self._finish, None, exc)
        else:
            self._post(self._finish, result, None)

    def _report(self, progress: P) -> None:
        with self._lock:
            queued = self._pending is not _NOTHING
            self._pending = progress
        if not queued:
            self._post(self._show_progress)

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop has closed: the app is ending
            pass

    # -- on the GUI thread -------------------------------------------------------------

    def _alive(self) -> bool:
        return not self.finished and shiboken6.isValid(self._owner)

    def _show_progress(self) -> None:
        with self._lock:
            progress, self._pending = self._pending, _NOTHING
        if progress is not _NOTHING and self._on_progress is not None and self._alive():
            self._on_progress(progress)

    def _finish(self, result: Any, error: BaseException | None) -> None:
        if not self._alive():
            return
        self.finished = True
        self._on_done(result, error)
