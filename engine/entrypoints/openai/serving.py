"""Running the app: uvicorn on a background thread, on a socket bound first
so that a busy port is an error the caller sees, and port 0 picks a free one
without a race; a socket bound beyond loopback needs an API key (gate.py).
`uvicorn_server` is how every server here (this one and the CLI's `serve`)
configures uvicorn, with connections.py's timeouts and connection limit.
uvicorn is imported only when a server starts."""

from __future__ import annotations

import socket
import sys
import threading
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from engine.entrypoints.openai.app import create_app
from engine.entrypoints.openai.gate import require_key_beyond_loopback
from engine.entrypoints.openai.models import ServedModels

if TYPE_CHECKING:
    from engine.llm import Engine


class RunningServer:
    """A uvicorn server on a background thread, serving until `close()`.

    `grace_s` is how long `close()` lets requests still running finish
    before it cancels them (their engine requests are aborted)."""

    def __init__(self, app: Any, sock: socket.socket, *, grace_s: float = 2.0) -> None:
        self.app = app
        self.host, self.port = sock.getsockname()[:2]
        self._sock = sock
        self._server = uvicorn_server(app, grace_s=grace_s)
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


def uvicorn_server(app: Any, *, grace_s: float) -> Any:
    """The uvicorn.Server serving `app` (`.run(sockets=[sock])`): quiet, no lifespan,
    `grace_s` for requests still running at shutdown, and connections.py's guards."""
    from engine.entrypoints.openai.connections import guarded_server

    return guarded_server(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=grace_s)


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
    allowed_hosts: Iterable[str] = (),
    allowed_origins: Iterable[str] = (),
    grace_s: float = 2.0,
) -> RunningServer:
    """Serve `engines` (as `create_app` takes them, with its gate options) on
    host:port (port 0: any free one) from a background thread; `.base_url`
    says where, `.models` changes what it serves, `.close()` stops it. No
    engine is closed. Raises OSError when the address cannot be bound (a port
    in use), ExposedWithoutKeyError for an address beyond loopback without
    `api_key`."""
    app = create_app(engines, model_name, api_key=api_key, allowed_hosts=allowed_hosts,
                     allowed_origins=allowed_origins)
    sock = bind(host, port)
    try:
        require_key_beyond_loopback(sock.getsockname()[0], api_key, "pass api_key=...")
    except BaseException:
        sock.close()
        raise
    return RunningServer(app, sock, grace_s=grace_s)
