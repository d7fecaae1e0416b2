"""View > Compare replies: the word differences of two panes' last replies,
highlighted in place; and the turn summary of the last broadcast turn
(figures computed off the GUI thread, shown in a dialog or exported)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from app.errors import AppError
from app.workspace.compare import default_pair, word_diff
from app.workspace.turn_summary import figures_of, last_turn
from ui.widgets.file_folders import remember, start_path

if TYPE_CHECKING:
    from ui.dialogs.turn_summary import TurnSummaryDialog
    from ui.window.main_window import MainWindow


class NoTurnError(AppError):
    """There is no broadcast turn to sum up (or the arena hides it)."""


class CompareReplies:
    def __init__(self, window: MainWindow) -> None:
        self._window = window
        self.summary_dialog: TurnSummaryDialog | None = None

    @property
    def on(self) -> bool:
        action = self._window.menu_actions.get("compare")  # None while the menus are being built
        return action is not None and action.isChecked()

    def set_compare(self, on: bool) -> None:
        window = self._window
        window.compare_bar.setVisible(on)
        if not on:
            self._clear()
            return
        if len(window.panes) < 2:
            window.statusBar().showMessage("Comparing needs two panes; add one with Ctrl+T.", 8000)
        pair = default_pair([window.panes[pid].pane for pid in window.pane_order()])
        if pair is not None:
            window.compare_bar.set_chosen(*pair)
        self.refresh()

    def _clear(self) -> None:
        for view in self._window.panes.values():
            for message in view.messages.values():
                message.body.set_highlight(None)

    def refresh(self) -> None:
        """Highlight again (the replies or the chosen panes changed); nothing while comparing is off."""
        if not self.on:
            return
        window = self._window
        self._clear()
        summary = window.compare_bar.summary
        chosen = window.compare_bar.chosen()
        if chosen is None or chosen[0] == chosen[1]:
            summary.setText("Choose two different panes.")
            return
        views = [window.panes.get(pid) for pid in chosen]
        if any(v is None for v in views):
            return
        indices = [v.last_reply_index() for v in views]
        if any(i is None for i in indices):
            summary.setText("Both panes need a reply to compare.")
            return
        texts = [v.pane.conversation.messages[i].answer for v, i in zip(views, indices)]  # reasoning left out
        left, right = word_diff(texts[0], texts[1])
        for view, index, segments in zip(views, indices, (left, right)):
            view.messages[index].body.set_highlight(segments)
        changed = sum(len(s.text.split()) for s in left if s.changed), sum(len(s.text.split()) for s in right if s.changed)
        total = len(texts[0].split()), len(texts[1].split())
        if changed == (0, 0):
            text = "The replies are identical word for word."
        else:
            text = f"Highlighted: {changed[0]} of {total[0]} words differ on the left, {changed[1]} of {total[1]} on the right."
        summary.setText(text + self.json_count_text())

    def json_count_text(self) -> str:
        """" · JSON valid in 2 of 3" over every pane's last reply asked for as JSON; "" when none was."""
        verdicts = []
        for view in self._window.panes.values():
            index = view.last_reply_index()
            verdict = view.messages[index].json_verdict if index is not None and index in view.messages else None
            if verdict is not None:
                verdicts.append(verdict.valid)
        return f" · JSON valid in {sum(verdicts)} of {len(verdicts)}" if verdicts else ""

    # -- the turn summary ------------------------------------------------------------

    def _turn(self) -> tuple[str, list] | None:
        window = self._window
        if window.arena.hiding:
            window.report_error("The turn summary", NoTurnError(
                "The turn summary shows each pane's model and speed, which the arena hides: vote first."))
            return None
        panes = [window.panes[pid].pane for pid in window.pane_order()]
        names = {p.conversation.model_id: window.models.name(p.conversation.model_id) for p in panes}
        turn = last_turn(panes, names)
        if turn is None:
            window.report_error("The turn summary", NoTurnError(
                "There is no reply to sum up yet: send a message to the panes, then open the summary."))
        return turn

    def show_turn_summary(self) -> None:
        """View > Turn summary: the table of the last broadcast turn."""
        from ui.dialogs.turn_summary import TurnSummaryDialog

        window = self._window
        turn = self._turn()
        if turn is None:
            return
        if self.summary_dialog is not None:
            self.summary_dialog.close()
        dialog = TurnSummaryDialog(window)
        self.summary_dialog = dialog
        dialog.finished.connect(lambda _result: setattr(self, "summary_dialog", None))
        dialog.open()
        message, replies = turn

        async def compute() -> None:
            # A word diff per pair of replies: long replies take a while, so not on the GUI thread.
            figures = await asyncio.to_thread(figures_of, replies)
            if self.summary_dialog is dialog:
                dialog.show_figures(message, figures)

        window.run_task(compute(), "The turn summary")

    def export_turn_summary(self, path: str | None = None) -> None:
        """File > Export turn summary: Markdown or CSV by the file's name."""
        from app.files import write_text_atomically
        from app.workspace.turn_summary import to_csv, to_markdown

        window = self._window
        turn = self._turn()
        if turn is None:
            return
        if path is None:
            from PySide6.QtWidgets import QFileDialog

            path, _ = QFileDialog.getSaveFileName(window, "Export turn summary", start_path("turn-summary.md"),
                                                  "Markdown (*.md);;CSV (*.csv)")
            if not path:
                return
            remember(path)
        message, replies = turn

        async def export() -> None:
            figures = await asyncio.to_thread(figures_of, replies)
            text = to_csv(figures) if str(path).lower().endswith(".csv") else to_markdown(message, figures)
            try:
                write_text_atomically(path, text)
            except OSError as exc:
                raise OSError(f"{path} could not be written: {exc.strerror or exc}") from None
            window.statusBar().showMessage(f"Saved {path}", 10000)

        window.run_task(export(), "Exporting the turn summary")
