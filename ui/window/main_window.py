"""The main window: panes side by side, the composer, menus, the status bar.

The window shows what the workspace (app/) reports through its events and
forwards what the user does as workspace calls. Coroutines (send, regenerate,
edit-and-resend, shutdown) run as tasks on the qasync loop; the GUI thread
never waits for the engine.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from collections.abc import Callable, Coroutine
from typing import Any

from PySide6.QtCore import QByteArray, QEvent, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QActionGroup, QCloseEvent, QGuiApplication, QKeySequence
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QDockWidget,
    QFrame,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QSplitter,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app import events as ev
from app.errors import AppError
from app.files import write_text_atomically
from app.workspace.compare import word_diff
from engine.errors import EngineError
from ui.panes.compare_bar import CompareBar
from ui.widgets.sidebar import ChatSidebar
from ui.panes.composer import Composer
from ui.dialogs.shortcuts import EditMessageDialog, ShortcutsDialog, about_text, shortcut_text
from ui.panes.pane_settings import PaneSettingsPopover
from ui.panes.pane_view import PaneView
from ui.theme import apply_theme

log = logging.getLogger(__name__)

# The port "Serve loaded models" listens on (127.0.0.1 only), as LM Studio's and vLLM's do.
SERVE_PORT = 8000

# ~30 repaints a second at most, whatever the token rate.
FRAME_INTERVAL_MS = 33
STATS_INTERVAL_MS = 500


class LoadingBanner(QFrame):
    """'Loading model…' with the engine's progress; the load error if it
    fails; a model that is not loaded (after a crash) with a button to load it."""

    retry_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("loadingBanner")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(8, 4, 8, 4)
        self.label = QLabel("Loading model…", self)
        self.label.setWordWrap(True)
        self.progress = QProgressBar(self)
        self.progress.setRange(0, 0)
        self.progress.setMaximumWidth(self.fontMetrics().averageCharWidth() * 30)
        self.retry = QPushButton("Try again", self)
        self.retry.clicked.connect(self.retry_requested)
        self.retry.hide()
        layout.addWidget(self.label, 1)
        layout.addWidget(self.progress)
        layout.addWidget(self.retry)

    def show_progress(self, progress: Any, name: str = "") -> None:
        self.retry.hide()
        self.progress.show()
        what = f"Loading {name}…" if name else "Loading model…"
        if progress is None:
            self.label.setText(what)
            self.progress.setRange(0, 0)
            return
        stage = {"import": "Importing", "weights": "Loading weights", "warmup": "Warming up", "ready": "Ready"}
        self.label.setText(f"{what} {stage.get(progress.stage, progress.stage)}: {progress.detail}")
        if progress.total:
            self.progress.setRange(0, progress.total)
            self.progress.setValue(progress.done)
        else:
            self.progress.setRange(0, 0)

    def show_error(self, error: str, name: str = "") -> None:
        self.label.setText(f"{name or 'The model'} could not be loaded: {error}")
        self.progress.hide()
        self.retry.setText("Try again")
        self.retry.show()

    def show_unloaded(self, text: str, button: str) -> None:
        self.label.setText(text)
        self.progress.hide()
        self.retry.setText(button)
        self.retry.show()


class MainWindow(QMainWindow):
    """One workspace in a window. `closed` fires once the workspace has shut down."""

    closed = Signal()

    def __init__(
        self,
        workspace: Any,
        settings: Any,
        *,
        engine_settings: Any = None,
        version: str = "",
        save_settings: bool = True,
        session: Any = None,
        registry: Any = None,
    ) -> None:
        """`settings` are the saved settings (the window saves its state and
        theme into them); `engine_settings` what this run loads the model with
        (the saved ones plus command-line choices), by default the same.
        `session` (app.store.session.ChatSession): the chat store this window
        records into and lists in its sidebar; `registry`
        (app.models.registry.ModelRegistry): the models a pane can pick."""
        super().__init__()
        self.workspace = workspace
        self.settings = settings
        self.engine_settings = engine_settings if engine_settings is not None else settings
        self.version = version
        self._save_settings = save_settings
        self.session = session
        self.registry = registry
        self.server: Any = None  # app.remote.local_server.LocalServer while serving
        self.serve_port = SERVE_PORT
        self.model_manager: Any = None
        self.settings_dialog: Any = None
        self._banner_model: str | None = None  # the model the banner's button loads
        self._sidebar_refresh_pending = False
        # After a crash no model loads by itself (it may be what crashed).
        self.crash_recovery = bool(getattr(session, "crashed_last_time", False))
        self._load_requested = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._shutdown_started = False
        self._shutdown_done = False
        self.panes: dict[int, PaneView] = {}
        self.current_pane_id: int | None = None
        self.popover: PaneSettingsPopover | None = None
        self.edit_dialog: EditMessageDialog | None = None
        self.confirm_box: QMessageBox | None = None
        self.setWindowTitle("Tandem")

        central = QWidget(self)
        column = QVBoxLayout(central)
        column.setContentsMargins(4, 4, 4, 0)
        column.setSpacing(4)
        self.banner = LoadingBanner(central)
        self.banner.retry_requested.connect(self._banner_load)
        column.addWidget(self.banner)
        self.compare_bar = CompareBar(central)
        self.compare_bar.hide()
        self.compare_bar.changed.connect(self.refresh_compare)
        self.compare_bar.close_requested.connect(lambda: self.compare_action.setChecked(False))
        column.addWidget(self.compare_bar)
        self.splitter = QSplitter(Qt.Orientation.Horizontal, central)
        self.splitter.setChildrenCollapsible(False)
        self.splitter.setHandleWidth(max(4, self.fontMetrics().averageCharWidth() // 2))
        column.addWidget(self.splitter, 1)
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

        self.status_label = QLabel("Loading model…", self)
        self.statusBar().addPermanentWidget(self.status_label)

        self.sidebar: ChatSidebar | None = None
        self.sidebar_dock: QDockWidget | None = None
        if session is not None:
            self.sidebar = ChatSidebar(_SidebarStore(session, self._sidebar_changed), self)
            self.sidebar.open_requested.connect(self.open_conversation)
            self.sidebar.new_requested.connect(self.new_chat)
            self.sidebar.renamed.connect(self._conversation_renamed)
            self.sidebar.deleted.connect(self._conversation_deleted)
            self.sidebar_dock = QDockWidget("Chats", self)
            self.sidebar_dock.setObjectName("chatsDock")
            self.sidebar_dock.setWidget(self.sidebar)
            self.sidebar_dock.setTitleBarWidget(QWidget())  # the sidebar has its own heading; Ctrl+B hides it
            self.sidebar_dock.setFeatures(QDockWidget.DockWidgetFeature.DockWidgetClosable)
            self.sidebar_dock.setAllowedAreas(Qt.DockWidgetArea.LeftDockWidgetArea)
            self.addDockWidget(Qt.DockWidgetArea.LeftDockWidgetArea, self.sidebar_dock)
            self.resizeDocks([self.sidebar_dock], [self.fontMetrics().averageCharWidth() * 40], Qt.Orientation.Horizontal)
            session.on_error(self._store_failed)
        self.store_banner = QLabel(central)
        self.store_banner.setObjectName("storeBanner")
        self.store_banner.setWordWrap(True)
        self.store_banner.setFrameShape(QFrame.Shape.StyledPanel)
        self.store_banner.hide()
        column.insertWidget(0, self.store_banner)

        self._build_actions()

        self._frame_timer = QTimer(self)
        self._frame_timer.setInterval(FRAME_INTERVAL_MS)
        self._frame_timer.timeout.connect(self._flush_panes)
        self._stats_timer = QTimer(self)
        self._stats_timer.setInterval(STATS_INTERVAL_MS)
        self._stats_timer.timeout.connect(self.refresh_status)
        self._stats_timer.start()

        QApplication.instance().focusChanged.connect(self._on_focus_changed)
        QGuiApplication.styleHints().colorSchemeChanged.connect(self._on_color_scheme_changed)
        self._unsubscribe = workspace.subscribe(self._on_event)
        for index, pane in enumerate(workspace.panes):
            self._on_event(ev.PaneAdded(pane, index))
        self._apply_engine_state(workspace.engine_state, workspace.load_progress, workspace.load_error)
        warnings = [getattr(settings, "load_warning", None), getattr(registry, "load_warning", None),
                    getattr(session, "warning", None)]
        for warning in filter(None, warnings):
            self.statusBar().showMessage(warning, 20000)
        if session is not None and session.warning:
            self._show_store_banner(session.warning)
        self._restore_geometry()

    # -- actions and menus -------------------------------------------------------

    def _action(
        self, menu: Any, text: str, keys: str | list[str] | None, slot: Callable[..., Any], tip: str = ""
    ) -> QAction:
        action = QAction(text, self)
        if keys:
            seqs = [QKeySequence(k) for k in ([keys] if isinstance(keys, str) else keys)]
            action.setShortcuts(seqs)
        action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        if tip:
            action.setStatusTip(tip)
        action.triggered.connect(lambda checked=False: slot())
        menu.addAction(action)
        self.addAction(action)  # shortcuts work while the menu bar is hidden too
        return action

    def _build_actions(self) -> None:
        bar = self.menuBar()
        file_menu = bar.addMenu("&File")
        self.new_pane_action = self._action(file_menu, "&New pane", "Ctrl+T", self.add_pane)
        self.new_chat_action = self._action(file_menu, "New c&hat in this pane", "Ctrl+N", self.new_chat)
        self.close_pane_action = self._action(file_menu, "&Close pane", "Ctrl+W", self.close_current_pane)
        file_menu.addSeparator()
        self._action(file_menu, "&Import chat…", "Ctrl+O", self.import_chat)
        self._action(file_menu, "Export chat as &Markdown…", "Ctrl+S", lambda: self.export_current("md"))
        self._action(file_menu, "Export chat as &JSON…", "Ctrl+Shift+S", lambda: self.export_current("json"))
        self._action(file_menu, "Export side-by-side c&omparison…", "Ctrl+Alt+E", self.export_comparison)
        file_menu.addSeparator()
        self._action(file_menu, "&Quit", "Ctrl+Q", self.close)

        edit = bar.addMenu("&Edit")
        self.send_action = self._action(edit, "&Send", ["Ctrl+Return", "Ctrl+Enter"], self._send_from_composer)
        self.stop_action = self._action(edit, "S&top all replies", "Esc", self.stop_all)
        self._action(edit, "Stop this &pane's reply", "Ctrl+.", lambda: self._with_current(self.stop_pane))
        edit.addSeparator()
        self._action(edit, "&Regenerate last reply", "Ctrl+R", self.regenerate_current)
        self._action(edit, "&Edit last message…", "Ctrl+E", self.edit_current)
        self._action(edit, "&Fork pane at last message", "Ctrl+Shift+F", self.fork_current)
        self._action(edit, "&Copy last reply", "Ctrl+Shift+C", self.copy_current)
        edit.addSeparator()
        self._action(edit, "Pane se&ttings…", "Ctrl+,", lambda: self._with_current(self.open_settings))
        self._action(edit, "Focus the &message box", "Ctrl+L", self.composer.edit.setFocus)
        edit.addSeparator()
        self._action(edit, "Pr&eferences…", "Ctrl+Alt+S", self.open_preferences)

        view = bar.addMenu("&View")
        self.compare_action = QAction("&Compare replies", self)
        self.compare_action.setCheckable(True)
        self.compare_action.setShortcut(QKeySequence("Ctrl+D"))
        self.compare_action.toggled.connect(self.set_compare)
        view.addAction(self.compare_action)
        self.addAction(self.compare_action)
        if self.sidebar_dock is not None:
            toggle = self.sidebar_dock.toggleViewAction()
            toggle.setText("C&hats sidebar")
            toggle.setShortcut(QKeySequence("Ctrl+B"))
            view.addAction(toggle)
            self.addAction(toggle)
            self._action(view, "&Search chats", "Ctrl+K", self.search_chats)
        view.addSeparator()
        self._action(view, "Move pane &left", "Ctrl+Shift+PgUp", lambda: self.move_current(-1))
        self._action(view, "Move pane &right", "Ctrl+Shift+PgDown", lambda: self.move_current(+1))
        self._action(view, "&Previous pane", "Ctrl+PgUp", lambda: self.focus_neighbour(-1))
        self._action(view, "&Next pane", "Ctrl+PgDown", lambda: self.focus_neighbour(+1))
        targets = view.addMenu("Send &to")
        for n in range(1, 10):
            action = self._action(targets, f"Toggle pane {n}", f"Alt+{n}", lambda n=n: self.composer.toggle_target(n - 1))
            action.setObjectName("toggleTarget")
        self._action(targets, "Target all panes", "Alt+0", self.target_all)
        theme_menu = view.addMenu("T&heme")
        group = QActionGroup(self)
        for name in ("system", "light", "dark"):
            action = QAction(name.capitalize(), self, checkable=True)
            action.setChecked(getattr(self.settings, "theme", "system") == name)
            action.triggered.connect(lambda checked=False, name=name: self.set_theme(name))
            group.addAction(action)
            theme_menu.addAction(action)

        models = bar.addMenu("&Models")
        self._action(models, "&Manage models…", "Ctrl+M", self.open_model_manager)
        self._action(models, "&Load this pane's model", "Ctrl+Shift+L", lambda: self._with_current(self.load_pane_model))
        self._action(models, "&Unload idle models", None, self.unload_idle_models)
        models.addSeparator()
        self.serve_action = QAction("&Serve loaded models (OpenAI API)", self)
        self.serve_action.setCheckable(True)
        self.serve_action.setShortcut(QKeySequence("Ctrl+Alt+A"))
        self.serve_action.setStatusTip("Let other programs use the loaded models at http://127.0.0.1:8000/v1")
        self.serve_action.toggled.connect(self.set_serving)
        models.addAction(self.serve_action)
        self.addAction(self.serve_action)

        help_menu = bar.addMenu("&Help")
        self._action(help_menu, "&Keyboard shortcuts", "F1", self.show_shortcuts)
        self._action(help_menu, "&About Tandem", None, self.show_about)

    def shortcuts(self) -> list[tuple[str, str]]:
        """(action, keys) for every action with a shortcut, as the Help menu lists them."""
        rows = []
        for action in self.actions():
            if action.objectName() == "toggleTarget":
                continue  # one row for the nine below
            keys = [s.toString(QKeySequence.SequenceFormat.NativeText) for s in action.shortcuts()]
            if keys:
                rows.append((action.text().replace("&", "").rstrip("…"), ", ".join(keys)))
        rows.append(("Toggle pane 1…9 as a target", f"{shortcut_text('Alt+1')} … {shortcut_text('Alt+9')}"))
        rows.append(("New line in the message box", shortcut_text("Return")))
        return rows

    # -- workspace events ------------------------------------------------------------

    def _on_event(self, event: Any) -> None:
        try:
            self._dispatch(event)
        except Exception:  # a view bug must not break the workspace's event delivery
            log.exception("window failed to show %r", event)

    def _dispatch(self, event: Any) -> None:
        if isinstance(event, ev.ReplyDelta):
            view = self.panes.get(event.pane_id)
            if view is not None:
                view.reply_delta(event.index, event.stats)
                if not self._frame_timer.isActive():
                    self._frame_timer.start()
        elif isinstance(event, ev.ReplyFinished):
            view = self.panes.get(event.pane_id)
            if view is not None:
                view.reply_finished(event.index)
            self._sidebar_changed()
            self._update_streaming()
            if self.compare_action.isChecked():
                self.refresh_compare()
        elif isinstance(event, ev.MessageAppended):
            view = self.panes.get(event.pane_id)
            if view is not None:
                view.message_appended(event.index)
            self._sidebar_changed()
        elif isinstance(event, ev.MessagesTruncated):
            view = self.panes.get(event.pane_id)
            if view is not None:
                view.messages_truncated(event.length)
            if self.compare_action.isChecked():
                self.refresh_compare()
        elif isinstance(event, ev.PaneUpdated):
            view = self.panes.get(event.pane_id)
            if view is not None:
                view.model_state = self.workspace.pane_model_state(event.pane_id)
                view.refresh_header()
                view.refresh_context()
            self._update_streaming()
            self._sync_pane_lists()
            self._refresh_ready()
        elif isinstance(event, ev.PaneAdded):
            self._add_pane_view(event.pane, event.index)
            self._refresh_ready()
        elif isinstance(event, ev.PaneClosed):
            self._remove_pane_view(event.pane_id)
            self._refresh_ready()
        elif isinstance(event, ev.PanesReordered):
            self._reorder(event.order)
        elif isinstance(event, ev.EngineStateChanged):
            self._apply_engine_state(event.state, event.progress, event.error)
            if self.server is not None and self.server.running:
                self.server.set_engines(self.workspace.loaded_models())

    def _add_pane_view(self, pane: Any, index: int) -> None:
        if pane.id in self.panes:
            return
        view = PaneView(pane, self.model_name(), self.splitter)
        view.stop_requested.connect(self.stop_pane)
        view.close_requested.connect(self.close_pane)
        view.settings_requested.connect(self.open_settings)
        view.regenerate_requested.connect(self.regenerate)
        view.edit_requested.connect(self.edit_message)
        view.fork_requested.connect(self.fork)
        view.activated.connect(self.set_current_pane)
        view.model_chosen.connect(self.choose_model)
        if self.registry is not None:
            view.set_model_entries(self._model_entries())
        view.model_state = self.workspace.pane_model_state(pane.id) if hasattr(self.workspace, "pane_model_state") else "ready"
        view.refresh_header()
        self.panes[pane.id] = view
        self.splitter.insertWidget(index, view)
        sizes = [1000] * self.splitter.count()
        self.splitter.setSizes(sizes)
        self._sync_pane_lists()
        if self.current_pane_id is None:
            self.set_current_pane(pane.id)

    def _remove_pane_view(self, pane_id: int) -> None:
        view = self.panes.pop(pane_id, None)
        if view is None:
            return
        view.hide()
        view.setParent(None)
        view.deleteLater()
        if self.current_pane_id == pane_id:
            self.current_pane_id = None
            order = self.pane_order()
            if order:
                self.set_current_pane(order[0])
        self._sync_pane_lists()
        self._update_streaming()

    def _reorder(self, order: list[int]) -> None:
        for position, pid in enumerate(order):
            view = self.panes.get(pid)
            if view is not None and self.splitter.indexOf(view) != position:
                self.splitter.insertWidget(position, view)
        self._sync_pane_lists()

    def pane_order(self) -> list[int]:
        return [self.splitter.widget(i).pane_id for i in range(self.splitter.count())
                if isinstance(self.splitter.widget(i), PaneView) and self.splitter.widget(i).pane_id in self.panes]

    def _sync_pane_lists(self) -> None:
        entries = [(pid, self.panes[pid].pane.title) for pid in self.pane_order()]
        self.composer.set_panes(entries)
        self.compare_bar.set_panes(entries)
        self.close_pane_action.setEnabled(len(entries) > 1)
        if self.sidebar is not None:
            self.sidebar.set_open(view.pane.conversation.id for view in self.panes.values())

    def _apply_engine_state(self, state: str, progress: Any, error: str | None) -> None:
        """Show what the panes' models are doing: the banner for the one that
        needs attention (loading, failed, not loaded), each pane's header, and
        whether anything can be sent."""
        ws = self.workspace
        if state == "closed" or getattr(ws, "_closed", False):
            self.composer.set_ready(False)
            return
        states: dict[int, str] = {pid: ws.pane_model_state(pid) for pid in self.panes}
        for pid, view in self.panes.items():
            view.model_state = states[pid]
            view.model_name = self.model_name(view.pane.conversation.model_id)
            view.refresh_header()
            view.refresh_context()
        self.composer.set_ready(any(st == "ready" for st in states.values()))
        local = [v.pane for v in self.panes.values() if v.pane.remote is None]
        wanted = list(dict.fromkeys([p.conversation.model_id for p in local] or [ws.default_model]))
        # Also any model being loaded or that failed to (asked for, if no pane runs it yet).
        wanted += [m for m in ws.slots if m not in wanted and ws.model_state(m) in ("loading", "error")]
        loading = [m for m in wanted if ws.model_state(m) == "loading"]
        failed = [m for m in wanted if ws.model_state(m) == "error"]
        unloaded = [m for m in wanted if ws.model_state(m) == "unloaded"]
        if loading:
            slot = ws.slots.get(loading[0])
            self.banner.show()
            self.banner.show_progress(slot.progress if slot is not None else None, self.model_name(loading[0]))
            self._banner_model = loading[0]
        elif failed:
            slot = ws.slots.get(failed[0])
            self.banner.show()
            self.banner.show_error((slot.error if slot is not None else None) or "unknown error", self.model_name(failed[0]))
            self._banner_model = failed[0]
            self.status_label.setText("No model loaded")
        elif unloaded and not (self.crash_recovery or self._load_requested):
            # Not asked for yet: the load starts as soon as the window is up.
            self.banner.show()
            self.banner.show_progress(None, self.model_name(unloaded[0]))
            self._banner_model = unloaded[0]
        elif unloaded:
            name = self.model_name(unloaded[0])
            if self.crash_recovery:
                text = (f"Tandem did not close properly last time, so no model was loaded in case the model caused "
                        f"it. Your chats are all here. Load {name} when you are ready, or pick another model in a pane.")
            else:
                text = f"{name} is not loaded; the panes on it cannot reply until it is."
            self.banner.show()
            self.banner.show_unloaded(text, f"Load {name}")
            self._banner_model = unloaded[0]
        else:
            self.banner.hide()
            self._banner_model = None
        if state == "ready":
            self.refresh_status()
            if not self.composer.edit.hasFocus():
                self.composer.edit.setFocus()

    def _refresh_ready(self) -> None:
        """The composer sends when at least one pane can reply (a remote pane needs no local model)."""
        if not self._shutdown_started:
            self.composer.set_ready(any(self.workspace.pane_model_state(pid) == "ready" for pid in self.panes))

    def _update_streaming(self) -> None:
        busy = any(view.pane.busy for view in self.panes.values())
        self.composer.set_streaming(busy)

    def _flush_panes(self) -> None:
        dirty = False
        for view in self.panes.values():
            if view.dirty:
                view.flush()
                dirty = True
        if not dirty and not any(view.pane.busy for view in self.panes.values()):
            self._frame_timer.stop()

    # -- what the user does ------------------------------------------------------------

    def _run(self, coro: Coroutine[Any, Any, Any], what: str, on_done: Callable[[], None] | None = None) -> asyncio.Task[Any]:
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
        if isinstance(exc, (AppError, EngineError)):
            message = str(exc)
        else:
            log.error("%s failed", what, exc_info=exc)
            message = f"{what} failed: {exc}"
        self.composer.show_notice(message)
        self.statusBar().showMessage(message, 10000)

    def _send_from_composer(self) -> None:
        self.composer.send()

    def send(self, text: str, targets: list[int]) -> None:
        if not text.strip():
            self.composer.show_notice("The message is empty. Type something to send.")
            return
        if not targets:
            self.composer.show_notice("No pane is selected to receive the message. Select at least one pane above.")
            return
        self.composer.set_sending(True)

        async def go() -> None:
            await self.workspace.send(text, targets)
            self.composer.clear()

        self._run(go(), "Sending", on_done=lambda: self.composer.set_sending(False))

    def stop_all(self) -> None:
        self.workspace.stop(None)

    def stop_pane(self, pane_id: int) -> None:
        self.workspace.stop(pane_id)

    def regenerate(self, pane_id: int, _index: int | None = None) -> None:
        self._run(self.workspace.regenerate(pane_id), "Regenerating")

    def regenerate_current(self) -> None:
        self._with_current(self.regenerate)

    def edit_message(self, pane_id: int, index: int) -> None:
        view = self.panes.get(pane_id)
        if view is None:
            return
        messages = view.pane.conversation.messages
        if index >= len(messages) or messages[index].role != "user":
            return
        if view.pane.busy:
            self.report_error("Editing", RuntimeError(f"{view.pane.title} is still replying; stop it first."))
            return
        dialog = EditMessageDialog(messages[index].text, len(messages) - index - 1, self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.edit_dialog = dialog

        def accepted() -> None:
            text = dialog.text()
            if text.strip():
                self._run(self.workspace.edit_and_resend(pane_id, index, text), "Edit and resend")

        dialog.accepted.connect(accepted)
        dialog.finished.connect(lambda _: setattr(self, "edit_dialog", None))
        dialog.open()

    def edit_current(self) -> None:
        view = self.current_view()
        if view is not None and view.last_user_index() is not None:
            self.edit_message(view.pane_id, view.last_user_index())

    def fork(self, pane_id: int, index: int) -> None:
        try:
            pane = self.workspace.fork_pane(pane_id, index)
        except Exception as exc:
            self.report_error("Forking", exc)
            return
        self.set_current_pane(pane.id)

    def fork_current(self) -> None:
        view = self.current_view()
        if view is None:
            return
        msgs = view.pane.conversation.messages
        index = len(msgs) - 1
        if view.pane.busy:
            index = (view.pane.conversation.streaming_index or 0) - 1
        if index >= 0:
            self.fork(view.pane_id, index)

    def copy_current(self) -> None:
        view = self.current_view()
        if view is not None and view.last_reply_index() is not None:
            view.messages[view.last_reply_index()].copy_text()

    def add_pane(self) -> None:
        try:
            pane = self.workspace.add_pane(after=self.current_pane_id)
        except Exception as exc:
            self.report_error("Adding a pane", exc)
            return
        self.set_current_pane(pane.id)

    def close_current_pane(self) -> None:
        self._with_current(self.close_pane)

    def close_pane(self, pane_id: int) -> None:
        view = self.panes.get(pane_id)
        if view is None:
            return
        if len(self.panes) <= 1:
            self.report_error("Closing", RuntimeError("The window needs at least one pane."))
            return
        if not view.pane.conversation.messages or self.session is not None:
            # A saved chat is not lost by closing its pane: the sidebar reopens it.
            self._close_pane_now(pane_id)
            if view.pane.conversation.messages:
                self.statusBar().showMessage(f"{view.pane.title} closed; its chat stays in the Chats sidebar.", 8000)
            return
        box = QMessageBox(
            QMessageBox.Icon.Question,
            "Close pane",
            f"Close {view.pane.title}? Its conversation will be discarded.",
            QMessageBox.StandardButton.Close | QMessageBox.StandardButton.Cancel,
            self,
        )
        box.setDefaultButton(QMessageBox.StandardButton.Cancel)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.confirm_box = box

        def finished(result: int) -> None:
            self.confirm_box = None
            if result == QMessageBox.StandardButton.Close:
                self._close_pane_now(pane_id)

        box.finished.connect(finished)
        box.open()

    def _close_pane_now(self, pane_id: int) -> None:
        try:
            self.workspace.close_pane(pane_id)
        except Exception as exc:
            self.report_error("Closing the pane", exc)

    def move_current(self, step: int) -> None:
        if self.current_pane_id is None:
            return
        order = self.pane_order()
        position = order.index(self.current_pane_id) + step
        if 0 <= position < len(order):
            self.workspace.move_pane(self.current_pane_id, position)

    def focus_neighbour(self, step: int) -> None:
        order = self.pane_order()
        if not order:
            return
        position = order.index(self.current_pane_id) if self.current_pane_id in order else 0
        self.set_current_pane(order[(position + step) % len(order)])

    def target_all(self) -> None:
        self.composer.set_targets(self.pane_order())

    def open_settings(self, pane_id: int) -> None:
        view = self.panes.get(pane_id)
        if view is None:
            return
        conv = view.pane.conversation
        popover = PaneSettingsPopover(
            conv.params,
            conv.system_prompt,
            self.max_context(),
            self,
            title=view.pane.title,
            remote=view.pane.remote,
            set_remote=lambda url, model, key: self.workspace.set_remote(pane_id, url, model, key),
            set_local=lambda: self.workspace.set_local(pane_id),
            context_policy=conv.context_policy,
        )
        popover.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        popover.destroyed.connect(lambda: setattr(self, "popover", None))
        self.popover = popover

        def applied(params: Any, system_prompt: str) -> None:
            try:
                self.workspace.set_params(pane_id, params)
                if system_prompt != conv.system_prompt:
                    self.workspace.set_system_prompt(pane_id, system_prompt)
                policy = popover.context_policy.currentData()
                if policy != conv.context_policy:
                    self.workspace.set_context_policy(pane_id, policy)
            except Exception as exc:
                self.report_error("Changing the settings", exc)

        popover.applied.connect(applied)
        button = view.settings_button
        anchor = button.mapToGlobal(button.rect().bottomRight())
        popover.adjustSize()
        popover.move(anchor.x() - popover.width(), anchor.y())
        popover.show()
        popover.temperature.setFocus()

    def set_current_pane(self, pane_id: int) -> None:
        if pane_id not in self.panes:
            return
        self.current_pane_id = pane_id
        for pid, view in self.panes.items():
            view.set_current(pid == pane_id)

    def current_view(self) -> PaneView | None:
        return self.panes.get(self.current_pane_id) if self.current_pane_id is not None else None

    def _with_current(self, fn: Callable[[int], Any]) -> None:
        if self.current_pane_id is not None:
            fn(self.current_pane_id)

    def _on_focus_changed(self, _old: QWidget | None, new: QWidget | None) -> None:
        widget = new
        while widget is not None:
            if isinstance(widget, PaneView):
                self.set_current_pane(widget.pane_id)
                return
            widget = widget.parentWidget()

    # -- compare -------------------------------------------------------------------

    def set_compare(self, on: bool) -> None:
        self.compare_bar.setVisible(on)
        if not on:
            for view in self.panes.values():
                for message in view.messages.values():
                    message.body.set_highlight(None)
            return
        if len(self.panes) < 2:
            self.statusBar().showMessage("Comparing needs two panes; add one with Ctrl+T.", 8000)
        self.refresh_compare()

    def refresh_compare(self) -> None:
        if not self.compare_action.isChecked():
            return
        for view in self.panes.values():
            for message in view.messages.values():
                message.body.set_highlight(None)
        chosen = self.compare_bar.chosen()
        if chosen is None or chosen[0] == chosen[1]:
            self.compare_bar.summary.setText("Choose two different panes.")
            return
        views = [self.panes.get(pid) for pid in chosen]
        if any(v is None for v in views):
            return
        indices = [v.last_reply_index() for v in views]
        if any(i is None for i in indices):
            self.compare_bar.summary.setText("Both panes need a reply to compare.")
            return
        texts = [v.pane.conversation.messages[i].text for v, i in zip(views, indices)]
        left, right = word_diff(texts[0], texts[1])
        for view, index, segments in zip(views, indices, (left, right)):
            view.messages[index].body.set_highlight(segments)
        changed = sum(len(s.text.split()) for s in left if s.changed), sum(len(s.text.split()) for s in right if s.changed)
        total = len(texts[0].split()), len(texts[1].split())
        if changed == (0, 0):
            self.compare_bar.summary.setText("The replies are identical word for word.")
        else:
            self.compare_bar.summary.setText(
                f"Highlighted: {changed[0]} of {total[0]} words differ on the left, {changed[1]} of {total[1]} on the right."
            )

    # -- status, theme, help -----------------------------------------------------------

    def model_name(self, model_id: str | None = None) -> str:
        """What people call the model: the registry's name, else the folder's."""
        model_id = self.workspace.default_model if model_id is None else model_id
        if self.registry is not None:
            try:
                return self.registry.get(model_id).name
            except Exception:
                pass
        if model_id == "default":
            from engine.formats.default_model import DEFAULT_MODEL_NAME

            return DEFAULT_MODEL_NAME
        engine = self.workspace.engine_for(model_id)
        path = getattr(engine, "model_path", None) if engine is not None else None
        return Path(path).name if path is not None else Path(str(model_id)).stem

    def _model_entries(self) -> list[Any]:
        """The registry's models, plus any model a pane runs that it does not list (a --model path)."""
        from app.models.registry import ModelEntry

        entries = list(self.registry.models()) if self.registry is not None else []
        known = {e.id for e in entries}
        for view in self.panes.values():
            model_id = view.pane.conversation.model_id
            if view.pane.remote is None and model_id not in known:
                known.add(model_id)
                entries.append(ModelEntry(model_id, Path(model_id).stem, Path(model_id), "folder"))
        return entries

    def _current_model(self) -> str:
        view = self.current_view()
        if view is not None and view.pane.remote is None:
            return view.pane.conversation.model_id
        return self.workspace.default_model

    def max_context(self) -> int:
        stats = self.workspace.stats(self._current_model())
        return int(getattr(stats, "max_context", 0) or 0) or 32768

    def refresh_status(self) -> None:
        stats = self.workspace.stats(self._current_model())
        if stats is None:
            return
        device = getattr(stats, "device", "?")
        dtype = str(getattr(stats, "dtype", "?")).replace("torch.", "")
        weights = str(getattr(stats, "weights", ""))
        if weights.endswith(" (kernel)"):  # kept quantized: the formats say more than the input dtype
            dtype = weights.removesuffix(" (kernel)")
        text = (
            f"{device} · {dtype} · KV pages {stats.pages_used} used / {stats.pages_cached} cached / "
            f"{stats.pages_free} free · prefix hits {stats.prefix_hit_rate:.0%}"
        )
        if stats.running:
            text += f" · {stats.decode_tokens_per_s:.0f} tok/s"
        self.status_label.setText(text)

    def set_theme(self, theme: str) -> None:
        self.settings.theme = theme
        self.engine_settings.theme = theme
        apply_theme(QApplication.instance(), theme)
        self._persist_settings()

    def _on_color_scheme_changed(self, *_: object) -> None:
        if getattr(self.settings, "theme", "system") == "system":
            apply_theme(QApplication.instance(), "system")

    def show_shortcuts(self) -> None:
        dialog = ShortcutsDialog(self.shortcuts(), self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()

    def show_about(self) -> None:
        stats = self.workspace.stats()
        device = f"{getattr(stats, 'device', '?')} ({str(getattr(stats, 'dtype', '?')).replace('torch.', '')})" if stats else "not loaded yet"
        box = QMessageBox(QMessageBox.Icon.Information, "About Tandem", about_text(self.version, device, self.model_name()),
                          QMessageBox.StandardButton.Ok, self)
        box.setTextFormat(Qt.TextFormat.RichText)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()

    # -- loading and closing -------------------------------------------------------------

    def load_engine(self) -> None:
        """Load the settings' model and every other model an open pane runs."""
        self._load_requested = True
        self.crash_recovery = False

        async def load_all() -> None:
            ok = await self.workspace.load_engine(self.engine_settings)
            others = [v.pane.conversation.model_id for v in self.panes.values() if v.pane.remote is None]
            for model_id in dict.fromkeys(others):
                if ok and self.workspace.model_state(model_id) == "unloaded":
                    await self._load_if_it_fits(model_id)

        self._run(load_all(), "Loading the model")

    def _banner_load(self) -> None:
        model_id = self._banner_model
        if model_id is None or (model_id == self.workspace.default_model and self.crash_recovery):
            self.load_engine()
        else:
            self.load_model(model_id)

    def load_model(self, model_id: str) -> None:
        self._load_requested = True
        self.crash_recovery = False
        self._run(self._load_if_it_fits(model_id), f"Loading {self.model_name(model_id)}")

    def load_pane_model(self, pane_id: int) -> None:
        view = self.panes.get(pane_id)
        if view is not None and view.pane.remote is None:
            self.load_model(view.pane.conversation.model_id)

    async def _load_if_it_fits(self, model_id: str) -> bool:
        """Load the model, after checking its memory estimate against what is
        free; when it does not fit, ask whether to unload idle models first."""
        verdict = self.memory_verdict(model_id)
        if verdict is not None and not verdict.fits:
            choice = await self._ask_memory(verdict)
            if choice == "cancel":
                self._apply_engine_state("unloaded", None, None)
                return False
            if choice == "unload":
                for other in verdict.unload:
                    await self.workspace.unload_model(other)
        return await self.workspace.load_model(model_id)

    def memory_verdict(self, model_id: str) -> Any:
        """app.models.memory_estimate.FitResult for loading `model_id` now, or None when it cannot be estimated."""
        if self.registry is None:
            return None
        from app.models.memory_estimate import LoadedModel, available_memory, check_fits

        s = self.engine_settings
        try:
            estimate = self.registry.estimate_memory(model_id, s.device, s.dtype, s.kv_cache_mb, s.page_size)
            available = available_memory(s.device)
            loaded = []
            for other in self.workspace.loaded_models():
                try:
                    size = self.registry.estimate_memory(other, s.device, s.dtype, s.kv_cache_mb, s.page_size).total_bytes
                except Exception:
                    continue
                loaded.append(LoadedModel(other, size, not self.workspace.model_busy(other)))
        except Exception as exc:  # an estimate is advice: never stop a load over it
            log.info("no memory estimate for %s: %s", model_id, exc)
            return None
        names = {m.model_id: self.model_name(m.model_id) for m in loaded}
        return check_fits(estimate, available, loaded, model_name=self.model_name(model_id), names=names)

    async def _ask_memory(self, verdict: Any) -> str:
        """"unload" | "load" | "cancel"."""
        box = QMessageBox(QMessageBox.Icon.Warning, "Not enough memory", verdict.message, QMessageBox.StandardButton.NoButton, self)
        unload = box.addButton("&Unload and load", QMessageBox.ButtonRole.AcceptRole) if verdict.unload else None
        anyway = box.addButton("Load &anyway", QMessageBox.ButtonRole.DestructiveRole)
        cancel = box.addButton(QMessageBox.StandardButton.Cancel)
        box.setDefaultButton(unload or cancel)
        self.confirm_box = box
        done: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        def finished(_result: int) -> None:
            clicked = box.clickedButton()
            answer = "unload" if clicked is unload and unload is not None else "load" if clicked is anyway else "cancel"
            if not done.done():
                done.set_result(answer)
            self.confirm_box = None

        box.finished.connect(finished)
        box.open()
        return await done

    def choose_model(self, pane_id: int, model_id: str) -> None:
        """The pane's header picked another model: switch the pane, and load the model when it is not loaded."""
        view = self.panes.get(pane_id)
        if view is None:
            return
        try:
            self.workspace.set_model(pane_id, model_id)
        except Exception as exc:
            view.refresh_header()  # back to the model it still runs
            self.report_error("Changing the model", exc)
            return
        self._apply_engine_state(self.workspace.model_state(model_id), None, None)
        if self.workspace.model_state(model_id) in ("unloaded", "error"):
            self.load_model(model_id)

    def unload_idle_models(self) -> None:
        """Free the memory of every loaded model that no pane is set to."""
        idle = [m for m in self.workspace.loaded_models() if not self.workspace.model_in_use(m)]
        if not idle:
            self.statusBar().showMessage("Every loaded model is in use by a pane.", 8000)
            return

        async def unload() -> None:
            for model_id in idle:
                await self.workspace.unload_model(model_id)
            self.statusBar().showMessage(f"Unloaded {', '.join(self.model_name(m) for m in idle)}.", 8000)

        self._run(unload(), "Unloading models")

    def open_model_manager(self) -> None:
        if self.registry is None:
            return
        from ui.dialogs.model_manager import ModelManagerDialog

        if self.model_manager is not None:
            self.model_manager.raise_()
            self.model_manager.activateWindow()
            return
        dialog = ModelManagerDialog(
            self.registry,
            self,
            is_in_use=self.workspace.model_in_use,
            is_loaded=lambda model_id: self.workspace.model_state(model_id) == "ready",
            reload_model=self.load_model,
        )
        s = self.engine_settings
        try:
            dialog.set_engine_settings(s.device, s.dtype, s.kv_cache_mb, s.page_size)
        except Exception:
            log.debug("model manager: no engine settings", exc_info=True)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.models_changed.connect(self._models_changed)
        dialog.destroyed.connect(lambda: setattr(self, "model_manager", None))
        self.model_manager = dialog
        dialog.open()

    def _models_changed(self) -> None:
        entries = self._model_entries()
        for view in self.panes.values():
            view.set_model_entries(entries)
            view.refresh_header()

    # -- chats: the sidebar, export and import -------------------------------------------

    def open_conversation(self, conversation_id: str) -> None:
        """Show a saved conversation: focus its pane when it is open, else open it in a new pane."""
        for view in self.panes.values():
            if view.pane.conversation.id == conversation_id:
                self.set_current_pane(view.pane_id)
                view.setFocus()
                return
        if self.session is None:
            return
        try:
            conversation = self.session.load_conversation(conversation_id)
            pane = self.workspace.open_conversation(conversation, after=self.current_pane_id)
        except Exception as exc:
            self.report_error("Opening the chat", exc)
            return
        self.set_current_pane(pane.id)
        self._apply_engine_state(self.workspace.pane_model_state(pane.id), None, None)

    def new_chat(self) -> None:
        """Start a new conversation in the current pane; the old one stays in the sidebar."""
        view = self.current_view()
        if view is None:
            self.add_pane()
            return
        if not view.pane.conversation.messages:
            self.composer.edit.setFocus()
            return
        try:
            pane = self.workspace.add_pane(after=view.pane_id)
            if view.pane.remote is None:
                self.workspace.set_model(pane.id, view.pane.conversation.model_id)
            self.workspace.close_pane(view.pane_id)
        except Exception as exc:
            self.report_error("Starting a new chat", exc)
            return
        self.set_current_pane(pane.id)
        self.composer.edit.setFocus()

    def _sidebar_changed(self) -> None:
        """Refresh the sidebar once the writes queued so far are in the store:
        a marker job behind them posts the refresh back to this thread. A
        marker that finds a refresh already posted (and not yet run) posts
        none: that refresh reads the store after this marker's writes too."""
        if self.sidebar is None or self._shutdown_started:
            return
        loop = asyncio.get_event_loop()

        def written(_store: Any) -> None:  # on the writer thread
            if self._sidebar_refresh_pending:
                return
            self._sidebar_refresh_pending = True
            try:
                loop.call_soon_threadsafe(self._refresh_sidebar)
            except RuntimeError:  # the loop has closed
                pass

        self.session.writer.submit(written)

    def _refresh_sidebar(self) -> None:
        self._sidebar_refresh_pending = False  # before reading: a later marker posts again
        if self.sidebar is None or self._shutdown_done:
            return
        if self.sidebar.list.state() == QAbstractItemView.State.EditingState:
            QTimer.singleShot(1000, self._sidebar_changed)  # not under a rename being typed
            return
        self.sidebar.refresh()

    def search_chats(self) -> None:
        if self.sidebar is None or self.sidebar_dock is None:
            return
        self.sidebar_dock.show()
        self.sidebar.focus_search()

    def _conversation_renamed(self, conversation_id: str, title: str) -> None:
        for view in self.panes.values():
            if view.pane.conversation.id == conversation_id:
                view.pane.conversation.title = title
                view.refresh_header()

    def _conversation_deleted(self, conversation_id: str) -> None:
        """A deleted chat leaves its pane (the last pane starts a new chat instead)."""
        for view in list(self.panes.values()):
            if view.pane.conversation.id != conversation_id:
                continue
            self.workspace.stop(view.pane_id)
            if len(self.panes) > 1:
                self._close_pane_now(view.pane_id)
            else:
                pane = self.workspace.add_pane()
                self._close_pane_now(view.pane_id)
                self.set_current_pane(pane.id)

    def _store_failed(self, error: Exception) -> None:
        self._show_store_banner(
            f"{error} Nothing open is lost: File → Export saves a chat anywhere you choose."
        )

    def show_store_problem(self, problem: str) -> None:
        """The chat store could not be opened at all: chats work, but are not saved."""
        self._show_store_banner(
            f"{problem} Chats are not being saved in this session; File → Export saves one anywhere you choose."
        )

    def _show_store_banner(self, text: str) -> None:
        self.store_banner.setText(text)
        self.store_banner.show()

    def _save_path(self, caption: str, name: str, filters: str) -> str | None:
        from PySide6.QtWidgets import QFileDialog

        path, _ = QFileDialog.getSaveFileName(self, caption, str(Path.home() / name), filters)
        return path or None

    def export_current(self, fmt: str, path: str | None = None) -> Path | None:
        """Save the current pane's chat as Markdown ("md") or JSON ("json"); returns the file written."""
        from app.store.export import to_json, to_markdown

        view = self.current_view()
        if view is None:
            return None
        conversation = view.pane.conversation
        stem = _file_stem(conversation.title or view.pane.title)
        if path is None:
            filters = "Markdown (*.md)" if fmt == "md" else "JSON (*.json)"
            path = self._save_path("Export chat", f"{stem}.{fmt}", filters)
            if path is None:
                return None
        try:
            if fmt == "md":
                text = to_markdown(conversation)
            else:
                import json

                text = json.dumps(to_json(conversation), indent=2, ensure_ascii=False) + "\n"
            return self._save_text(Path(path), text)
        except Exception as exc:
            self.report_error("Exporting the chat", exc)
            return None

    def export_comparison(self, path: str | None = None) -> Path | None:
        """Save every open pane's chat side by side as one Markdown file."""
        from app.store.export import comparison_markdown

        panes = [(self.panes[pid].pane.title, self.panes[pid].pane.conversation) for pid in self.pane_order()]
        if path is None:
            path = self._save_path("Export comparison", "comparison.md", "Markdown (*.md)")
            if path is None:
                return None
        try:
            return self._save_text(Path(path), comparison_markdown(panes))
        except Exception as exc:
            self.report_error("Exporting the comparison", exc)
            return None

    def _save_text(self, path: Path, text: str) -> Path:
        try:
            write_text_atomically(path, text)
        except OSError as exc:
            raise OSError(f"{path} could not be written: {exc.strerror or exc}") from None
        self.statusBar().showMessage(f"Saved {path}", 10000)
        return path

    def import_chat(self, path: str | None = None) -> None:
        """Open a chat exported as Tandem JSON in a new pane (and save it)."""
        import json

        from app.store.export import ChatImportError, from_json

        if path is None:
            from PySide6.QtWidgets import QFileDialog

            path, _ = QFileDialog.getOpenFileName(self, "Import chat", str(Path.home()), "Tandem chat (*.json)")
            if not path:
                return
        name = Path(path).name
        try:
            try:
                data = json.loads(Path(path).read_text(encoding="utf-8"))
            except json.JSONDecodeError as exc:
                raise ChatImportError(f"{name} is not a Tandem chat: it is not valid JSON ({exc.msg}, line {exc.lineno}).") from None
            except (OSError, UnicodeDecodeError) as exc:
                raise ChatImportError(f"{name} could not be read: {exc}") from None
            pane = self.workspace.open_conversation(from_json(data), after=self.current_pane_id)
        except Exception as exc:
            self.report_error("Importing", exc)
            return
        self.set_current_pane(pane.id)
        self._apply_engine_state(self.workspace.pane_model_state(pane.id), None, None)

    # -- preferences and serving ---------------------------------------------------------

    def open_preferences(self) -> None:
        from ui.dialogs.settings_dialog import open_settings_dialog

        if self.settings_dialog is not None:
            self.settings_dialog.raise_()
            return

        def accepted(new: Any) -> None:
            engine_changes = any(
                getattr(new, k) != getattr(self.settings, k) for k in ("device", "dtype", "threads", "kv_cache_mb", "page_size")
            )
            for key in ("device", "dtype", "threads", "kv_cache_mb", "page_size", "default_params",
                        "default_system_prompt", "context_policy", "theme"):
                setattr(self.settings, key, getattr(new, key))
                setattr(self.engine_settings, key, getattr(new, key))
            apply_theme(QApplication.instance(), new.theme)
            self._persist_settings()
            if engine_changes:
                self.statusBar().showMessage(
                    "Saved. Engine settings apply the next time a model loads (Models → Load this pane's model).", 15000
                )

        dialog = open_settings_dialog(self.settings, self, accepted)
        self.settings_dialog = dialog
        dialog.finished.connect(lambda _r: setattr(self, "settings_dialog", None))

    def set_serving(self, on: bool) -> None:
        """Serve the loaded models over the OpenAI API on 127.0.0.1 (other tools share their prefix cache)."""
        if not on:
            if self.server is not None:
                server, self.server = self.server, None
                self._run(asyncio.to_thread(server.stop), "Stopping the API server")
                self.statusBar().showMessage("The API server has stopped.", 8000)
            return
        from app.remote.local_server import LocalServer

        server = LocalServer(where="Models → Serve loaded models (or quit the program using it)")
        try:
            url = server.start(self.workspace.loaded_models(), host="127.0.0.1", port=self.serve_port)
        except Exception as exc:
            self.serve_action.blockSignals(True)
            self.serve_action.setChecked(False)
            self.serve_action.blockSignals(False)
            self.report_error("Serving the API", exc)
            return
        self.server = server
        self.statusBar().showMessage(f"Serving the loaded models at {url} (OpenAI API).", 15000)

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802
        if self._shutdown_done:
            event.accept()
            return
        event.ignore()
        if self._shutdown_started:
            return
        self._shutdown_started = True
        self.hide()  # the user asked to close: go away now, finish stopping behind the scenes
        self._persist_settings()

        async def shut_down() -> None:
            try:
                if self.server is not None:
                    server, self.server = self.server, None
                    await asyncio.to_thread(server.stop)
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
        QGuiApplication.styleHints().colorSchemeChanged.disconnect(self._on_color_scheme_changed)
        self.close()
        self.closed.emit()

    @property
    def shut_down(self) -> bool:
        return self._shutdown_done

    def _restore_geometry(self) -> None:
        state = getattr(self.settings, "ui_state", None) or {}
        geometry = state.get("geometry")
        if isinstance(geometry, str):
            self.restoreGeometry(QByteArray.fromBase64(geometry.encode("ascii")))

    def _persist_settings(self) -> None:
        if not self._save_settings:
            return
        try:
            state = dict(getattr(self.settings, "ui_state", None) or {})
            state["geometry"] = bytes(self.saveGeometry().toBase64().data()).decode("ascii")
            self.settings.ui_state = state
            self.settings.save()
        except Exception as exc:  # a read-only config folder must not stop the app closing
            log.warning("could not save settings: %s", exc)

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange and self.compare_action.isChecked():
            self.refresh_compare()


class _SidebarStore:
    """The sidebar's view of the chat store: reads on the GUI thread's own
    connection (quick), writes queued for the writer thread (the GUI thread
    never waits for a transaction in progress); `written()` is called once
    they are in, to refresh the list."""

    def __init__(self, session: Any, written: Callable[[], None]) -> None:
        self._session = session
        self._written = written

    def list_conversations(self, search: str | None = None) -> list[Any]:
        # Empty chats (a pane nobody wrote in yet) are not worth listing.
        return [c for c in self._session.store.list_conversations(search) if c.message_count]

    def rename(self, conversation_id: str, title: str) -> None:
        self._write(lambda store: store.rename(conversation_id, title))

    def delete(self, conversation_id: str) -> None:
        self._write(lambda store: store.delete(conversation_id))

    def undelete(self, conversation_id: str) -> None:
        self._write(lambda store: store.undelete(conversation_id))

    def _write(self, fn: Callable[[Any], None]) -> None:
        self._session.writer.submit(fn)
        self._written()


def _file_stem(title: str) -> str:
    import re

    stem = re.sub(r"[^\w\- ]+", "", title).strip().replace(" ", "-")[:60]
    return stem or "chat"
