"""A pane served by an OpenAI-compatible server instead of the local engine.

`RemoteBackend` is the pane's setting (base URL, model, API key) plus the
client that talks to it; `RemoteReply` is one reply streaming from it, run
as a task on the asyncio loop. The reply reports through the same calls the
local path makes (`Conversation.add_reply_delta` / `end_reply`, via the
workspace's callbacks), so the workspace's events are the same for both.

A remote server sees the conversation as chat messages (its text); token ids
are the local engine's business, so a remote reply keeps none.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from app.workspace.messages import MessageState, ReplyStats
from app.remote.openai_client import ChatStream, OpenAIClient, RemoteError, RemoteStats, normalize_base_url

log = logging.getLogger(__name__)


@dataclass(eq=False)
class RemoteBackend:
    """Where a remote pane's replies come from. The API key never shows in repr/str.

    `key_id` names the key in app.secrets (the OS keyring or a 0600 file),
    where the chat store keeps it between runs: the store file holds only
    the id.
    """

    base_url: str  # normalized: http(s)://host[:port]/path, as OpenAIClient takes it
    model: str
    api_key: str | None = field(default=None, repr=False)
    client: OpenAIClient | None = field(default=None, repr=False)
    key_id: str | None = None  # None when there is no key

    @classmethod
    def create(
        cls, base_url: str, model: str, api_key: str | None = None, *, key_id: str | None = None
    ) -> RemoteBackend:
        """Raises ValueError for a URL that is not http(s) or an empty model name.

        `key_id`: the saved key's id when the pane is restored; a new one is
        made for a new key."""
        from app.secrets import new_remote_key_id

        model = model.strip()
        if not model:
            raise ValueError("Enter the name of the model the server should run.")
        url = normalize_base_url(base_url)
        key = (api_key or "").strip() or None
        if key is None:
            key_id = None
        elif key_id is None:
            key_id = new_remote_key_id()
        return cls(url, model, key, OpenAIClient(url, model=model, api_key=key), key_id)

    def copy(self) -> RemoteBackend:
        """The same setting with a client of its own (for a forked pane; the key is shared, one copy)."""
        return RemoteBackend.create(self.base_url, self.model, self.api_key, key_id=self.key_id)

    @property
    def host(self) -> str:
        """host[:port], for the pane header."""
        return urlsplit(self.base_url).netloc

    @property
    def label(self) -> str:
        return f"{self.model} @ {self.host}"

    async def check(self) -> list[str]:
        """GET /v1/models; raises the client's RemoteError unless the model is served."""
        assert self.client is not None
        return await self.client.check()

    async def aclose(self) -> None:
        if self.client is not None:
            client, self.client = self.client, None
            await client.aclose()


def reply_stats(stats: RemoteStats, finish_reason: str | None = None) -> ReplyStats:
    """The client-side figures as the pane's ReplyStats (prompt figures only when the server reports usage)."""
    return ReplyStats(
        generated_tokens=stats.completion_tokens,
        tokens_per_s=stats.tokens_per_s,
        ttft_s=stats.ttft_s,
        prompt_tokens=stats.prompt_tokens or 0,
        cached_prompt_tokens=stats.cached_prompt_tokens or 0,
        finish_reason=finish_reason,
        elapsed_s=stats.elapsed_s,
    )


OnDelta = Callable[[str, ReplyStats], None]
OnEnd = Callable[[MessageState, ReplyStats | None, str | None], None]


class RemoteReply:
    """One reply streaming from a remote server into one pane.

    `abort()` stops it: the stream is closed (the server aborts the request)
    and the reply ends as "stopped", keeping what arrived. Every failure ends
    it as "error" with the client's message; nothing escapes the task.
    """

    def __init__(
        self,
        backend: RemoteBackend,
        messages: Sequence[Mapping[str, str]],
        params: Any,
        on_delta: OnDelta,
        on_end: OnEnd,
    ) -> None:
        assert backend.client is not None
        self._stream: ChatStream = backend.client.stream_chat(messages, params)
        self._on_delta = on_delta
        self._on_end = on_end
        self._stopping = False
        self._started = False
        self.task: asyncio.Task[None] = asyncio.get_running_loop().create_task(
            self._pump(), name="tandem-remote-reply"
        )

    def abort(self) -> None:
        if self.task.done():
            return
        self._stopping = True
        # A task cancelled before it first runs never enters _pump, and the
        # reply would stay "streaming"; one that has not started sees the flag.
        if self._started:
            self.task.cancel()

    async def _pump(self) -> None:
        self._started = True
        stream = self._stream
        if self._stopping:  # stopped before it was sent
            self._on_end("stopped", reply_stats(stream.stats, "abort"), None)
            return
        state: MessageState = "complete"
        error: str | None = None
        cancelled = False
        try:
            async for delta in stream:
                self._on_delta(delta, reply_stats(stream.stats))
        except asyncio.CancelledError:
            state = "stopped"
            cancelled = not self._stopping  # from outside (shutdown): the canceller must see it
        except RemoteError as exc:
            state, error = "error", str(exc)
        except Exception as exc:  # a bug must not leave the pane "streaming"
            log.exception("remote reply failed")
            state, error = "error", f"The reply was lost: {exc}"
        finish = {"complete": stream.stats.finish_reason or "stop", "stopped": "abort"}.get(state, "error")
        # The reply ends before anything else is awaited, so no later cancel can leave it streaming.
        self._on_end(state, reply_stats(stream.stats, finish), error)
        await _close_quietly(stream)
        if cancelled:
            raise asyncio.CancelledError


async def _close_quietly(stream: ChatStream) -> None:
    try:
        await stream.aclose()
    except Exception:  # already broken: closing it can only fail the same way
        log.debug("closing a remote stream failed", exc_info=True)
