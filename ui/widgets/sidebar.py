"""The sidebar: saved conversations, searchable, to open, rename and delete.

It reads and writes through a small interface (`ConversationIndex`) that
`app.store.chat_store.ChatStore` provides. Deleting is a soft delete: an Undo bar
stays for `undo_seconds`, and Undo undeletes; removing deleted chats for good
is the store's business (`purge_deleted`). A store error (disk full, a
read-only folder) is shown in the sidebar's bar and nothing else happens:
the list stays as it was and the app keeps running.

Keys in the list: Enter opens, F2 renames in place, Delete deletes (after a
confirmation); in the search field, Down goes to the list, Enter opens the
first match and Esc clears the search.
"""

from __future__ import annotations

import datetime as dt
import html
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from PySide6.QtCore import QEvent, QModelIndex, QObject, QRect, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QColor, QFont, QFontMetrics, QKeyEvent, QKeySequence, QPainter, QPalette
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QMessageBox,
    QPushButton,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QVBoxLayout,
    QWidget,
)

from app.store.chat_store import ConversationSummary
from app.store.records import UNKNOWN_TIME_TEXT, local_datetime, local_time_text
from app.errors import AppError

SUMMARY_ROLE = Qt.ItemDataRole.UserRole + 1
UNTITLED = "Untitled chat"
MAX_TITLE_CHARS = 200
TOOLTIP_PREVIEW_CHARS = 300


class ConversationIndex(Protocol):
    """What the sidebar needs from the chat store (ChatStore has all four)."""

    def list_conversations(self, search: str | None = None) -> list[ConversationSummary]: ...

    def rename(self, conversation_id: str, title: str) -> None: ...

    def delete(self, conversation_id: str) -> None: ...

    def undelete(self, conversation_id: str) -> None: ...


def relative_time(timestamp: float, now: float | None = None) -> str:
    """'Today 10:42', 'Yesterday 18:05', 'Mon 09:12' (this week), '12 Mar', '12 Mar 2024' (local time);
    'unknown date' for a stored time that is no date (an older version imported it), so the row still shows."""
    when = local_datetime(timestamp)
    if when is None:
        return UNKNOWN_TIME_TEXT
    today = dt.datetime.fromtimestamp(time.time() if now is None else now).date()
    clock = when.strftime("%H:%M")
    days = (today - when.date()).days
    if days == 0:
        return f"Today {clock}"
    if days == 1:
        return f"Yesterday {clock}"
    if 1 < days < 7:
        return f"{when.strftime('%a')} {clock}"
    if when.year == today.year:
        return f"{when.day} {when.strftime('%b')}"
    return f"{when.day} {when.strftime('%b')} {when.year}"


def count_label(count: int) -> str:
    return "1 message" if count == 1 else f"{count} messages"


def clean_title(text: str) -> str:
    """A title as typed, on one line, without surrounding space, at most MAX_TITLE_CHARS."""
    return " ".join(text.split())[:MAX_TITLE_CHARS]


