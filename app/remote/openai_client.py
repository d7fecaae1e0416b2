"""A client for an OpenAI-compatible server (Tandem's own, vLLM, SGLang,
llama.cpp's server, Ollama, LM Studio...): the backend of a remote pane.

It runs on the asyncio loop (qasync's, in the window) with one
`httpx.AsyncClient`: no thread per request, and the loop never blocks.

Interface::

    client = OpenAIClient("http://127.0.0.1:8000/v1", model="SmolLM2-135M-Instruct",
                          api_key=None, timeout=ClientTimeouts())
    models = await client.check()          # GET /v1/models -> list of model ids;
                                           # raises ModelNotServedError if `model` is not among them
    stream = client.stream_chat(messages, params)   # nothing is sent until iterated
    async for delta in stream:             # text deltas as they arrive
                                           # (reasoning sent apart arrives inside <think>...</think>)
        pane.append(delta, stream.stats)   # stats: live RemoteStats (client-side TTFT, tokens/s)
    stream.stats.finish_reason             # "stop" | "length" | ... once the stream ended
    await stream.aclose()                  # stop early (the server aborts the request)
    await client.aclose()

`base_url` is the URL an `openai` client takes (`http://host:port/v1`); a URL
with no path gets `/v1` appended, so `http://127.0.0.1:8000` works too.
`messages` are `{"role", "content"}` mappings; `params` is a mapping or any
object with the engine's SamplingParams attribute names (temperature, top_p,
max_tokens, seed, stop, and top_k / min_p / repetition_penalty, which are sent
only when not neutral, since OpenAI's own API refuses them).

Every failure is a `RemoteError` subclass whose message a person can act on:
`RemoteConnectionError` (refused, unknown host), `RemoteTimeoutError`,
`RemoteAuthError` (401/403), `RemoteHTTPError` (any other status, with the
server's own message), `RemoteProtocolError` (the answer is not the OpenAI
API's), `ModelNotServedError`, and `RemoteStreamError` (the stream stopped
halfway or the server reported an error in it). The client is safe to keep
using after any of them.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import httpx

from app.errors import AppError
from engine import reasoning

# Parameters OpenAI's API does not know: sent only when they change something.
_EXTRA_PARAMS = {"top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}

# How long the end of a stream's body may take to arrive after `data: [DONE]`.
_AFTER_DONE_TIMEOUT_S = 5.0


class RemoteError(AppError):
    """Base class for everything that can go wrong talking to a remote server."""


class RemoteConnectionError(RemoteError):
    """Nothing answers at the address (refused, unknown host, network down)."""


class RemoteTimeoutError(RemoteError):
    """The server accepted the connection but took too long to answer."""


class RemoteHTTPError(RemoteError):
    """The server answered with an error status; `server_message` is its own words."""

    def __init__(self, message: str, status: int, server_message: str | None) -> None:
        super().__init__(message)
        self.status = status
        self.server_message = server_message


class RemoteAuthError(RemoteHTTPError):
    """401/403: the API key is missing or wrong."""


class RemoteProtocolError(RemoteError):
    """The server answered, but not as an OpenAI-compatible API does."""


class ModelNotServedError(RemoteError):
    """The server works but does not serve the model asked for."""

    def __init__(self, message: str, available: list[str]) -> None:
        super().__init__(message)
        self.available = available


class RemoteStreamError(RemoteError):
    """A streaming reply broke off (connection lost, server error) before it finished."""


@dataclass(slots=True)
class ClientTimeouts:
    connect: float = 10.0
    # Between two reads: a long prompt on a busy server may take a while to
    # produce its first token, so this is generous.
    read: float = 120.0
    write: float = 30.0

    def httpx(self) -> httpx.Timeout:
        return httpx.Timeout(connect=self.connect, read=self.read, write=self.write, pool=self.connect)


@dataclass(slots=True)
class RemoteStats:
    """A reply's figures as measured here, on the client."""

    started: float = field(default_factory=time.perf_counter)
    ttft_s: float | None = None  # request sent -> first text
    elapsed_s: float = 0.0
    completion_tokens: int = 0  # the server's usage once it sends it; chunks with text until then
    prompt_tokens: int | None = None
    cached_prompt_tokens: int | None = None
    finish_reason: str | None = None
    _last_text_at: float | None = None

    @property
    def tokens_per_s(self) -> float:
        """Decode speed: tokens after the first over the time since the first."""
        if self.ttft_s is None or self._last_text_at is None or self.completion_tokens < 2:
            return 0.0
        span = self._last_text_at - (self.started + self.ttft_s)
        return (self.completion_tokens - 1) / span if span > 0 else 0.0


