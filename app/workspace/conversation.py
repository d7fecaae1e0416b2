"""One pane's conversation: its messages, and the token ids the model saw.

The kept ids are the conversation exactly as the model was fed it and
generated it: prompt ids plus generated ids, turn after turn. A new turn's
prompt is those ids plus what the chat template adds for the new message
(`Tokenizer.encode_next_turn`), so it starts with every page the previous
turn left in the prefix cache. Re-tokenizing earlier replies from their text
would give other ids and silently miss the cache, so replies are never
re-tokenized: for each message that closes a turn the conversation remembers
how many kept ids cover the conversation up to it, and cutting the
conversation back (regenerate, edit, fork) cuts the kept ids at that mark.
"""

from __future__ import annotations

import copy
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from engine import reasoning
from engine.documents import Document, user_message_with_documents
from engine.params import SamplingParams

from app.errors import MessageIndexError
from app.workspace.messages import Message, MessageState, ReplyStats, ReplyVersion, ReplyVersions
from app.workspace.titles import fork_title, labelled_title, without_label

if TYPE_CHECKING:
    from engine import Tokenizer

ContextPolicy = Literal["stop", "drop_oldest"]
CONTEXT_POLICIES: tuple[str, ...] = ("stop", "drop_oldest")

DEFAULT_MODEL_ID = "default"


@dataclass(slots=True)
class _Turn:
    """The reply being written: where it is and the prompt it answers."""

    index: int
    prompt_ids: list[int]
    # The think block's opening tag when the prompt wrote it (the R1 distills'
    # templates): the reply's text starts with it, so the text says by itself
    # where its reasoning is, also once stored.
    opening: str
    thinking: reasoning.ReasoningParser


