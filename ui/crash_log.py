"""Unexpected errors in the running app: a crash report the user can find, and a dialog.

Errors a user can act on (a model that will not load, a full disk) are
AppErrors, and the window shows them where they happen. This module is for
the rest, the bugs: an exception that escapes a Qt slot, an asyncio
callback or task, or a background thread. Each one

- is written to a crash report, `crash-<time>-<pid>.log` in the log folder
  (platformdirs' user log folder for "Tandem", `$TANDEM_LOG_DIR` overrides
  it), with the traceback and the versions that matter; the newest
  `KEEP_REPORTS` reports are kept;
- is shown in a dialog that names that file (on the GUI thread, without
  blocking the loop), and the app keeps running, as Qt and asyncio
  let it after such an error; one line on stderr names the file too.

Native crashes (a segfault in Qt or torch) never reach Python's hooks:
faulthandler writes the Python stacks of every thread to this run's
`fatal-<time>-<pid>.log`, which a clean exit deletes while it is still empty.

`install()` is for the `tandem` program only (ui.main.run): it replaces
process-wide hooks, which tests and embedding code must keep.
"""

from __future__ import annotations

import asyncio
import faulthandler
import html
import logging
import logging.handlers
import os
import platform
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import platformdirs

log = logging.getLogger(__name__)

KEEP_REPORTS = 10
APP_LOG_NAME = "tandem.log"
APP_LOG_BYTES = 1_000_000
APP_LOG_BACKUPS = 2

_lock = threading.Lock()
_stderr_lock = threading.Lock()
_installed = False
_fatal_file: IO[str] | None = None
_fatal_path: Path | None = None
_post_to_gui: Callable[[Callable[[], None]], None] | None = None
_dialog: Any = None  # the crash dialog on screen, if any: one at a time


def log_dir() -> Path:
    """Where crash reports and the app's warning log go."""
    override = os.environ.get("TANDEM_LOG_DIR")
    if override:
        return Path(override).expanduser().absolute()
    return Path(platformdirs.user_log_dir("Tandem", appauthor=False))


def _version() -> str:
    try:
        from importlib import metadata

        return metadata.version("tandem")
    except Exception:  # PackageNotFoundError, or metadata that does not parse
        return "unknown"


def _environment() -> str:
    """The facts a bug report needs first, without importing anything new."""
    lines = [
        f"Tandem {_version()}" + (" (installed bundle)" if getattr(sys, "frozen", False) else ""),
        f"Python {platform.python_version()} on {platform.platform()}",
    ]
    torch = sys.modules.get("torch")
    if torch is not None:
        lines.append(f"torch {getattr(torch, '__version__', '?')} (CUDA {getattr(torch.version, 'cuda', None)})")
    qtcore = sys.modules.get("PySide6.QtCore")
    if qtcore is not None:
        lines.append(f"Qt {qtcore.qVersion()}, PySide6 {getattr(sys.modules.get('PySide6'), '__version__', '?')}")
    lines.append(f"command line: {' '.join(sys.argv)}")
    return "\n".join(lines)


