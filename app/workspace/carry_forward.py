"""Use in all panes: one pane's reply becomes every other pane's answer to the same message.

Each other pane that was asked the same last message takes the reply as the
newest version of its answer (`Conversation.adopt_reply`; its own answer
stays a version, so nothing is lost) and the next broadcast continues from
the same history everywhere. A pane on the reply's model keeps the ids the
reply was generated with, after its own prompt for that turn, so the next
turn is served from the pages that generation left in the prefix cache; a
pane on another model (or a remote one) keeps the answer's text (a
reasoning model's think block stays with the model that wrote it), which its
next turn encodes once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from app.errors import CarryError

if TYPE_CHECKING:
    from engine import Tokenizer

    from app.workspace.messages import Message
    from app.workspace.pane import Pane


@dataclass(slots=True)
class CarryResult:
    """Which panes took the reply, and which were left as they were and why."""

    carried: list[int] = field(default_factory=list)  # pane ids
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (pane id, why, in words)

    def summary(self, titles: dict[int, str]) -> str:
        """One sentence for the status bar."""
        said = []
        if self.carried:
            names = ", ".join(titles.get(pid, str(pid)) for pid in self.carried)
            said.append(f"The reply is now the answer in {names} (their own answers stay as earlier versions).")
        for pid, why in self.skipped:
            said.append(f"{titles.get(pid, str(pid))} was left as it was: {why}.")
        return " ".join(said) or "There is no other pane to use the reply in."


def carried_reply(pane: Pane, message_index: int) -> tuple[Message, str]:
    """The reply at `message_index` of `pane` and the user text it answers;
    CarryError when it is not the pane's finished last reply."""
    conversation = pane.conversation
    messages = conversation.messages
    if not 0 <= message_index < len(messages) or messages[message_index].role != "assistant":
        raise CarryError(f"Message {message_index + 1} of {pane.title} is not a reply.")
    turn = conversation.last_turn()
    if turn is None or turn[1] != message_index:
        raise CarryError(
            f"Only the last reply of {pane.title} can be used in all panes: "
            "it becomes the answer to the last message everywhere."
        )
    reply = messages[message_index]
    if reply.state == "streaming":
        raise CarryError(f"The reply in {pane.title} is still being written; wait for it or stop it.")
    if reply.state in ("error", "interrupted") or not reply.text:
        raise CarryError(f"The reply in {pane.title} did not finish, so there is nothing to use in the other panes.")
    if reply.parts.has_reasoning and not reply.answer.strip():
        raise CarryError(f"The reply in {pane.title} is all reasoning, with no answer to use in the other panes.")
    return reply, messages[turn[0]].text


def why_not_carried(pane: Pane, user_text: str) -> str | None:
    """Why `pane` cannot take a reply to `user_text` (None: it can)."""
    turn = pane.conversation.last_turn()
    if turn is None:
        return "it has no message to answer"
    if pane.conversation.messages[turn[0]].text != user_text:
        return "its last message is not the same"
    return None


def prompt_for_carried_ids(source: Pane, target: Pane, tokenizer: Tokenizer | None) -> list[int] | None:
    """The target's prompt for its last turn when it can keep the source reply's ids
    (both local, on the same model, its tokenizer at hand); None: it keeps the text."""
    if tokenizer is None or source.remote is not None or target.remote is not None:
        return None
    if source.conversation.model_id != target.conversation.model_id:
        return None
    conversation = target.conversation
    turn = conversation.last_turn()
    if turn is None:
        return None
    return conversation.next_prompt(tokenizer, upto=turn[0] + 1)
