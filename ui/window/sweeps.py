"""Sweep…: one new pane per value of a setting, each a fork of the pane's conversation (app.workspace.sweep)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Qt

from app.errors import AppError
from app.workspace.sweep import open_sweep

if TYPE_CHECKING:
    from ui.dialogs.sweep_dialog import SweepDialog
    from ui.window.main_window import MainWindow


class WindowSweeps:
    def __init__(self, window: MainWindow) -> None:
        self._window = window
        self.dialog: SweepDialog | None = None

    def open_current(self) -> None:
        if self._window.current_pane_id is not None:
            self.open_for(self._window.current_pane_id)

    def open_for(self, pane_id: int) -> None:
        from ui.dialogs.sweep_dialog import SweepDialog

        window = self._window
        view = window.panes.get(pane_id)
        if view is None:
            return
        pane = view.pane
        if window.arena.hiding:
            window.report_error("Sweeping", AppError("Vote first: a sweep would show the pane's hidden settings."))
            return
        if pane.busy:
            window.report_error("Sweeping", AppError(f"{pane.title} is still replying; sweep once it has finished (or stop it)."))
            return
        conversation = pane.conversation
        models = {entry.id: entry.name for entry in window.models.entries()}
        models.setdefault(conversation.model_id, window.models.name(conversation.model_id))
        turn = conversation.last_turn()
        constraint = conversation.params.constraint
        schema_name = window.saved_schemas.name_of(constraint.spec) if constraint is not None else None
        dialog = SweepDialog(pane.title, conversation.params, conversation.system_prompt, models,
                             can_reply_again=turn is not None, parent=window, schema_name=schema_name)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.dialog = dialog
        dialog.finished.connect(lambda _result: setattr(self, "dialog", None))
        dialog.accepted.connect(lambda: self.run(pane_id, dialog.chosen, dialog.values, models,
                                                 reply_again=dialog.reply_again.isChecked(),
                                                 keep_constraint=dialog.keep_json.isChecked()))
        dialog.open()

    def run(self, pane_id: int, parameter: str, values: list[object], models: dict[str, str],
            *, reply_again: bool = False, keep_constraint: bool = True) -> None:
        """Open the sweep's panes; load the models they need (with the memory check); answer again when asked."""
        window = self._window
        workspace = window.workspace
        try:
            panes = open_sweep(workspace, pane_id, parameter, values, models, keep_constraint=keep_constraint)
        except Exception as exc:
            window.report_error("Sweeping", exc)
            return
        ids = [pane.id for pane in panes]
        window.composer.set_targets(ids)
        window.set_current_pane(ids[0])
        window.statusBar().showMessage(
            f"Opened {len(ids)} panes, one per value; the message box sends to them.", 10000)

        async def then() -> None:
            for model_id in dict.fromkeys(p.conversation.model_id for p in panes if p.remote is None):
                if workspace.model_state(model_id) in ("unloaded", "error"):
                    await window.models.load_if_it_fits(model_id)
            if reply_again:
                for pane in panes:
                    if pane in workspace.panes and workspace.pane_model_state(pane.id) == "ready":
                        # The fork's last reply stays as the earlier version of each new one.
                        await workspace.regenerate(pane.id)

        window.run_task(then(), "Sweeping")
