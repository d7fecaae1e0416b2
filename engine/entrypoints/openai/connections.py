"""Connections: how long one may take to ask, and how many may be open.

uvicorn's HTTP/1.1 protocol (h11) times a connection out only between two
requests, after an answer, and accepts connections until the process runs out
of file descriptors. So a client that opens connections and never finishes a
request head (slowloris) held them forever, needing no API key (the key is
read from the head), and ~1,000 of them left the server unable to accept
anyone. `GuardedH11Protocol` adds what nginx calls client_header_timeout and a
connection limit:

- A request head must be complete within REQUEST_HEAD_TIMEOUT_S of the
  connection opening or of the previous answer (a total, not an idle time:
  one byte a second does not keep it open). A partial head then gets a 408,
  an idle connection is closed.
- At most `connection_limit()` connections are open: MAX_CONNECTIONS, fewer
  when the file-descriptor limit is low. A connection past it closes the
  open connection that has been waiting longest for a request head (a
  slowloris one, or an idle keep-alive one) instead of being refused, so
  that clients who send a request at once are served while an attack runs;
  only when every open connection is answering a request is the new one
  refused with a 503.
- A refusal (503, 408) is written, the sending side shut, and the socket
  closed LINGER_S later, what the client sends meanwhile unread: closing at
  once, with the client's request unread, would reset the connection and
  could lose the answer. At most as many connections linger as are served;
  past that a new one is closed without an answer.

Connections not yet accepted wait in the kernel's listen queue (LISTEN_BACKLOG
long), which costs no file descriptor: the server accepts them in batches of
half the limit (`accept_batch`), so that a flood of connections is closed about
as fast as it is accepted and never takes the last descriptors.

A body is bounded in time where it is read (request_body.BODY_TIMEOUT_S).
The timeouts and limits are module constants, read at each use, so that a
test can make them small.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from engine.entrypoints.openai.protocol import error_body

# The head (request line and headers) must have arrived this long after the
# connection opened or its previous answer ended.
REQUEST_HEAD_TIMEOUT_S = 10.0
# An idle connection between requests is closed after this (uvicorn's timer).
KEEP_ALIVE_S = 5.0
# The most connections open at once; an eighth of the file-descriptor limit
# when that is lower (128 of the usual 1,024). Connections use up to three
# times that at the worst moment of a flood (those served, those lingering,
# those accepted and not yet closed), which leaves over half to the process.
MAX_CONNECTIONS = 256
# A head larger than this is a 400 (h11's own default; headers are small).
MAX_REQUEST_HEAD_BYTES = 16 * 1024
# How long a refused connection stays open for its answer to be read.
LINGER_S = 1.0
# Connections the kernel holds until they are accepted (uvicorn's default is 2,048).
LISTEN_BACKLOG = 1024


def connection_limit() -> int:
    """MAX_CONNECTIONS, or an eighth of the process's file-descriptor limit when lower."""
    try:
        import resource
    except ImportError:  # Windows: no such limit to run into
        return MAX_CONNECTIONS
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(1, min(MAX_CONNECTIONS, soft // 8))


def accept_batch() -> int:
    """How many connections the server accepts in one turn of its event loop
    (asyncio's `backlog`, which it also gives listen()): half the limit. A
    connection is let in or closed two or three turns after it is accepted, so
    a flood holds about three batches more than the limit at any moment.
    GuardedServer then lengthens the listen queue again."""
    return max(1, min(128, connection_limit() // 2))


class GuardedServer(uvicorn.Server):
    """uvicorn's server with connections past the accept batch kept waiting in a long
    listen queue, rather than refused by the kernel (a client then retries a second later)."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        for sock in sockets or ():
            sock.listen(LISTEN_BACKLOG)


# Orders connections by when they began waiting (the loop's clock gives a whole
# batch of accepted connections the same time).
_WAIT_ORDER = itertools.count()


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request head and a connection limit."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timer: asyncio.TimerHandle | None = None  # the head's deadline, or the end of a linger
        self._waiting_since = 0  # when it began waiting for a request head, in _WAIT_ORDER
        self._head_started = False  # bytes of a new request head have arrived
        self._refused = False  # answered with a refusal: lingering until it is closed

    # -- uvicorn's hooks ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        others = [c for c in self.connections
                  if isinstance(c, GuardedH11Protocol) and c is not self and not c.transport.is_closing()]
        served = [c for c in others if not c._refused]
        limit = connection_limit()
        if len(served) >= limit:
            waiting = [c for c in served if not c._answering()]
            if waiting:
                min(waiting, key=lambda c: c._waiting_since)._close()
            elif len(others) - len(served) < limit:
                self._refuse(503, "Service Unavailable", error_body(
                    "The server has as many connections open as it allows, all of them answering "
                    "requests; try again shortly.", type="server_error", code="too_many_connections"))
                return
            else:
                self._close()
                return
        self._await_head()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # read only so that closing does not reset the connection
        if self._timer is not None and data:
            self._head_started = True
        super().data_received(data)

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a whole head arrived: its request is being answered
            self._stop_timer()

    def on_response_complete(self) -> None:
        # Armed before uvicorn reads a pipelined request, whose head then stops it.
        if not self.transport.is_closing():
            self._await_head()
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        super().connection_lost(exc)

    # -- the deadline -------------------------------------------------------------------

    def _await_head(self) -> None:
        self._stop_timer()
        self._waiting_since = next(_WAIT_ORDER)
        self._head_started = False
        self._timer = self.loop.call_later(REQUEST_HEAD_TIMEOUT_S, self._head_timed_out)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _head_timed_out(self) -> None:
        self._timer = None
        if self.transport.is_closing() or self._answering():
            return
        # A client half-way through a head learns why; an idle one is closed, as a keep-alive is.
        if self._head_started and self.conn.their_state is h11.IDLE:
            self._refuse(408, "Request Timeout", error_body(
                f"The request's headers did not arrive within {REQUEST_HEAD_TIMEOUT_S:g} seconds; "
                "send them at once.", code="request_timeout"))
        else:
            self._close()

    # -- ending a connection --------------------------------------------------------------

    def _answering(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _close(self) -> None:
        self._stop_timer()
        try:
            self.conn.send(h11.ConnectionClosed())
        except h11.LocalProtocolError:  # a state h11 will not close from: the socket goes anyway
            pass
        self.transport.close()

    def _refuse(self, status: int, reason: str, body: dict[str, Any]) -> None:
        # Written as bytes: h11 sends no answer before it has read a request.
        payload = json.dumps(body).encode()
        head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(payload)}\r\nconnection: close\r\n\r\n").encode("ascii")
        self._stop_timer()
        self._refused = True
        self.transport.write(head + payload)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._timer = self.loop.call_later(LINGER_S, self._close)


def guarded_server(app: Any, **config: Any) -> GuardedServer:
    """A uvicorn server for `app` (further uvicorn.Config options in `config`) with these guards."""
    return GuardedServer(uvicorn.Config(app, **config, **_config_options()))


def _config_options() -> dict[str, Any]:
    return {
        "http": GuardedH11Protocol,
        # No WebSocket routes: an upgrade request is answered as plain HTTP.
        "ws": "none",
        "timeout_keep_alive": KEEP_ALIVE_S,
        "h11_max_incomplete_event_size": MAX_REQUEST_HEAD_BYTES,
        "backlog": accept_batch(),
    }
