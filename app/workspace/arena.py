"""A blind arena over some of the workspace's panes: labels drawn per turn, and the vote.

Each broadcast turn of the arena draws which pane stands behind which label
(app.arena.labels.draw_order) before the message goes out, so a view can
hide every pane's model and settings behind its label from the reply's first
token on, and seats the panes in label order (A leftmost), so where a model
is shown changes with the draw. Once every reply has ended the user votes (one label better, a
tie, or all bad); the vote names what each label hid (app.arena.votes) and
is then shown. Storing it is the caller's (the store's writer thread).

Keys: with N sides, 1..N choose the winner A..N, N+1 is a tie and N+2 "all
bad", so two sides vote with 1, 2, 3, 4 and every arena with the digits in
the same order. Hence at most seven sides.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.arena.labels import arena_labels, draw_order
from app.arena.votes import OUTCOMES, ArenaSide, ArenaVote, contender_settings
from app.errors import ArenaError

if TYPE_CHECKING:
    from app.workspace.pane import Pane
    from app.workspace.replies import Turn
    from app.workspace.workspace import Workspace

MIN_ARENA_PANES = 2
# Winner keys 1..N, then tie and all-bad on the next two digits: at most 1..9.
MAX_ARENA_PANES = 7


@dataclass(frozen=True, slots=True)
class VoteChoice:
    key: str  # the digit that casts it
    text: str  # "A is better"
    outcome: str  # one of OUTCOMES
    winner: str | None


@dataclass(slots=True)
class ArenaTurn:
    """One broadcast turn of the arena: the message, the labels drawn for it, the vote once cast."""

    prompt: str
    labels: dict[str, int]  # label -> pane id, "A" first
    vote: ArenaVote | None = None
    sent: bool = False  # the replies were started

    def label_of(self, pane_id: int) -> str | None:
        for label, pid in self.labels.items():
            if pid == pane_id:
                return label
        return None


def check_arena_panes(panes: Sequence[Pane]) -> None:
    """ArenaError unless the panes can form an arena."""
    if len(panes) < MIN_ARENA_PANES:
        raise ArenaError(
            "An arena compares two or more panes, and there is only one. Add a pane (Ctrl+T), "
            "give it another model or other settings, then start the arena again."
        )
    if len(panes) > MAX_ARENA_PANES:
        raise ArenaError(
            f"An arena compares at most {MAX_ARENA_PANES} panes (the vote keys are the digits 1-9); "
            f"there are {len(panes)}. Close some panes first."
        )


def check_arena_start(panes: Sequence[Pane]) -> None:
    """ArenaError unless the panes can begin an arena: the checks of every
    turn, and one history shared by all (none, or the same messages)."""
    check_arena_panes(panes)
    histories = {tuple((m.role, m.text) for m in pane.conversation.messages) for pane in panes}
    if len(histories) > 1:
        # Each pane's own history would show which pane is which, and the
        # replies would answer different conversations: no fair vote.
        raise ArenaError(
            "These panes hold different conversations, which would show who is who and have each "
            "reply answer a different history. Use New arena at the top of the Chats sidebar "
            "instead: it gives every pane a new chat, each keeping its model and settings."
        )


def vote_choices(count: int) -> list[VoteChoice]:
    """The choices of a vote between `count` sides, in key order."""
    labels = arena_labels(count)
    choices = [VoteChoice(str(i + 1), f"{label} is better", "win", label) for i, label in enumerate(labels)]
    choices.append(VoteChoice(str(count + 1), "Tie", "tie", None))
    choices.append(VoteChoice(str(count + 2), "Both are bad" if count == 2 else "All are bad", "both_bad", None))
    return choices


class Arena:
    """The arena over `pane_ids` (in the workspace's order when it began)."""

    def __init__(self, pane_ids: Sequence[int], *, rng: random.Random | None = None, arena_id: str | None = None) -> None:
        self.id = arena_id if arena_id is not None else uuid.uuid4().hex
        self.pane_ids = list(pane_ids)
        self._rng = rng if rng is not None else random.Random()
        self.turn: ArenaTurn | None = None
        self.votes: list[ArenaVote] = []  # cast in this arena

    @classmethod
    def over(cls, panes: Sequence[Pane], **kwargs: object) -> Arena:
        check_arena_start(panes)
        return cls([pane.id for pane in panes], **kwargs)  # type: ignore[arg-type]

    def choices(self) -> list[VoteChoice]:
        return vote_choices(len(self.pane_ids))

    @property
    def revealed(self) -> bool:
        """Whether the panes' models and settings may be shown: no turn yet, or the turn was voted on."""
        return self.turn is None or self.turn.vote is not None

    @property
    def awaiting_vote(self) -> bool:
        return self.turn is not None and self.turn.sent and self.turn.vote is None

    async def send(self, workspace: Workspace, text: str) -> Turn:
        """Send `text` to the arena's panes under labels drawn afresh; a refused
        send (a busy pane, an empty message) leaves the previous turn as it was."""
        panes = [workspace.pane(pid) for pid in self.pane_ids]
        check_arena_panes(panes)
        previous = self.turn
        # Drawn before the send: the replies' first events already show labels, not models.
        self.turn = ArenaTurn(text, draw_order(self.pane_ids, self._rng))
        _seat(workspace, list(self.turn.labels.values()))
        try:
            turn = await workspace.send(text, targets=self.pane_ids)
        except BaseException:
            self.turn = previous
            raise
        self.turn.sent = True
        return turn

    def vote(
        self, workspace: Workspace, outcome: str, winner: str | None = None, *,
        model_name: Callable[[str], str] | None = None,
    ) -> ArenaVote:
        """Cast the vote on the current turn; returns it (with every side's model and settings) to store and show."""
        turn = self.turn
        if turn is None or not turn.sent:
            raise ArenaError("There is nothing to vote on yet: send a message, and vote once the replies have ended.")
        if turn.vote is not None:
            raise ArenaError("This turn has its vote. Send the next message to vote again.")
        if outcome not in OUTCOMES:
            raise ArenaError(f"A vote is one of {', '.join(OUTCOMES)}, not {outcome!r}.")
        if outcome == "win" and winner not in turn.labels:
            raise ArenaError(f"The winner is one of {', '.join(turn.labels)}, not {winner!r}.")
        panes = {label: workspace.pane(pid) for label, pid in turn.labels.items()}
        busy = [label for label, pane in panes.items() if pane.busy]
        if busy:
            which = f"Reply {busy[0]} is" if len(busy) == 1 else f"Replies {', '.join(busy[:-1])} and {busy[-1]} are"
            raise ArenaError(f"{which} still being written: vote once every reply has ended (or stop them with Esc).")
        names = model_name if model_name is not None else (lambda model_id: model_id)
        sides = tuple(_side(label, pane, names) for label, pane in panes.items())
        vote = ArenaVote(
            prompt=turn.prompt, sides=sides, outcome=outcome, winner=winner if outcome == "win" else None,
            created_at=time.time(), arena_id=self.id,
        )
        turn.vote = vote
        self.votes.append(vote)
        return vote

    def drop_closed(self, open_ids: Sequence[int]) -> bool:
        """Forget panes that were closed; False when fewer than two are left (the arena ends)."""
        self.pane_ids = [pid for pid in self.pane_ids if pid in open_ids]
        if self.turn is not None and any(pid not in open_ids for pid in self.turn.labels.values()):
            self.turn = None
        return len(self.pane_ids) >= MIN_ARENA_PANES


def _seat(workspace: Workspace, in_label_order: list[int]) -> None:
    """Move the arena's panes so that A is the leftmost of their places, B the
    next and so on (other panes keep theirs): the position a model is shown in
    changes with the draw, so a liking for the left reply favours no model."""
    arena = set(in_label_order)
    labelled = iter(in_label_order)
    order = [next(labelled) if pane.id in arena else pane.id for pane in workspace.panes]
    for position, pane_id in enumerate(order):
        if workspace.index_of(pane_id) != position:
            workspace.move_pane(pane_id, position)


def _side(label: str, pane: Pane, model_name: Callable[[str], str]) -> ArenaSide:
    conversation = pane.conversation
    turn = conversation.last_turn()
    # The answer is what is judged: a reasoning model's think block is left out.
    reply = conversation.messages[turn[1]].answer if turn is not None and turn[1] is not None else ""
    model = pane.remote.label if pane.remote is not None else model_name(conversation.model_id)
    return ArenaSide(label, model, contender_settings(conversation.params, conversation.system_prompt), reply, pane.id)
