"""An OpenAI-compatible HTTP server over one or several Engines.

    python -m engine serve --model default [--host 127.0.0.1] [--port 8000] [--api-key KEY]
        [--allow-host NAME]... [--allow-origin https://app.example]...
    (the `serve` command itself: engine.entrypoints.cli.serve)

Endpoints: `GET /v1/models`, `GET /v1/models/{id}`, `POST
/v1/chat/completions`, `POST /v1/completions` (streaming as server-sent
events ending in `data: [DONE]`, or one JSON answer), plus `GET /health`.

This module is the package's front door, and the one module of it that the
app imports (tests/architecture): the names other layers use,
re-exported from where they live (one concept a module, as vLLM's
`entrypoints/openai` is split):

    protocol.py      request parsing and checking; the errors
    responses.py     every answer's body: JSON answers, stream chunks, usage, model cards
    tools.py         response_format, tools, tool_choice and tool turns read; a reply's tool
                     calls as `tool_calls` (whole or streamed); the grammar of a forced call
    request_body.py  reading a request's JSON body, bounded (size, time, items), decoded off the loop
    models.py        ServedModels (model id -> Engine), GET /v1/models[/{id}], /health
    choices.py       the engine side of one call: n choices sharing prompt pages, waiting, aborting
    streaming.py     server-sent events of one call, aborted however they end
    chat.py          POST /v1/chat/completions
    completions.py   POST /v1/completions
    gate.py          before any route: Host, Origin (CORS), Content-Type; the API key; no
                     listening beyond loopback without a key (docs/security.md)
    app.py           create_app: the gate, routes, error answers
    connections.py   the HTTP/1.1 connections: a deadline on each request head, a connection
                     limit (slowloris), uvicorn's options
    serving.py       RunningServer, bind, serve_in_thread, uvicorn_server: uvicorn on a
                     background thread

Every request joins the engine's continuous batch: the handlers only submit
to the engine and await what its thread pushes back through
`loop.call_soon_threadsafe`, so the server's event loop never waits on the
model.

`create_app(engines)` builds the ASGI app for engines someone else owns (the
desktop app serves the ones it has loaded); `serve_in_thread(...)` runs that
app with uvicorn on a background thread.

Nothing here imports torch or uvicorn at import time, so that the CLI's
`--help` stays quick.
"""

from __future__ import annotations

from engine.entrypoints.openai.app import create_app
from engine.entrypoints.openai.gate import ExposedWithoutKeyError, GatePolicy, is_loopback, require_key_beyond_loopback
from engine.entrypoints.openai.models import ServedModels, model_name_for, served_model_id, served_models
from engine.entrypoints.openai.request_body import MAX_BODY_BYTES
from engine.entrypoints.openai.request_log import RequestCallback, RequestRecord
from engine.entrypoints.openai.serving import RunningServer, bind, serve_in_thread, uvicorn_server

__all__ = [
    "ExposedWithoutKeyError",
    "GatePolicy",
    "MAX_BODY_BYTES",
    "RequestCallback",
    "RequestRecord",
    "RunningServer",
    "ServedModels",
    "bind",
    "create_app",
    "is_loopback",
    "model_name_for",
    "require_key_beyond_loopback",
    "serve_in_thread",
    "uvicorn_server",
    "served_model_id",
    "served_models",
]
