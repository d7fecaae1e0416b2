"""Server-sent events: one call's choices as an event stream ending in
`data: [DONE]`, its engine requests aborted however the stream ends.

The chunks themselves are `protocol`'s (`ChatChunks`, `CompletionChunks`);
this module frames them and decides what comes when: each choice's text as
it arrives, its finish, the usage chunk when asked for, and an error event
instead of a broken connection when the engine fails or closes mid-answer.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from engine.entrypoints.openai import protocol as proto
from engine.entrypoints.openai import responses
from engine.entrypoints.openai.choices import Choices
from engine.errors import EngineError

# Proxies (nginx) would otherwise buffer the stream and deliver it at the end.
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
DONE = "data: [DONE]\n\n"


def sse(obj: Any) -> str:
    """One server-sent event carrying `obj` as compact JSON."""
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


class EventStream(StreamingResponse):
    """A server-sent-event response that runs `on_close` however it ends:
    finished, client gone (Starlette cancels the stream), or failed."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/event-stream", headers=SSE_HEADERS)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()


def stream_choices(choices: Choices, chunks: responses.StreamChunks, model: str) -> EventStream:
    """The response streaming `choices` as `chunks` builds them; closing it
    (finished, client gone, server stopping) aborts what is still running."""
    return EventStream(_guarded(_events(choices, chunks, model), model), choices.abort)


async def _events(choices: Choices, chunks: responses.StreamChunks, model: str) -> AsyncIterator[str]:
    async for index, event in choices.events():
        if event.output is not None and event.output.error is not None:
            yield sse(proto.engine_failure(event.output.error, model).body())
            return
        # The step's token ids too: a tool-call marker may be a special token its text leaves out.
        chunk = chunks.text(index, event.text, event.token_ids)
        if chunk is not None:
            yield sse(chunk)
        if event.output is not None:
            yield sse(chunks.finish(index, event.output.finish_reason))
    if chunks.include_usage:
        yield sse(chunks.usage(choices.usage()))
    yield DONE


async def _guarded(stream: AsyncIterator[str], model: str) -> AsyncIterator[str]:
    """An event stream that reports an engine failure mid-call (the engine
    closed under it) as an error event instead of a broken connection."""
    try:
        async for item in stream:
            yield item
    except EngineError as exc:
        yield sse(proto.engine_failure(exc, model).body())
