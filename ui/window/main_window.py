"""The main window: panes side by side, the composer, menus, the status bar.

The window shows what the workspace (app/) reports through its events and
forwards what the user does as workspace calls. Coroutines (send, regenerate,
edit-and-resend, shutdown) run as tasks on the qasync loop; the GUI thread
never waits for the engine.

This module is the wiring: it lays out the widgets and hands each concern to
its own module: the menus (`actions`), the events (`event_dispatch`), the
banners (`banner`), the status bar (`status_bar`), what the user does to
panes (`pane_commands`), models (`models`), saved chats (`chats`), chat
files (`chat_files`), comparing (`compare`), serving (`server_control`) and
the saved settings (`preferences`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QEvent, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QCloseEvent, QGuiApplication
from PySide6.QtWidgets import (
    QApplication,
    QFrame,
    QMainWindow,
    QMessageBox,
    QScrollArea,
    QSplitter,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.errors import AppError, EngineNotReadyError
from app.workspace.saved_schemas import SavedSchemas
from engine.errors import EngineError
from ui.dialogs.shortcuts import EditMessageDialog, ShortcutsDialog, about_text
from ui.panes.arena_bar import ArenaBar
from ui.panes.code_highlight import warm_up as warm_up_code
from ui.panes.compare_bar import CompareBar
from ui.panes.composer import Composer, ModelHint
from ui.panes.pane_settings import PaneSettingsPopover
from ui.panes.pane_view import PaneView
from ui.startup import set_window_minimum
from ui.theme import is_dark
from ui.window.actions import WindowShortcuts, build_actions, refresh_enabled, shortcut_rows
from ui.window.arena import WindowArena
from ui.window.attachments import WindowAttachments
from ui.window.banner import LoadingBanner, StoreBanner
from ui.window.chat_files import ChatFiles
from ui.window.chats import ChatsLink
from ui.window.compare import CompareReplies
from ui.window.event_dispatch import WorkspaceEventRouter
from ui.window.models import WindowModels
from ui.window.pane_commands import PaneCommands
from ui.window.preferences import WindowPreferences
from ui.window.server_control import ServerControl
from ui.window.status_bar import STATS_INTERVAL_MS, WindowStatusBar
from ui.window.sweeps import WindowSweeps

if TYPE_CHECKING:
    from app.models.registry import ModelRegistry
    from app.remote.local_server import LocalServer
    from app.settings import Settings
    from app.store.session import ChatSession
    from app.workspace.workspace import Workspace
    from engine.progress import LoadProgress

log = logging.getLogger(__name__)

# ~30 repaints a second at most, whatever the token rate.
FRAME_INTERVAL_MS = 33
# With several replies streaming, each frame costs the GUI thread once per
# streaming pane, and the GUI thread shares the cores and the GIL with the
# engine that is then busiest: ~15 frames a second, the same text a little
# later (measured in bench/ui_latency.py; docs/benchmarks.md).
BUSY_FRAME_INTERVAL_MS = 66
# While a reply streams its stats line and its pane's context meter change
# every frame but are read at a glance: they follow every this many frames.
LIVE_DETAILS_EVERY_FRAMES = 8
# A moment after the window opens, the first code block's lexer and font are
# loaded while nothing streams (ui.panes.code_highlight.warm_up).
WARM_UP_CODE_AFTER_MS = 1500


class MainWindow(QMainWindow):
    """One workspace in a window. `closed` fires once the workspace has shut down."""

    closed = Signal()

    def __init__(
        self,
        workspace: Workspace,
        settings: Settings,
        *,
        engine_settings: Settings | None = None,
        version: str = "",
        save_settings: bool = True,
        session: ChatSession | None = None,
        registry: ModelRegistry | None = None,
    ) -> None:
        """`settings` are the saved settings (the window saves its state and
        theme into them); `engine_settings` what this run loads the model with
        (the saved ones plus command-line choices), by default the same.
        `session`: the chat store this window records into and lists in its
        sidebar; `registry`: the models a pane can pick."""
        super().__init__()
        self.workspace = workspace
        self.settings = settings
        self.engine_settings = engine_settings if engine_settings is not None else settings
        self.version = version
        self.session = session
        self.registry = registry
        # After a crash no model loads by itself (it may be what crashed).
        self.crash_recovery = session is not None and session.crashed_last_time
        self.load_requested = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self.shutdown_started = False
        self._shutdown_done = False
        self.panes: dict[int, PaneView] = {}
        self.current_pane_id: int | None = None
        # "Reply as JSON"'s saved schemas, for every pane's settings (a file that cannot be read is a warning).
        self.saved_schemas = SavedSchemas.load()
        # The popups open now (one of each at a time).
        self.popover: PaneSettingsPopover | None = None
        self.edit_dialog: EditMessageDialog | None = None
        self.confirm_box: QMessageBox | None = None
        self.setWindowTitle("Tandem")
        self.menu_actions: dict[str, QAction] = {}  # by the ids of ui.window.actions.ACTIONS, once built

        self.commands = PaneCommands(self)
        self.models = WindowModels(self)
        self.files = ChatFiles(self)
        self.compare = CompareReplies(self)
        self.arena = WindowArena(self)
        self.sweeps = WindowSweeps(self)
        self.server_control = ServerControl(self)
        self.preferences = WindowPreferences(self, save=save_settings)

        central = QWidget(self)
        column = QVBoxLayout(central)
        column.setContentsMargins(4, 4, 4, 0)
        column.setSpacing(4)
        self.store_banner = StoreBanner(central)
        column.addWidget(self.store_banner)
        self.banner = LoadingBanner(central)
        self.banner.retry_requested.connect(self.models.load_from_banner)
        column.addWidget(self.banner)
        self.compare_bar = CompareBar(central)
        self.compare_bar.hide()
        self.compare_bar.changed.connect(self.compare.refresh)
        self.compare_bar.close_requested.connect(lambda: self.compare_action.setChecked(False))
        column.addWidget(self.compare_bar)
        self.arena_bar = ArenaBar(central)
        self.arena_bar.hide()
        self.arena_bar.voted.connect(self.arena.vote)
        self.arena_bar.leaderboard_requested.connect(self.arena.open_leaderboard)
        self.arena_bar.close_requested.connect(lambda: self.arena.set_arena(False))
        column.addWidget(self.arena_bar)
        # The panes side by side; when the window is narrower than every pane at
        # its minimum width, the row scrolls sideways instead of squeezing them.
        self.pane_row = QScrollArea(central)
        self.pane_row.setObjectName("paneRow")
        self.pane_row.setWidgetResizable(True)
        self.pane_row.setFrameShape(QFrame.Shape.NoFrame)
        self.pane_row.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.pane_row.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.setChildrenCollapsible(False)
        self.splitter.setHandleWidth(max(4, self.fontMetrics().averageCharWidth() // 2))
        self.pane_row.setWidget(self.splitter)
        column.addWidget(self.pane_row, 1)
        self.composer = Composer(central)
        self.composer.send_requested.connect(self.send)
        self.composer.stop_requested.connect(self.stop_all)
        self.add_pane_button = QToolButton(self.composer)
        self.add_pane_button.setText("+ Pane")
        self.add_pane_button.setToolTip("Add a pane (Ctrl+T)")
        self.add_pane_button.clicked.connect(self.add_pane)
        self.composer.add_to_target_row(self.add_pane_button)
        column.addWidget(self.composer)
        self.setCentralWidget(central)
        self.attachments = WindowAttachments(self)

        status_bar = WindowStatusBar(self)
        self.setStatusBar(status_bar)
        self.status_bar = status_bar
        self.status_label = status_bar.engine_label

        self.chats = ChatsLink(self, session)
        self.sidebar = self.chats.sidebar
        self.sidebar_dock = self.chats.dock
        if session is not None:
            session.on_error(self.store_banner.show_write_failure)

        provided = {"chats_sidebar": self.sidebar_dock.toggleViewAction()} if self.sidebar_dock is not None else {}
        features = frozenset({"sidebar"} if self.sidebar is not None else set())
        self.menu_actions = build_actions(self, self.menuBar(), features=features, provided=provided)
        self.window_shortcuts = WindowShortcuts(self, self.menu_actions)
        self.new_pane_action = self.menu_actions["new_pane"]
        self.close_pane_action = self.menu_actions["close_pane"]
        self.send_action = self.menu_actions["send"]
        self.stop_action = self.menu_actions["stop_all"]
        self.compare_action = self.menu_actions["compare"]
        self.serve_action = self.menu_actions["serve"]

        self._frame_timer = QTimer(self)
        self._frame_timer.setInterval(FRAME_INTERVAL_MS)
        self._frame_timer.timeout.connect(self.render_frame)
        self._frames = 0
        QTimer.singleShot(WARM_UP_CODE_AFTER_MS, self, self._warm_up_code)
        self._stats_timer = QTimer(self)
        self._stats_timer.setInterval(STATS_INTERVAL_MS)
        self._stats_timer.timeout.connect(self.refresh_status)
        self._stats_timer.start()

        QApplication.instance().focusChanged.connect(self._on_focus_changed)
        QGuiApplication.styleHints().colorSchemeChanged.connect(self.preferences.follow_color_scheme)
        self.events = WorkspaceEventRouter(self)
        self._unsubscribe = workspace.subscribe(self.events)
        for index, pane in enumerate(workspace.panes):
            self.events.add_pane_view(pane, index)
        self.refresh_ready()
        self.apply_engine_state(workspace.engine_state, workspace.load_progress, workspace.load_error)
        warnings = [settings.load_warning, registry.load_warning if registry is not None else None,
                    session.warning if session is not None else None, self.saved_schemas.load_warning]
        for warning in filter(None, warnings):
            self.statusBar().showMessage(warning, 20000)
        if session is not None and session.warning:
            self.store_banner.show_problem(session.warning)
        set_window_minimum(self)
        self.preferences.restore_window_state()

    # -- the panes -----------------------------------------------------------------------

    def pane_order(self) -> list[int]:
        """The pane ids left to right, as on screen."""
        views = [self.splitter.widget(i) for i in range(self.splitter.count())]
        return [v.pane_id for v in views if isinstance(v, PaneView) and v.pane_id in self.panes]

    def has_several_panes(self) -> bool:
        return len(self.panes) > 1

    def sync_pane_lists(self) -> None:
        """The composer's targets, the compare bar, the menus and the sidebar follow the panes."""
        entries = [(pid, self.arena.display_title(pid, self.panes[pid].pane.title)) for pid in self.pane_order()]
        for view in self.panes.values():
            view.set_can_carry(len(self.panes) > 1)
        self.composer.set_panes(entries)
        self.compare_bar.set_panes(entries)
        refresh_enabled(self, self.menu_actions)
        self.chats.set_open([view.pane.conversation.id for view in self.panes.values()])
        self.preferences.apply_zoom()

    def set_current_pane(self, pane_id: int) -> None:
        if pane_id not in self.panes:
            return
        self.current_pane_id = pane_id
        for pid, view in self.panes.items():
            view.set_current(pid == pane_id)
        # When the row of panes scrolls sideways, the current pane is the one on screen.
        self.pane_row.ensureWidgetVisible(self.panes[pane_id], 0, 0)

    def current_view(self) -> PaneView | None:
        return self.panes.get(self.current_pane_id) if self.current_pane_id is not None else None

    def _on_focus_changed(self, _old: QWidget | None, new: QWidget | None) -> None:
        widget = new
        while widget is not None:
            if isinstance(widget, PaneView):
                self.set_current_pane(widget.pane_id)
                return
            widget = widget.parentWidget()

    def repaint_soon(self) -> None:
        """A reply grew: repaint at the next frame (at most ~30 a second)."""
        if not self._frame_timer.isActive():
            self._frame_timer.start()

    def flush_panes(self) -> None:
        """Show everything that changed in the panes now, stats lines and context meters included."""
        for view in self.panes.values():
            if view.dirty:
                view.flush()

    def render_frame(self) -> None:
        """One frame of the frame timer: the streamed text of every pane that
        changed, its stats line and context meter every few frames, and the
        next frame sooner or later by how many panes stream."""
        self._frames += 1
        details = self._frames % LIVE_DETAILS_EVERY_FRAMES == 0
        dirty = False
        for view in self.panes.values():
            if view.dirty:
                view.flush(live_details=details)
                dirty = True
        streaming = sum(1 for view in self.panes.values() if view.pane.busy)
        if not dirty and not streaming:
            self._frame_timer.stop()
            return
        interval = BUSY_FRAME_INTERVAL_MS if streaming > 1 else FRAME_INTERVAL_MS
        if self._frame_timer.interval() != interval:
            self._frame_timer.setInterval(interval)

    def _warm_up_code(self) -> None:
        if not self.shutdown_started:
            warm_up_code(is_dark(self.palette()))

    @property
    def frame_interval_ms(self) -> int:
        """How often the panes repaint while replies stream (FRAME_INTERVAL_MS or BUSY_FRAME_INTERVAL_MS)."""
        return self._frame_timer.interval()

    def update_streaming(self) -> None:
        self.composer.set_streaming(any(view.pane.busy for view in self.panes.values()))

    def refresh_ready(self) -> None:
        """The composer sends when at least one pane can reply (a remote pane needs no local model)."""
        if not self.shutdown_started and not self.workspace.closed:
            states = [self.workspace.pane_model_state(pid) for pid in self.panes]
            self.composer.set_model_state(self._model_hint(states), self._hint_model_name())

    def _model_hint(self, states: list[str]) -> ModelHint:
        """What the message box says, from the panes' model states; a model not
        asked for yet counts as loading (the window loads it once it is up,
        and the banner says "Loading…") unless after a crash or a cancel."""
        if any(st == "ready" for st in states):
            return "ready"
        asked = self.crash_recovery or self.load_requested
        if any(st == "loading" or (st == "unloaded" and not asked) for st in states):
            return "loading"
        return "failed" if any(st == "error" for st in states) else "none"

    def _hint_model_name(self) -> str:
        # The model the banner shows (its button says "Load <name>"), else the default one.
        model_id = self.banner.model_id or self.workspace.default_model
        return self.models.name(model_id) if model_id else ""

    def apply_engine_state(self, state: str, progress: LoadProgress | None, error: str | None) -> None:
        """Show what the panes' models are doing: the banner for the one that
        needs attention (loading, failed, not loaded), each pane's header, and
        whether anything can be sent. (`progress` and `error` are the default
        model's; the banner asks the workspace for the model it shows.)"""
        ws = self.workspace
        if state == "closed" or ws.closed:
            self.composer.set_model_state("none")
            return
        states: dict[int, str] = {pid: ws.pane_model_state(pid) for pid in self.panes}
        for pid, view in self.panes.items():
            view.model_state = states[pid]
            view.model_name = self.models.name(view.pane.conversation.model_id)
            view.refresh_header()
            view.refresh_context()
        local = [v.pane.conversation.model_id for v in self.panes.values() if v.pane.remote is None]
        shown = self.banner.show_models(ws, local or [ws.default_model], self.models.name,
                                        crash_recovery=self.crash_recovery, load_requested=self.load_requested)
        self.composer.set_model_state(self._model_hint(list(states.values())), self._hint_model_name())
        if shown == "error":
            self.status_bar.show_no_model()
        current = self.current_pane_id if self.current_pane_id in states else next(iter(states), None)
        if current is not None and self.panes[current].pane.remote is None:
            self.status_bar.show_model_state(states[current])
        if state == "ready":
            self.refresh_status()
            if not self.composer.edit.hasFocus():
                self.composer.edit.setFocus()

    # -- tasks and errors ----------------------------------------------------------------

    def run_task(
        self, coro: Coroutine[Any, Any, Any], what: str, on_done: Callable[[], None] | None = None
    ) -> asyncio.Task[Any]:
        """Run a workspace coroutine; an error the user can act on shows in the window."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._tasks.discard(t)
            if on_done is not None:
                on_done()
            if t.cancelled():
                return
            exc = t.exception()
            if exc is not None:
                self.report_error(what, exc)

        task.add_done_callback(done)
        return task

    def report_error(self, what: str, exc: BaseException) -> None:
        if isinstance(exc, EngineNotReadyError) and exc.state == "unloaded" and exc.model:
            # The window knows the model's shown name and where its Load button is; the core only its id.
            name = self.models.name(exc.model)
            message = (f"{name} is not loaded: load it with the Load button above the panes "
                       f"(or Models → Load this pane's model), then send the message again.")
        elif isinstance(exc, (AppError, EngineError)):
            message = str(exc)
        else:
            log.error("%s failed", what, exc_info=exc)
            message = f"{what} failed: {exc}"
        self.composer.show_notice(message)
        self.statusBar().showMessage(message, 10000)

    # -- what the user does (the panes' own signals and the public entry points) --------

    def send(self, text: str, targets: list[int]) -> None:
        self.commands.send(text, targets)

    def stop_all(self) -> None:
        self.workspace.stop(None)
        # A note that a pane was busy is stale once everything is stopped.
        self.composer.notice.hide()

    def stop_pane(self, pane_id: int) -> None:
        self.workspace.stop(pane_id)

    def add_pane(self) -> None:
        self.commands.add_pane()

    def close_pane(self, pane_id: int) -> None:
        self.commands.close_pane(pane_id)

    def close_pane_now(self, pane_id: int) -> None:
        """Close without asking (the chat stays in the store when there is one)."""
        self.commands.close_pane_now(pane_id)

    def fork(self, pane_id: int, index: int) -> None:
        self.commands.fork(pane_id, index)

    def new_chat(self) -> None:
        self.commands.new_chat()

    def load_engine(self) -> None:
        """Load the settings' model and every other model an open pane runs."""
        self.models.load_engine()

    def export_current(self, fmt: str, path: str | None = None) -> Path | None:
        return self.files.export_current(fmt, path)

    def export_comparison(self, path: str | None = None) -> Path | None:
        return self.files.export_comparison(path)

    def import_chat(self, path: str | None = None) -> None:
        self.files.import_chat(path)

    def refresh_compare(self) -> None:
        self.compare.refresh()

    def show_store_problem(self, problem: str) -> None:
        """The chat store could not be opened at all: chats work, but are not saved."""
        self.store_banner.show_unavailable(problem)

    @property
    def server(self) -> LocalServer | None:
        """The local OpenAI-compatible server while serving."""
        return self.server_control.server

    @property
    def serve_port(self) -> int:
        return self.server_control.port

    @serve_port.setter
    def serve_port(self, port: int) -> None:
        self.server_control.port = port

    # -- status and help -----------------------------------------------------------------

    def refresh_status(self) -> None:
        # In a blind arena the current pane's model (its quantization, its device) would tell who wrote a reply.
        model = self.workspace.default_model if self.arena.hiding else self.models.current()
        self.status_bar.show_stats(self.workspace.stats(model))

    def shortcuts(self) -> list[tuple[str, str]]:
        """(action, keys) for every action with a shortcut, as the Help menu lists them."""
        return shortcut_rows(self.menu_actions)

    def show_shortcuts(self) -> None:
        dialog = ShortcutsDialog(self.shortcuts(), self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()

    def show_about(self) -> None:
        stats = self.workspace.stats()
        device = f"{stats.device} ({str(stats.dtype).replace('torch.', '')})" if stats else "not loaded yet"
        box = QMessageBox(QMessageBox.Icon.Information, "About Tandem", about_text(self.version, device, self.models.name()),
                          QMessageBox.StandardButton.Ok, self)
        box.setTextFormat(Qt.TextFormat.RichText)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()

    # -- closing -------------------------------------------------------------------------

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802
        if self._shutdown_done:
            event.accept()
            return
        event.ignore()
        if self.shutdown_started:
            return
        self.shutdown_started = True
        self.hide()  # the user asked to close: go away now, finish stopping behind the scenes
        self.preferences.persist()

        async def shut_down() -> None:
            try:
                await self.server_control.stop()
                await asyncio.wait_for(self.workspace.shutdown(), timeout=5)
            except Exception:
                log.exception("shutting down the workspace failed")
            try:
                if self.session is not None:
                    # After the shutdown: the stopped replies' final saves are queued first.
                    await self.session.aclose()
            except Exception:
                log.exception("closing the chat store failed")
            finally:
                self._finish_close()

        asyncio.ensure_future(shut_down())

    def _finish_close(self) -> None:
        self._shutdown_done = True
        # A model load still under way (or a send being queued) has nothing
        # left to report to: end it rather than leave it pending at exit.
        for task in list(self._tasks):
            task.cancel()
        self._frame_timer.stop()
        self._stats_timer.stop()
        try:
            self._unsubscribe()
        except Exception:
            pass
        QApplication.instance().focusChanged.disconnect(self._on_focus_changed)
        QGuiApplication.styleHints().colorSchemeChanged.disconnect(self.preferences.follow_color_scheme)
        self.close()
        self.closed.emit()

    @property
    def shut_down(self) -> bool:
        return self._shutdown_done

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            self.compare.refresh()