class Conversation:
    """Messages plus the token ids that cover them.

    The conversation does not talk to the engine: the workspace asks it for
    the next prompt (`next_prompt`), submits it, and reports back with
    `begin_reply` / `add_reply_delta` / `end_reply`.
    """

    def __init__(
        self,
        *,
        system_prompt: str = "",
        params: SamplingParams | None = None,
        model_id: str = DEFAULT_MODEL_ID,
        context_limit: int = 0,
        context_policy: ContextPolicy = "stop",
        title: str = "",
    ) -> None:
        if context_policy not in CONTEXT_POLICIES:
            raise ValueError(f"context_policy must be one of {CONTEXT_POLICIES}, not {context_policy!r}")
        self.id = uuid.uuid4().hex  # the chat store's key; a fork is a new conversation
        self.title = title  # "" until the first message names it (auto_title)
        self.label = ""  # the pane's name, which leads the title (app.workspace.titles)
        self.created_at = time.time()
        self.system_prompt = system_prompt
        self.params = params if params is not None else SamplingParams()
        self.model_id = model_id
        # The model's context in tokens; 0 until a model is loaded.
        self.context_limit = context_limit
        # What to do when the next turn does not fit the context: refuse it,
        # or leave the oldest turns out of the prompt (they stay on screen).
        self.context_policy: ContextPolicy = context_policy
        # "Think before answering": the template's thinking switch (Qwen3's
        # enable_thinking), for a model whose template has one.
        self.thinking = True
        self.messages: list[Message] = []
        self._kept_ids: list[int] = []
        # _kept_after[i]: how many kept ids cover messages[: i + 1], for a
        # message that closed a turn; None for the others (a user message is
        # only ever fed together with the generation prompt after it).
        self._kept_after: list[int | None] = []
        self._turn: _Turn | None = None
        # Set by `set_version_aside`: (index, versions) the next reply at that index takes over.
        self._next_versions: tuple[int, ReplyVersions] | None = None

    @classmethod
    def restore(
        cls,
        *,
        id: str,  # noqa: A002 - the stored record's name for it
        title: str,
        created_at: float,
        system_prompt: str,
        params: SamplingParams,
        model_id: str,
        context_policy: str,
        messages: Sequence[Message],
        kept_ids: Sequence[int],
        turn_marks: Sequence[int | None],
        thinking: bool = True,
    ) -> Conversation:
        """A conversation as the chat store saved it.

        A reply saved while it streamed (the app ended before it did) comes
        back "interrupted" with the text it had. Marks that do not fit the
        kept ids are dropped: the next turn then renders afresh instead of
        feeding the model ids that do not belong to this text.
        """
        conversation = cls(
            system_prompt=system_prompt,
            params=params,
            model_id=model_id,
            context_policy=context_policy if context_policy in CONTEXT_POLICIES else "stop",  # type: ignore[arg-type]
            title=title,
        )
        conversation.id = id
        conversation.created_at = created_at
        conversation.thinking = thinking
        conversation.messages = list(messages)
        for message in conversation.messages:
            if message.state == "streaming":
                message.state = "interrupted"
        conversation._kept_ids = list(kept_ids)
        marks = list(turn_marks)[: len(messages)]
        marks += [None] * (len(messages) - len(marks))
        conversation._kept_after = [m if m is not None and 0 < m <= len(kept_ids) else None for m in marks]
        # An interrupted reply's ids were never confirmed as part of the
        # conversation: its text is kept, its turn is rendered afresh.
        for i, message in enumerate(conversation.messages):
            if message.state in ("interrupted", "error"):
                conversation._kept_after[i] = None
        last = max((m for m in conversation._kept_after if m is not None), default=0)
        conversation._kept_ids = conversation._kept_ids[:last]
        return conversation

    def set_label(self, label: str) -> None:
        """Lead the title with the pane's name `label` ("" for none), in place of the previous one."""
        self.title = labelled_title(self.title, self.label, label)
        self.label = label

    @staticmethod
    def auto_title(text: str, limit: int = 60) -> str:
        """A title from the first message: its first line, whitespace collapsed, cut at a word."""
        line = next((ln for ln in text.strip().splitlines() if ln.strip()), "")
        line = re.sub(r"\s+", " ", line).strip()
        if len(line) <= limit:
            return line
        cut = line[: limit - 1]
        if " " in cut[limit // 2 :]:
            cut = cut[: cut.rindex(" ")]
        return cut.rstrip(" ,.;:-") + "…"

    @property
    def turn_marks(self) -> list[int | None]:
        """For each message, how many kept ids cover the conversation up to it (None: not a turn's end)."""
        return list(self._kept_after)

    # -- what the model sees ---------------------------------------------

    @property
    def kept_ids(self) -> list[int]:
        """The ids of the conversation up to its last finished reply, as fed and generated."""
        return list(self._kept_ids)

    @property
    def context_used(self) -> int:
        """Tokens of the model's context the conversation takes (the reply being written included)."""
        if self._turn is not None:
            return len(self._turn.prompt_ids) + len(self.messages[self._turn.index].token_ids)
        return len(self._kept_ids)

    @property
    def streaming(self) -> bool:
        return self._turn is not None

    @property
    def streaming_index(self) -> int | None:
        return None if self._turn is None else self._turn.index

    def context_start(self, upto: int | None = None) -> int:
        """Index of the first message of messages[:upto] the model is fed: the
        one after the last notice (a notice marks where older turns were left out)."""
        upto = len(self.messages) if upto is None else upto
        for i in range(min(upto, len(self.messages)) - 1, -1, -1):
            if self.messages[i].role == "notice":
                return i + 1
        return 0

    def chat_messages(
        self,
        upto: int | None = None,
        user_text: str | None = None,
        start: int | None = None,
        *,
        raw_replies: bool = False,
    ) -> list[dict[str, str]]:
        """The conversation as chat-template messages: system prompt,
        messages[start:upto], then user_text. `start` defaults to
        `context_start(upto)`.

        A reply that failed and notices are left out: the model never produced them.
        A reply's reasoning is left out too, unless `raw_replies`: the replies
        as written, for a template that drops the reasoning itself.
        """
        upto = len(self.messages) if upto is None else upto
        start = self.context_start(upto) if start is None else start
        chat: list[dict[str, str]] = []
        if self.system_prompt:
            chat.append({"role": "system", "content": self.system_prompt})
        for message in self.messages[start:upto]:
            if message.to_model:
                content = user_message_with_documents(message.text if raw_replies else message.answer, message.attachments)
                chat.append({"role": message.role, "content": content})
        if user_text is not None:
            chat.append({"role": "user", "content": user_text})
        return chat

    def kept_ids_for(self, upto: int) -> list[int]:
        """The kept ids that cover messages[:upto] (up to the last turn boundary within them)."""
        for i in range(min(upto, len(self.messages)) - 1, -1, -1):
            mark = self._kept_after[i]
            if mark is not None:
                return self._kept_ids[:mark]
        return []

    def next_prompt(self, tokenizer: Tokenizer, user_text: str | None = None, upto: int | None = None) -> list[int]:
        """Prompt ids for a reply to messages[:upto] (all by default) followed by `user_text`.

        Changes nothing: the caller submits the prompt and only then records
        the turn, so a prompt the engine refuses leaves the conversation as it was.
        Without `user_text`, messages[:upto] must end with a user message.
        """
        upto = len(self.messages) if upto is None else upto
        self._require_user_message(upto, user_text)
        return tokenizer.encode_next_turn(
            self.kept_ids_for(upto),
            self.chat_messages(upto, user_text, raw_replies=tokenizer.drops_reasoning),
            template_kwargs=self.template_kwargs(tokenizer),
        )

    def template_kwargs(self, tokenizer: Tokenizer) -> dict[str, bool] | None:
        """The template variables the pane's settings set: "Think before answering"
        for a template with a thinking switch."""
        if reasoning.template_has_thinking_switch(tokenizer.chat_template_source):
            return {reasoning.THINKING_SWITCH: self.thinking}
        return None

    def prompt_dropping_oldest(
        self, tokenizer: Tokenizer, budget: int, user_text: str | None = None, upto: int | None = None
    ) -> tuple[list[int], int] | None:
        """The prompt of `next_prompt` with the oldest turns left out until it is
        at most `budget` tokens; returns (prompt, start) where messages[start:upto]
        are the ones kept, or None when even the newest message alone does not fit.

        The system prompt is always kept. Turns are dropped whole (a user
        message with its replies), and the prompt is rendered afresh from what
        is kept, so the turns after it extend it and hit the cache again.
        """
        upto = len(self.messages) if upto is None else upto
        self._require_user_message(upto, user_text)
        first = self.context_start(upto)
        # Candidate starts: each user message after the current start, oldest
        # first; without user_text the last user message must stay.
        starts = [i for i in range(first + 1, upto) if self.messages[i].role == "user"]
        if user_text is not None:
            starts.append(upto)
        # Dropping more turns never lengthens the prompt, so the oldest start
        # that fits is found by bisection: a few encodes of the conversation on
        # the GUI thread, not one per turn.
        found: tuple[list[int], int] | None = None
        lo, hi = 0, len(starts) - 1
        while lo <= hi:
            mid = (lo + hi) // 2
            messages = self.chat_messages(upto, user_text, start=starts[mid], raw_replies=tokenizer.drops_reasoning)
            prompt = tokenizer.encode_chat(messages, template_kwargs=self.template_kwargs(tokenizer))
            if len(prompt) <= budget:
                found, hi = (prompt, starts[mid]), mid - 1
            else:
                lo = mid + 1
        return found

    def insert_notice(self, index: int, text: str) -> int:
        """Insert a notice before messages[index]; the model is fed only what follows it."""
        self._require_idle()
        if not 0 <= index <= len(self.messages):
            raise MessageIndexError(f"Cannot insert a notice at {index} of {len(self.messages)} messages.")
        self.messages.insert(index, Message("notice", text))
        self._kept_after.insert(index, None)
        if self._next_versions is not None and self._next_versions[0] >= index:
            self._next_versions = (self._next_versions[0] + 1, self._next_versions[1])
        return index

    def _require_user_message(self, upto: int, user_text: str | None) -> None:
        if user_text is None:
            last = next((m for m in reversed(self.messages[:upto]) if m.to_model), None)
            if last is None or last.role != "user":
                raise MessageIndexError("There is no user message to reply to.")

    # -- recording a turn ----------------------------------------------------

    def append_user(self, text: str, attachments: Sequence[Document] = ()) -> int:
        self._require_idle()
        self.messages.append(Message("user", text, attachments=tuple(attachments)))
        self._kept_after.append(None)
        return len(self.messages) - 1

    def begin_reply(self, prompt_ids: list[int], *, opens_reasoning: bool = False) -> int:
        """Add the (empty, streaming) reply that `prompt_ids` asks for; returns its index.

        `opens_reasoning`: the prompt ends inside a think block
        (engine.reasoning.prompt_opens_reasoning), so the reply starts as reasoning."""
        self._require_idle()
        if not self.title:
            first = next((m.text for m in self.messages if m.role == "user"), "")
            self.title = labelled_title(self.auto_title(first), "", self.label)
        opening = reasoning.THINK_START + "\n" if opens_reasoning else ""
        message = Message("assistant", opening, state="streaming", model_id=self.model_id, params=self.params,
                          system_prompt=self.system_prompt)
        self.messages.append(message)
        self._kept_after.append(None)
        thinking = reasoning.ReasoningParser()
        thinking.feed(opening)
        self._turn = _Turn(len(self.messages) - 1, list(prompt_ids), opening, thinking)
        if self._next_versions is not None and self._next_versions[0] == self._turn.index:
            message.versions = self._next_versions[1]
        self._next_versions = None
        return self._turn.index

    def add_reply_delta(self, text: str, token_ids: list[int], stats: ReplyStats | None = None) -> Message:
        message = self._streaming_message()
        message.text += text
        message.token_ids.extend(token_ids)
        if stats is not None:
            message.stats = stats
        self._time_reasoning(message, text, stats)
        return message

    def _time_reasoning(self, message: Message, text: str, stats: ReplyStats | None) -> None:
        """Count the reply's reasoning: its tokens and seconds up to the delta that closes it."""
        assert self._turn is not None
        thinking = self._turn.thinking
        was_thinking = thinking.in_reasoning
        thinking.feed(text)
        if (was_thinking or thinking.has_reasoning and message.reasoning_tokens is None) and stats is not None:
            message.reasoning_tokens = stats.generated_tokens
            message.reasoning_s = max(0.0, stats.elapsed_s - (stats.ttft_s or 0.0))

    def end_reply(
        self,
        state: MessageState,
        *,
        text: str | None = None,
        token_ids: list[int] | None = None,
        stats: ReplyStats | None = None,
        error: str | None = None,
    ) -> Message:
        """Close the streaming reply: "complete", "stopped" (kept as far as it got) or "error".

        `text` / `token_ids`, when given, are the engine's final record and
        replace what the deltas added up to. A complete or stopped reply's ids
        extend the kept ids; a failed one leaves them as they were.
        """
        if state == "streaming":
            raise ValueError("end_reply needs a final state")
        message = self._streaming_message()
        turn = self._turn
        assert turn is not None
        if text is not None:
            message.text = turn.opening + text
        if token_ids is not None:
            message.token_ids = list(token_ids)
        if stats is not None:
            message.stats = stats
            if turn.thinking.in_reasoning:  # it ended still thinking: all of it was reasoning
                message.reasoning_tokens = stats.generated_tokens
                message.reasoning_s = max(0.0, stats.elapsed_s - (stats.ttft_s or 0.0))
        message.state = state
        message.error = error
        if state != "error":
            self._adopt_prompt(turn.prompt_ids)
            self._kept_ids = turn.prompt_ids + message.token_ids
            self._kept_after[turn.index] = len(self._kept_ids)
        self._turn = None
        return message

    def _adopt_prompt(self, prompt_ids: list[int]) -> None:
        """Forget turn marks the prompt does not extend.

        The prompt starts with the kept ids unless the chat template rewrote
        earlier turns (or the system prompt changed); then the old marks no
        longer index into the new kept ids.
        """
        for i, mark in enumerate(self._kept_after):
            if mark is not None and (mark > len(prompt_ids) or prompt_ids[:mark] != self._kept_ids[:mark]):
                self._kept_after[i] = None

    # -- cutting back and copying ----------------------------------------

    def truncate(self, length: int) -> None:
        """Keep messages[:length] and the kept ids that cover them."""
        self._require_idle()
        if not 0 <= length <= len(self.messages):
            raise MessageIndexError(f"Cannot keep {length} messages of {len(self.messages)}.")
        self._kept_ids = self.kept_ids_for(length)
        del self.messages[length:]
        del self._kept_after[length:]
        self._next_versions = None

    # -- versions of a reply ---------------------------------------------

    def user_message_of(self, index: int) -> int:
        """The user message that the reply at `index` answers (MessageIndexError when none)."""
        if not 0 < index <= len(self.messages):
            raise MessageIndexError(f"Message {index} does not exist; the conversation has {len(self.messages)}.")
        for i in range(index - 1, -1, -1):
            if self.messages[i].role == "user":
                return i
        raise MessageIndexError(f"Message {index} does not answer a message you wrote.")

    def _tail(self, index: int) -> ReplyVersion:
        """messages[index:] as a version (the version set of its head stays with the conversation)."""
        tail = self.messages[index:]
        return ReplyVersion(
            user_text=self.messages[self.user_message_of(index)].text,
            messages=[copy.copy(tail[0]), *tail[1:]] if tail else [],
            turn_marks=list(self._kept_after[index:]),
            kept_ids=list(self._kept_ids),
        )

    def set_version_aside(self, index: int) -> None:
        """Keep messages[index:] (a reply and what followed it) as a version of
        that turn and cut the conversation back to messages[:index]; the next
        reply written at `index` is the turn's newest version.

        With no reply at `index` there is nothing to keep: a plain truncate.
        """
        self._require_idle()
        if index >= len(self.messages) or self.messages[index].role != "assistant":
            self.truncate(index)
            return
        head = self.messages[index]
        versions = head.versions if head.versions is not None else ReplyVersions([None], 0)
        aside = self._tail(index)
        aside.messages[0].versions = None
        versions.versions[versions.current] = aside
        versions.versions.append(None)
        versions.current = versions.count - 1
        self.truncate(index)
        self._next_versions = (index, versions)

    def edit_user(self, index: int, text: str) -> None:
        """Replace user message `index` with `text`, keeping the reply after it
        (and what followed) as a version of that turn, with the old text."""
        self._require_idle()
        if not 0 <= index < len(self.messages) or self.messages[index].role != "user":
            raise MessageIndexError(f"Message {index} is not a message you wrote.")
        self.set_version_aside(index + 1)
        self.messages[index].text = text

    def show_version(self, index: int, version: int) -> None:
        """Show version `version` (0-based) of the reply at `index`: the
        messages from there on, the user text it answers and the kept ids
        become that version's, so the next turn continues from it."""
        self._require_idle()
        head = self.messages[index] if 0 <= index < len(self.messages) else None
        versions = head.versions if head is not None else None
        if versions is None:
            raise MessageIndexError(f"Message {index} has no other versions.")
        if not 0 <= version < versions.count:
            raise MessageIndexError(
                f"Message {index} has {versions.count} versions; there is no version {version + 1}."
            )
        if version == versions.current:
            return
        target = versions.versions[version]
        assert target is not None
        shown = self._tail(index)
        shown.messages[0].versions = None
        versions.versions[versions.current] = shown
        versions.versions[version] = None
        versions.current = version
        self.messages[self.user_message_of(index)].text = target.user_text
        del self.messages[index:]
        del self._kept_after[index:]
        self.messages.extend(target.messages)
        limit = len(target.kept_ids)
        self._kept_after.extend(m if m is not None and 0 < m <= limit else None for m in target.turn_marks)
        self._kept_ids = list(target.kept_ids)
        self.messages[index].versions = versions

    def last_turn(self) -> tuple[int, int | None] | None:
        """(index of the last user message, index of the reply after it or None); None when nothing was asked."""
        for i in range(len(self.messages) - 1, -1, -1):
            if self.messages[i].role == "user":
                after = i + 1
                has_reply = after < len(self.messages) and self.messages[after].role == "assistant"
                return i, after if has_reply else None
        return None

    def adopt_reply(self, reply: Message, prompt_ids: list[int] | None) -> int:
        """Make `reply` (another pane's answer to the same message) the answer
        to this conversation's last user message, as that turn's newest
        version; the answer it had, and anything after it, stays an earlier
        version. Returns the reply's index.

        `prompt_ids`: this conversation's prompt for the turn when `reply`'s
        ids come from the same model: the kept ids become that prompt plus the
        ids the reply was generated with, so the next turn starts on the pages
        its generation left in the prefix cache. None when they come from
        another model: the reply's answer is kept as text (its reasoning left
        out) and the next turn encodes it.
        """
        self._require_idle()
        turn = self.last_turn()
        if turn is None:
            raise MessageIndexError("There is no message you wrote to answer.")
        index = turn[0] + 1
        self.set_version_aside(index)
        same_ids = prompt_ids is not None
        message = Message(
            "assistant",
            reply.text if same_ids else reply.answer,
            token_ids=list(reply.token_ids) if same_ids else [],
            state="stopped" if reply.state == "stopped" else "complete",
            model_id=reply.model_id,
            params=reply.params,
            system_prompt=reply.system_prompt,
        )
        self.messages.append(message)
        self._kept_after.append(None)
        if self._next_versions is not None and self._next_versions[0] == index:
            message.versions = self._next_versions[1]
        self._next_versions = None
        if prompt_ids is not None:
            self._adopt_prompt(prompt_ids)
            self._kept_ids = list(prompt_ids) + message.token_ids
            self._kept_after[index] = len(self._kept_ids)
        if not self.title:
            self.title = labelled_title(self.auto_title(self.messages[turn[0]].text), "", self.label)
        return index

    def fork(self, upto_message_index: int) -> Conversation:
        """A new conversation holding messages[: upto_message_index + 1] and the kept ids that cover them.

        Its next turn starts with those ids, so it reuses the pages this
        conversation left in the prefix cache.
        """
        if not 0 <= upto_message_index < len(self.messages):
            raise MessageIndexError(
                f"Message {upto_message_index} does not exist; the conversation has {len(self.messages)}."
            )
        if self._turn is not None and upto_message_index >= self._turn.index:
            raise MessageIndexError("A reply that is still being written cannot be forked; wait for it or stop it.")
        length = upto_message_index + 1
        other = Conversation(
            system_prompt=self.system_prompt,
            params=self.params,
            model_id=self.model_id,
            context_limit=self.context_limit,
            context_policy=self.context_policy,
            title=fork_title(without_label(self.title, self.label)),
        )
        other.thinking = self.thinking
        other.messages = copy.deepcopy(self.messages[:length])
        other._kept_after = list(self._kept_after[:length])
        other._kept_ids = self.kept_ids_for(length)
        return other

    # -- helpers -------------------------------------------------------------

    def _streaming_message(self) -> Message:
        if self._turn is None:
            raise RuntimeError("No reply is being written")
        return self.messages[self._turn.index]

    def _require_idle(self) -> None:
        if self._turn is not None:
            raise RuntimeError("A reply is still being written")
