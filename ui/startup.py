"""Start-up: a frame on screen at once, the window's imports behind it.

Importing the workspace, the chat store, the model registry and the window
takes a few tenths of a second on a warm start (Qt widgets, httpx, the
engine's torch-free parts), more on a busy machine. So the window's first
frame comes before them: `StartupFrame` is an empty Tandem window (the
title, the menus' names, "Starting…"), shown at the size and place the real
window will have; `import_in_background` imports those modules on a worker
thread while Qt keeps painting; then the real window takes the frame's
place (`StartupFrame.hand_over`) and the model loads behind it.

None of those modules imports torch (seconds): the engine imports it when
the model loads, on its loading thread, with the full window already on
screen (tests/ui/test_startup.py keeps it so; docs/packaging.md has the
times).

`process_age()` is the clock the smoke test reports start-up times with.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from PySide6.QtCore import QByteArray, QEventLoop, QMessageLogContext, QObject, Qt, QtMsgType, Signal, qInstallMessageHandler
from PySide6.QtGui import QCloseEvent
from PySide6.QtWidgets import QApplication, QLabel, QMainWindow, QWidget

if TYPE_CHECKING:
    from collections.abc import Callable

# What the full window needs beyond Qt and the settings, in the order they are used (none imports torch).
HEAVY_MODULES: tuple[str, ...] = ("app.models.registry", "app.workspace.workspace", "app.store.session",
                                  "ui.window.main_window")
# The real window's menus, named in the frame so that it looks like what comes.
MENU_TITLES = ("&File", "&Edit", "&View", "&Models", "&Help")


def process_age() -> float | None:
    """Seconds since this process started (Linux: from /proc), or None where
    that is not known. In the one-folder bundle the bootloader and Python
    are one process, so the bootloader's part of the start counts too."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            # The command name (field 2) may hold spaces; the fields after it are plain.
            fields = f.read().rsplit(")", 1)[1].split()
        started_ticks = int(fields[19])  # field 22, starttime, in clock ticks after boot
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        return uptime - started_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def qt_message(kind: QtMsgType, context: QMessageLogContext, message: str) -> None:
    """Qt's messages while the application starts: printed as Qt prints them,
    and a fatal one about the platform plugin explained (ui.platform_check)
    before Qt aborts."""
    sys.stderr.write(message + "\n")
    if kind == QtMsgType.QtFatalMsg:
        from ui.platform_check import explain_qt_failure

        explanation = explain_qt_failure(message)
        if explanation:
            sys.stderr.write(explanation + "\n")
    sys.stderr.flush()


def start_application(argv: list[str]) -> QApplication:
    """The QApplication (the one there is, else a new one), with Qt's start-up
    messages passing through `qt_message`."""
    existing = QApplication.instance()
    if isinstance(existing, QApplication):
        return existing
    previous: Callable[..., None] | None = qInstallMessageHandler(qt_message)
    try:
        return QApplication(argv)
    finally:
        qInstallMessageHandler(previous)


def set_window_minimum(window: QWidget) -> None:
    """Give a top-level window its smallest size once, before it is shown,
    rather than leave it to the layout. Left to the layout, the minimum
    follows the content and changes whenever a banner or a bar shows or
    hides; each change is passed on to the window system, and Qt's offscreen
    platform (tests, `--smoke-test`) answers every one with "This plugin does
    not support propagateSizeHints()". Room for a usable pane and composer,
    and never less than the content needs now."""
    metrics = window.fontMetrics()
    content = window.minimumSizeHint()
    window.setMinimumSize(max(content.width(), metrics.averageCharWidth() * 64),
                          max(content.height(), metrics.lineSpacing() * 24))


class StartupFrame(QMainWindow):
    """The window's first frame, until the real one is built."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Tandem")
        for title in MENU_TITLES:
            self.menuBar().addMenu(title).setEnabled(False)
        note = QLabel("Starting Tandem…", self)
        note.setAlignment(Qt.AlignmentFlag.AlignCenter)
        note.setEnabled(False)  # the theme's muted text
        self.setCentralWidget(note)
        self.statusBar().showMessage("Starting…")
        set_window_minimum(self)
        self.closed_by_user = False  # closed before the window came: the user changed their mind
        self._handing_over = False

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802
        if not self._handing_over:
            self.closed_by_user = True
        super().closeEvent(event)

    def hand_over(self, window: QWidget) -> None:
        """Show `window` where this frame is now (the user may have moved or
        resized it), then close the frame."""
        window.setGeometry(self.geometry())
        if self.isMaximized():
            window.setWindowState(Qt.WindowState.WindowMaximized)
        window.show()
        self._handing_over = True
        self.close()
        self.deleteLater()


def show_startup_frame(app: QApplication, saved_geometry: str | None, size: tuple[int, int] | None,
                       default_size: tuple[int, int] = (1280, 800)) -> StartupFrame:
    """The frame on screen, painted: where the window was last time
    (`saved_geometry`, the window's saveGeometry() in base64), `size` (width,
    height) over it when given, else `default_size`."""
    frame = StartupFrame()
    restored = isinstance(saved_geometry, str) and frame.restoreGeometry(
        QByteArray.fromBase64(saved_geometry.encode("ascii")))
    if size is not None:
        frame.resize(*size)
    elif not restored:
        frame.resize(*default_size)
    frame.show()
    frame.repaint()
    app.processEvents(QEventLoop.ProcessEventsFlag.ExcludeUserInputEvents)
    return frame


class _Done(QObject):
    finished = Signal()


def import_in_background(modules: Sequence[str] = HEAVY_MODULES) -> None:
    """Import `modules` on a worker thread while the Qt event loop runs here
    (the frame repaints, moves and resizes meanwhile); re-raises what an
    import raised. Returns once all are imported."""
    done = _Done()
    loop = QEventLoop()
    done.finished.connect(loop.quit, Qt.ConnectionType.QueuedConnection)
    failure: list[BaseException] = []

    def work() -> None:
        try:
            for name in modules:
                importlib.import_module(name)
        except BaseException as exc:  # handed to the GUI thread below
            failure.append(exc)
        finally:
            done.finished.emit()

    worker = threading.Thread(target=work, name="tandem-imports", daemon=True)
    worker.start()
    # The worker may finish before exec() starts: the queued quit still arrives then.
    loop.exec()
    worker.join()
    if failure:
        raise failure[0]