class _RowDelegate(QStyledItemDelegate):
    """Two lines a row: the title and the time; the preview and the message count.

    An open conversation gets a dot and a bold title. Renaming edits the title
    line in place; the new title goes to `on_rename`, not into the model (the
    list is reloaded from the store, which is what counts).
    """

    def __init__(self, sidebar: ChatSidebar) -> None:
        super().__init__(sidebar)
        self._sidebar = sidebar
        self.on_rename: Callable[[str, str], None] = lambda conv_id, title: None

    def _metrics(self, option: QStyleOptionViewItem) -> tuple[QFont, QFont, int]:
        title_font = QFont(option.font)
        small = QFont(option.font)
        small.setPointSizeF(max(6.0, option.font.pointSizeF() * 0.9))
        pad = max(5, QFontMetrics(option.font).height() * 2 // 5)
        return title_font, small, pad

    def sizeHint(self, option: QStyleOptionViewItem, index: QModelIndex) -> QSize:
        title_font, small, pad = self._metrics(option)
        height = QFontMetrics(title_font).height() + QFontMetrics(small).height() + 2 * pad + 2
        return QSize(QFontMetrics(option.font).averageCharWidth() * 30, height)

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex) -> None:
        summary: ConversationSummary | None = index.data(SUMMARY_ROLE)
        if summary is None:
            super().paint(painter, option, index)
            return
        opt = QStyleOptionViewItem(option)
        self.initStyleOption(opt, index)
        opt.text = ""
        style = opt.widget.style() if opt.widget is not None else self._sidebar.style()
        style.drawControl(QStyle.ControlElement.CE_ItemViewItem, opt, painter, opt.widget)
        if not option.state & QStyle.StateFlag.State_Selected:
            # A hairline between rows: two-line rows run together without it.
            painter.save()
            painter.setPen(_blend(option.palette.color(QPalette.ColorRole.Base), option.palette.color(QPalette.ColorRole.Text), 0.1))
            painter.drawLine(option.rect.left() + 6, option.rect.bottom(), option.rect.right() - 6, option.rect.bottom())
            painter.restore()

        title_font, small, pad = self._metrics(option)
        is_open = summary.id in self._sidebar.open_ids
        if is_open:
            title_font.setBold(True)
        selected = bool(option.state & QStyle.StateFlag.State_Selected)
        palette = option.palette
        text_color = palette.color(QPalette.ColorRole.HighlightedText if selected else QPalette.ColorRole.Text)
        muted = _blend(text_color, palette.color(QPalette.ColorRole.Highlight if selected else QPalette.ColorRole.Base), 0.4)

        rect = option.rect.adjusted(pad + 2, pad, -pad - 2, -pad)
        title_height = QFontMetrics(title_font).height()
        small_metrics = QFontMetrics(small)
        dot_width = 0
        painter.save()
        if is_open:
            # The dot marks "open in a pane"; the accent colour is readable on both themes.
            dot = max(6, title_height // 3)
            dot_color = text_color if selected else palette.color(QPalette.ColorRole.Highlight)
            painter.setRenderHint(QPainter.RenderHint.Antialiasing)
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(dot_color)
            painter.drawEllipse(rect.left(), rect.top() + (title_height - dot) // 2, dot, dot)
            dot_width = dot + pad
        when = relative_time(summary.updated_at, self._sidebar.now())
        painter.setFont(small)
        painter.setPen(muted)
        when_width = small_metrics.horizontalAdvance(when)
        painter.drawText(
            QRect(rect.right() - when_width, rect.top(), when_width, title_height),
            int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter), when,
        )
        painter.setFont(title_font)
        painter.setPen(text_color)
        title_rect = QRect(rect.left() + dot_width, rect.top(), rect.width() - dot_width - when_width - pad, title_height)
        title = summary.title or UNTITLED
        if not summary.title:
            italic = QFont(title_font)
            italic.setItalic(True)
            painter.setFont(italic)
        elided = QFontMetrics(painter.font()).elidedText(title, Qt.TextElideMode.ElideRight, title_rect.width())
        painter.drawText(title_rect, int(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter), elided)

        second_top = rect.top() + title_height + 2
        line_height = small_metrics.height()
        count = count_label(summary.message_count)
        count_width = small_metrics.horizontalAdvance(count)
        painter.setFont(small)
        painter.setPen(muted)
        painter.drawText(
            QRect(rect.right() - count_width, second_top, count_width, line_height),
            int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter), count,
        )
        preview_width = rect.width() - count_width - pad
        preview = small_metrics.elidedText(summary.preview or "No messages yet", Qt.TextElideMode.ElideRight, preview_width)
        painter.drawText(
            QRect(rect.left(), second_top, preview_width, line_height),
            int(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter), preview,
        )
        painter.restore()

    # -- renaming in place -------------------------------------------------------

    def createEditor(self, parent: QWidget, option: QStyleOptionViewItem, index: QModelIndex) -> QWidget:
        editor = QLineEdit(parent)
        editor.setMaxLength(MAX_TITLE_CHARS)
        editor.setPlaceholderText(UNTITLED)
        return editor

    def updateEditorGeometry(self, editor: QWidget, option: QStyleOptionViewItem, index: QModelIndex) -> None:
        _title_font, _small, pad = self._metrics(option)
        height = editor.sizeHint().height()
        editor.setGeometry(option.rect.left() + pad, option.rect.top() + max(0, pad - 3), option.rect.width() - 2 * pad, height)

    def setEditorData(self, editor: QWidget, index: QModelIndex) -> None:
        summary: ConversationSummary = index.data(SUMMARY_ROLE)
        assert isinstance(editor, QLineEdit)
        editor.setText(summary.title)
        editor.selectAll()

    def setModelData(self, editor: QWidget, model: object, index: QModelIndex) -> None:
        summary: ConversationSummary = index.data(SUMMARY_ROLE)
        assert isinstance(editor, QLineEdit)
        title = clean_title(editor.text())
        if title != summary.title:
            # Posted: the rename reloads the list, which must not happen while
            # the view is still closing this editor.
            conv_id = summary.id
            QTimer.singleShot(0, self, lambda: self.on_rename(conv_id, title))


