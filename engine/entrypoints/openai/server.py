"""An OpenAI-compatible HTTP server over one Engine.

    python -m engine serve --model default [--host 127.0.0.1] [--port 8000] [--api-key KEY]
    (the `serve` command itself: engine.entrypoints.cli.serve)

Endpoints: `GET /v1/models`, `POST /v1/chat/completions`, `POST
/v1/completions` (streaming as server-sent events ending in `data: [DONE]`,
or one JSON answer), plus `GET /health`. Request checking and response shapes
live in `engine.entrypoints.openai.protocol`; this module moves requests between HTTP and
the engine.

Every request joins the engine's continuous batch: the handlers only submit
to the engine and await what its thread pushes back through
`loop.call_soon_threadsafe`, so the server's event loop never waits on the
model. A choice of `n` is one engine request; the first choice of a prompt is
prefilled alone and the others are submitted once its prompt pages are in the
prefix cache, so all of them share those pages instead of computing the
prompt n times. A client that goes away (a closed stream or an abandoned
non-streaming call) aborts its requests, which frees their KV pages at the
engine's next step.

One server can serve several engines, each under its own model id: a
request's `model` picks the engine, and `GET /v1/models` lists them all.
`ServedModels` holds that mapping and may change while the server runs (the
desktop app loads and unloads models); a request keeps the engine it started
on, and one whose engine is closed under it ends with a clean 503 error, never
a hang. An engine that is closed is no longer served.

`create_app(engines)` builds the ASGI app for engines someone else owns (the
desktop app serves the ones it has loaded); `serve_in_thread(...)` runs that
app with uvicorn on a background thread.

This module imports neither torch nor uvicorn at import time, so that the
CLI's `--help` stays quick.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import socket
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from engine.entrypoints.openai import protocol as proto
from engine.errors import EngineClosedError, EngineError, PromptError
from engine.entrypoints.openai.protocol import APIError, SamplingFields

if TYPE_CHECKING:
    from engine.llm import Engine, RequestHandle
    from engine.params import SamplingParams
    from engine.core.sequence import RequestOutput, StreamEvent

log = logging.getLogger(__name__)

# A chat request is a few kilobytes; this only stops a runaway upload.
MAX_BODY_BYTES = 32 << 20

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


# -- the engine side of one API call ----------------------------------------------


class _Choices:
    """The engine requests behind one API call: `n` choices for each prompt,
    choice index `prompt_index * n + i` as the API numbers them.

    Events from the engine thread land in an asyncio queue via
    `call_soon_threadsafe`; `events()` hands them out in arrival order.
    `abort()` stops whatever has not finished and is safe to call repeatedly.
    """

    def __init__(self, engine: Engine, prompts: list[list[int]], params: list[SamplingParams], n: int) -> None:
        self.engine = engine
        self.prompts = prompts
        self.params = params  # one per choice
        self.n = n
        self.total = len(prompts) * n
        self.outputs: list[RequestOutput | None] = [None] * self.total
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[tuple[int, StreamEvent]] = asyncio.Queue()
        self._handles: dict[int, RequestHandle] = {}
        self._deferred: dict[int, list[int]] = {}  # prompt index -> choices not yet submitted
        self._closed = False

    def start(self) -> None:
        """Submit the first choice of every prompt (all choices when sharing
        cannot help). Raises the engine's error for a prompt that cannot run,
        having aborted anything this call already submitted."""
        share = self.n > 1 and self.engine.pool.enable_prefix_cache
        try:
            for p in range(len(self.prompts)):
                first = p * self.n
                self._submit(first)
                rest = list(range(first + 1, first + self.n))
                # Only full pages are shared, so a prompt under one page gains nothing from waiting.
                if share and len(self.prompts[p]) > self.engine.pool.page_size:
                    self._deferred[p] = rest
                else:
                    for choice in rest:
                        self._submit(choice)
        except BaseException:
            self.abort()
            raise

    def _submit(self, choice: int) -> None:
        queue, loop = self._queue, self._loop

        def sink(event: StreamEvent) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, (choice, event))
            except RuntimeError:  # the server's loop is gone: nobody is listening
                pass

        prompt = self.prompts[choice // self.n]
        self._handles[choice] = self.engine.submit(prompt, self.params[choice], sink)

    async def events(self) -> AsyncIterator[tuple[int, StreamEvent]]:
        finished = 0
        while finished < self.total:
            choice, event = await self._queue.get()
            # The first event of a prompt's first choice means its prompt has
            # been computed and its full pages registered in the prefix cache.
            rest = self._deferred.pop(choice // self.n, None) if choice % self.n == 0 else None
            if rest and not self._closed:
                try:
                    for other in rest:
                        self._submit(other)
                except BaseException:  # the engine closed meanwhile
                    self.abort()
                    raise
            if event.output is not None:
                self.outputs[choice] = event.output
                finished += 1
            yield choice, event

    async def collect(self) -> list[RequestOutput]:
        async for _ in self.events():
            pass
        return [o for o in self.outputs if o is not None]

    def abort(self) -> None:
        self._closed = True
        self._deferred.clear()
        for choice, handle in self._handles.items():
            if self.outputs[choice] is None:
                self.engine.abort(handle)

    def usage(self) -> dict[str, Any]:
        # The prompt is billed once per prompt, not once per choice, as OpenAI does.
        firsts = [self.outputs[p * self.n] for p in range(len(self.prompts))]
        return proto.usage(
            prompt_tokens=sum(len(ids) for ids in self.prompts),
            completion_tokens=sum(len(o.token_ids) for o in self.outputs if o is not None),
            cached_tokens=sum(o.metrics.cached_prompt_tokens for o in firsts if o is not None),
        )

    def first_error(self) -> Exception | None:
        return next((o.error for o in self.outputs if o is not None and o.error is not None), None)


async def _guarded(stream: AsyncIterator[str], model: str) -> AsyncIterator[str]:
    """An event stream that reports an engine failure mid-call (the engine
    closed under it) as an error event instead of a broken connection."""
    try:
        async for item in stream:
            yield item
    except EngineError as exc:
        yield _sse(_engine_failure(exc, model).body())


def _engine_failure(error: Exception, model: str | None = None) -> APIError:
    if isinstance(error, EngineClosedError):
        what = f"The model '{model}'" if model else "The model"
        return APIError(503, f"{what} was unloaded, or the server is shutting down, before the "
                        "answer was complete; try again later.",
                        type="server_error", code="engine_closed")
    log.error("generation failed: %s", error)
    return APIError(500, f"The model failed while generating: {error}", type="server_error",
                    code="internal_error")


# -- HTTP plumbing --------------------------------------------------------------


def _error_response(error: APIError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


class _EventStream(StreamingResponse):
    """A server-sent-event response that runs `on_close` however it ends:
    finished, client gone (Starlette cancels the stream), or failed."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/event-stream", headers=_SSE_HEADERS)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()


