"""The server's gate: which requests reach the endpoints at all.

A server on 127.0.0.1 is reachable by every web page the user opens: a page
can POST to it ("simple" requests need no CORS preflight) and, by rebinding
its own DNS name to 127.0.0.1, read the answers too. So, before any route:

- `Host` must be a loopback name or address (localhost, 127.0.0.0/8, ::1,
  with or without a port) or a name the user allowed (`--allow-host`). A
  DNS-rebinding page sends its own name here, so it is refused (403).
- A request carrying `Origin` (browsers add it to every cross-origin
  request, and to POSTs) must come from an origin the user allowed
  (`--allow-origin`, exact), or from the server's own origin; else 403.
  Allowed origins get CORS headers and an answer to their preflight; nobody
  else gets any. Clients that are not browsers (curl, the `openai` package,
  the app's remote panes) send no `Origin` and pass as before.
- A POST body must be declared `application/json` (415 otherwise), which a
  page cannot send cross-origin without a preflight that the Origin rule
  refuses.
- Before all of these: a request framed two ways (`Content-Length` and
  `Transfer-Encoding` both) is refused with a 400 and its connection closed,
  as RFC 9112 section 6.1 asks: a proxy in front may have read its body the
  other way, so whatever follows on that connection could be a request the
  proxy never saw (request smuggling).

The API key (`check_api_key`, compared in constant time) is checked per
route, after the gate, so that `/health` needs none; a server bound beyond
loopback must have one (`require_key_beyond_loopback`, called by everything
that starts a server). Every refusal is a JSON body in OpenAI's error shape.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine.entrypoints.openai.protocol import APIError
from engine.errors import ExposedWithoutKeyError

# Names that always mean this computer (IP addresses are checked by value).
_LOOPBACK_NAMES = frozenset({"localhost"})
# What a preflight may ask for, besides the headers it names.
_CORS_METHODS = "GET, POST, OPTIONS"
_CORS_DEFAULT_HEADERS = "Authorization, Content-Type"
_CORS_MAX_AGE_S = "600"
# An origin as browsers send it: scheme://host[:port], nothing after.
_ORIGIN = re.compile(r"^[a-z][a-z0-9+.-]*://[^/?#\s@]+$")
_HOST = re.compile(r"^[a-z0-9._-]+$|^\[[0-9a-f:.]+\]$|^[0-9a-f:]+$")


# -- names and addresses -----------------------------------------------------------------


def host_name(header: str) -> str:
    """The name part of a `Host` header (or of an --allow-host value): no port, no
    brackets around an IPv6 address, lower case, no trailing dot."""
    text = header.strip().lower()
    if text.startswith("["):  # [::1]:8000
        name = text[1:].partition("]")[0]
    elif text.count(":") == 1:  # name:port (an IPv6 address without brackets has several colons)
        name = text.partition(":")[0]
    else:
        name = text
    return name.rstrip(".")


def is_loopback(name: str) -> bool:
    """Whether a host name or IP address (as `host_name` gives it) is this computer only."""
    if name in _LOOPBACK_NAMES:
        return True
    try:
        address = ipaddress.ip_address(name.partition("%")[0])  # an IPv6 zone is no part of it
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def allowed_host(text: str) -> str:
    """An --allow-host value, checked and as the gate compares it; ValueError says what is wrong."""
    name = host_name(text)
    if not name or not _HOST.match(name) or "://" in text:
        raise ValueError(f"expected a host name or IP address such as myhost.lan or 192.168.1.5, got {text!r}")
    return name


def allowed_origin(text: str) -> str:
    """An --allow-origin value (`https://app.example`, `http://localhost:3000`), as the gate
    compares it; ValueError says what is wrong."""
    origin = text.strip().lower().rstrip("/")
    if not _ORIGIN.match(origin):
        raise ValueError(f"expected an origin such as https://app.example or http://localhost:3000 "
                         f"(scheme, host and port, no path), got {text!r}")
    return origin


def require_key_beyond_loopback(address: str, api_key: str | None, how: str) -> None:
    """Raise ExposedWithoutKeyError when `address` (a bound socket's IP, or a host name) is
    not loopback and there is no API key; `how` says how to give one, in the caller's words."""
    if not api_key and not is_loopback(address.strip().strip("[]").lower()):
        raise ExposedWithoutKeyError(address, how)


# -- the API key -----------------------------------------------------------------------------


def check_api_key(request: Request, api_key: str) -> None:
    """Raise a 401 APIError unless the request carries `Authorization: Bearer <api_key>`."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise APIError(401, "This server needs an API key: send 'Authorization: Bearer YOUR_KEY'.",
                       code="invalid_api_key")
    if not keys_match(token.encode("latin-1"), api_key.encode("utf-8", "surrogateescape")):
        raise APIError(401, "Incorrect API key provided.", code="invalid_api_key")


def keys_match(given: bytes, expected: bytes) -> bool:
    """Constant time, length included: the key cannot be guessed a byte at a time from
    response times. (Header values arrive as bytes decoded as Latin-1; a key from the
    environment may hold undecodable bytes, kept by surrogateescape.)"""
    return hmac.compare_digest(hashlib.sha256(given).digest(), hashlib.sha256(expected).digest())


# -- the policy and the middleware -------------------------------------------------------


@dataclass(slots=True, frozen=True)
class GatePolicy:
    """Who may use the server beyond loopback callers without an Origin."""

    allowed_hosts: frozenset[str] = frozenset()
    """Host names (no port) served besides loopback ones."""
    allowed_origins: frozenset[str] = frozenset()
    """Exact browser origins that may call the server, with CORS headers."""

    @classmethod
    def of(cls, allowed_hosts: Iterable[str] = (), allowed_origins: Iterable[str] = ()) -> GatePolicy:
        """Checked and normalized; ValueError names a value that is no host or origin."""
        if isinstance(allowed_hosts, str) or isinstance(allowed_origins, str):
            raise TypeError("allowed_hosts and allowed_origins are collections of strings, not one string")
        return cls(frozenset(allowed_host(h) for h in allowed_hosts),
                   frozenset(allowed_origin(o) for o in allowed_origins))

    def host_allowed(self, header: str | None) -> bool:
        # No Host at all is HTTP/1.0 from a program, never a browser.
        if header is None:
            return True
        name = host_name(header)
        return is_loopback(name) or name in self.allowed_hosts

    def origin_allowed(self, origin: str, host_header: str | None) -> bool:
        """Whether a request with this Origin may proceed: an allowed origin, or the server's own."""
        origin = origin.strip().lower()
        if origin in self.allowed_origins:
            return True
        return host_header is not None and origin in (f"http://{host_header.strip().lower()}",
                                                      f"https://{host_header.strip().lower()}")


class Gate:
    """ASGI middleware applying a GatePolicy to every HTTP request before any route."""

    def __init__(self, app: ASGIApp, policy: GatePolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        if "content-length" in headers and "transfer-encoding" in headers:
            await _refuse(scope, receive, send, APIError(
                400,
                "The request has both Content-Length and Transfer-Encoding, so where its body ends is "
                "ambiguous; send one of them. The connection is closed.",
                code="invalid_framing"), close=True)
            return
        host = headers.get("host")
        if not self.policy.host_allowed(host):
            name = host_name(host or "")
            await _refuse(scope, receive, send, APIError(
                403,
                f"This server does not answer requests addressed to '{name}': it answers loopback "
                "names (localhost, 127.0.0.1, [::1]) and the hosts it was started with "
                f"(--allow-host {name} adds this one). This stops web pages that rebind their "
                "own DNS name to this computer.",
                code="host_not_allowed"))
            return
        origin = headers.get("origin")
        if origin is not None and not self.policy.origin_allowed(origin, host):
            await _refuse(scope, receive, send, APIError(
                403,
                f"Browser requests from {origin!r} are refused: a web page may use this server only "
                f"when the server is started with --allow-origin {origin}.",
                code="origin_not_allowed"))
            return
        cors = origin is not None and origin.strip().lower() in self.policy.allowed_origins
        method = scope["method"]
        if method == "OPTIONS" and cors and "access-control-request-method" in headers:
            assert origin is not None
            await _preflight(scope, receive, send, origin, headers.get("access-control-request-headers"))
            return
        if method == "POST" and not _is_json(headers.get("content-type")):
            await _refuse(scope, receive, send, APIError(
                415,
                "Send the request body as JSON with 'Content-Type: application/json' "
                f"(this one came as {headers.get('content-type') or 'no content type'!r}).",
                code="unsupported_media_type"), origin if cors else None)
            return
        if not cors:
            await self.app(scope, receive, send)
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *_cors_headers(origin)]}
            await send(message)

        await self.app(scope, receive, send_with_cors)


