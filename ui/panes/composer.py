"""The composer: one message box, which panes receive it, the documents attached, Send and Stop.

Files reach it by the paperclip button, a drop (on the composer, the message
box or a pane) or a paste; it reports them (`files_given`) and shows the
chips and the fit line that ui/window/attachments.py gives it.
"""

from __future__ import annotations

from typing import Literal

from PySide6.QtCore import QMimeData, Qt, QTimer, Signal
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QKeyEvent
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from ui.widgets.attachment_chip import dropped_files, paperclip_icon
from ui.widgets.flow_layout import FlowLayout

# What the message box tells the user about the models (Composer.set_model_state).
ModelHint = Literal["ready", "loading", "failed", "none"]


class MessageEdit(QPlainTextEdit):
    """Enter adds a line; Ctrl+Enter sends; files dropped or pasted are attached, not typed as paths."""

    send_requested = Signal()
    files_given = Signal(list)  # local file paths

    def canInsertFromMimeData(self, source: QMimeData) -> bool:  # noqa: N802
        return bool(dropped_files(source)) or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QMimeData) -> None:  # noqa: N802
        files = dropped_files(source)
        if files:
            self.files_given.emit(files)
            return
        super().insertFromMimeData(source)

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and (
            event.modifiers() & Qt.KeyboardModifier.ControlModifier
        ):
            self.send_requested.emit()
            return
        super().keyPressEvent(event)