def _new_report_path(folder: Path, kind: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for attempt in range(1000):
        suffix = f"-{attempt}" if attempt else ""
        path = folder / f"{kind}-{stamp}-{os.getpid()}{suffix}.log"
        if not path.exists():
            return path
    return folder / f"{kind}-{stamp}-{os.getpid()}-{time.monotonic_ns()}.log"


def _prune(folder: Path) -> None:
    """Keep the newest KEEP_REPORTS crash reports (fatal logs count too)."""
    reports = []
    for path in folder.glob("*.log"):
        if not path.name.startswith(("crash-", "fatal-")) or path == _fatal_path:
            continue
        try:
            reports.append((path.stat().st_mtime, path.name, path))
        except OSError:
            continue
    reports.sort(reverse=True)
    for _, _, path in reports[KEEP_REPORTS:]:
        try:
            path.unlink()
        except OSError:
            pass


def write_report(
    exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None, *, where: str
) -> Path | None:
    """Write one crash report; its path, or None when the folder cannot be written
    (the report then goes to stderr only: a crash handler must not raise)."""
    text = (
        f"Tandem hit an unexpected error in {where}, {time.strftime('%Y-%m-%d %H:%M:%S %z')}.\n\n"
        f"{_environment()}\n\n" + "".join(traceback.format_exception(exc_type, exc, tb))
    )
    folder = log_dir()
    try:
        with _lock:
            folder.mkdir(parents=True, exist_ok=True)
            path = _new_report_path(folder, "crash")
            path.write_text(text, encoding="utf-8")
            _prune(folder)
        return path
    except OSError as problem:
        print(f"Tandem could not write a crash report to {folder}: {problem}\n{text}", file=sys.stderr)
        return None


def _summary(exc: BaseException) -> str:
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def report(
    exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None, *, where: str
) -> Path | None:
    """Record an unexpected error and tell the user: the crash report, one
    line on stderr, and the dialog (posted to the GUI thread when called from another)."""
    path = write_report(exc_type, exc, tb, where=where)
    summary = _summary(exc)
    where_saved = f"details saved to {path}" if path else "no crash report could be written"
    # One write under a lock: print() writes the text and the newline apart,
    # so two threads reporting at once would run their lines together.
    with _stderr_lock:
        sys.stderr.write(f"Tandem: unexpected error in {where}: {summary} ({where_saved})\n")
        sys.stderr.flush()
    details = "".join(traceback.format_exception(exc_type, exc, tb))
    if threading.current_thread() is threading.main_thread():
        show_dialog(summary, path, details)
    elif _post_to_gui is not None:
        try:
            _post_to_gui(lambda: show_dialog(summary, path, details))
        except Exception:  # the loop is closed: the report and the stderr line remain
            pass
    return path


def show_dialog(summary: str, path: Path | None, details: str = "") -> None:
    """The crash dialog, on the GUI thread. Without a running event loop
    (the error ended start-up) it waits for the user; otherwise it opens
    without blocking, and only one is on screen at a time."""
    global _dialog
    try:
        from PySide6.QtCore import QThread, Qt
        from PySide6.QtWidgets import QApplication, QMessageBox
    except ImportError:
        return
    app = QApplication.instance()
    if not isinstance(app, QApplication) or QThread.currentThread() is not app.thread():
        return
    if _dialog is not None:
        return  # a burst of errors: the first one's dialog is enough, each has its report
    folder = path.parent if path else log_dir()
    box = QMessageBox(
        QMessageBox.Icon.Critical,
        "Tandem: unexpected error",
        "Tandem hit an unexpected error. Your conversations are saved; "
        "if something stops working, save your work and restart Tandem.",
        QMessageBox.StandardButton.Ok,
        app.activeWindow(),
    )
    where = (
        f"The details are in the crash report<br><a href='{folder.as_uri()}'>{html.escape(str(path))}</a>"
        if path else f"The crash report could not be written to {html.escape(str(folder))}."
    )
    box.setInformativeText(f"{html.escape(summary)}<br><br>{where}<br>Please attach it to a bug report.")
    box.setTextFormat(Qt.TextFormat.RichText)
    if details:
        box.setDetailedText(details)
    box.setObjectName("crashDialog")

    def closed(*_: object) -> None:
        global _dialog
        _dialog = None

    box.finished.connect(closed)
    _dialog = box
    if QThread.currentThread().loopLevel() > 0:
        box.open()
    elif app.platformName() not in ("offscreen", "minimal"):
        box.exec()  # no event loop: the error ended the program, which waits for the user to read it
    else:
        _dialog = None  # nobody can see or close it (tests, CI): the report and stderr say it all


# -- the hooks ---------------------------------------------------------------------------


def _excepthook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    if issubclass(exc_type, KeyboardInterrupt):
        sys.__excepthook__(exc_type, exc, tb)
        return
    report(exc_type, exc, tb, where="the main thread")


def _threading_excepthook(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit or args.exc_value is None:
        return
    name = args.thread.name if args.thread is not None else "a background thread"
    report(args.exc_type, args.exc_value, args.exc_traceback, where=f"thread {name!r}")


def _loop_exception_handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    exc = context.get("exception")
    if isinstance(exc, Exception) and not isinstance(exc, asyncio.CancelledError):
        report(type(exc), exc, exc.__traceback__, where=f"the event loop ({context.get('message', 'a callback')})")
    else:
        loop.default_exception_handler(context)


def _start_fatal_log(folder: Path) -> None:
    """faulthandler into this run's fatal log (see the module's docstring)."""
    global _fatal_file, _fatal_path
    # Empty fatal logs of runs that ended without deleting theirs (killed) go;
    # a running instance's own (its pid alive) stays.
    for old in folder.glob("fatal-*.log"):
        try:
            pid = int(old.stem.split("-")[3])
            if old.stat().st_size == 0 and not _pid_alive(pid):
                old.unlink()
        except (IndexError, ValueError, OSError):
            continue
    path = _new_report_path(folder, "fatal")
    _fatal_file = open(path, "w", encoding="utf-8")  # noqa: SIM115 (open for the process's lifetime)
    _fatal_path = path
    faulthandler.enable(file=_fatal_file, all_threads=True)


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # someone else's: leave it
    return True


def _start_app_log(folder: Path) -> None:
    """Warnings and errors of every logger to tandem.log (rotated), for bug reports."""
    handler = logging.handlers.RotatingFileHandler(
        folder / APP_LOG_NAME, maxBytes=APP_LOG_BYTES, backupCount=APP_LOG_BACKUPS, encoding="utf-8", delay=True
    )
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(threadName)s]: %(message)s"))
    logging.getLogger().addHandler(handler)


def install() -> None:
    """Route unexpected errors to crash reports and the dialog, for this process.

    A log folder that cannot be created leaves the hooks in place (reports
    then go to stderr) and says so on stderr once."""
    global _installed
    if _installed:
        return
    _installed = True
    sys.excepthook = _excepthook
    threading.excepthook = _threading_excepthook
    folder = log_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # -X faulthandler or PYTHONFAULTHANDLER asked for the stacks on stderr: keep them there.
        if not faulthandler.is_enabled():
            _start_fatal_log(folder)
        _start_app_log(folder)
    except OSError as problem:
        print(f"Tandem: cannot write logs to {folder}: {problem}", file=sys.stderr)


def attach_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Errors that escape the loop's callbacks and tasks become crash reports,
    and other threads' reports show their dialog through this loop."""
    global _post_to_gui
    loop.set_exception_handler(_loop_exception_handler)
    _post_to_gui = lambda fn: loop.call_soon_threadsafe(fn)  # noqa: E731


def clean_exit() -> None:
    """At a clean end of the program: the empty fatal log of this run goes."""
    global _fatal_file, _fatal_path
    if _fatal_file is None or _fatal_path is None:
        return
    try:
        faulthandler.disable()
        _fatal_file.close()
        if _fatal_path.stat().st_size == 0:
            _fatal_path.unlink()
    except OSError:
        pass
    _fatal_file = _fatal_path = None
