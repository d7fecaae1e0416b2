"""Reading a request's JSON body: bounded in size, and every way it can be
wrong answered with a 400 that says what to send instead."""

from __future__ import annotations

import json
import re
from typing import Any

from starlette.requests import ClientDisconnect, Request

from engine.entrypoints.openai.protocol import APIError

# A chat request is a few kilobytes; this only stops a runaway upload.
MAX_BODY_BYTES = 32 << 20


async def read_json(request: Request) -> Any:
    """The decoded JSON body of `request` (any JSON value: the parsers check its shape)."""
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
        body = json.loads(raw)
    # ValueError: JSONDecodeError, and an integer longer than Python converts
    # (4,300 digits); RecursionError: arrays or objects nested thousands deep.
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise APIError(
            400,
            f"We could not parse the JSON body of your request ({_reason(exc)}). "
            "Send a JSON object with 'Content-Type: application/json'.",
            code="invalid_json",
        ) from None
    if _has_lone_surrogate(body):
        # JSON lets "\ud800" through, but it is no character: a tokenizer
        # cannot read it and no answer quoting it could be encoded.
        raise APIError(400, "The request contains an unpaired UTF-16 surrogate escape (such as "
                       "\\ud800), which is not text; send valid Unicode.", code="invalid_json")
    return body


def _reason(exc: Exception) -> str:
    if isinstance(exc, RecursionError):
        return "it is nested too deeply"
    if isinstance(exc, (json.JSONDecodeError, UnicodeDecodeError)):
        return str(exc)
    return "a number in it has too many digits"


def _has_lone_surrogate(value: Any) -> bool:
    # Iterative: json.loads accepts nesting deeper than a recursive walk could follow.
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return True
        elif isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
    return False


# json.loads pairs a valid high + low escape into one character, so any
# surrogate left in a decoded string is unpaired.
_SURROGATE = re.compile("[\ud800-\udfff]")
