"""Opening the engine from the command line's options, with its loading
progress on stderr (`generate`, `chat` and `serve` all open it this way)."""

from __future__ import annotations

import argparse
import shutil
import sys
from typing import Any, TextIO

from engine.config import EngineConfig
from engine.errors import EngineError, MaxContextTooLargeError
from engine.entrypoints.cli.options import engine_kwargs, max_context_in_flags


class ProgressPrinter:
    """Shows the engine's loading progress (engine.progress.LoadProgress) on a stream.

    On a terminal: one line rewritten in place (percentage first, cut to the
    terminal's width so that it never wraps), cleared once the model is
    ready. Elsewhere (a log, a pipe): a line when the GGUF import starts and
    one when it ends, since only the import is slow enough to need saying;
    the other stages stay quiet so that scripts get a clean stderr. Called
    from the engine's loading thread while the caller waits.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._tty = bool(getattr(stream, "isatty", lambda: False)())
        self._stage: str | None = None
        self._shown = ""

    def __call__(self, progress: Any) -> None:
        if self._tty:
            self._update_line(progress)
        elif progress.stage != self._stage:
            if progress.stage == "import":
                self._write(f"{progress.detail}...\n")
            elif self._stage == "import":
                self._write("Import done.\n")
        self._stage = progress.stage

    def _update_line(self, progress: Any) -> None:
        if progress.stage == "ready":
            if self._shown:
                self._write("\r\x1b[K")
                self._shown = ""
            return
        percent = 100 * progress.done // progress.total if progress.total else 100
        width = shutil.get_terminal_size().columns - 1
        line = f"{percent:3d}% {progress.detail}"[:width]
        if line != self._shown:
            self._write(f"\r\x1b[K{line}")
            self._shown = line

    def finish(self) -> None:
        """End a progress line left open (loading failed or was interrupted)."""
        if self._shown:
            self._write("\n")
            self._shown = ""

    def _write(self, text: str) -> None:
        self._stream.write(text)
        self._stream.flush()


def open_engine(args: argparse.Namespace) -> Any:
    """The Engine for the engine options in `args` (engine.config's flags),
    showing its loading progress on stderr."""
    options = engine_kwargs(args)  # checked before torch is imported
    model = options.pop("model", EngineConfig().model)
    from engine.llm import Engine  # heavy import (torch) after argument errors

    progress = ProgressPrinter(sys.stderr)
    try:
        # Only the options given: the engine's own defaults for the others.
        return Engine(model, **options, on_progress=progress)
    except MaxContextTooLargeError as exc:
        raise EngineError(max_context_in_flags(exc)) from exc
    finally:
        progress.finish()