class Composer(QWidget):
    send_requested = Signal(str, list)  # (text, target pane ids)
    stop_requested = Signal()
    attach_requested = Signal()  # the paperclip: choose files
    files_given = Signal(list)  # local file paths dropped or pasted
    targets_changed = Signal()
    first_part_toggled = Signal(bool)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 4, 6, 4)
        layout.setSpacing(4)

        targets = QHBoxLayout()
        targets.setSpacing(4)
        self.to_label = QLabel("Send to:", self)
        targets.addWidget(self.to_label)
        self._chip_row = QHBoxLayout()
        self._chip_row.setSpacing(4)
        targets.addLayout(self._chip_row)
        targets.addStretch(1)
        self._targets_row = targets
        self.notice = QLabel(self)
        self.notice.setObjectName("composerNotice")
        self.notice.setWordWrap(True)
        self.notice.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        self.notice.hide()
        layout.addLayout(targets)
        layout.addWidget(self.notice)

        # The documents attached to the next message, and what each target pane would receive.
        self.attachments = QWidget(self)
        self.attachment_row = FlowLayout(self.attachments)
        self.attachments.hide()
        layout.addWidget(self.attachments)
        self.fit_bar = QWidget(self)
        fit_row = QHBoxLayout(self.fit_bar)
        fit_row.setContentsMargins(0, 0, 0, 0)
        self.fit_label = QLabel(self.fit_bar)
        self.fit_label.setObjectName("attachmentFit")
        self.fit_label.setWordWrap(True)
        self.fit_label.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        self.fit_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        fit_row.addWidget(self.fit_label, 1)
        self.first_part_button = QPushButton("Send only the first part that fits", self.fit_bar)
        self.first_part_button.setCheckable(True)
        self.first_part_button.setToolTip("Send the panes it does not fit only the start of each document, "
                                          "as much as fits their context; the chips say so")
        self.first_part_button.toggled.connect(self.first_part_toggled)
        self.first_part_button.hide()
        fit_row.addWidget(self.first_part_button, 0, Qt.AlignmentFlag.AlignTop)
        self.fit_bar.hide()
        layout.addWidget(self.fit_bar)

        row = QHBoxLayout()
        self.edit = MessageEdit(self)
        self.edit.setPlaceholderText("Message every selected pane…  (Ctrl+Enter sends)")
        self.edit.setTabChangesFocus(True)
        lines = self.edit.fontMetrics().lineSpacing()
        self.edit.setFixedHeight(lines * 3 + 14)
        self.edit.send_requested.connect(self.send)
        self.edit.files_given.connect(self.files_given)
        self.attach_button = QToolButton(self)
        self.attach_button.setIcon(paperclip_icon(self.palette().windowText().color()))
        self.attach_button.setToolTip("Attach files: text, code, PDF, Word… (Ctrl+Shift+O); or drop them here")
        self.attach_button.setAccessibleName("Attach files")
        self.attach_button.clicked.connect(self.attach_requested)
        row.addWidget(self.attach_button, 0, Qt.AlignmentFlag.AlignTop)
        row.addWidget(self.edit, 1)
        buttons = QVBoxLayout()
        self.send_button = QPushButton("Send", self)
        self.send_button.setToolTip("Send to the selected panes (Ctrl+Enter)")
        self.send_button.clicked.connect(self.send)
        self.stop_button = QPushButton("Stop", self)
        self.stop_button.setToolTip("Stop every running reply (Esc)")
        self.stop_button.clicked.connect(self.stop_requested)
        self.stop_button.setEnabled(False)
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        row.addLayout(buttons)
        layout.addLayout(row)

        self._chips: dict[int, QToolButton] = {}
        self._notice_timer = QTimer(self)
        self._notice_timer.setSingleShot(True)
        self._notice_timer.timeout.connect(self.notice.hide)
        self._ready = False
        self._sending = False
        self._refusal = ""
        self.model_state: ModelHint = "loading"
        self.set_model_state("loading")
        self.setAcceptDrops(True)

    # -- targets -------------------------------------------------------------

    def add_to_target_row(self, widget: QWidget) -> None:
        """Put `widget` at the right end of the "Send to" row (the window's "+ Pane")."""
        self._targets_row.addWidget(widget)

    def set_panes(self, panes: list[tuple[int, str]]) -> None:
        """Chips for (pane id, label) in display order; new panes start selected."""
        keep = {pid for pid, _ in panes}
        for pid in list(self._chips):
            if pid not in keep:
                chip = self._chips.pop(pid)
                self._chip_row.removeWidget(chip)
                chip.deleteLater()
        for pid, label in panes:
            chip = self._chips.get(pid)
            if chip is None:
                chip = QToolButton(self)
                chip.setCheckable(True)
                chip.setChecked(True)
                chip.setObjectName(f"target{pid}")
                chip.toggled.connect(lambda _on, c=chip: self._label_chip(c))
                chip.toggled.connect(self.targets_changed)
                self._chips[pid] = chip
            chip.setProperty("paneLabel", label)
            self._label_chip(chip)
            self._chip_row.removeWidget(chip)
        for pid, _ in panes:
            self._chip_row.addWidget(self._chips[pid])

    @staticmethod
    def _label_chip(chip: QToolButton) -> None:
        # The check mark makes the choice readable whatever the style draws for "checked".
        label = chip.property("paneLabel") or ""
        chip.setText(("✓ " if chip.isChecked() else "") + label)
        chip.setToolTip(f"{label} {'receives' if chip.isChecked() else 'does not receive'} the message; click to change")

    def chip(self, pane_id: int) -> QToolButton:
        return self._chips[pane_id]

    def targets(self) -> list[int]:
        order = [self._chip_row.itemAt(i).widget() for i in range(self._chip_row.count())]
        return [pid for w in order for pid, chip in self._chips.items() if chip is w and chip.isChecked()]

    def set_targets(self, pane_ids: list[int]) -> None:
        for pid, chip in self._chips.items():
            chip.setChecked(pid in pane_ids)

    def toggle_target(self, position: int) -> None:
        """Toggle the chip at display position `position` (0-based)."""
        if 0 <= position < self._chip_row.count():
            self._chip_row.itemAt(position).widget().toggle()

    # -- attachments ---------------------------------------------------------

    def add_attachment_chip(self, chip: QWidget) -> None:
        self.attachment_row.addWidget(chip)
        self.attachments.show()

    def remove_attachment_chip(self, chip: QWidget) -> None:
        self.attachment_row.removeWidget(chip)
        chip.deleteLater()
        self.attachments.setVisible(self.attachment_row.count() > 0)

    def set_fit(self, text: str, offer_first_part: bool) -> None:
        """What each target pane would receive ("" hides it), and whether some pane needs the first-part choice."""
        self.fit_label.setText(text)
        self.fit_bar.setVisible(bool(text))
        self.first_part_button.setVisible(offer_first_part or self.first_part_button.isChecked())

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:  # noqa: N802
        if dropped_files(event.mimeData()):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:  # noqa: N802
        files = dropped_files(event.mimeData())
        if files:
            event.acceptProposedAction()
            self.files_given.emit(files)

    # -- state ---------------------------------------------------------------

    def set_ready(self, ready: bool, loading: bool = True) -> None:
        """Whether a pane can take a message, and when none can, whether a model is on its way."""
        self.set_model_state("ready" if ready else "loading" if loading else "none")

    def set_model_state(self, state: ModelHint, name: str = "") -> None:
        """What the message box says it can do: `state` is "ready" (a pane can
        reply), "loading" (a model is on its way), "failed" (it could not be
        loaded) or "none" (nothing loads until the user asks); `name` is the
        model the window's banner is about. Typing is always allowed: what
        the user writes meanwhile is sent once a model is ready."""
        self._ready = state == "ready"
        self.model_state = state
        self.send_button.setEnabled(self._ready and not self._sending)
        model = name or "The model"
        texts: dict[str, tuple[str, str]] = {
            "ready": ("Message every selected pane…  (Ctrl+Enter sends)", ""),
            "loading": (f"{model} is loading… type away: Ctrl+Enter sends once it is ready.",
                        f"{model} is still loading"),
            # The banner above the panes holds the button these name (ui/window/banner.py).
            "failed": (f"{model} could not be loaded: press Try again above the panes, or pick another "
                       f"model in a pane's header.", f"{model} could not be loaded"),
            "none": (f"No model is loaded: press Load {name or 'the model'} above the panes, or Models → "
                     f"Load this pane's model (Ctrl+Shift+L).", "No model is loaded"),
        }
        hint, self._refusal = texts[state]
        self.edit.setPlaceholderText(hint)
        self.send_button.setToolTip("Send to the selected panes (Ctrl+Enter)" if self._ready else hint)

    def set_sending(self, sending: bool) -> None:
        self._sending = sending
        self.send_button.setEnabled(self._ready and not sending)

    def set_streaming(self, streaming: bool) -> None:
        self.stop_button.setEnabled(streaming)

    def show_notice(self, text: str, seconds: float = 8.0) -> None:
        """A visible, temporary explanation (why a message was refused)."""
        self.notice.setText(text)
        self.notice.show()
        self._notice_timer.start(int(seconds * 1000))

    def send(self) -> None:
        if not self._ready or self._sending:
            if not self._ready:
                then = "once the model is ready" if self.model_state == "loading" else "once a model is loaded"
                self.show_notice(f"{self._refusal}, so the message was not sent. It is still here: send it {then}.")
            return
        self.send_requested.emit(self.edit.toPlainText(), self.targets())

    def clear(self) -> None:
        self.edit.clear()