def _blend(a: QColor, b: QColor, t: float) -> QColor:
    return QColor(
        round(a.red() * (1 - t) + b.red() * t),
        round(a.green() * (1 - t) + b.green() * t),
        round(a.blue() * (1 - t) + b.blue() * t),
    )


class ChatSidebar(QWidget):
    """Saved conversations: search, open, rename, delete with undo, new chat."""

    open_requested = Signal(str)  # a conversation id
    new_requested = Signal()
    arena_requested = Signal()  # a new blind arena over the panes
    renamed = Signal(str, str)  # id, new title (an open pane may show it)
    deleted = Signal(str)  # id, soft-deleted (undo is still possible)
    restored = Signal(str)  # id, undeleted

    def __init__(
        self,
        store: ConversationIndex,
        parent: QWidget | None = None,
        *,
        undo_seconds: float = 10.0,
        search_delay_ms: int = 150,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(parent)
        self._store = store
        self._clock = clock
        self.open_ids: set[str] = set()
        self.blind_ids: set[str] = set()  # chats whose model an arena hides now
        self._undo_ids: list[str] = []
        self._confirm: QMessageBox | None = None

        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.setSpacing(6)
        top = QHBoxLayout()
        self.title_label = QLabel("<b>Chats</b>", self)
        self.new_button = QPushButton("&New chat", self)
        self.new_button.setToolTip("Start a new conversation in a pane")
        self.new_button.clicked.connect(self.new_requested)
        self.arena_button = QPushButton("New &arena", self)
        self.arena_button.setToolTip("A new chat in every pane, compared blind: vote on each turn (View → Arena)")
        self.arena_button.clicked.connect(self.arena_requested)
        top.addWidget(self.title_label, 1)
        top.addWidget(self.arena_button)
        top.addWidget(self.new_button)
        layout.addLayout(top)

        self.search = QLineEdit(self)
        self.search.setPlaceholderText("Search titles and messages")
        self.search.setClearButtonEnabled(True)
        self.search.setAccessibleName("Search chats")
        self.search.installEventFilter(self)
        layout.addWidget(self.search)
        self._search_timer = QTimer(self)
        self._search_timer.setSingleShot(True)
        self._search_timer.setInterval(search_delay_ms)
        self._search_timer.timeout.connect(self.refresh)
        self.search.textChanged.connect(lambda _text: self._search_timer.start())

        self.list = QListWidget(self)
        self.list.setAccessibleName("Saved chats")
        self.list.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.list.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)  # F2 goes through the action
        self.list.setUniformItemSizes(True)
        self.list.setVerticalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        self.list.setMouseTracking(True)
        self._delegate = _RowDelegate(self)
        self._delegate.on_rename = self.rename
        self.list.setItemDelegate(self._delegate)
        self.list.doubleClicked.connect(lambda index: self._open_index(index))
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._context_menu)
        layout.addWidget(self.list, 1)

        self.empty_label = QLabel(self)
        self.empty_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty_label.setWordWrap(True)
        self.empty_label.setTextFormat(Qt.TextFormat.PlainText)
        self.empty_label.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        self.empty_label.hide()
        layout.addWidget(self.empty_label, 1)

        # The bar under the list: "Deleted …  [Undo]", or a store error.
        self.bar = QFrame(self)
        self.bar.setFrameShape(QFrame.Shape.StyledPanel)
        self.bar.setAutoFillBackground(True)
        self.bar.setBackgroundRole(QPalette.ColorRole.AlternateBase)
        bar_layout = QHBoxLayout(self.bar)
        bar_layout.setContentsMargins(8, 4, 4, 4)
        self.bar_label = QLabel(self.bar)
        self.bar_label.setWordWrap(True)
        self.bar_label.setTextFormat(Qt.TextFormat.PlainText)
        self.bar_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.undo_button = QPushButton("&Undo", self.bar)
        self.undo_button.clicked.connect(self.undo_delete)
        self.dismiss_button = QPushButton("Dismiss", self.bar)
        self.dismiss_button.clicked.connect(self._hide_bar)
        bar_layout.addWidget(self.bar_label, 1)
        bar_layout.addWidget(self.undo_button)
        bar_layout.addWidget(self.dismiss_button)
        self.bar.hide()
        layout.addWidget(self.bar)
        self._undo_timer = QTimer(self)
        self._undo_timer.setSingleShot(True)
        self._undo_timer.setInterval(round(undo_seconds * 1000))
        self._undo_timer.timeout.connect(self._undo_expired)

        self.open_action = self._action("&Open", [QKeySequence(Qt.Key.Key_Return), QKeySequence(Qt.Key.Key_Enter)], self.open_selected)
        self.rename_action = self._action("&Rename", [QKeySequence(Qt.Key.Key_F2)], self.rename_selected)
        self.delete_action = self._action("&Delete…", [QKeySequence(QKeySequence.StandardKey.Delete)], self.delete_selected)

        self.setTabOrder(self.new_button, self.search)
        self.setTabOrder(self.search, self.list)
        self.refresh()

    def _action(self, text: str, keys: list[QKeySequence], slot: Callable[[], object]) -> QAction:
        action = QAction(text, self.list)
        action.setShortcuts(keys)
        # Only while the list has focus: Enter in the search field or the
        # rename editor, Delete in any text field, stay theirs.
        action.setShortcutContext(Qt.ShortcutContext.WidgetShortcut)
        action.triggered.connect(lambda _checked=False: slot())
        self.list.addAction(action)
        return action

    # -- state -------------------------------------------------------------------

    def now(self) -> float:
        return self._clock()

    def set_store(self, store: ConversationIndex) -> None:
        self._store = store
        self.refresh()

    def set_open(self, conv_ids: Iterable[str]) -> None:
        """Mark these conversations as open in a pane (a dot and a bold title)."""
        self.open_ids = set(conv_ids)
        self.list.viewport().update()

    def set_blind(self, conv_ids: Iterable[str]) -> None:
        """The chats whose model the tooltips leave out (a blind arena's, until the vote)."""
        ids = set(conv_ids)
        if ids != self.blind_ids:
            self.blind_ids = ids
            self.refresh()

    def selected_id(self) -> str | None:
        item = self.list.currentItem()
        if item is None or not item.isSelected():
            return None
        return item.data(SUMMARY_ROLE).id

    def select(self, conv_id: str) -> bool:
        for row in range(self.list.count()):
            if self.list.item(row).data(SUMMARY_ROLE).id == conv_id:
                self.list.setCurrentRow(row)
                return True
        return False

    def summaries(self) -> list[ConversationSummary]:
        """The rows shown, top to bottom."""
        return [self.list.item(row).data(SUMMARY_ROLE) for row in range(self.list.count())]

    def focus_search(self) -> None:
        self.search.setFocus(Qt.FocusReason.ShortcutFocusReason)
        self.search.selectAll()

    # -- loading -----------------------------------------------------------------

    def refresh(self) -> None:
        """Reload the list from the store (keeping the selection where it can)."""
        self._search_timer.stop()
        query = self.search.text().strip()
        try:
            rows = self._store.list_conversations(query or None)
        except AppError as exc:
            self._show_error(f"The saved chats could not be listed: {exc}")
            return
        keep = self.selected_id()
        had_focus = self.list.hasFocus()
        self.list.clear()
        for summary in rows:
            item = QListWidgetItem()
            item.setData(SUMMARY_ROLE, summary)
            item.setData(Qt.ItemDataRole.DisplayRole, summary.title or UNTITLED)
            item.setToolTip(self._tooltip(summary))
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)
            self.list.addItem(item)
        if keep is None or not self.select(keep):
            if self.list.count() and had_focus:
                self.list.setCurrentRow(0)
        if rows:
            self.empty_label.hide()
            self.list.show()
        else:
            self.empty_label.setText(
                f"No saved chat mentions “{query}”." if query else "No saved chats yet.\nThey appear here as you talk."
            )
            self.list.hide()
            self.empty_label.show()

    def _tooltip(self, summary: ConversationSummary) -> str:
        preview = summary.preview
        if len(preview) > TOOLTIP_PREVIEW_CHARS:
            preview = preview[: TOOLTIP_PREVIEW_CHARS - 1] + "…"
        # A chat in a blind arena does not name its model until the vote.
        model = "model hidden (arena)" if summary.id in self.blind_ids else summary.model_id
        lines = [
            f"<b>{html.escape(summary.title or UNTITLED)}</b>",
            f"{count_label(summary.message_count)} · {html.escape(model)}",
            # The times as `tandem chats list` writes them (the row shows the update relative to today).
            f"updated {local_time_text(summary.updated_at)}",
            f"started {local_time_text(summary.created_at)}",
        ]
        if preview:
            lines.append(f"<i>{html.escape(preview)}</i>")
        return "<p style='white-space:pre-wrap'>" + "<br>".join(lines) + "</p>"

    # -- actions -------------------------------------------------------------------

    def _open_index(self, index: QModelIndex) -> None:
        summary = index.data(SUMMARY_ROLE)
        if summary is not None:
            self.open_requested.emit(summary.id)

    def open_selected(self) -> None:
        conv_id = self.selected_id()
        if conv_id is not None:
            self.open_requested.emit(conv_id)

    def rename_selected(self) -> None:
        """Edit the selected title in place (Enter keeps it, Esc cancels)."""
        item = self.list.currentItem()
        if item is not None:
            self.list.editItem(item)

    def rename(self, conv_id: str, title: str) -> bool:
        title = clean_title(title)
        try:
            self._store.rename(conv_id, title)
        except AppError as exc:
            self._show_error(f"The chat could not be renamed: {exc}")
            return False
        self.refresh()
        self.select(conv_id)
        self.renamed.emit(conv_id, title)
        return True

    def delete_selected(self) -> None:
        """Ask, then delete the selected conversation (Undo stays offered for a while)."""
        item = self.list.currentItem()
        if item is None:
            return
        summary: ConversationSummary = item.data(SUMMARY_ROLE)
        box = QMessageBox(self)
        box.setIcon(QMessageBox.Icon.Question)
        box.setWindowTitle("Delete chat")
        box.setText(f"Delete “{summary.title or UNTITLED}”?")
        seconds = round(self._undo_timer.interval() / 1000)
        box.setInformativeText(
            f"Its {count_label(summary.message_count)} go with it. You can undo this for {seconds} seconds."
        )
        delete_button = box.addButton("&Delete", QMessageBox.ButtonRole.DestructiveRole)
        box.addButton(QMessageBox.StandardButton.Cancel)
        box.setDefaultButton(delete_button)
        box.setEscapeButton(QMessageBox.StandardButton.Cancel)
        conv_id = summary.id

        def answered() -> None:
            if box.clickedButton() is delete_button:
                self.delete(conv_id)
            self._confirm = None
            self.list.setFocus()

        box.finished.connect(lambda _result: answered())
        self._confirm = box
        box.open()  # window-modal, no nested loop (qasync)

    @property
    def confirmation(self) -> QMessageBox | None:
        """The delete confirmation while it is showing."""
        return self._confirm

    def delete(self, conv_id: str) -> bool:
        """Soft-delete without asking and offer Undo (for `undo_seconds`)."""
        row = self.list.currentRow()
        try:
            self._store.delete(conv_id)
        except AppError as exc:
            self._show_error(f"The chat could not be deleted: {exc}")
            return False
        title = next((s.title for s in self.summaries() if s.id == conv_id), "")
        self._undo_ids.append(conv_id)
        self.refresh()
        if self.list.count():
            self.list.setCurrentRow(min(max(row, 0), self.list.count() - 1))
        if len(self._undo_ids) == 1:
            shown = title or UNTITLED
            # A title that ends a sentence itself ("Hi.") needs no second period.
            text = f"Deleted “{shown}”" + ("" if shown.endswith((".", "…", "?", "!")) else ".")
        else:
            text = f"Deleted {len(self._undo_ids)} chats."
        self._show_bar(text, undo=True)
        self._undo_timer.start()
        self.deleted.emit(conv_id)
        return True

    def undo_delete(self) -> None:
        """Bring back every chat deleted since the Undo bar appeared."""
        self._undo_timer.stop()
        ids, self._undo_ids = self._undo_ids, []
        failed: list[str] = []
        for conv_id in ids:
            try:
                self._store.undelete(conv_id)
            except AppError as exc:
                failed.append(str(exc))
            else:
                self.restored.emit(conv_id)
        self.refresh()
        if ids and not failed:
            self.select(ids[-1])
            self._hide_bar()
            self.list.setFocus()
        elif failed:
            self._show_error("Undo did not bring back every chat: " + " ".join(failed))

    @property
    def undo_pending(self) -> list[str]:
        """Ids Undo would bring back now."""
        return list(self._undo_ids)

    def _undo_expired(self) -> None:
        self._undo_ids = []
        self._hide_bar()

    # -- the bar -------------------------------------------------------------------

    def _show_bar(self, text: str, *, undo: bool) -> None:
        self.bar_label.setText(text)
        self.undo_button.setVisible(undo)
        self.dismiss_button.setVisible(not undo)
        self.bar.show()

    def _show_error(self, message: str) -> None:
        # An error replaces an Undo offer; the chats stay deleted (still restorable by the store).
        self._undo_timer.stop()
        self._undo_ids = []
        self._show_bar(message, undo=False)

    def _hide_bar(self) -> None:
        self.bar.hide()
        self.bar_label.clear()

    @property
    def bar_text(self) -> str:
        """What the bar says now ('' when hidden), as plain text."""
        return "" if self.bar.isHidden() else self.bar_label.text()

    # -- menus and keys ----------------------------------------------------------

    def _context_menu(self, pos: object) -> None:
        index = self.list.indexAt(pos)  # type: ignore[arg-type]
        menu = QMenu(self)
        if index.isValid():
            self.list.setCurrentIndex(index)
            menu.addAction(self.open_action)
            menu.addAction(self.rename_action)
            menu.addSeparator()
            menu.addAction(self.delete_action)
            menu.addSeparator()
        new = menu.addAction("&New chat")
        new.triggered.connect(self.new_requested)
        menu.popup(self.list.viewport().mapToGlobal(pos))  # type: ignore[arg-type]

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched is self.search and event.type() == QEvent.Type.KeyPress:
            assert isinstance(event, QKeyEvent)
            key = event.key()
            if key == Qt.Key.Key_Down and self.list.count():
                self.refresh()  # what is typed so far, without waiting for the debounce
                self.list.setFocus()
                if self.list.currentRow() < 0:
                    self.list.setCurrentRow(0)
                return True
            if key in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
                self.refresh()
                if self.list.count():
                    if self.selected_id() is None:
                        self.list.setCurrentRow(0)
                    self.open_selected()
                return True
            if key == Qt.Key.Key_Escape and self.search.text():
                self.search.clear()
                self.refresh()
                return True
        return super().eventFilter(watched, event)