def _headers(scope: Scope) -> dict[str, str]:
    # The first of a repeated header wins; the gate's headers are never legitimately repeated.
    out: dict[str, str] = {}
    for key, value in scope.get("headers", []):
        out.setdefault(key.decode("latin-1").lower(), value.decode("latin-1"))
    return out


def _is_json(content_type: str | None) -> bool:
    if content_type is None:
        return False
    media_type = content_type.partition(";")[0].strip().lower()
    return media_type == "application/json"


def _cors_headers(origin: str) -> list[tuple[bytes, bytes]]:
    return [(b"access-control-allow-origin", origin.strip().encode("latin-1")), (b"vary", b"Origin")]


async def _refuse(scope: Scope, receive: Receive, send: Send, error: APIError, cors_origin: str | None = None,
                  *, close: bool = False) -> None:
    headers = {"Access-Control-Allow-Origin": cors_origin.strip(), "Vary": "Origin"} if cors_origin else {}
    if close:  # the HTTP server (h11) closes a connection after an answer that says so
        headers["Connection"] = "close"
    await JSONResponse(error.body(), status_code=error.status, headers=headers)(scope, receive, send)


async def _preflight(scope: Scope, receive: Receive, send: Send, origin: str, asked: str | None) -> None:
    # Only an allowed origin gets here; it may send any header it asks for.
    headers = {
        "Access-Control-Allow-Origin": origin.strip(),
        "Access-Control-Allow-Methods": _CORS_METHODS,
        "Access-Control-Allow-Headers": asked or _CORS_DEFAULT_HEADERS,
        "Access-Control-Max-Age": _CORS_MAX_AGE_S,
        "Vary": "Origin",
    }
    await Response(status_code=204, headers=headers)(scope, receive, send)
