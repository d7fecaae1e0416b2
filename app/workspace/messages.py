"""A conversation's messages as records: what each says, its state, the engine's
figures for a reply (ReplyStats), and the versions a regenerated turn keeps.

Plain data: the store, the exports, the window and the remote panes read
and write these; app.workspace.conversation keeps them in order and the
token ids beside them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from engine import reasoning
from engine.documents import Document
from engine.params import SamplingParams

if TYPE_CHECKING:
    from engine import RequestOutput, StreamEvent

# "notice": a note for the user in the conversation (older turns dropped to
# fit the context, say); never sent to the model.
Role = Literal["system", "user", "assistant", "notice"]
# "interrupted": the app ended (crashed) while the reply streamed; it keeps
# what its last checkpoint saved.
MessageState = Literal["complete", "streaming", "stopped", "interrupted", "error"]


@dataclass(slots=True)
class ReplyStats:
    """What the engine did for one reply; live while it streams, final after."""

    generated_tokens: int
    tokens_per_s: float  # decode speed: tokens after the first over the time after the first
    ttft_s: float | None  # time to first token
    prompt_tokens: int
    cached_prompt_tokens: int  # prompt tokens served from the prefix cache
    finish_reason: str | None  # None while streaming; "stop" | "length" | "abort" | "error"
    elapsed_s: float

    @staticmethod
    def _rate(generated: int, elapsed: float, ttft: float | None) -> float:
        if ttft is None or generated < 2 or elapsed <= ttft:
            return 0.0
        return (generated - 1) / (elapsed - ttft)

    @classmethod
    def from_event(cls, event: StreamEvent) -> ReplyStats:
        """Live stats from a stream event's running figures."""
        return cls(
            generated_tokens=event.num_generated,
            tokens_per_s=cls._rate(event.num_generated, event.elapsed_s, event.ttft_s),
            ttft_s=event.ttft_s,
            prompt_tokens=event.prompt_tokens,
            cached_prompt_tokens=event.cached_prompt_tokens,
            finish_reason=None,
            elapsed_s=event.elapsed_s,
        )

    @classmethod
    def from_output(cls, output: RequestOutput) -> ReplyStats:
        """Final stats from a finished request's record."""
        m = output.metrics
        end = m.finish_time if m.finish_time is not None else m.arrival_time
        elapsed = max(0.0, end - m.arrival_time)
        ttft = m.time_to_first_token
        return cls(
            generated_tokens=len(output.token_ids),
            tokens_per_s=cls._rate(len(output.token_ids), elapsed, ttft),
            ttft_s=ttft,
            prompt_tokens=m.prompt_tokens,
            cached_prompt_tokens=m.cached_prompt_tokens,
            finish_reason=output.finish_reason,
            elapsed_s=elapsed,
        )


@dataclass(slots=True)
class Message:
    role: Role
    text: str
    # assistant: the generated ids (a stopping end token included); user/system: [].
    token_ids: list[int] = field(default_factory=list)
    state: MessageState = "complete"
    stats: ReplyStats | None = None
    error: str | None = None
    created_at: float = field(default_factory=time.time)
    # assistant: the model that wrote it and the sampling it used.
    model_id: str | None = None
    params: SamplingParams | None = None
    # A reply that regenerate or edit-and-resend made again: every version of
    # its turn (None on any other message, and on the versions set aside).
    versions: ReplyVersions | None = None
    # assistant: the system prompt it was written under ("" for none), so an
    # export can say where one set midway took effect; None when not known
    # (a reply stored before the chat store kept it, schema v6).
    system_prompt: str | None = None
    # assistant: its reasoning's tokens and seconds (live while it thinks), for a
    # reply that thinks before answering. Not stored: None once restored.
    reasoning_tokens: int | None = field(default=None, compare=False)
    reasoning_s: float | None = field(default=None, compare=False)
    # user: the documents sent with it; the model reads them before the text
    # (app.workspace.attachments), the window shows them as chips.
    attachments: tuple[Document, ...] = ()

    @property
    def to_model(self) -> bool:
        """Whether the message is part of what the model is fed."""
        return self.role != "notice" and self.state != "error"

    @property
    def parts(self) -> reasoning.ReplyParts:
        """The reply's reasoning and its answer (engine.reasoning); a message
        without a think block is all answer."""
        return reasoning.split_reply(self.text)

    @property
    def answer(self) -> str:
        """What the message says, reasoning left out: what compare, copy and the arena act on."""
        return reasoning.answer_of(self.text) if self.role == "assistant" else self.text


@dataclass(slots=True)
class ReplyVersion:
    """A version of a turn set aside: the reply and everything the conversation
    went on to after it, with the token ids that cover them.

    `user_text` is the user message the reply answers, as it read in this
    version (edit-and-resend changes it). `kept_ids` are the conversation's
    kept ids at the end of `messages` and `turn_marks` index into them, so
    a conversation continued from this version feeds the model the ids it
    generated and hits the prefix cache.
    """

    user_text: str
    messages: list[Message]
    turn_marks: list[int | None]
    kept_ids: list[int]


@dataclass(slots=True)
class ReplyVersions:
    """Every version of one turn's reply, carried by the reply that is shown.

    `versions[current]` is None: the version shown is the conversation itself.
    """

    versions: list[ReplyVersion | None]
    current: int

    @property
    def count(self) -> int:
        return len(self.versions)