async def _read_json(request: Request) -> Any:
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise APIError(413, f"The request body is larger than {MAX_BODY_BYTES >> 20} MiB.",
                               code="request_too_large")
            chunks.append(chunk)
    except ClientDisconnect:
        raise APIError(400, "The client went away while sending the request.") from None
    raw = b"".join(chunks)
    if not raw.strip():
        raise APIError(400, "The request body is empty; send a JSON object.", code="invalid_body")
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(
            400,
            f"We could not parse the JSON body of your request ({exc}). "
            "Send a JSON object with 'Content-Type: application/json'.",
            code="invalid_json",
        ) from None


async def _until_disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


@dataclass(slots=True, frozen=True)
class _Served:
    engine: Engine
    created: int  # when it started being served under its id: the model card's `created`


class ServedModels:
    """The engines a server serves, by model id; safe to change from any
    thread while the server runs.

    The engines stay their owner's: closing one (after taking it out, or
    not) is the owner's business. A closed engine is no longer served, and
    the requests it was running end with a 503 error.
    """

    def __init__(self, engines: Mapping[str, Engine] | None = None) -> None:
        self._lock = threading.Lock()
        # Replaced whole, never changed in place: readers on the server's
        # thread take the current mapping without locking.
        self._served: Mapping[str, _Served] = {}
        if engines:
            self.set(engines)

    def set(self, engines: Mapping[str, Engine]) -> None:
        """Serve exactly `engines` from now on. A request already running
        keeps its engine; an id that stays on the same engine keeps its card."""
        checked = dict(engines)
        for model_id, engine in checked.items():
            if not isinstance(model_id, str) or not model_id.strip():
                raise ValueError(f"A model id must be a non-empty string, not {model_id!r}")
            if not hasattr(engine, "submit"):
                raise TypeError(f"The model '{model_id}' maps to {type(engine).__name__}, not an Engine")
        with self._lock:
            old = self._served
            now = proto.now()
            self._served = {
                model_id: old[model_id] if model_id in old and old[model_id].engine is engine
                else _Served(engine, now)
                for model_id, engine in checked.items()
            }

    def get(self, model_id: str) -> Engine | None:
        """The open engine served as `model_id`, else None."""
        served = self._served.get(model_id)
        return served.engine if served is not None and not served.engine.closed else None

    def cards(self) -> list[dict[str, Any]]:
        """The model cards of the open engines, in the order they were given."""
        return [proto.model_card(model_id, served.created) for model_id, served in self._served.items()
                if not served.engine.closed]

    def ids(self) -> list[str]:
        return [card["id"] for card in self.cards()]

    def engines(self) -> dict[str, Engine]:
        """A snapshot of the mapping (closed engines included)."""
        return {model_id: served.engine for model_id, served in self._served.items()}


