"""One message in a pane: who said it, the text, a stats line, its actions."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import shiboken6

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtGui import QFont, QGuiApplication, QPalette, QResizeEvent
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QMenu, QToolButton, QVBoxLayout, QWidget

from app.workspace.json_reply import JsonVerdict, check_reply, display_markdown, is_json_constraint
from app.workspace.model_slots import in_thread
from ui.dialogs.document_viewer import show_document
from ui.panes.markdown_view import MarkdownView
from ui.panes.thinking_view import ThinkingSection, thinking_title
from ui.panes.version_switcher import VersionSwitcher
from ui.theme import error_color, muted_text_color, success_color, user_bubble_color
from ui.widgets.attachment_chip import AttachmentChip
from ui.widgets.flow_layout import FlowLayout

if TYPE_CHECKING:
    from collections.abc import Callable

    from engine.documents import Document
    from engine.structured import Constraint

    from app.workspace.messages import Message, ReplyStats


def format_stats(stats: ReplyStats | None, streaming: bool = False) -> str:
    """'41.2 tok/s · TTFT 0.05 s · prompt 812 tokens, 800 from cache'."""
    if stats is None:
        return ""
    parts = []
    if stats.tokens_per_s:
        parts.append(f"{stats.tokens_per_s:.1f} tok/s")
    if stats.ttft_s is not None:
        parts.append(f"TTFT {stats.ttft_s:.2f} s")
    if stats.prompt_tokens:
        parts.append(f"prompt {stats.prompt_tokens} tokens, {stats.cached_prompt_tokens} from cache")
    if stats.generated_tokens:
        parts.append(f"{stats.generated_tokens} generated")
    reason = stats.finish_reason
    if not streaming and reason == "length":
        parts.append("hit max tokens")
    return " · ".join(parts)


# The stats line's size against the message text's: smaller, at every zoom.
STATS_SCALE = 0.85

# A message's state: the word its header shows, and what the word means (its tooltip).
STATE_NOTES: dict[str, tuple[str, str]] = {
    "streaming": ("replying…", "The model is writing this reply"),
    "stopped": ("stopped", "The reply was stopped before the model finished it"),
    "error": ("failed", "The reply failed; the line below says why"),
    "interrupted": ("interrupted", "Tandem closed while this reply was being written; "
                                   "Regenerate writes it again"),
}


class MessageView(QFrame):
    """A message; `update_from(message)` refreshes it from the app's record."""

    copy_requested = Signal(int)
    regenerate_requested = Signal(int)
    edit_requested = Signal(int)
    fork_requested = Signal(int)
    version_requested = Signal(int, int)  # message index, version (0-based)
    carry_requested = Signal(int)  # "Use in all panes"
    json_checked = Signal(int)  # a JSON reply's mark is known (message index)

    def __init__(self, index: int, role: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.index = index
        self.role = role
        self.setObjectName(f"message{index}")
        self.setFrameShape(QFrame.Shape.NoFrame)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 6, 8, 6)
        layout.setSpacing(2)

        header = QHBoxLayout()
        header.setSpacing(4)
        names = {"user": "You", "assistant": "Assistant", "notice": "Note"}
        self.role_label = QLabel(names.get(role, role.capitalize()), self)
        bold = QFont(self.role_label.font())
        bold.setBold(True)
        self.role_label.setFont(bold)
        self.state_label = QLabel(self)
        header.addWidget(self.role_label)
        # ‹ 2/3 ›: shown on a reply that regenerate or edit-and-resend made again.
        self.versions = VersionSwitcher(self)
        self.versions.switch_requested.connect(lambda version: self.version_requested.emit(self.index, version))
        self.versions.attach_shortcuts(self)
        header.addWidget(self.versions)
        header.addWidget(self.state_label)
        header.addStretch(1)
        # The actions fold into "⋯" when the pane is too narrow for them (see resizeEvent);
        # their row may shrink to nothing, so they never make the pane's messages wider than the pane.
        self.actions = QWidget(self)
        self.actions.setMinimumWidth(1)
        actions_row = QHBoxLayout(self.actions)
        actions_row.setContentsMargins(0, 0, 0, 0)
        actions_row.setSpacing(4)
        self.copy_button = self._action("Copy", "Copy this message", self.copy_requested)
        self.edit_button = self._action("Edit", "Edit this message and send it again", self.edit_requested)
        self.regenerate_button = self._action("Regenerate", "Replace this reply with a new one", self.regenerate_requested)
        self.fork_button = self._action("Fork", "Open a new pane holding the conversation up to here", self.fork_requested)
        self.carry_button = self._action(
            "Use in all panes",
            "Make this reply the answer in every other pane (theirs stay as earlier versions), "
            "so the next message continues from it everywhere (Ctrl+Shift+U)",
            self.carry_requested,
        )
        self._buttons = (self.copy_button, self.edit_button, self.regenerate_button, self.carry_button, self.fork_button)
        for button in self._buttons:
            actions_row.addWidget(button)
        header.addWidget(self.actions)
        self.more_button = QToolButton(self)
        self.more_button.setText("⋯")
        self.more_button.setToolTip("Actions on this message")
        self.more_button.setAutoRaise(True)
        self.more_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.more_button.setStyleSheet("QToolButton::menu-indicator { image: none; width: 0px; }")  # "⋯" says it
        self.more_button.setMenu(QMenu(self.more_button))
        self.more_button.menu().aboutToShow.connect(self._fill_more_menu)
        self.more_button.hide()
        header.addWidget(self.more_button)
        self.edit_button.setVisible(role == "user")
        self.regenerate_button.setVisible(False)
        self.carry_button.setVisible(False)
        # In a blind arena a reply's speed would tell which model wrote it: the stats wait for the vote.
        self.stats_hidden = False
        if role == "notice":  # a note about the conversation, not part of it: nothing to copy, fork or edit
            self.copy_button.hide()
            self.fork_button.hide()
        layout.addLayout(header)

        # A reasoning model's think block, collapsed above the answer (shown once a reply has one).
        self.thinking = ThinkingSection(self)
        self.thinking.hide()
        layout.addWidget(self.thinking)
        self.body = MarkdownView(self, plain=(role in ("user", "notice")))
        layout.addWidget(self.body)
        # A reply asked for as JSON: "✓ matches the schema" or "✗ invalid: why" under it.
        self.json_mark = QLabel(self)
        self.json_mark.setWordWrap(True)
        self.json_mark.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.json_mark.hide()
        layout.addWidget(self.json_mark)
        self.json_verdict: JsonVerdict | None = None  # None also while the check runs
        self._json_checked: tuple[str, Constraint, str | None] | None = None  # what was (or is being) checked
        # What Copy copies: the reply as the model wrote it (a JSON reply is shown indented).
        self._copy_source: str | None = None
        # A message's documents, as chips under its text (opened by a click).
        self.attachments = QWidget(self)
        self.attachment_row = FlowLayout(self.attachments)
        self.attachment_row.setContentsMargins(0, 2, 0, 0)
        self.attachments.hide()
        layout.addWidget(self.attachments)
        self.attachment_chips: list[AttachmentChip] = []
        self.count_document_tokens: Callable[[Document], int | None] | None = None
        self._attachments_shown: tuple[tuple[Document, ...], list[int | None]] = ((), [])
        if role == "notice":
            italic = QFont(self.body.font())
            italic.setItalic(True)
            self.body.setFont(italic)
        self.stats_label = QLabel(self)
        self.stats_label.setWordWrap(True)
        self._size_stats_line()
        self.stats_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.stats_label.hide()
        layout.addWidget(self.stats_label)
        self.state = ""
        self._apply_colors()

    def _action(self, text: str, tip: str, signal: Signal) -> QToolButton:
        button = QToolButton(self.actions)
        button.setText(text)
        button.setToolTip(tip)
        button.setAutoRaise(True)
        button.setFocusPolicy(Qt.FocusPolicy.TabFocus)
        button.clicked.connect(lambda: signal.emit(self.index))
        return button

    def update_from(self, message: Message, live_stats: ReplyStats | None = None, *, details: bool = True) -> None:
        """Show `message`. `details=False` while it streams and is shown streaming
        already: only its text, the stats line and the rest as they were."""
        streaming = message.state == "streaming"
        if not details and streaming and self.state == "streaming":
            self._show_text(message)
            return
        self.state = message.state
        self._show_text(message)
        self._show_attachments(message.attachments)
        # One word on screen: a longer note would set the header's least width and
        # push the pane past the window (the text cut, the actions off screen).
        note, tip = STATE_NOTES.get(message.state, ("", ""))
        self.state_label.setText(note)
        self.state_label.setToolTip(tip)
        stats = live_stats if streaming and live_stats is not None else message.stats
        line = format_stats(stats, streaming)
        if message.state == "error" and message.error:
            line = f"Error: {message.error}" + (f" · {line}" if line else "")
        self.stats_label.setText(line)
        self.stats_label.setVisible(bool(line) and not self.stats_hidden)
        self.fork_button.setEnabled(not streaming)
        versions = message.versions
        had_switcher = self.versions.isVisibleTo(self)
        if versions is None:
            self.versions.set_versions(0, 1)
        else:
            self.versions.set_versions(versions.current, versions.count, enabled=not streaming)
        if self.versions.isVisibleTo(self) != had_switcher:
            self._fold_actions()  # the switcher takes room from the actions

    def _show_text(self, message: Message) -> None:
        """The answer in the body; a reply's reasoning in its Thinking section."""
        if self.role != "assistant":
            self.body.set_markdown(message.text)
            return
        parts = message.parts
        thinking = message.state == "streaming" and not parts.reasoning_finished
        shown = parts.has_reasoning and (bool(parts.reasoning) or thinking)
        if shown:
            title = thinking_title(message.reasoning_tokens, message.reasoning_s, thinking=thinking,
                                   finished=parts.reasoning_finished)
            self.thinking.set_reasoning(parts.reasoning, title)
        if shown != self.thinking.isVisibleTo(self):
            self.thinking.setVisible(shown)
        constraint = message.params.constraint if message.params is not None else None
        if is_json_constraint(constraint):
            assert constraint is not None
            self._show_json(message, parts.answer, constraint)
        else:
            self._copy_source = None
            self._json_checked = None
            self._set_json_mark(None)
            self.body.set_markdown(parts.answer)
        answering = bool(parts.answer) or not shown  # no empty line under a reply that is still thinking
        if answering != self.body.isVisibleTo(self):
            self.body.setVisible(answering)

    def _show_json(self, message: Message, answer: str, constraint: Constraint) -> None:
        """The reply as an indented JSON block with its mark; while it streams, as written and unmarked."""
        self._copy_source = answer
        if message.state in ("streaming", "error"):
            self._json_checked = None
            self._set_json_mark(None)
            self.body.set_markdown(display_markdown(None, answer) if answer.strip() else "")
            return
        reason = message.stats.finish_reason if message.stats is not None else None
        if message.state in ("stopped", "interrupted"):
            reason = "abort"
        key = (answer, constraint, reason)
        if key != self._json_checked:  # checked once per reply, not on every repaint
            self._json_checked = key
            self._set_json_mark(None)
            self._check_json(key)
        self.body.set_markdown(display_markdown(self.json_verdict, answer))

    def _check_json(self, key: tuple[str, Constraint, str | None]) -> None:
        """The reply's verdict, on a worker thread: a schema's `pattern` is a Python regular
        expression, and one from a chat file may backtrack for minutes on the reply it came with."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a view shown outside the app's event loop: checked here
            self._json_done(key, check_reply(*key))
            return
        task = asyncio.ensure_future(in_thread(loop, lambda: check_reply(*key), "tandem-json-check"))
        task.add_done_callback(lambda done: self._json_task_done(done, key))

    def _json_task_done(self, task: asyncio.Future[JsonVerdict], key: tuple[str, Constraint, str | None]) -> None:
        exc = None if task.cancelled() else task.exception()
        if task.cancelled() or not shiboken6.isValid(self) or key != self._json_checked:
            return  # the view is gone, or shows another reply now
        verdict = task.result() if exc is None else JsonVerdict(False, f"could not be checked: {exc}", None)
        self._json_done(key, verdict)

    def _json_done(self, key: tuple[str, Constraint, str | None], verdict: JsonVerdict) -> None:
        self._set_json_mark(verdict)
        self.body.set_markdown(display_markdown(verdict, key[0]))
        self.json_checked.emit(self.index)

    def _set_json_mark(self, verdict: JsonVerdict | None) -> None:
        self.json_verdict = verdict
        if verdict is None:
            self.json_mark.hide()
            return
        self.json_mark.setText(verdict.mark)
        self.json_mark.setToolTip("The reply was asked for as JSON" + (
            "; it is what was asked for." if verdict.valid else f"; it is not: {verdict.reason}."))
        self._color_json_mark()
        self.json_mark.show()

    def _color_json_mark(self) -> None:
        if getattr(self, "json_verdict", None) is None:  # also while __init__ has not made the mark yet
            return
        base = self.parentWidget().palette() if self.parentWidget() else self.palette()
        color = success_color(base) if self.json_verdict.valid else error_color(base)
        # A style sheet: the theme's palette changes would otherwise reset a palette colour.
        self.json_mark.setStyleSheet(f"color: {color.name()}; font-weight: 600;")

    def _show_attachments(self, documents: tuple[Document, ...]) -> None:
        count = self.count_document_tokens
        tokens = [count(d) if count is not None else None for d in documents]
        if self._attachments_shown == (documents, tokens):
            return
        self._attachments_shown = (documents, tokens)
        for chip in self.attachment_chips:
            self.attachment_row.removeWidget(chip)
            chip.deleteLater()
        self.attachment_chips = []
        for document, n in zip(documents, tokens):
            chip = AttachmentChip(document.name, self.attachments)
            chip.set_document(document, n)
            chip.open_requested.connect(lambda document=document: show_document(self, document))
            self.attachment_row.addWidget(chip)
            self.attachment_chips.append(chip)
        self.attachments.setVisible(bool(documents))

    def set_can_regenerate(self, can: bool, can_carry: bool = False) -> None:
        self.regenerate_button.setVisible(self.role == "assistant" and can)
        self.carry_button.setVisible(self.role == "assistant" and can_carry)
        self._fold_actions()

    def set_stats_hidden(self, hidden: bool) -> None:
        self.stats_hidden = hidden
        self.stats_label.setVisible(bool(self.stats_label.text()) and not hidden)

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802
        super().resizeEvent(event)
        self._fold_actions()

    def _fold_actions(self) -> None:
        """Show the actions as buttons when they fit beside the role, else as a "⋯" menu."""
        margins = self.layout().contentsMargins()
        header = self.role_label.sizeHint().width() + self.state_label.sizeHint().width() + margins.left() + margins.right() + 12
        if self.versions.isVisibleTo(self):
            header += self.versions.sizeHint().width()
        fits = header + self.actions.sizeHint().width() <= self.contentsRect().width()
        offered = [b for b in self._buttons if b.isVisibleTo(self.actions)]
        self.actions.setVisible(fits)
        self.more_button.setVisible(not fits and bool(offered))

    def _fill_more_menu(self) -> None:
        menu = self.more_button.menu()
        menu.clear()
        for button in self._buttons:
            if button.isVisibleTo(self.actions):
                action = menu.addAction(button.text(), button.click)
                action.setEnabled(button.isEnabled())
                action.setToolTip(button.toolTip())

    def copy_text(self) -> None:
        text = self._copy_source if self._copy_source is not None else self.body.markdown()
        QGuiApplication.clipboard().setText(text)

    def _apply_colors(self) -> None:
        palette = self.parentWidget().palette() if self.parentWidget() else self.palette()
        # Fresh palettes that set one role each, so everything else still
        # follows the application's palette when it changes.
        muted = QPalette()
        muted.setColor(QPalette.ColorRole.WindowText, muted_text_color(palette))
        self.stats_label.setPalette(muted)
        self.state_label.setPalette(muted)
        self._color_json_mark()
        if self.role == "user":
            own = QPalette()
            own.setColor(QPalette.ColorRole.Window, user_bubble_color(palette))
            self.setAutoFillBackground(True)
            self.setBackgroundRole(QPalette.ColorRole.Window)
            # Only this frame's background: children keep the inherited palette.
            self.setPalette(own)

    def _size_stats_line(self) -> None:
        # A size of its own stops the label following the pane's zoom, so it is
        # derived again from the message's font whenever that changes.
        small = QFont(self.font())
        if small.pointSizeF() > 0:
            small.setPointSizeF(max(small.pointSizeF() * STATS_SCALE, min(small.pointSizeF(), 4.0)))
        else:  # a pixel-sized font
            small.setPixelSize(max(round(small.pixelSize() * STATS_SCALE), min(small.pixelSize(), 5)))
        self.stats_label.setFont(small)

    def changeEvent(self, event) -> None:  # noqa: N802
        super().changeEvent(event)
        if event.type() == QEvent.Type.FontChange and hasattr(self, "stats_label"):
            self._size_stats_line()
        if event.type() == QEvent.Type.PaletteChange and not getattr(self, "_coloring", False):
            self._coloring = True
            try:
                self._apply_colors()
            finally:
                self._coloring = False
