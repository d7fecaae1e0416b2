"""Reading a request's JSON body: bounded in size, in time and in the number of
items, decoded and checked off the event loop, and every way it can be wrong
answered with a 4xx that says what to send instead.

The event loop answers every client (and /health), so nothing that grows with
the body runs on it: the bytes are only gathered there. Decoding is refused up
front when the body holds more items than any request needs (counted from its
bytes, which costs milliseconds even for 32 MiB), because `json.loads` of
millions of small values holds the interpreter for seconds, on whatever thread
it runs. What is left runs on a worker thread: numbers go through Python hooks,
so the interpreter switches back to the loop between them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any, TypeVar

from starlette.requests import ClientDisconnect, Request

from engine.entrypoints.openai.protocol import APIError

T = TypeVar("T")

# A chat request is a few kilobytes; this only stops a runaway upload.
MAX_BODY_BYTES = 32 << 20
# Array elements and object fields in one body, counted as the bytes `,` `:` `[` `{`
# (those inside strings too: a bound, not a parse). 262,144 holds a batch of 128
# token-id prompts of 2,048 ids, or any chat; json.loads of that many values takes
# about 0.15 s, of the 16 M a 32 MiB body can hold, 2 to 13 s.
MAX_JSON_ITEMS = 1 << 18
# No field takes a longer integer (a seed is at most 20 digits); Python's own
# limit is 4,300 digits, and converting thousands of those takes seconds.
MAX_INT_DIGITS = 64
# The whole body must arrive within this; a client trickling bytes would otherwise
# hold its connection (and a slot of the server's connection limit) forever.
BODY_TIMEOUT_S = 60.0

_STRUCTURAL = (b",", b":", b"[", b"{")


async def read_request(request: Request, parse: Callable[[Any], T]) -> T:
    """`parse(body)` of the request's decoded JSON body (any JSON value: `parse`
    checks its shape), run on a worker thread; an APIError for any body it refuses."""
    raw = await read_body(request)
    return await asyncio.to_thread(lambda: parse(decode_json(raw)))


async def read_body(request: Request) -> bytes:
    """The raw body, at most MAX_BODY_BYTES, within BODY_TIMEOUT_S."""
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(BODY_TIMEOUT_S):
            async for chunk in request.stream():
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise APIError(413, f"The request body is larger than {MAX_BODY_BYTES >> 20} MiB.",
                                   code="request_too_large")
                chunks.append(chunk)
    except ClientDisconnect:
        raise APIError(400, "The client went away while sending the request.") from None
    except TimeoutError:
        raise APIError(408, f"The request body did not arrive within {BODY_TIMEOUT_S:g} seconds "
                       f"({size:,} bytes came); send it at once.", code="request_timeout") from None
    return b"".join(chunks)


def decode_json(raw: bytes) -> Any:
    """The JSON value in `raw`; an APIError 400 for a body that is empty, malformed,
    too large in items or digits, nested too deeply, or not text."""
    if not raw.strip():
        raise APIError(400, "The request body is empty; send a JSON object.", code="invalid_body")
    items = sum(raw.count(mark) for mark in _STRUCTURAL)
    if items > MAX_JSON_ITEMS:
        raise APIError(
            400,
            f"The request body holds about {items:,} JSON items (array elements and object fields); "
            f"at most {MAX_JSON_ITEMS:,} are allowed. Send a long batch of prompts as several requests.",
            code="request_too_large")
    try:
        body = json.loads(raw, parse_int=_parse_int, parse_float=_parse_float)
    # ValueError: JSONDecodeError, and an integer longer than MAX_INT_DIGITS;
    # RecursionError: arrays or objects nested thousands deep.
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


def _parse_int(text: str) -> int:
    # Being Python code, this hook also lets the interpreter switch to the event loop.
    if len(text) > MAX_INT_DIGITS + 1:  # a sign
        raise ValueError(text[:20])
    return int(text)


def _parse_float(text: str) -> float:
    return float(text)


def _reason(exc: Exception) -> str:
    if isinstance(exc, RecursionError):
        return "it is nested too deeply"
    if isinstance(exc, (json.JSONDecodeError, UnicodeDecodeError)):
        return str(exc)
    return f"a number in it has more than {MAX_INT_DIGITS} digits"


def _has_lone_surrogate(value: Any) -> bool:
    # Iterative: json.loads accepts nesting deeper than a recursive walk could follow.
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if not item.isascii() and not _is_unicode(item):
                return True
        elif isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
    return False


def _is_unicode(text: str) -> bool:
    # json.loads pairs a valid high + low escape into one character, so any
    # surrogate left in a decoded string is unpaired, and UTF-8 refuses it.
    # (Encoding is ten times faster than searching the text for one.)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