@dataclass(slots=True)
class _ServerState:
    models: ServedModels
    api_key: str | None


Handler = Callable[[Request, _ServerState], Awaitable[Response]]


def _endpoint(state: _ServerState, handler: Handler, *, auth: bool = True) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            if auth and state.api_key is not None:
                _check_api_key(request, state.api_key)
            return await handler(request, state)
        except APIError as exc:
            return _error_response(exc)

    return endpoint


def _check_api_key(request: Request, api_key: str) -> None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise APIError(401, "This server needs an API key: send 'Authorization: Bearer YOUR_KEY'.",
                       code="invalid_api_key")
    if not hmac.compare_digest(token.strip().encode(), api_key.encode()):
        raise APIError(401, "Incorrect API key provided.", code="invalid_api_key")


def _engine_for(state: _ServerState, model: str) -> Engine:
    engine = state.models.get(model)
    if engine is None:
        raise _model_not_found(state, model)
    return engine


def _model_not_found(state: _ServerState, model: str) -> APIError:
    ids = state.models.ids()
    if not ids:
        served = "it has no model loaded right now"
    elif len(ids) == 1:
        served = f"it serves '{ids[0]}'"
    else:
        served = "it serves " + ", ".join(f"'{i}'" for i in ids[:10]) + (", ..." if len(ids) > 10 else "")
    return APIError(
        404,
        f"The model '{model}' does not exist on this server or is not loaded; {served} "
        "(see GET /v1/models).",
        param="model",
        code="model_not_found",
    )


# -- sampling and prompts -----------------------------------------------------------


def _params_per_choice(
    fields: SamplingFields, max_tokens: list[int], n: int
) -> list[SamplingParams]:
    """One SamplingParams per choice; with a seed, choice i of a prompt draws
    with seed + i so that the choices differ yet the call is reproducible."""
    from engine.params import InvalidSamplingParams, SamplingParams

    out = []
    for limit in max_tokens:
        for i in range(n):
            try:
                out.append(SamplingParams(
                    max_tokens=limit,
                    temperature=fields.temperature,
                    top_p=fields.top_p,
                    top_k=fields.top_k,
                    min_p=fields.min_p,
                    repetition_penalty=fields.repetition_penalty,
                    seed=None if fields.seed is None else fields.seed + i,
                    stop=fields.stop,
                    ignore_eos=fields.ignore_eos,
                ))
            except InvalidSamplingParams as exc:  # the parser checks ranges first; a safety net
                raise APIError(400, str(exc), code="invalid_value") from None
    return out


