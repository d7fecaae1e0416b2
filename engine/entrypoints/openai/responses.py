"""The bodies the OpenAI-compatible server answers with: the JSON answers of
both endpoints (`chat_completion`, `completion`), their stream chunks
(`ChatChunks`, `CompletionChunks`), the final usage chunk, the model cards,
and the ids and usage they carry. Request parsing and the errors are in
protocol.py; nothing here reads a socket or touches an engine.

A reasoning model's chat answers carry its think block apart, as
`reasoning_content` beside `content` (on the message, and in stream deltas),
as vLLM's reasoning parsers and DeepSeek's API do; a reply's tool calls
become `tool_calls` (on the message, or in stream deltas: tools.py).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.entrypoints.openai.tools import ToolCallDeltas, with_tool_calls
from engine.model.tool_calls import ToolCallFormat
from engine.reasoning import ReasoningParser, split_reply


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def model_card(model_id: str, created: int) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": created, "owned_by": "tandem"}


def model_list(cards: list[dict[str, Any]]) -> dict[str, Any]:
    return {"object": "list", "data": cards}


def finish_reason(engine_reason: str) -> str:
    # An aborted request only reaches a client when the server shuts down
    # under it; "stop" would claim the model ended its answer.
    return {"stop": "stop", "length": "length"}.get(engine_reason, "abort")


class FinishedChoice(Protocol):
    """What an answer needs of one finished choice (the engine's RequestOutput is one)."""

    text: str
    finish_reason: str  # the engine's reason: "stop", "length", "abort", "error"


@dataclass(slots=True, frozen=True)
class ResponseHead:
    """What every body of one answer repeats: its id, when it was made, the model id."""

    id: str
    created: int
    model: str

    @classmethod
    def new(cls, prefix: str, model: str) -> ResponseHead:
        """A fresh answer's head; `prefix` is "chatcmpl" or "cmpl", as OpenAI's ids start."""
        return cls(new_id(prefix), now(), model)

    def fields(self, kind: str) -> dict[str, Any]:
        """The head as a body's first fields; `kind` is the body's "object"."""
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "system_fingerprint": None}


def chat_completion(
    head: ResponseHead,
    outputs: Sequence[FinishedChoice],
    usage: dict[str, Any],
    starts_in_reasoning: bool | None = None,
    tools: ToolCallFormat | None = None,
    one_call: bool = False,
) -> dict[str, Any]:
    """The JSON answer of a chat completion, choice i being `outputs[i]`.

    `starts_in_reasoning`: None for a model that does not reason (its text is
    the content); else whether its replies start inside the think block, and
    each message has the block as `reasoning_content` (null when it has none).
    `tools`: the model's tool-call format when the request offered tools; the
    calls in a reply become its `tool_calls` (its first only with `one_call`:
    parallel_tool_calls false), and its finish reason "tool_calls"."""
    choices = []
    for i, o in enumerate(outputs):
        message = chat_message(o.text, starts_in_reasoning, tools, one_call)
        reason = "tool_calls" if message.get("tool_calls") and o.finish_reason == "stop" else \
            finish_reason(o.finish_reason)
        choices.append({"index": i, "message": message, "logprobs": None, "finish_reason": reason})
    return {**head.fields("chat.completion"), "choices": choices, "usage": usage}


def chat_message(
    text: str, starts_in_reasoning: bool | None, tools: ToolCallFormat | None = None, one_call: bool = False
) -> dict[str, Any]:
    if starts_in_reasoning is None:
        message: dict[str, Any] = {"role": "assistant", "content": text}
    else:
        parts = split_reply(text, starts_in_reasoning=starts_in_reasoning)
        message = {"role": "assistant", "content": parts.answer, "reasoning_content": parts.reasoning or None}
    return message if tools is None else with_tool_calls(message, tools, one_call=one_call)


def completion(head: ResponseHead, outputs: Sequence[FinishedChoice], usage: dict[str, Any]) -> dict[str, Any]:
    """The JSON answer of a (legacy) text completion, choice i being `outputs[i]`."""
    return {
        **head.fields("text_completion"),
        "choices": [{
            "index": i, "text": o.text, "logprobs": None,
            "finish_reason": finish_reason(o.finish_reason),
        } for i, o in enumerate(outputs)],
        "usage": usage,
    }


class StreamChunks(Protocol):
    """The chunks of one streamed answer, in the order a stream sends them:
    `text` and `finish` for each choice, then `usage` when `include_usage`."""

    include_usage: bool

    def text(self, index: int, text: str, token_ids: Sequence[int] = ()) -> dict[str, Any] | None: ...

    def finish(self, index: int, engine_reason: str) -> dict[str, Any]: ...

    def usage(self, usage: dict[str, Any]) -> dict[str, Any]: ...


