"""Progress and cancellation of loading a model.

Loading has up to four stages, reported in this order: "import" (a GGUF file
turned into a checkpoint folder, first use only), "weights" (reading and
placing the weights on the device), "warmup" (one small forward, so the first
request does not pay for kernel set-up) and "ready". Within a stage `done`
never decreases and ends equal to `total`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.errors import LoadCancelled

log = logging.getLogger(__name__)

STAGES = ("import", "weights", "warmup", "ready")


@dataclass(slots=True, frozen=True)
class LoadProgress:
    stage: str  # "import" | "weights" | "warmup" | "ready"
    done: int
    total: int
    detail: str  # human text for a progress dialog

    @property
    def fraction(self) -> float:
        """done / total within the stage, 1.0 for an empty stage."""
        return self.done / self.total if self.total else 1.0


ProgressCallback = Callable[[LoadProgress], None]


class LoadReporter:
    """Calls the caller's progress callback and checks for cancellation.

    Every report is also a cancellation point, so the loops that report
    progress are exactly the ones a cancel can stop.
    """

    __slots__ = ("_callback", "_cancel", "_stop")

    def __init__(
        self,
        on_progress: ProgressCallback | None = None,
        cancel: threading.Event | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        self._callback = on_progress
        self._cancel = cancel
        # Set by the engine itself (process exit) rather than by the caller.
        self._stop = stop

    @property
    def cancelled(self) -> bool:
        return bool(
            (self._cancel is not None and self._cancel.is_set())
            or (self._stop is not None and self._stop.is_set())
        )

    def check(self) -> None:
        """Raise LoadCancelled if the caller asked to cancel."""
        if self.cancelled:
            raise LoadCancelled("Loading the model was cancelled")

    def report(self, stage: str, done: int, total: int, detail: str) -> None:
        self.check()
        if self._callback is not None:
            try:
                self._callback(LoadProgress(stage, done, total, detail))
            except Exception:  # a progress bar's bug must not fail the load
                log.exception("load progress callback failed")
        self.check()


def as_reporter(
    on_progress: ProgressCallback | LoadReporter | None, cancel: threading.Event | None
) -> LoadReporter:
    if isinstance(on_progress, LoadReporter):
        return on_progress
    return LoadReporter(on_progress, cancel)


def format_bytes(size: int) -> str:
    """1536 -> '1.5 KB', 98_000_000 -> '98 MB' (decimal units, as file managers show)."""
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000:
            break
        value /= 1000
    else:
        unit = "TB"
    return f"{value:.0f} {unit}" if value >= 10 or unit == "B" else f"{value:.1f} {unit}"


def display_path(path: Path) -> str:
    """A path as a person reads it: the home folder shown as ~."""
    try:
        return "~/" + path.relative_to(Path.home()).as_posix()
    except ValueError:
        return str(path)