def _max_tokens(engine: Engine, prompt_len: int, requested: int | None, default: int | None) -> int:
    """The reply length limit: what the client asked, else `default`, else all
    the room the context and the KV cache leave after the prompt."""
    if requested is not None:
        return requested
    stats = engine.stats()
    room = min(engine.max_context, stats.pages_total * stats.page_size + 1) - prompt_len
    return max(1, room if default is None else min(default, room))


async def _encode(engine: Engine, prompt: Any, param: str) -> list[int]:
    # Chat templates and tokenizers are CPU work: keep them off the event loop.
    try:
        return await asyncio.to_thread(engine.encode_prompt, prompt)
    except PromptError as exc:
        raise APIError(400, str(exc), param=param, code="invalid_prompt") from None
    except EngineError as exc:  # a broken chat template (TokenizerError)
        raise APIError(500, str(exc), type="server_error", code="template_error") from None


def _start(choices: _Choices, param: str, model: str) -> None:
    try:
        choices.start()
    except PromptError as exc:  # RequestTooLargeError included: prompt + max_tokens too long
        raise APIError(400, str(exc), param=param, code="context_length_exceeded") from None
    except EngineClosedError as exc:
        raise _engine_failure(exc, model) from None


async def _wait_or_disconnect(request: Request, choices: _Choices, model: str) -> list[RequestOutput] | None:
    """Run the choices to the end; None (and everything aborted) when the
    client hangs up first, so nobody's pages are held for a dead socket."""
    done = asyncio.ensure_future(choices.collect())
    gone = asyncio.ensure_future(_until_disconnected(request.receive))
    try:
        await asyncio.wait({done, gone}, return_when=asyncio.FIRST_COMPLETED)
        if done.done():
            try:
                return done.result()
            except EngineError as exc:
                raise _engine_failure(exc, model) from None
        choices.abort()
        return None
    finally:
        # Cancelled (server shutdown) or finished: nothing may keep running for this call.
        if not done.done():
            choices.abort()
        for task in (done, gone):
            task.cancel()


# -- endpoints ----------------------------------------------------------------------


async def _models(request: Request, state: _ServerState) -> Response:
    return JSONResponse({"object": "list", "data": state.models.cards()})


async def _model(request: Request, state: _ServerState) -> Response:
    model = request.path_params["model"]
    card = next((c for c in state.models.cards() if c["id"] == model), None)
    if card is None:
        raise _model_not_found(state, model)
    return JSONResponse(card)


async def _health(request: Request, state: _ServerState) -> Response:
    return JSONResponse({"status": "ok"})