@dataclass(slots=True)
class ChatChunks:
    """The `chat.completion.chunk`s of one streamed chat completion.

    A choice's first delta carries the role, as OpenAI's do; a choice that
    ends without any text still sends it, with empty content. With
    `include_usage`, every chunk carries `"usage": null` and a last chunk
    without choices carries the usage.

    `starts_in_reasoning` as in `chat_completion`: for a reasoning model each
    delta carries its reasoning as `reasoning_content` and its answer as
    `content`; text that may still be part of a tag waits for the next
    delta, so a text delta may have no chunk (None).

    `tools` as in `chat_completion`: the answer is parsed for calls, and
    deltas carry them in `tool_calls` (tools.ToolCallDeltas: index, id and
    name, then the arguments in pieces); text that may be the start of a
    call waits until that is decided. `markers`: the format's markers that
    are special tokens (id -> text), which a delta's text leaves out: they
    come with its token ids."""

    head: ResponseHead
    include_usage: bool
    starts_in_reasoning: bool | None = None
    tools: ToolCallFormat | None = None
    markers: Mapping[int, str] = field(default_factory=dict)
    one_call: bool = False  # parallel_tool_calls false: a choice's first call only
    _started: set[int] = field(default_factory=set)
    _parsers: dict[int, ReasoningParser] = field(default_factory=dict)
    _calls: ToolCallDeltas | None = None

    def __post_init__(self) -> None:
        self._calls = ToolCallDeltas(self.tools, self.one_call) if self.tools is not None else None

    def text(self, index: int, text: str, token_ids: Sequence[int] = ()) -> dict[str, Any] | None:
        if self.markers:
            text = "".join(self.markers[t] for t in token_ids if t in self.markers) + text
        if not text:
            return None
        reasoning, answer = self._split(index, text)
        answer, calls = self._calls.feed(index, answer, final=False) if self._calls else (answer, [])
        delta = self._delta(index, reasoning, answer, calls)
        return None if delta is None else self._chunk(index, delta, None)

    def finish(self, index: int, engine_reason: str) -> dict[str, Any]:
        parser = self._parsers.pop(index, None)
        reasoning, answer = parser.finish() if parser is not None else ("", "")
        answer, calls = self._calls.feed(index, answer, final=True) if self._calls else (answer, [])
        delta = self._delta(index, reasoning, answer, calls)
        if delta is None:
            delta = {} if index in self._started else {"role": "assistant", "content": ""}
            self._started.add(index)
        called = self._calls is not None and self._calls.called(index)
        reason = "tool_calls" if called and engine_reason == "stop" else finish_reason(engine_reason)
        return self._chunk(index, delta, reason)

    def _split(self, index: int, text: str) -> tuple[str, str]:
        """(reasoning, answer) of a delta's text."""
        if self.starts_in_reasoning is None:
            return "", text
        parser = self._parsers.get(index)
        if parser is None:
            parser = self._parsers[index] = ReasoningParser(starts_in_reasoning=self.starts_in_reasoning)
        return parser.feed(text)

    def _delta(self, index: int, reasoning: str, answer: str, calls: list[dict[str, Any]]) -> dict[str, Any] | None:
        if not reasoning and not answer and not calls:
            return None
        delta: dict[str, Any] = {} if index in self._started else {"role": "assistant"}
        self._started.add(index)
        if reasoning:
            delta["reasoning_content"] = reasoning
        if answer or not (reasoning or calls):
            delta["content"] = answer
        if calls:
            delta["tool_calls"] = calls
        return delta

    def usage(self, usage: dict[str, Any]) -> dict[str, Any]:
        return usage_chunk(self.head, "chat.completion.chunk", usage)

    def _chunk(self, index: int, delta: dict[str, Any], reason: str | None) -> dict[str, Any]:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}
        return _stream_chunk(self.head, "chat.completion.chunk", choice, self.include_usage)


@dataclass(slots=True)
class CompletionChunks:
    """The `text_completion` chunks of one streamed text completion (usage as in `ChatChunks`)."""

    head: ResponseHead
    include_usage: bool

    def text(self, index: int, text: str, token_ids: Sequence[int] = ()) -> dict[str, Any] | None:
        if not text:
            return None
        choice = {"index": index, "text": text, "logprobs": None, "finish_reason": None}
        return _stream_chunk(self.head, "text_completion", choice, self.include_usage)

    def finish(self, index: int, engine_reason: str) -> dict[str, Any]:
        choice = {"index": index, "text": "", "logprobs": None, "finish_reason": finish_reason(engine_reason)}
        return _stream_chunk(self.head, "text_completion", choice, self.include_usage)

    def usage(self, usage: dict[str, Any]) -> dict[str, Any]:
        return usage_chunk(self.head, "text_completion", usage)


def _stream_chunk(head: ResponseHead, kind: str, choice: dict[str, Any], include_usage: bool) -> dict[str, Any]:
    # With include_usage, OpenAI sends "usage": null on every chunk but the last.
    extra = {"usage": None} if include_usage else {}
    return {**head.fields(kind), "choices": [choice], **extra}


def usage_chunk(head: ResponseHead, kind: str, usage: dict[str, Any]) -> dict[str, Any]:
    """The last chunk of a stream asked for `include_usage`: no choices, the usage."""
    return {**head.fields(kind), "choices": [], "usage": usage}


# -- errors the server answers with ------------------------------------------------
