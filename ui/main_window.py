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
    QApplication,
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
from app.compare import word_diff
from engine.errors import EngineError
from ui.compare_bar import CompareBar
from ui.composer import Composer
from ui.dialogs import EditMessageDialog, ShortcutsDialog, about_text, shortcut_text
from ui.pane_settings import PaneSettingsPopover
from ui.pane_view import PaneView
from ui.theme import apply_theme

log = logging.getLogger(__name__)

# ~30 repaints a second at most, whatever the token rate.
FRAME_INTERVAL_MS = 33
STATS_INTERVAL_MS = 500


class LoadingBanner(QFrame):
    """'Loading model…' with the engine's progress; the load error if it fails."""

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

    def show_progress(self, progress: Any) -> None:
        self.retry.hide()
        self.progress.show()
        if progress is None:
            self.label.setText("Loading model…")
            self.progress.setRange(0, 0)
            return
        stage = {"import": "Importing", "weights": "Loading weights", "warmup": "Warming up", "ready": "Ready"}
        self.label.setText(f"Loading model… {stage.get(progress.stage, progress.stage)}: {progress.detail}")
        if progress.total:
            self.progress.setRange(0, progress.total)
            self.progress.setValue(progress.done)
        else:
            self.progress.setRange(0, 0)

    def show_error(self, error: str) -> None:
        self.label.setText(f"The model could not be loaded: {error}")
        self.progress.hide()
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
    ) -> None:
        """`settings` are the saved settings (the window saves its state and
        theme into them); `engine_settings` what this run loads the model with
        (the saved ones plus command-line choices), by default the same."""
        super().__init__()
        self.workspace = workspace
        self.settings = settings
        self.engine_settings = engine_settings if engine_settings is not None else settings
        self.version = version
        self._save_settings = save_settings
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
        self.banner.retry_requested.connect(self.load_engine)
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
        if getattr(settings, "load_warning", None):
            self.statusBar().showMessage(settings.load_warning, 15000)
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
        self.close_pane_action = self._action(file_menu, "&Close pane", "Ctrl+W", self.close_current_pane)
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

        view = bar.addMenu("&View")
        self.compare_action = QAction("&Compare replies", self)
        self.compare_action.setCheckable(True)
        self.compare_action.setShortcut(QKeySequence("Ctrl+D"))
        self.compare_action.toggled.connect(self.set_compare)
        view.addAction(self.compare_action)
        self.addAction(self.compare_action)
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
            self._update_streaming()
            if self.compare_action.isChecked():
                self.refresh_compare()
        elif isinstance(event, ev.MessageAppended):
            view = self.panes.get(event.pane_id)
            if view is not None:
                view.message_appended(event.index)
        elif isinstance(event, ev.MessagesTruncated):
            view = self.panes.get(event.pane_id)
            if view is not None:
                view.messages_truncated(event.length)
            if self.compare_action.isChecked():
                self.refresh_compare()
        elif isinstance(event, ev.PaneUpdated):
            view = self.panes.get(event.pane_id)
            if view is not None:
                view.refresh_header()
                view.refresh_context()
            self._update_streaming()
            self._sync_pane_lists()
        elif isinstance(event, ev.PaneAdded):
            self._add_pane_view(event.pane, event.index)
        elif isinstance(event, ev.PaneClosed):
            self._remove_pane_view(event.pane_id)
        elif isinstance(event, ev.PanesReordered):
            self._reorder(event.order)
        elif isinstance(event, ev.EngineStateChanged):
            self._apply_engine_state(event.state, event.progress, event.error)

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

    def _apply_engine_state(self, state: str, progress: Any, error: str | None) -> None:
        if state == "ready":
            self.banner.hide()
            self.composer.set_ready(True)
            for view in self.panes.values():
                view.model_name = self.model_name()
                view.refresh_header()
                view.refresh_context()
            self.refresh_status()
            if not self.composer.edit.hasFocus():
                self.composer.edit.setFocus()
        elif state == "error":
            self.banner.show()
            self.banner.show_error(error or "unknown error")
            self.composer.set_ready(False)
            self.status_label.setText("No model loaded")
        elif state in ("loading", "unloaded"):
            self.banner.show()
            self.banner.show_progress(progress)
            self.composer.set_ready(False)
        else:  # closed
            self.composer.set_ready(False)

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
        if not view.pane.conversation.messages:
            self._close_pane_now(pane_id)
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
        )
        popover.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        popover.destroyed.connect(lambda: setattr(self, "popover", None))
        self.popover = popover

        def applied(params: Any, system_prompt: str) -> None:
            try:
                self.workspace.set_params(pane_id, params)
                if system_prompt != conv.system_prompt:
                    self.workspace.set_system_prompt(pane_id, system_prompt)
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

    def model_name(self) -> str:
        engine = getattr(self.workspace, "engine", None)
        path = getattr(engine, "model_path", None) if engine is not None else None
        if path is not None:
            return Path(path).name  # the imported folder: the model's name
        model = getattr(self.engine_settings, "model", "default")
        if model == "default":
            from engine.default_model import DEFAULT_MODEL_NAME

            return DEFAULT_MODEL_NAME
        return Path(str(model)).stem

    def max_context(self) -> int:
        stats = self.workspace.stats()
        return int(getattr(stats, "max_context", 0) or 0) or 32768

    def refresh_status(self) -> None:
        stats = self.workspace.stats()
        if stats is None:
            return
        device = getattr(stats, "device", "?")
        dtype = str(getattr(stats, "dtype", "?")).replace("torch.", "")
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
        self._run(self.workspace.load_engine(self.engine_settings), "Loading the model")

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
                await asyncio.wait_for(self.workspace.shutdown(), timeout=5)
            except Exception:
                log.exception("shutting down the workspace failed")
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
