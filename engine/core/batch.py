"""Handles on a submitted batch of requests: ids at once, stop one, read events.

`Engine.start_batch_async` returns an `AsyncBatch`, `Engine.start_batch` a
`Batch`. Both know every request's id as soon as they exist, can stop one
request (or all) without disturbing the others, and deliver `(idx,
StreamEvent)` pairs until every request has produced exactly one event whose
`output` is set, whatever its finish reason: "stop", "length", "abort" (a
stopped request's partial ids and text) or "error" (`output.error`, which is
not raised here: one failed request does not end its neighbours).

The engine thread pushes into the handle's queue; nothing polls. A sink never
references its handle, so a handle nobody holds is collected, and then aborts
whatever it left running.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Callable
from typing import Any

from engine.core.sequence import EventSink, RequestOutput, StreamEvent

Item = tuple[int, StreamEvent]


class _BatchBase:
    """What both handles share: ids, per-request bookkeeping and abort."""

    def __init__(self, abort_request: Callable[[int], None]) -> None:
        self.request_ids: list[int] = []
        self.prompt_token_ids: list[list[int]] = []
        # Filled as the final events are read: outputs[idx] is the request's
        # RequestOutput once its last event has been consumed.
        self.outputs: list[RequestOutput | None] = []
        self._abort_request = abort_request
        self._finished: set[int] = set()

    def _add(self, request_id: int, prompt_token_ids: list[int]) -> None:
        self.request_ids.append(request_id)
        self.prompt_token_ids.append(prompt_token_ids)
        self.outputs.append(None)

    def __len__(self) -> int:
        return len(self.request_ids)

    @property
    def done(self) -> bool:
        """True once every request's final event has been read."""
        return len(self._finished) == len(self.request_ids)

    def finished(self, idx: int) -> bool:
        return idx in self._finished

    def abort(self, idx: int | None = None) -> None:
        """Stop request `idx` (every unfinished one when None). Its final event,
        with finish_reason "abort" and what it generated so far, still comes."""
        if idx is None:
            targets: range | tuple[int] = range(len(self.request_ids))
        else:
            if not -len(self.request_ids) <= idx < len(self.request_ids):
                raise IndexError(f"request index {idx} out of range for a batch of {len(self)}")
            targets = (idx % len(self.request_ids),)
        for i in targets:
            if i not in self._finished:
                self._abort_request(self.request_ids[i])

    def _record(self, item: Item) -> Item:
        idx, event = item
        if event.output is not None:
            self._finished.add(idx)
            self.outputs[idx] = event.output
        return item

    def __del__(self) -> None:
        # Dropped unfinished (a consumer that gave up without aborting): the
        # engine would otherwise generate for nobody until max_tokens.
        try:
            if not self.done:
                self.abort()
        except Exception:
            pass


class AsyncBatch(_BatchBase):
    """A batch read with `async for idx, event in batch`. Made by
    Engine.start_batch_async on the loop that will read it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, abort_request: Callable[[int], None]) -> None:
        super().__init__(abort_request)
        self._loop = loop
        self._queue: asyncio.Queue[Item] = asyncio.Queue()

    def _sink_for(self, idx: int) -> EventSink:
        loop, put = self._loop, self._queue.put_nowait

        def sink(event: StreamEvent) -> None:
            # A loop closed meanwhile (the program is ending) has nobody left
            # to deliver to.
            try:
                loop.call_soon_threadsafe(put, (idx, event))
            except RuntimeError:
                if not loop.is_closed():
                    raise

        return sink

    def __aiter__(self) -> AsyncBatch:
        return self

    async def __anext__(self) -> Item:
        if self.done:
            raise StopAsyncIteration
        return self._record(await self._queue.get())

    async def aclose(self) -> None:
        """Abort what is left and read it to the end (the outputs are kept)."""
        self.abort()
        while not self.done:
            self._record(await self._queue.get())

    async def __aenter__(self) -> AsyncBatch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class Batch(_BatchBase):
    """A batch read with a plain `for idx, event in batch` (blocking). Made by
    Engine.start_batch."""

    def __init__(self, abort_request: Callable[[int], None]) -> None:
        super().__init__(abort_request)
        self._queue: queue.SimpleQueue[Item] = queue.SimpleQueue()

    def _sink_for(self, idx: int) -> EventSink:
        put = self._queue.put
        return lambda event: put((idx, event))

    def __iter__(self) -> Batch:
        return self

    def __next__(self) -> Item:
        if self.done:
            raise StopIteration
        return self._record(self._queue.get())

    def close(self) -> None:
        """Abort what is left and read it to the end (the outputs are kept)."""
        self.abort()
        while not self.done:
            self._record(self._queue.get())

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
