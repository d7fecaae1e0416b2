"""One conversation pane: header, messages, context meter.

The pane never renders on every delta: `reply_delta` records what changed and
the window's frame timer calls `flush` at most ~30 times a second (~15 while
several panes stream), which re-renders only the messages that changed (while
a reply streams: that one reply, and within it only its last Markdown block;
its stats line and the context meter every few frames).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtCore import QEvent, QSize, Qt, Signal
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QFont, QPalette
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QScrollArea,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.workspace.pane_defaults import source_line
from ui.panes.markdown_view import settle_layouts
from ui.panes.message_view import MessageView
from ui.panes.pane_settings import describe_params
from ui.theme import warning_color
from ui.widgets.attachment_chip import dropped_files
from ui.widgets.model_picker import ModelPicker

if TYPE_CHECKING:
    from engine.documents import Document

    from app.models.registry import ModelEntry
    from app.workspace.messages import ReplyStats
    from app.workspace.workspace import Pane

# Room left for the next message when deciding that the context is nearly full.
CONTEXT_MARGIN_TOKENS = 64
# The narrowest a pane gets, in average characters of its font: its header
# (title, model picker, settings summary, buttons) and a message's actions
# stay readable. Narrower windows scroll the row of panes sideways instead.
MIN_PANE_CHARS = 40


class ElidedLabel(QLabel):
    """A one-line label that ends in "…" when the pane is too narrow for it.

    `min_chars`: the least it keeps (0: it may shrink away); its tooltip
    holds the full text whenever it is cut, unless a tooltip was set."""

    def __init__(self, parent: QWidget | None = None, *, min_chars: int = 0) -> None:
        super().__init__(parent)
        self._min_chars = min_chars
        policy = QSizePolicy.Policy.Ignored if min_chars == 0 else QSizePolicy.Policy.Preferred
        self.setSizePolicy(policy, QSizePolicy.Policy.Preferred)
        self._full = ""
        self._own_tip = ""

    def setText(self, text: str) -> None:  # noqa: N802
        self._full = text
        self.updateGeometry()
        self._elide()

    def setToolTip(self, tip: str) -> None:  # noqa: N802
        self._own_tip = tip
        super().setToolTip(tip)

    def sizeHint(self) -> QSize:  # noqa: N802
        hint = super().sizeHint()
        margins = self.contentsMargins().left() + self.contentsMargins().right()
        return QSize(self.fontMetrics().horizontalAdvance(self._full) + margins + 2, hint.height())

    def minimumSizeHint(self) -> QSize:  # noqa: N802
        hint = super().minimumSizeHint()
        least = min(self.sizeHint().width(), self.fontMetrics().averageCharWidth() * self._min_chars)
        return QSize(least, hint.height())

    def full_text(self) -> str:
        return self._full

    def _elide(self) -> None:
        shown = self.fontMetrics().elidedText(self._full, Qt.TextElideMode.ElideRight, max(self.width(), 1))
        super().setText(shown)
        if not self._own_tip:
            super().setToolTip(self._full if shown != self._full else "")

    def is_elided(self) -> bool:
        return self.text() != self._full

    def resizeEvent(self, event) -> None:  # noqa: N802
        super().resizeEvent(event)
        self._elide()


def _short_count(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else str(n)


class PaneView(QFrame):
    """Shows one `app.workspace.workspace.Pane`; forwards the user's requests as signals."""

    stop_requested = Signal(int)  # pane id
    close_requested = Signal(int)
    settings_requested = Signal(int)
    regenerate_requested = Signal(int, int)  # pane id, message index
    edit_requested = Signal(int, int)
    fork_requested = Signal(int, int)
    carry_requested = Signal(int, int)  # pane id, message index: "Use in all panes"
    sweep_requested = Signal(int)
    activated = Signal(int)  # the user clicked or focused into this pane
    model_chosen = Signal(int, str)  # pane id, model id
    files_dropped = Signal(list)  # local file paths dropped on the pane: attached to the next message
    json_checked = Signal(int)  # pane id: a reply's "Reply as JSON" mark is known

    def __init__(self, pane: Pane, model_name: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.pane = pane
        self.pane_id: int = pane.id
        # Counts a chat's text when it has no kept ids yet (an import): None when it cannot.
        self.count_text_tokens: Callable[[], int | None] | None = None
        # An attached document's tokens in the pane's model, for its chip: None when it cannot count.
        self.count_document_tokens: Callable[[Document], int | None] | None = None
        # The saved name of a "Reply as JSON" schema, for the settings summary: None when it has none.
        self.schema_name: Callable[[str], str | None] = lambda _spec: None
        self.model_name = model_name
        self.setObjectName(f"pane{pane.id}")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setMinimumWidth(self.fontMetrics().averageCharWidth() * MIN_PANE_CHARS)
        self.setFocusPolicy(Qt.FocusPolicy.ClickFocus)
        self.setAcceptDrops(True)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)

        self.header = QFrame(self)
        self.header.setAutoFillBackground(True)
        rows = QVBoxLayout(self.header)
        rows.setContentsMargins(0, 0, 0, 0)
        rows.setSpacing(0)
        head = QHBoxLayout()
        head.setContentsMargins(6, 3, 3, 3)
        head.setSpacing(2)
        rows.addLayout(head)
        self._head = head
        # The summary's line of its own in a narrow pane (see _place_summary).
        self._summary_row = QHBoxLayout()
        self._summary_row.setContentsMargins(6, 0, 3, 3)
        rows.addLayout(self._summary_row)
        self.summary_below = False
        # A forked pane's long title ends in "…" (the full title in its tooltip), never the picker.
        self.title_label = ElidedLabel(self.header, min_chars=7)
        bold = QFont(self.title_label.font())
        bold.setBold(True)
        self.title_label.setFont(bold)
        self.model_picker = ModelPicker(self.header)
        self.model_picker.setFocusPolicy(Qt.FocusPolicy.TabFocus)
        self.model_picker.model_chosen.connect(lambda model_id: self.model_chosen.emit(self.pane_id, model_id))
        # The picker shows the model's whole name when the pane has room, and at
        # least its start (ModelPicker.MIN_CHARS; the whole name in its tooltip) when not.
        self.model_picker.hide()  # shown once the window gives it the models to choose from
        self.summary_label = ElidedLabel(self.header)
        # Keeps the buttons at the right end while the summary is on its own line.
        self._head_gap = QWidget(self.header)
        self._head_gap.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Minimum)
        self._head_gap.hide()
        # "ready" | "loading" | "error" | "unloaded" | "closed": the pane's model, as the window last heard.
        self.model_state = "ready"
        self._model_entries: list[ModelEntry] = []
        self._picker_shows: tuple[tuple[str, ...], str] | None = None  # (entry ids, model id) the picker shows
        self.settings_button = self._tool("⚙", "Settings for this pane (Ctrl+,)", lambda: self.settings_requested.emit(self.pane_id))
        self.sweep_button = self._tool(
            "⋔", "Sweep a setting: one new pane per value, each a fork of this conversation (Ctrl+Shift+P)",
            lambda: self.sweep_requested.emit(self.pane_id),
        )
        self.stop_button = self._tool("■", "Stop this pane's reply", lambda: self.stop_requested.emit(self.pane_id))
        self.close_button = self._tool("✕", "Close this pane (Ctrl+W)", lambda: self.close_requested.emit(self.pane_id))
        head.addWidget(self.title_label, 0)
        head.addWidget(self.model_picker)
        head.addWidget(self.summary_label, 1)
        head.addWidget(self._head_gap, 1)
        for button in (self.sweep_button, self.settings_button, self.stop_button, self.close_button):
            head.addWidget(button)
        layout.addWidget(self.header)

        self.scroll = QScrollArea(self)
        self.scroll.setWidgetResizable(True)
        self.scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.scroll.setBackgroundRole(QPalette.ColorRole.Base)
        self._content = QWidget()
        self._content.setBackgroundRole(QPalette.ColorRole.Base)
        self._content.setAutoFillBackground(True)
        self._list = QVBoxLayout(self._content)
        self._list.setContentsMargins(4, 4, 4, 4)
        self._list.setSpacing(6)
        self.empty_label = QLabel("No messages yet. Type in the box below and press Ctrl+Enter.", self._content)
        self.empty_label.setWordWrap(True)
        self.empty_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty_label.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        self._list.addWidget(self.empty_label)
        self._list.addStretch(1)
        self.scroll.setWidget(self._content)
        layout.addWidget(self.scroll, 1)

        foot = QHBoxLayout()
        foot.setContentsMargins(6, 2, 6, 3)
        self.context_meter = QProgressBar(self)
        self.context_meter.setTextVisible(True)
        self.context_meter.setMaximumHeight(self.fontMetrics().height() + 4)
        self.context_meter.setToolTip("Tokens of the model's context this conversation uses")
        foot.addWidget(QLabel("context", self))
        foot.addWidget(self.context_meter, 1)
        layout.addLayout(foot)

        self.context_warning = False
        # In an arena: the label the pane is shown under, and whether its model and settings are hidden.
        self.arena_label: str | None = None
        self.arena_hidden = False
        # Whether "Use in all panes" is offered (there is another pane to use a reply in).
        self.can_carry = False
        self.messages: dict[int, MessageView] = {}
        self._dirty: set[int] = set()
        self._live_stats: dict[int, ReplyStats | None] = {}
        self._follow = True
        bar = self.scroll.verticalScrollBar()
        bar.rangeChanged.connect(self._on_range_changed)
        bar.valueChanged.connect(self._on_scrolled)
        self._current = False
        self._zoom = 100
        self.refresh_header()
        self.refresh_context()
        for index in range(len(pane.conversation.messages)):
            self._add_message(index)

    def _tool(self, text: str, tip: str, slot: Callable[[], object]) -> QToolButton:
        button = QToolButton(self.header)
        button.setText(text)
        button.setToolTip(tip)
        button.setAutoRaise(True)
        button.clicked.connect(slot)
        return button

    # -- reacting to the app ---------------------------------------------------

    def set_can_carry(self, can: bool) -> None:
        if can != self.can_carry:
            self.can_carry = can
            self._refresh_actions()

    def set_arena(self, label: str | None, hidden: bool) -> None:
        """Show the pane under an arena label (None: as itself); `hidden`: its
        model, settings and reply stats stay out of sight until the vote."""
        self.arena_label, self.arena_hidden = label, bool(label) and hidden
        for message in self.messages.values():
            message.set_stats_hidden(self.arena_hidden)
        self.refresh_header()
        self.refresh_context()

    def refresh_header(self) -> None:
        conv = self.pane.conversation
        if self.arena_label is not None and self.arena_hidden:
            self.title_label.setText(self.arena_label)
            self.model_picker.hide()
            self.summary_label.setText("model and settings hidden until you vote")
            self.summary_label.setToolTip("A blind arena: who wrote this reply shows once you have voted.")
            for button in (self.settings_button, self.sweep_button):
                button.setEnabled(False)
            self.stop_button.setEnabled(bool(self.pane.busy))
            self._refresh_actions()
            return
        self.settings_button.setEnabled(True)
        self.sweep_button.setEnabled(True)
        title = self.pane.title if self.arena_label is None else f"{self.arena_label} = {self.pane.title}"
        self.title_label.setText(title)
        remote = self.pane.remote
        picking = remote is None and bool(self._model_entries)
        self.model_picker.setVisible(picking)
        shown = (tuple(e.id for e in self._model_entries), conv.model_id)
        if picking and shown != self._picker_shows:
            self.model_picker.set_models(self._model_entries, conv.model_id)
            self._picker_shows = shown
        name = remote.label if remote is not None else ("" if picking else self.model_name)
        constraint = conv.params.constraint
        saved = self.schema_name(constraint.spec) if constraint is not None and constraint.spec else None
        summary = describe_params(name, conv.params, saved).lstrip(" ·")
        if conv.system_prompt:
            summary += " · system prompt"
        note = {"loading": "loading…", "error": "failed to load", "unloaded": "not loaded"}.get(self.model_state)
        if remote is None and note:
            summary = f"{note} · {summary}"
        self.summary_label.setText(summary)
        tip = summary if remote is None else f"{summary}\nServed by {remote.base_url}"
        if remote is None and self.pane.params_source:
            tip += f"\n{source_line(self.pane.params_source)}"
        if conv.system_prompt:
            tip += f"\nSystem prompt: {conv.system_prompt[:300]}"
        self.summary_label.setToolTip(tip)
        self.stop_button.setEnabled(bool(self.pane.busy))
        # Never narrower than the header needs: the model picker keeps its name readable.
        least = max(self.fontMetrics().averageCharWidth() * MIN_PANE_CHARS, self.header.minimumSizeHint().width())
        if least != self.minimumWidth():
            self.setMinimumWidth(least)
        self._place_summary()
        self._refresh_actions()

    def _place_summary(self) -> None:
        """The sampling summary beside the model's name when the header has room
        for the whole of it, else on a second line, where it is cut (with "…")
        only when even the pane's width is too little: a narrow pane (three
        and more in a 1024-pixel window) showed none of it."""
        room = self.summary_label.sizeHint().width()
        parts = [self.title_label, self.model_picker, self.sweep_button, self.settings_button, self.stop_button,
                 self.close_button]
        used = sum(w.sizeHint().width() for w in parts if not w.isHidden())
        margins = self._head.contentsMargins()
        used += margins.left() + margins.right() + self._head.spacing() * len(parts)
        below = bool(self.summary_label.full_text()) and used + room > self.width()
        if below == self.summary_below:
            return
        self.summary_below = below
        if below:
            self._head.removeWidget(self.summary_label)
            self._summary_row.addWidget(self.summary_label)
        else:
            self._summary_row.removeWidget(self.summary_label)
            self._head.insertWidget(self._head.indexOf(self._head_gap), self.summary_label, 1)
        self._head_gap.setVisible(below)

    def resizeEvent(self, event) -> None:  # noqa: N802
        super().resizeEvent(event)
        self._place_summary()

    def set_model_entries(self, entries: list[ModelEntry]) -> None:
        """The models the header's picker offers (app.models.registry.ModelEntry)."""
        self._model_entries = list(entries)
        self._picker_shows = None
        self.refresh_header()

    def refresh_context(self) -> None:
        conv = self.pane.conversation
        if self.arena_hidden:
            # How much of the context a turn took tells a system prompt (or a tokenizer) apart.
            self.context_meter.setRange(0, 1)
            self.context_meter.setValue(0)
            self.context_meter.setFormat("hidden until you vote")
            return
        limit = max(int(conv.context_limit or 0), 0)
        used = self.context_tokens()
        self.context_meter.setRange(0, max(limit, 1))
        # An unknown context size is not a full one: the bar stays empty and says what it knows.
        self.context_meter.setValue(min(used or 0, limit) if limit else 0)
        if used is None:
            self.context_meter.setFormat("no token counts from the server yet")
        elif limit:
            self.context_meter.setFormat(f"{_short_count(used)} / {_short_count(limit)} tokens")
        else:  # short, so that it fits the narrowest pane's meter; the tooltip says the size is unknown
            self.context_meter.setFormat(f"{_short_count(used)} tokens")
        size_unknown = used is not None and not limit
        used = used or 0
        # Warn before the next turn stops fitting: the conversation, a reply
        # of the pane's maximum length and a message's worth of room.
        near = bool(limit) and used + conv.params.max_tokens + CONTEXT_MARGIN_TOKENS > limit
        if near != self.context_warning:
            self.context_warning = near
            palette = QPalette(self.palette())
            if near:
                palette.setColor(QPalette.ColorRole.Highlight, warning_color(self.palette()))
                self.context_meter.setPalette(palette)
            else:
                self.context_meter.setPalette(QPalette())
        if near:
            then = (
                "the oldest turns will be left out of what the model reads"
                if conv.context_policy == "drop_oldest"
                else "the next message will be refused (pane settings: drop the oldest turns instead)"
            )
            self.context_meter.setToolTip(f"The conversation nearly fills the model's context: soon {then}.")
        elif size_unknown:
            self.context_meter.setToolTip(f"This conversation uses {used} tokens; the model's context size "
                                          f"is unknown (the server did not say it)")
        else:
            self.context_meter.setToolTip("Tokens of the model's context this conversation uses")

    def context_tokens(self) -> int | None:
        """Tokens the conversation uses: the kept ids for a local model; for a
        remote pane (no ids here) what the server reported for the last reply,
        None when it reported nothing."""
        conv = self.pane.conversation
        used = int(conv.context_used)
        if not used and conv.messages and self.pane.remote is None and self.count_text_tokens is not None:
            counted = self.count_text_tokens()
            if counted is not None:
                return counted
        if used or self.pane.remote is None:
            return used
        for message in reversed(conv.messages):
            stats = message.stats
            if message.role == "assistant" and stats is not None and (stats.prompt_tokens or stats.generated_tokens):
                return stats.prompt_tokens + stats.generated_tokens
        return 0 if not conv.messages else None

    def message_appended(self, index: int) -> None:
        self._add_message(index)
        self._refresh_actions()
        self._follow = True

    def reply_delta(self, index: int, stats: ReplyStats | None) -> None:
        self._live_stats[index] = stats
        self._dirty.add(index)

    def reply_finished(self, index: int) -> None:
        self._live_stats.pop(index, None)
        self._dirty.add(index)
        self.flush()

    def messages_truncated(self, length: int) -> None:
        for index in [i for i in self.messages if i >= length]:
            view = self.messages.pop(index)
            self._list.removeWidget(view)
            view.deleteLater()
            self._dirty.discard(index)
            self._live_stats.pop(index, None)
        self.empty_label.setVisible(not self.messages)
        self._refresh_actions()
        self.refresh_context()

    @property
    def dirty(self) -> bool:
        return bool(self._dirty)

    def flush(self, live_details: bool = True) -> None:
        """Re-render what changed since the last flush (called by the frame timer).

        `live_details=False` leaves a streaming reply's stats line and the
        context meter as they are (the window refreshes them every few
        frames); what is not streaming is always shown whole."""
        if not self._dirty:
            return
        msgs = self.pane.conversation.messages
        for index in sorted(self._dirty):
            view = self.messages.get(index)
            if view is not None and index < len(msgs):
                view.update_from(msgs[index], self._live_stats.get(index), details=live_details)
        self._dirty.clear()
        settle_layouts()
        if live_details or not self.pane.busy:
            self.refresh_context()

    # -- messages --------------------------------------------------------------

    def _add_message(self, index: int) -> None:
        msgs = self.pane.conversation.messages
        if index in self.messages or index >= len(msgs):
            return
        message = msgs[index]
        view = MessageView(index, message.role, self._content)
        view.copy_requested.connect(lambda i: self.messages[i].copy_text())
        view.regenerate_requested.connect(lambda i: self.regenerate_requested.emit(self.pane_id, i))
        view.edit_requested.connect(lambda i: self.edit_requested.emit(self.pane_id, i))
        view.fork_requested.connect(lambda i: self.fork_requested.emit(self.pane_id, i))
        view.carry_requested.connect(lambda i: self.carry_requested.emit(self.pane_id, i))
        view.json_checked.connect(lambda _i: self.json_checked.emit(self.pane_id))
        view.set_stats_hidden(self.arena_hidden)
        view.count_document_tokens = self._document_tokens
        # Before the trailing stretch, in index order.
        position = sum(1 for i in self.messages if i < index) + 1
        self._list.insertWidget(position, view)
        self.messages[index] = view
        self.empty_label.hide()
        view.update_from(message)

    def _refresh_actions(self) -> None:
        # Regenerate and edit change the conversation: not while a reply streams into it.
        busy = bool(self.pane.busy)
        last = len(self.pane.conversation.messages) - 1
        for index, view in self.messages.items():
            is_last = index == last and not busy
            view.set_can_regenerate(is_last, is_last and self.can_carry and not self.arena_hidden)
            view.edit_button.setEnabled(not busy)

    def last_reply_index(self) -> int | None:
        msgs = self.pane.conversation.messages
        for index in range(len(msgs) - 1, -1, -1):
            if msgs[index].role == "assistant":
                return index
        return None

    def last_user_index(self) -> int | None:
        msgs = self.pane.conversation.messages
        for index in range(len(msgs) - 1, -1, -1):
            if msgs[index].role == "user":
                return index
        return None

    # -- following the stream ------------------------------------------------------

    def _on_range_changed(self, _lo: int, hi: int) -> None:
        if self._follow:
            self.scroll.verticalScrollBar().setValue(hi)

    def _on_scrolled(self, value: int) -> None:
        bar = self.scroll.verticalScrollBar()
        # Near the bottom counts as the bottom: a line of slack for rounding.
        self._follow = value >= bar.maximum() - self.fontMetrics().height()

    @property
    def following(self) -> bool:
        return self._follow

    # -- the text's size -------------------------------------------------------------

    def set_zoom(self, percent: int) -> None:
        """The messages at `percent` of the application's text size (the header and meter stay as they are)."""
        if percent == self._zoom:
            return
        self._zoom = percent
        font = QFont(self.font())
        base = self.font().pointSizeF()
        if base > 0:
            font.setPointSizeF(base * percent / 100)
        else:  # a pixel-sized font
            font.setPixelSize(max(1, round(self.font().pixelSize() * percent / 100)))
        self._content.setFont(font)

    @property
    def zoom(self) -> int:
        return self._zoom

    # -- being the current pane -----------------------------------------------------

    def set_current(self, current: bool) -> None:
        self._current = current
        self.header.setBackgroundRole(
            QPalette.ColorRole.Highlight if current else QPalette.ColorRole.Window
        )
        role = QPalette.ColorRole.HighlightedText if current else QPalette.ColorRole.WindowText
        self.title_label.setForegroundRole(role)
        self.summary_label.setForegroundRole(role)

    def _document_tokens(self, document: Document) -> int | None:
        return self.count_document_tokens(document) if self.count_document_tokens is not None else None

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:  # noqa: N802
        if dropped_files(event.mimeData()):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:  # noqa: N802
        files = dropped_files(event.mimeData())
        if files:
            event.acceptProposedAction()
            self.files_dropped.emit(files)

    def mousePressEvent(self, event) -> None:  # noqa: N802
        self.activated.emit(self.pane_id)
        super().mousePressEvent(event)

    def event(self, event) -> bool:  # noqa: A003
        if event.type() == QEvent.Type.FocusIn:
            self.activated.emit(self.pane_id)
        return super().event(event)
