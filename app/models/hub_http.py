"""Talking to the Hub, whatever answers on HF_ENDPOINT: its address, and
requests that read at most what was asked within a wall-clock deadline.

HF_ENDPOINT is how users reach mirrors and company proxies, so what answers
there is untrusted (docs/security.md). httpx's timeout is per read, so a
server sending one byte every few seconds never trips it, and a body is as
long as the server likes: `hub_stream` puts a HubDeadline on the whole
exchange, headers included, and asks for the body uncompressed (a compressed
one could inflate without bound); `hub_read` keeps at most `limit` bytes.
app/models/hub.py (searches, file lists, the names the Hub sends) and
app/models/download.py (files) read the Hub only through these.

No Qt and no torch at import.
"""

from __future__ import annotations

import functools
import os
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from app.models.errors import HubError, HubOfflineError, HubSlowError

if TYPE_CHECKING:
    import httpx

# What a hub may cost (module constants: the tests shrink them): a search, a
# file list or a small file is complete within HUB_DEADLINE, its headers
# included (a download's rule is in download.py).
HUB_DEADLINE = 60.0
READ_TIMEOUT = 30.0
MAX_REDIRECTS = 10


def hub_endpoint() -> str:
    """The Hub's address: HF_ENDPOINT (a mirror, or the tests' local server) or huggingface.co."""
    from huggingface_hub import constants

    return os.environ.get("HF_ENDPOINT", constants.ENDPOINT).rstrip("/")


def hub_host() -> str:
    """'huggingface.co', or the mirror's host: who a message blames."""
    return urlparse(hub_endpoint()).netloc or hub_endpoint()


def shown(value: object, limit: int = 60) -> str:
    """A value a server sent, fit for a one-line message: quoted, control
    characters escaped, cut short; a list or an object only by its kind
    (its repr could be huge or nested too deeply to print)."""
    if isinstance(value, str):
        return repr(value[:limit]) + ("…" if len(value) > limit else "")
    if value is None or isinstance(value, (bool, int, float)):
        text = repr(value)
        return text if len(text) <= limit else text[:limit] + "…"
    return {"list": "a list", "dict": "an object"}.get(type(value).__name__, type(value).__name__)


class HubDeadline:
    """A wall-clock limit on one exchange with the hub, its headers included.

    When it passes, the connection's socket (from httpcore's `trace`
    extension) is shut down, which ends a read that is waiting at once; the
    exchange then fails and `hub_stream` says the hub was too slow.
    `extend()` gives an exchange that keeps moving (a download) another period."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.expired = False
        self._until = time.monotonic() + seconds
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._done = threading.Event()

    def __enter__(self) -> HubDeadline:
        threading.Thread(target=self._watch, name="tandem-hub-deadline", daemon=True).start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()

    def extend(self) -> None:
        self._until = time.monotonic() + self.seconds

    def trace(self, event: str, info: dict[str, Any]) -> None:
        if not event.endswith(("connect_tcp.complete", "start_tls.complete")):
            return
        stream = info.get("return_value")
        sock = stream.get_extra_info("socket") if hasattr(stream, "get_extra_info") else None
        if isinstance(sock, socket.socket):
            with self._lock:
                self._sockets.append(sock)
                if self.expired:
                    _shut(sock)

    def _watch(self) -> None:
        while not self._done.wait(max(0.0, self._until - time.monotonic())):
            if time.monotonic() >= self._until:
                with self._lock:
                    self.expired = True
                    for sock in self._sockets:
                        _shut(sock)
                return


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # closed already


@contextmanager
def hub_stream(url: str, *, what: str, seconds: float, headers: dict[str, str] | None = None,
               params: dict[str, Any] | None = None) -> Iterator[tuple[httpx.Response, HubDeadline]]:
    """GET `url` with its body unread, under a HubDeadline of `seconds`.

    Asks for the body uncompressed (a compressed one could inflate without
    bound) and refuses another. Raises HubSlowError past the deadline,
    HubError for a redirect loop, HubOfflineError for any other failure."""
    import httpx

    deadline = HubDeadline(seconds)
    try:
        # No single wait may outlast the deadline either (a connection that never opens).
        with deadline, httpx.Client(timeout=min(READ_TIMEOUT, seconds), follow_redirects=True,
                                    max_redirects=MAX_REDIRECTS, verify=_tls_context()) as client:
            request = client.build_request("GET", url, params=params,
                                           headers={**(headers or {}), "Accept-Encoding": "identity"},
                                           extensions={"trace": deadline.trace})
            response = client.send(request, stream=True)
            try:
                encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
                if response.status_code < 300 and encoding not in ("", "identity"):
                    raise HubError(f"{hub_host()} sent {what} compressed ({shown(encoding)}) though it was asked "
                                   "not to; check HF_ENDPOINT or try again later.")
                yield response, deadline
            finally:
                response.close()
    except httpx.TooManyRedirects as exc:
        raise HubError(f"{hub_host()} redirected the request for {what} in a loop; check HF_ENDPOINT or try "
                       "again later.") from exc
    except httpx.HTTPError as exc:
        if deadline.expired:
            raise HubSlowError(f"{hub_host()} did not send {what} within {seconds:g} s; try again later.") from exc
        raise HubOfflineError(f"The connection to {hub_host()} was lost while reading {what} "
                              f"({type(exc).__name__}); check the network and try again.") from exc


def hub_read(url: str, *, what: str, limit: int, cut: bool = False, headers: dict[str, str] | None = None,
             params: dict[str, Any] | None = None, seconds: float | None = None) -> tuple[int, bytes]:
    """The status and at most `limit` bytes of the body of a GET, within
    HUB_DEADLINE. More than `limit` is cut there (`cut`: a Range the server
    ignored sends the whole file) or refused. An error status reads no body."""
    with hub_stream(url, what=what, seconds=HUB_DEADLINE if seconds is None else seconds, headers=headers,
                    params=params) as (response, _deadline):
        if response.status_code >= 300:
            return response.status_code, b""
        too_big = HubError(f"{hub_host()} sent more than {_size_text(limit)} for {what}, more than it can be; "
                           "check HF_ENDPOINT or try again later.")
        declared = content_length(response)
        if declared is not None and declared > limit and not cut:
            raise too_big
        body = bytearray()
        for chunk in response.iter_raw():
            body += chunk
            if len(body) > limit:
                if not cut:
                    raise too_big
                del body[limit:]
                break
        return response.status_code, bytes(body)


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """httpx's default context (SSL_CERT_FILE/SSL_CERT_DIR respected), made once:
    loading the certificates takes tens of milliseconds per client."""
    import httpx

    return httpx.create_ssl_context()


def content_length(response: httpx.Response) -> int | None:
    return whole_number(response.headers.get("Content-Length", ""))


def whole_number(text: str) -> int | None:
    """ASCII digits as an int ('²'.isdigit() is true too, and int() refuses it), else None."""
    return int(text) if text.isascii() and text.isdigit() else None


def _size_text(size: int) -> str:
    from engine.progress import format_bytes

    return format_bytes(size)
