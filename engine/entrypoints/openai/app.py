"""The ASGI app: the gate (gate.py: Host, Origin, Content-Type) before every
route, routes to the endpoint handlers, the API-key check, and every failure
answered in the OpenAI error shape (never a traceback).

Each handler is `async (request, models) -> Response` and raises
`APIError` for anything it refuses; the wrapper here turns that into the
JSON error answer.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from engine.entrypoints.openai import protocol as proto
from engine.entrypoints.openai.chat import create_chat_completion
from engine.entrypoints.openai.completions import create_completion
from engine.entrypoints.openai.gate import Gate, GatePolicy, check_api_key
from engine.entrypoints.openai.models import ServedModels, health, list_models, retrieve_model, served_models
from engine.entrypoints.openai.protocol import APIError
from engine.entrypoints.openai.request_log import RequestCallback, RequestLog

if TYPE_CHECKING:
    from engine.llm import Engine

log = logging.getLogger(__name__)

Handler = Callable[[Request, ServedModels], Awaitable[Response]]


def create_app(
    engines: Engine | Mapping[str, Engine] | ServedModels,
    model_name: str | None = None,
    *,
    api_key: str | None = None,
    allowed_hosts: Iterable[str] = (),
    allowed_origins: Iterable[str] = (),
    on_request: RequestCallback | None = None,
) -> Starlette:
    """The ASGI app serving `engines`: one Engine (under `model_name`, by
    default its folder's name), a mapping of model id -> Engine, or a
    `ServedModels` to change while it serves. `app.state.models` is the
    `ServedModels` in use either way.

    The engines stay the caller's: the app never closes them. With
    `api_key`, every /v1 request must carry `Authorization: Bearer <api_key>`.

    Every request passes the gate first (engine.entrypoints.openai.gate): its
    `Host` must be loopback or in `allowed_hosts`, an `Origin` must be in
    `allowed_origins` (exact, e.g. "https://app.example"; those get CORS
    headers), and a POST body must be `application/json`.

    `on_request(record)` (request_log.RequestRecord: time, model, tokens,
    status) is called on the server's thread after each answer, refusals
    included.
    """
    if api_key is not None and not api_key:
        raise ValueError("api_key must be a non-empty string or None")
    policy = GatePolicy.of(allowed_hosts, allowed_origins)
    models = served_models(engines, model_name)

    def route(path: str, handler: Handler, method: str, *, auth: bool = True) -> Route:
        return Route(path, _endpoint(handler, models, api_key if auth else None), methods=[method])

    routes = [
        route("/health", health, "GET", auth=False),
        route("/v1/models", list_models, "GET"),
        route("/v1/models/{model:path}", retrieve_model, "GET"),
        route("/v1/chat/completions", create_chat_completion, "POST"),
        route("/v1/completions", create_completion, "POST"),
    ]
    app = Starlette(
        routes=routes,
        middleware=[
            *([Middleware(RequestLog, on_request=on_request)] if on_request is not None else []),
            Middleware(Gate, policy=policy),
        ],
        exception_handlers={HTTPException: _http_error, Exception: _unexpected_error},
    )
    app.state.models = models
    app.state.gate = policy
    return app


def _endpoint(handler: Handler, models: ServedModels, api_key: str | None) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            if api_key is not None:
                check_api_key(request, api_key)
            return await handler(request, models)
        except APIError as exc:
            return error_response(exc)

    return endpoint


def error_response(error: APIError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else {}
    if error.status == 408:  # a body too slow to wait for: its connection is not worth keeping
        headers["Connection"] = "close"
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return error_response(proto.route_error(exc.status_code, request.method, request.url.path, str(exc.detail)))


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error in %s %s", request.method, request.url.path)
    return error_response(proto.internal_error(exc))
