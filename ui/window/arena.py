"""View > Arena: a blind vote between the panes, and its leaderboard.

While the arena is on, a message goes to every arena pane under labels drawn
for that turn (app.workspace.arena); each pane shows its label instead of its
model, settings and reply stats until the vote. The arena bar offers the
vote once every reply has ended (buttons, or the digits while it has the
focus); the vote is handed to the store's writer thread, and reveals who was
who. The leaderboard is computed off the GUI thread.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from app.arena.votes import contender_name
from app.errors import ArenaError
from app.workspace.arena import Arena, vote_choices
from app.workspace.conversation import Conversation

if TYPE_CHECKING:
    from app.arena.votes import ArenaVote
    from ui.dialogs.leaderboard import LeaderboardDialog
    from ui.window.main_window import MainWindow

# Until the draw of a turn is known, an arena pane is shown under this.
_DRAWING = "…"


class WindowArena:
    def __init__(self, window: MainWindow) -> None:
        self._window = window
        self.arena: Arena | None = None
        self.leaderboard: LeaderboardDialog | None = None
        self.last_vote: ArenaVote | None = None

    @property
    def on(self) -> bool:
        return self.arena is not None

    # -- starting and leaving ------------------------------------------------------------

    def set_arena(self, on: bool) -> None:
        """The View > Arena toggle."""
        if on and self.arena is None:
            self.start()
        elif not on and self.arena is not None:
            self.stop()

    def start(self) -> bool:
        window = self._window
        panes = [window.workspace.pane(pid) for pid in window.pane_order()]
        try:
            self.arena = Arena.over(panes)
        except ArenaError as exc:
            self._set_checked(False)
            window.report_error("Starting the arena", exc)
            return False
        self._set_checked(True)
        window.arena_bar.set_choices(self.arena.choices())
        window.arena_bar.show()
        window.composer.set_targets(self.arena.pane_ids)
        self.refresh()
        window.composer.edit.setFocus()
        return True

    def stop(self, reason: str = "") -> None:
        window = self._window
        self.arena = None
        self._set_checked(False)
        window.arena_bar.hide()
        for view in window.panes.values():
            view.set_arena(None, False)
        self._blind_sidebar()
        window.sync_pane_lists()
        if reason:
            window.statusBar().showMessage(reason, 10000)

    def new_arena(self) -> None:
        """A new arena from the Chats sidebar: every pane starts a new chat on its
        model and settings (the old chats stay in the sidebar), then the arena begins."""
        window = self._window
        workspace = window.workspace
        order = window.pane_order()
        if len(order) < 2:
            window.report_error("Starting the arena", ArenaError(
                "An arena compares two or more panes, and there is only one. Add a pane (Ctrl+T), "
                "give it another model or other settings, then start the arena again."))
            return
        busy = [window.panes[pid].pane.title for pid in order if window.panes[pid].pane.busy]
        if busy:
            window.report_error("Starting the arena", ArenaError(
                f"{', '.join(busy)} is still replying; stop it (Esc) before starting a new arena."))
            return
        if self.arena is not None:
            self.stop()
        try:
            for pid in order:
                pane = workspace.pane(pid)
                if not pane.conversation.messages:
                    continue
                old = pane.conversation
                fresh = Conversation(system_prompt=old.system_prompt, params=old.params, model_id=old.model_id,
                                     context_policy=old.context_policy)
                remote = pane.remote.copy() if pane.remote is not None else None
                workspace.open_conversation(fresh, after=pid, remote=remote)
                workspace.close_pane(pid)
        except Exception as exc:
            window.report_error("Starting the arena", exc)
            return
        self.start()

    def _set_checked(self, on: bool) -> None:
        action = self._window.menu_actions.get("arena")
        if action is not None and action.isChecked() != on:
            action.blockSignals(True)
            action.setChecked(on)
            action.blockSignals(False)

    # -- turns --------------------------------------------------------------------------

    def send(self, text: str) -> None:
        """The composer's message, to the arena's panes under a new draw."""
        window = self._window
        arena = self.arena
        assert arena is not None
        composer = window.composer
        # Hidden at once: the labels are drawn when the send runs, before any reply shows.
        for pid in arena.pane_ids:
            if pid in window.panes:
                window.panes[pid].set_arena(_DRAWING, True)
        composer.set_sending(True)

        async def go() -> None:
            try:
                await arena.send(window.workspace, text)
            finally:
                self.refresh()
            composer.clear()

        window.run_task(go(), "Sending", on_done=lambda: composer.set_sending(False))

    def replies_changed(self) -> None:
        """A reply ended (or a pane stopped): the vote opens once all of the turn's have."""
        if self.arena is None:
            return
        was_open = self._window.arena_bar.voting
        self.refresh()
        bar = self._window.arena_bar
        if bar.voting and not was_open:
            bar.setFocus()

    def panes_changed(self) -> None:
        """A pane closed: the arena goes on with the others, or ends with fewer than two."""
        if self.arena is None:
            return
        if not self.arena.drop_closed(list(self._window.panes)):
            self.stop("The arena ended: it needs two or more panes.")
        else:
            self.refresh()

    def refresh(self) -> None:
        """Labels and what is hidden in each pane, the bar's text and whether it votes."""
        window = self._window
        arena = self.arena
        if arena is None:
            return
        turn = arena.turn
        for pid, view in window.panes.items():
            if pid not in arena.pane_ids:
                view.set_arena(None, False)
                continue
            label = turn.label_of(pid) if turn is not None else None
            view.set_arena(label, not arena.revealed)
        busy = any(window.panes[pid].pane.busy for pid in arena.pane_ids if pid in window.panes)
        voting = arena.awaiting_vote and not busy
        bar = window.arena_bar
        bar.set_voting(voting)
        keys = ", ".join(f"{c.key} {c.text[:1].lower() + c.text[1:] if c.winner is None else c.text}"
                         for c in vote_choices(len(arena.pane_ids)))
        if turn is None or not turn.sent:
            bar.status.setText(f"Send a message: the replies come under labels {', '.join(_labels(arena))}, "
                               "in an order drawn each turn; models and settings stay hidden until you vote.")
        elif busy:
            bar.status.setText("The replies are being written. The vote opens when they have all ended.")
        elif voting:
            bar.status.setText(f"Which reply is better? Keys: {keys}.")
        elif turn.vote is not None:
            bar.status.setText(reveal_text(turn.vote))
        self._blind_sidebar()
        window.sync_pane_lists()

    def _blind_sidebar(self) -> None:
        sidebar = self._window.sidebar
        if sidebar is None:
            return
        arena = self.arena
        hidden = arena is not None and not arena.revealed
        panes = self._window.panes
        sidebar.set_blind([panes[pid].pane.conversation.id for pid in arena.pane_ids if pid in panes] if hidden else [])

    def display_title(self, pane_id: int, title: str) -> str:
        """What the composer's chips and the compare bar call a pane: its label while hidden."""
        arena = self.arena
        if arena is None or pane_id not in arena.pane_ids or arena.revealed:
            return title
        label = arena.turn.label_of(pane_id) if arena.turn is not None else None
        return label or _DRAWING

    @property
    def hiding(self) -> bool:
        """Whether the arena hides models and settings now."""
        return self.arena is not None and not self.arena.revealed

    # -- the vote -----------------------------------------------------------------------

    def vote(self, outcome: str, winner: str | None) -> None:
        window = self._window
        arena = self.arena
        if arena is None:
            return
        try:
            vote = arena.vote(window.workspace, outcome, winner, model_name=window.models.name)
        except ArenaError as exc:
            window.report_error("Voting", exc)
            return
        self.last_vote = vote
        window.composer.notice.hide()  # a note that the vote was early is stale now
        session = window.session
        if session is None or not session.writer.submit(lambda store: store.add_arena_vote(vote)):
            window.statusBar().showMessage(
                "The vote was counted here but not saved: the chat store is not available.", 15000)
        else:
            window.statusBar().showMessage("Vote saved.", 5000)
        self.refresh()
        window.composer.edit.setFocus()

    def focus_vote(self) -> None:
        window = self._window
        if self.arena is None:
            window.report_error("Voting", ArenaError("The arena is off: start it with View → Arena (Ctrl+Shift+A)."))
            return
        window.arena_bar.setFocus()
        if not window.arena_bar.voting:
            self.refresh()
            window.statusBar().showMessage(window.arena_bar.status.text(), 8000)

    # -- the leaderboard ----------------------------------------------------------------

    def open_leaderboard(self) -> None:
        from ui.dialogs.leaderboard import LeaderboardDialog

        window = self._window
        if self.leaderboard is not None:
            self.leaderboard.raise_()
            self.leaderboard.activateWindow()
            return
        dialog = LeaderboardDialog(window)
        self.leaderboard = dialog
        dialog.finished.connect(lambda _result: setattr(self, "leaderboard", None))
        dialog.open()
        window.run_task(self._load_leaderboard(dialog), "Computing the leaderboard")

    async def _load_leaderboard(self, dialog: LeaderboardDialog) -> None:
        from app.arena.leaderboard import leaderboard

        session = self._window.session
        if session is None:
            dialog.show_problem("The chat store is not available, so there are no saved votes to rate.")
            return
        # The votes queued a moment ago are written before they are read.
        await asyncio.to_thread(session.writer.flush, 5.0)
        if self.leaderboard is not dialog:
            return
        problems: list[str] = []
        try:
            votes = session.store.arena_votes(problems=problems)
        except Exception as exc:
            dialog.show_problem(f"The votes could not be read: {exc}")
            return
        rows = await asyncio.to_thread(leaderboard, votes)
        if self.leaderboard is dialog:  # not closed meanwhile
            dialog.show_rows(rows, votes, problems)


def _labels(arena: Arena) -> list[str]:
    return [c.winner for c in vote_choices(len(arena.pane_ids)) if c.winner is not None]


def reveal_text(vote: ArenaVote) -> str:
    """"You chose B. A was SmolLM2 · temperature 0.3; B was …"."""
    chosen = {"win": f"You chose {vote.winner}.", "tie": "You called it a tie.",
              "both_bad": "You found them all bad." if len(vote.sides) > 2 else "You found both bad."}[vote.outcome]
    sides = "; ".join(f"{side.label} was {contender_name(side)}" for side in vote.sides)
    return f"{chosen} {sides}."
