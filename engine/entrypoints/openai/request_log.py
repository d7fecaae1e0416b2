"""A line for each request a server answered: when, which model, how many
tokens, what status, for a live log beside the server (the desktop app's
server panel).

`RequestLog` is an ASGI middleware outside every other (the gate's refusals
are logged too). It learns the model from the handler (`note_model`, called
where a request's model is looked up) and the tokens from the answer itself:
the `usage` of a JSON answer, or of a stream's usage chunk; a stream without
one counts the chunks that carried text (one per token as the engine streams
them, so `tokens_exact` is False). The callback runs on the server's thread
once the answer has been sent; it must be quick and must not raise (an error
in it is logged and the server goes on).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)

# A JSON answer larger than this is not read for its usage (answers are small).
_MAX_SNIFFED_BYTES = 1 << 20


@dataclass(slots=True)
class RequestRecord:
    """One answered request. `model` is the id asked for (None before one
    was read); token counts are None when the answer did not say."""

    started: float  # time.time() when it arrived
    method: str
    path: str
    status: int = 0
    model: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    tokens_exact: bool = True
    duration_s: float = 0.0


RequestCallback = Callable[[RequestRecord], None]

_current: ContextVar[RequestRecord | None] = ContextVar("tandem_request_record", default=None)


def note_model(model: str) -> None:
    """Record the model the request being answered asked for (nothing when
    no log is kept)."""
    record = _current.get()
    if record is not None and isinstance(model, str):
        record.model = model[:200]


class RequestLog:
    """ASGI middleware calling `on_request(record)` after each HTTP answer."""

    def __init__(self, app: ASGIApp, on_request: RequestCallback) -> None:
        self.app = app
        self.on_request = on_request

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = RequestRecord(time.time(), scope.get("method", ""), scope.get("path", ""))
        token = _current.set(record)
        sniffer = _AnswerSniffer(record)
        started = time.monotonic()

        async def watched_send(message: Message) -> None:
            sniffer.see(message)
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        finally:
            _current.reset(token)
            record.duration_s = time.monotonic() - started
            sniffer.finish()
            try:
                self.on_request(record)
            except Exception:
                log.exception("the request log's callback failed")


class _AnswerSniffer:
    """Reads status, model and usage from the answer as it is sent."""

    def __init__(self, record: RequestRecord) -> None:
        self._record = record
        self._stream = False
        self._body = bytearray()
        self._too_big = False
        self._text_chunks = 0
        self._stream_usage = False

    def see(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self._record.status = int(message.get("status", 0))
            headers = dict(message.get("headers") or [])
            self._stream = headers.get(b"content-type", b"").startswith(b"text/event-stream")
        elif message["type"] == "http.response.body":
            body = message.get("body", b"")
            if self._stream:
                self._see_events(body)
            elif not self._too_big:
                self._body += body
                if len(self._body) > _MAX_SNIFFED_BYTES:
                    self._too_big, self._body = True, bytearray()

    def _see_events(self, body: bytes) -> None:
        for line in body.split(b"\n"):
            if not line.startswith(b"data: {"):
                continue
            try:
                event = json.loads(line[6:])
            except ValueError:
                continue
            self._see_answer(event)
            for choice in event.get("choices") or ():
                delta = choice.get("delta") or {}
                if delta.get("content") or choice.get("text"):
                    self._text_chunks += 1
            if event.get("usage"):
                self._stream_usage = True

    def _see_answer(self, answer: Any) -> None:
        if not isinstance(answer, dict):
            return
        if self._record.model is None and isinstance(answer.get("model"), str):
            self._record.model = answer["model"]
        usage = answer.get("usage")
        if isinstance(usage, dict):
            prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
            if isinstance(prompt, int):
                self._record.prompt_tokens = prompt
            if isinstance(completion, int):
                self._record.completion_tokens = completion

    def finish(self) -> None:
        if self._stream:
            if not self._stream_usage:
                self._record.completion_tokens = self._text_chunks
                self._record.tokens_exact = False
        elif self._body:
            try:
                self._see_answer(json.loads(bytes(self._body)))
            except ValueError:
                pass
