"""What a pane's next prompt holds when the conversation outgrows the model's context.

A pane's conversation has a context policy (`Conversation.context_policy`):
"stop" refuses a turn whose prompt plus its reply budget (`max_tokens`) does
not fit the model's context, saying so (ContextFullError); "drop_oldest"
leaves the oldest turns out of what the model reads (the system prompt stays)
and the workspace marks the cut with a notice in the conversation, which the
next turns start from, so they extend that prompt and hit the prefix cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.errors import ContextFullError

if TYPE_CHECKING:
    from engine import Tokenizer

    from app.workspace.conversation import Conversation


@dataclass(slots=True)
class PromptPlan:
    """A pane's next prompt; `start` is set when older turns were left out
    (messages[start:] are what the prompt holds) and `dropped` counts them."""

    prompt: list[int]
    start: int | None = None
    dropped: int = 0


def plan_prompt(
    tokenizer: Tokenizer, conversation: Conversation, pane_title: str, user_text: str | None, upto: int | None
) -> PromptPlan:
    """The conversation's next prompt (a reply to messages[:upto] and then
    `user_text`), leaving its oldest turns out when its context policy says
    so and the whole conversation does not fit.

    Raises ContextFullError (naming the pane) when it does not fit and the
    policy is "stop", or when even the newest message alone is too long.
    Changes nothing in the conversation.
    """
    prompt = conversation.next_prompt(tokenizer, user_text=user_text, upto=upto)
    limit = conversation.context_limit
    reserve = conversation.params.max_tokens
    if not limit or len(prompt) + reserve <= limit:
        return PromptPlan(prompt)
    if conversation.context_policy == "drop_oldest":
        fitted = conversation.prompt_dropping_oldest(tokenizer, limit - reserve, user_text, upto)
        if fitted is not None:
            prompt, start = fitted
            first = conversation.context_start(upto)
            dropped = sum(1 for m in conversation.messages[first:start] if m.to_model)
            return PromptPlan(prompt, start, dropped)
    raise ContextFullError(pane_title, len(prompt), reserve, limit)


def drop_notice(dropped: int, context_limit: int) -> str:
    """The notice shown where a prompt now starts, after `dropped` earlier messages were left out."""
    return (
        f"{dropped} earlier message{'s' if dropped != 1 else ''} no longer fit the model's "
        f"context of {context_limit:,} tokens and are left out of what it reads "
        f"from here on (the system prompt is kept). They stay here for you."
    )