async def _chat_completions(request: Request, state: _ServerState) -> Response:
    req = proto.parse_chat_request(await _read_json(request))
    engine, fields, model = _engine_for(state, req.model), req.sampling, req.model
    ids = await _encode(engine, req.messages, "messages")
    limit = _max_tokens(engine, len(ids), fields.max_tokens, None)
    choices = _Choices(engine, [ids], _params_per_choice(fields, [limit], fields.n), fields.n)
    _start(choices, "messages", model)
    rid, created = proto.new_id("chatcmpl"), proto.now()
    head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
            "system_fingerprint": None}

    if req.stream:
        async def stream() -> AsyncIterator[str]:
            extra = {"usage": None} if req.include_usage else {}
            started: set[int] = set()
            async for idx, event in choices.events():
                if event.output is not None and event.output.error is not None:
                    yield _sse(_engine_failure(event.output.error, model).body())
                    return
                if event.text:
                    delta = {"content": event.text}
                    if idx not in started:
                        delta = {"role": "assistant", "content": event.text}
                        started.add(idx)
                    yield _sse({**head, "choices": [
                        {"index": idx, "delta": delta, "logprobs": None, "finish_reason": None}
                    ], **extra})
                if event.output is not None:
                    delta = {} if idx in started else {"role": "assistant", "content": ""}
                    yield _sse({**head, "choices": [{
                        "index": idx, "delta": delta, "logprobs": None,
                        "finish_reason": proto.finish_reason(event.output.finish_reason),
                    }], **extra})
            if req.include_usage:
                yield _sse({**head, "choices": [], "usage": choices.usage()})
            yield "data: [DONE]\n\n"

        return _EventStream(_guarded(stream(), model), choices.abort)

    outputs = await _wait_or_disconnect(request, choices, model)
    if outputs is None:
        return Response(status_code=499)  # nginx's "client closed request"; nobody reads it
    error = choices.first_error()
    if error is not None:
        raise _engine_failure(error, model)
    return JSONResponse({
        "id": rid, "object": "chat.completion", "created": created, "model": model,
        "system_fingerprint": None,
        "choices": [{
            "index": i,
            "message": {"role": "assistant", "content": o.text},
            "logprobs": None,
            "finish_reason": proto.finish_reason(o.finish_reason),
        } for i, o in enumerate(outputs)],
        "usage": choices.usage(),
    })


async def _completions(request: Request, state: _ServerState) -> Response:
    req = proto.parse_completion_request(await _read_json(request))
    engine, fields, model = _engine_for(state, req.model), req.sampling, req.model
    prompts = [await _encode(engine, p, "prompt") for p in req.prompts]
    limits = [
        _max_tokens(engine, len(ids), fields.max_tokens, proto.COMPLETIONS_DEFAULT_MAX_TOKENS)
        for ids in prompts
    ]
    choices = _Choices(engine, prompts, _params_per_choice(fields, limits, fields.n), fields.n)
    _start(choices, "prompt", model)
    rid, created = proto.new_id("cmpl"), proto.now()
    head = {"id": rid, "object": "text_completion", "created": created, "model": model,
            "system_fingerprint": None}

    if req.stream:
        async def stream() -> AsyncIterator[str]:
            extra = {"usage": None} if req.include_usage else {}
            async for idx, event in choices.events():
                if event.output is not None and event.output.error is not None:
                    yield _sse(_engine_failure(event.output.error, model).body())
                    return
                if event.text:
                    yield _sse({**head, "choices": [
                        {"index": idx, "text": event.text, "logprobs": None, "finish_reason": None}
                    ], **extra})
                if event.output is not None:
                    yield _sse({**head, "choices": [{
                        "index": idx, "text": "", "logprobs": None,
                        "finish_reason": proto.finish_reason(event.output.finish_reason),
                    }], **extra})
            if req.include_usage:
                yield _sse({**head, "choices": [], "usage": choices.usage()})
            yield "data: [DONE]\n\n"

        return _EventStream(_guarded(stream(), model), choices.abort)

    outputs = await _wait_or_disconnect(request, choices, model)
    if outputs is None:
        return Response(status_code=499)
    error = choices.first_error()
    if error is not None:
        raise _engine_failure(error, model)
    return JSONResponse({
        **head,
        "choices": [{
            "index": i, "text": o.text, "logprobs": None,
            "finish_reason": proto.finish_reason(o.finish_reason),
        } for i, o in enumerate(outputs)],
        "usage": choices.usage(),
    })


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = f"Unknown endpoint {request.method} {request.url.path}; this server has " \
                  "/v1/models, /v1/chat/completions and /v1/completions."
    elif exc.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}."
    else:
        message = str(exc.detail)
    return _error_response(APIError(exc.status_code, message, code=None))


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error in %s %s", request.method, request.url.path)
    return _error_response(APIError(500, f"Internal server error: {type(exc).__name__}: {exc}",
                                    type="server_error", code="internal_error"))