def normalize_base_url(url: str) -> str:
    """`http://host:port` -> `http://host:port/v1`; a URL with a path is kept
    (minus a trailing slash). Raises ValueError for something that is not an
    http(s) URL."""
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an http:// or https:// URL")
    path = parts.path.rstrip("/") or "/v1"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


class OpenAIClient:
    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        api_key: str | None = None,
        *,
        timeout: ClientTimeouts | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = normalize_base_url(base_url)
        self.model = model
        # Whether a key was sent decides what a 401 means: none given, or the wrong one.
        self.has_api_key = bool(api_key)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(
            base_url=self.base_url + "/",
            headers=headers,
            timeout=(timeout or ClientTimeouts()).httpx(),
            transport=transport,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> OpenAIClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _serves_alias(self, model: str) -> bool:
        """Whether the server answers for `model` though its list names it
        otherwise (Tandem lists slugs and also answers the name a window shows,
        and `default`): GET /v1/models/{model} says so."""
        try:
            response = await self._http.get(f"models/{quote(model, safe='')}")
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def check(self) -> list[str]:
        """The ids of the models the server serves (GET /v1/models). With a
        `model` set, raises ModelNotServedError unless it is one of them."""
        try:
            response = await self._http.get("models")
        except httpx.HTTPError as exc:
            raise self._transport_error(exc, "models") from None
        if response.status_code == 404:
            raise RemoteProtocolError(
                f"{self.base_url}/models does not exist, so this is not the base URL of an "
                "OpenAI-compatible API. Such URLs usually end in /v1 (for example "
                "http://127.0.0.1:8000/v1)."
            )
        self._raise_for_status(response)
        try:
            data = response.json()["data"]
            ids = [str(m["id"]) for m in data]
        except (ValueError, KeyError, TypeError):
            raise RemoteProtocolError(
                f"{self.base_url}/models answered, but not with an OpenAI model list "
                f"(got {_preview(response.text)!r}). Check that the URL is the API's base URL."
            ) from None
        if self.model is not None and self.model not in ids and not await self._serves_alias(self.model):
            shown = ", ".join(ids[:10]) + (", ..." if len(ids) > 10 else "")
            raise ModelNotServedError(
                f"The server at {self.base_url} does not serve the model '{self.model}'. "
                f"It serves: {shown or 'no models'}.",
                ids,
            )
        return ids

    def stream_chat(
        self,
        messages: Sequence[Mapping[str, str]],
        params: Any = None,
        *,
        model: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> ChatStream:
        """Start a streaming chat completion; iterate the result for text deltas.
        `extra` adds request fields as they are (a server's own options)."""
        name = model or self.model
        if not name:
            raise ValueError("No model given: pass model= here or to OpenAIClient")
        body: dict[str, Any] = {
            "model": name,
            "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        body.update(request_params(params))
        body.update(extra or {})
        return ChatStream(self, body)

    # -- errors ----------------------------------------------------------------

    def _transport_error(self, exc: httpx.HTTPError, what: str) -> RemoteError:
        where = self.base_url
        if isinstance(exc, httpx.ConnectTimeout):
            return RemoteTimeoutError(
                f"Connecting to {where} timed out. Check the address and that the server is reachable."
            )
        if isinstance(exc, httpx.TimeoutException):
            return RemoteTimeoutError(
                f"The server at {where} did not answer in time ({what}). It may be overloaded, "
                "or still loading its model; try again."
            )
        if isinstance(exc, httpx.ConnectError):
            reason = str(exc) or type(exc).__name__
            if _caused_by(exc, ConnectionRefusedError) or "refused" in reason.lower():
                return RemoteConnectionError(
                    f"Could not connect to {where}: the connection was refused. Is the server "
                    "running, and is the port right?"
                )
            return RemoteConnectionError(
                f"Could not connect to {where} ({reason}). Check the address and your network."
            )
        if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError)):
            return RemoteStreamError(
                f"The connection to {where} broke off before the answer was complete ({exc or type(exc).__name__})."
            )
        return RemoteError(f"Talking to {where} failed: {exc or type(exc).__name__}")

    def _raise_for_status(self, response: httpx.Response) -> None:
        status = response.status_code
        if status < 400:
            return
        server_message = _server_message(response)
        # The sentence below ends in its own period; the server's may too.
        said = f": {server_message.rstrip(' .')}" if server_message else ""
        if status in (401, 403):
            if not self.has_api_key:
                # The server's own words here are for curl users ("send 'Bearer YOUR_KEY'"):
                # kept in server_message, not shown, as they read as a truncated placeholder.
                raise RemoteAuthError(
                    f"The server at {self.base_url} needs an API key (HTTP {status}), and none was given. "
                    "Enter the server's key.",
                    status,
                    server_message,
                )
            raise RemoteAuthError(
                f"The server at {self.base_url} refused the API key given (HTTP {status}){said}. "
                "Check the key set for this server.",
                status,
                server_message,
            )
        raise RemoteHTTPError(
            f"The server at {self.base_url} answered HTTP {status}"
            f" {response.reason_phrase or ''}".rstrip() + f"{said}",
            status,
            server_message,
        )


class ChatStream:
    """One streaming reply: an async iterator of text deltas, with live `stats`.

    `aclose()` (or leaving an `async with`) stops it; closing the connection is
    what tells the server to abort the request and free its resources.
    """

    def __init__(self, client: OpenAIClient, body: dict[str, Any]) -> None:
        self._client = client
        self._body = body
        self.stats = RemoteStats()
        self.text = ""
        self._iter: AsyncIterator[str] | None = None
        self._in_reasoning = False  # inside reasoning the server sent apart from the answer

    def __aiter__(self) -> AsyncIterator[str]:
        if self._iter is None:
            self._iter = self._run()
        return self._iter

    async def aclose(self) -> None:
        if self._iter is not None:
            await self._iter.aclose()  # type: ignore[attr-defined]

    async def __aenter__(self) -> ChatStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _run(self) -> AsyncIterator[str]:
        client = self._client
        stats = self.stats
        stats.started = time.perf_counter()
        done = False
        events: AsyncGenerator[str, None] | None = None
        try:
            async with client._http.stream("POST", "chat/completions", json=self._body) as response:
                try:
                    if response.status_code >= 400:
                        await response.aread()
                        client._raise_for_status(response)
                    kind = response.headers.get("content-type", "")
                    if not kind.startswith("text/event-stream"):
                        await response.aread()
                        raise RemoteProtocolError(
                            f"The server at {client.base_url} did not stream its answer (content type "
                            f"{kind or 'none'}: {_preview(response.text)!r}); is it OpenAI-compatible?"
                        )
                    events = _sse_data(response)
                    async for data in events:
                        if data == "[DONE]":
                            done = True
                            break
                        delta = self._take(data)
                        if delta:
                            now = time.perf_counter()
                            if stats.ttft_s is None:
                                stats.ttft_s = now - stats.started
                            stats._last_text_at = now
                            stats.elapsed_s = now - stats.started
                            self.text += delta
                            yield delta
                    if done:
                        await _read_to_end(events)
                finally:
                    # However the stream ends (done, stopped, failed), close it
                    # here, in this task, response first. httpx reads through
                    # a stack of async generators; one left suspended is closed
                    # whenever the garbage collector finds it, and under the
                    # window's loop (qasync installs no async-generator hooks)
                    # that happens outside any task, where closing a live
                    # connection cannot work ("async generator ignored
                    # GeneratorExit"). With the response closed first, those
                    # generators have nothing left to do when they go.
                    await response.aclose()
                    if events is not None:
                        await events.aclose()
        except httpx.HTTPError as exc:
            raise client._transport_error(exc, "chat/completions") from None
        finally:
            stats.elapsed_s = time.perf_counter() - stats.started
        if not done and stats.finish_reason is None:
            got = f" after {stats.completion_tokens} tokens" if stats.completion_tokens else ""
            raise RemoteStreamError(
                f"The reply from {client.base_url} stopped halfway{got}: the server closed the "
                "stream without finishing it. The text so far is kept; try again."
            )

    def _take(self, data: str) -> str:
        """Record one event's chunk; return its text."""
        try:
            chunk = json.loads(data)
        except ValueError:
            raise RemoteProtocolError(
                f"The server at {self._client.base_url} sent a stream event that is not JSON: "
                f"{_preview(data)!r}"
            ) from None
        if not isinstance(chunk, dict):
            raise RemoteProtocolError(f"Unexpected stream event from {self._client.base_url}: {_preview(data)!r}")
        if "error" in chunk:
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else str(error)
            raise RemoteStreamError(f"The server at {self._client.base_url} stopped the reply: {message}")
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self._usage(usage)
        text = ""
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                delta = {}
            # Reasoning comes apart from the answer (`reasoning_content`: vLLM,
            # llama.cpp's server, LM Studio, Tandem's own; `reasoning`: Ollama,
            # OpenRouter). It joins the reply inside a think block, where the
            # pane shows it as thinking, as it does a local model's.
            thought = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(thought, str) and thought:
                if not self._in_reasoning:
                    text += reasoning.THINK_START
                    self._in_reasoning = True
                text += thought
            content = delta.get("content")
            if isinstance(content, str) and content:
                if self._in_reasoning:
                    text += reasoning.THINK_END
                    self._in_reasoning = False
                text += content
            if choice.get("finish_reason"):
                self.stats.finish_reason = str(choice["finish_reason"])
        if text and not isinstance(usage, dict):
            self.stats.completion_tokens += 1
        return text

    def _usage(self, usage: Mapping[str, Any]) -> None:
        stats = self.stats
        if isinstance(usage.get("completion_tokens"), int):
            stats.completion_tokens = usage["completion_tokens"]
        if isinstance(usage.get("prompt_tokens"), int):
            stats.prompt_tokens = usage["prompt_tokens"]
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            stats.cached_prompt_tokens = details["cached_tokens"]


def request_params(params: Any) -> dict[str, Any]:
    """The request fields for sampling settings given as a mapping or as an
    object with SamplingParams' attribute names; None values are left out."""
    if params is None:
        return {}

    def get(name: str) -> Any:
        if isinstance(params, Mapping):
            return params.get(name)
        return getattr(params, name, None)

    out: dict[str, Any] = {}
    for name in ("temperature", "top_p", "max_tokens", "seed"):
        value = get(name)
        if value is not None:
            out[name] = value
    stop = get("stop")
    if stop:
        out["stop"] = [stop] if isinstance(stop, str) else list(stop)
    for name, neutral in _EXTRA_PARAMS.items():
        value = get(name)
        if value is not None and value != neutral:
            out[name] = value
    response_format = _response_format(get("constraint"))
    if response_format is not None:
        out["response_format"] = response_format
    return out


def _response_format(constraint: Any) -> dict[str, Any] | None:
    """A pane's "Reply as JSON" as OpenAI's response_format; None for none (or a grammar the API has no
    field for). A server that ignores it still gets its reply checked in the window (app.workspace.json_reply)."""
    kind = getattr(constraint, "kind", None)
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema":
        return None
    try:
        schema = json.loads(constraint.spec)
    except (ValueError, RecursionError):
        return None
    if not isinstance(schema, dict):
        return None
    title = schema.get("title")
    # OpenAI's name: letters, digits, _ and -, at most 64.
    name = "".join(c if c.isascii() and (c.isalnum() or c in "_-") else "_" for c in title)[:64] if isinstance(
        title, str) and title.strip() else "reply"
    return {"type": "json_schema", "json_schema": {"name": name or "reply", "schema": schema}}


async def _read_to_end(events: AsyncIterator[str]) -> None:
    """After `data: [DONE]`: read the rest of the body (normally only its
    end) so that every generator under `events` finishes on its own and the
    connection goes back to the pool for the next request. A server that
    keeps the body open past [DONE] is cut off after a moment instead."""
    try:
        async with asyncio.timeout(_AFTER_DONE_TIMEOUT_S):
            async for _ in events:
                pass  # nothing may follow [DONE]; a server that sends more is ignored
    except (TimeoutError, httpx.HTTPError):
        pass  # the reply is complete; only the connection is not reused


async def _sse_data(response: httpx.Response) -> AsyncGenerator[str, None]:
    """The `data` of each server-sent event (multi-line data joined with newlines)."""
    lines: list[str] = []
    async for line in response.aiter_lines():
        if not line:
            if lines:
                yield "\n".join(lines)
                lines = []
            continue
        if line.startswith(":"):
            continue  # a comment / keep-alive
        name, _, value = line.partition(":")
        if name == "data":
            lines.append(value[1:] if value.startswith(" ") else value)
    if lines:
        yield "\n".join(lines)


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    # httpx wraps the socket error a few levels down (httpcore, anyio's
    # "All connection attempts failed").
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _server_message(response: httpx.Response) -> str | None:
    try:
        body = response.json()
    except ValueError:
        text = response.text.strip()
        return _preview(text) if text else None
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str):
            return error
        if body.get("detail"):
            return str(body["detail"])
        if body.get("message"):
            return str(body["message"])
    return _preview(response.text)


def _preview(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."