def create_app(
    engines: Engine | Mapping[str, Engine] | ServedModels,
    model_name: str | None = None,
    *,
    api_key: str | None = None,
) -> Starlette:
    """The ASGI app serving `engines`: one Engine (under `model_name`, by
    default its folder's name), a mapping of model id -> Engine, or a
    `ServedModels` to change while it serves. `app.state.models` is the
    `ServedModels` in use either way.

    The engines stay the caller's: the app never closes them. With
    `api_key`, every /v1 request must carry `Authorization: Bearer <api_key>`.
    """
    if api_key is not None and not api_key:
        raise ValueError("api_key must be a non-empty string or None")
    models = served_models(engines, model_name)
    state = _ServerState(models, api_key)
    routes = [
        Route("/health", _endpoint(state, _health, auth=False), methods=["GET"]),
        Route("/v1/models", _endpoint(state, _models), methods=["GET"]),
        Route("/v1/models/{model:path}", _endpoint(state, _model), methods=["GET"]),
        Route("/v1/chat/completions", _endpoint(state, _chat_completions), methods=["POST"]),
        Route("/v1/completions", _endpoint(state, _completions), methods=["POST"]),
    ]
    app = Starlette(
        routes=routes,
        exception_handlers={HTTPException: _http_error, Exception: _unexpected_error},
    )
    app.state.models = models
    return app


def served_models(
    engines: Engine | Mapping[str, Engine] | ServedModels, model_name: str | None = None
) -> ServedModels:
    """`engines` as a ServedModels (the same object when it already is one)."""
    if isinstance(engines, ServedModels):
        if model_name is not None:
            raise TypeError("model_name names a single engine; a ServedModels has its own ids")
        return engines
    if isinstance(engines, Mapping):
        if model_name is not None:
            raise TypeError("model_name names a single engine; a mapping has its own ids")
        return ServedModels(engines)
    return ServedModels({model_name or model_name_for(engines): engines})


def model_name_for(engine: Engine) -> str:
    """The id a served engine goes by: its model folder's name."""
    return engine.model_path.name


# -- running it ---------------------------------------------------------------------


class RunningServer:
    """A uvicorn server on a background thread, serving until `close()`.

    `grace_s` is how long `close()` lets requests still running finish
    before it cancels them (their engine requests are aborted)."""

    def __init__(self, app: Any, sock: socket.socket, *, grace_s: float = 2.0) -> None:
        import uvicorn

        self.app = app
        self.host, self.port = sock.getsockname()[:2]
        self._sock = sock
        config = uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=grace_s)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name="tandem-openai-server", daemon=True)
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                sock.close()
                raise OSError(f"The server on {self.host}:{self.port} failed to start (see the log).")
            self._thread.join(0.01)

    @property
    def base_url(self) -> str:
        """The URL an OpenAI client takes as base_url (ends in /v1)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    @property
    def models(self) -> ServedModels:
        """What it serves; `.set(...)` changes that while it runs."""
        return self.app.state.models

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def close(self) -> None:
        """Stop accepting, end open streams (their requests are aborted), join.
        The port is free once this returns. Idempotent."""
        self._server.should_exit = True
        self._thread.join()
        self._sock.close()

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def bind(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening socket (port 0: a free one, chosen by the OS, with no race)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    if sys.platform == "win32":
        # Windows' SO_REUSEADDR would let us share a port another program
        # listens on; exclusive use makes that an error, as elsewhere.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_EXCLUSIVEADDRUSE, 1)
    else:
        # Rebinding right after a stop works despite connections in TIME_WAIT;
        # a port another socket listens on is still refused.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def serve_in_thread(
    engines: Engine | Mapping[str, Engine] | ServedModels,
    model_name: str | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    api_key: str | None = None,
    grace_s: float = 2.0,
) -> RunningServer:
    """Serve `engines` (as `create_app` takes them) on host:port (port 0: any
    free one) from a background thread; `.base_url` says where, `.models`
    changes what it serves, `.close()` stops it. No engine is closed.
    Raises OSError when the address cannot be bound (a port in use)."""
    app = create_app(engines, model_name, api_key=api_key)
    return RunningServer(app, bind(host, port), grace_s=grace_s)
