"""Serve the engines the app has loaded over the OpenAI-compatible API, so
that other tools (an editor plugin, a script with the `openai` package, a
second Tandem window) share the same models, the same continuous batch and
the same prefix cache as the window.

    server = LocalServer()
    engines, aliases = served_mapping(workspace.loaded_models(), name_of, "default")
    url = server.start(engines, aliases=aliases, on_request=log_line)   # http://127.0.0.1:<free port>/v1
    server.set_engines(engines, aliases)           # a model loaded or unloaded
    server.stop()                                  # within about a second; the port is free again

Model ids are the names the window shows, as a slug (engine.entrypoints.openai.models.
served_model_id: "SmolLM2-135M-Instruct" is served as `smollm2-135m-instruct`);
`served_mapping` makes them from the app's own ids, which stay aliases (so
`default` reaches the built-in model, and a second Tandem window's remote
pane may use either).

The HTTP side is engine/entrypoints/openai/server.py's (Starlette and uvicorn, on a thread of
its own), with its gate: only loopback `Host`s (and those in `allowed_hosts`),
no web page's `Origin` unless allowed, JSON bodies only, and no listening
beyond this computer without an API key (docs/security.md). This module adds
what the app needs around it: a mapping that follows the models the app loads
and unloads, and bind errors a person can act on. Requests already running on an engine that is unloaded end with a
clean 503 error; a model id that is not loaded answers 404 with OpenAI's
error body. The engines stay the app's: stopping the server closes none.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from app.errors import AppError
from engine.entrypoints.openai.server import (
    ExposedWithoutKeyError,
    RequestCallback,
    RequestRecord,
    RunningServer,
    ServedModels,
    bind,
    create_app,
    is_loopback,
    require_key_beyond_loopback,
    served_model_id,
)

if TYPE_CHECKING:
    from engine import Engine

__all__ = ["LocalServer", "LocalServerError", "PortInUseError", "RequestRecord", "lan_addresses",
           "new_api_key", "served_mapping"]

# Where the server listens: this computer only, or every network it is on (a key required).
LOOPBACK_HOST = "127.0.0.1"
ALL_NETWORKS_HOST = "0.0.0.0"

log = logging.getLogger(__name__)

# How long stop() lets requests that are still running finish before it
# cuts them off (their engine requests are aborted, freeing their pages).
STOP_GRACE_S = 1.0


class LocalServerError(AppError):
    """The app's server could not start at the address asked for."""


class PortInUseError(LocalServerError):
    def __init__(self, host: str, port: int, where: str) -> None:
        self.host = host
        self.port = port
        super().__init__(
            f"Port {port} is in use by another program; choose another port in {where} "
            "(0 picks a free one), or stop the program that uses it."
        )


def new_api_key() -> str:
    """A fresh API key for the server: 192 random bits, URL-safe, recognisable."""
    import secrets

    return "tandem-" + secrets.token_urlsafe(24)


def lan_addresses() -> list[str]:
    """The names other computers on the local network may reach this one by:
    its address on the network with the default route (found without sending
    anything), then its host name. Empty when it is on no network."""
    found: list[str] = []
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: a UDP "connect" only picks the route
            address = probe.getsockname()[0]
        if address and not is_loopback(address) and address != ALL_NETWORKS_HOST:
            found.append(address)
    except OSError:
        pass
    name = socket.gethostname().strip().lower()
    if name and name != "localhost":
        found.append(name)
        if "." not in name:
            found.append(f"{name}.local")  # mDNS, as macOS and most Linux desktops answer
    return found


def served_mapping(
    loaded: Mapping[str, Engine], name_of: Callable[[str], str], first: str | None = None
) -> tuple[dict[str, Engine], dict[str, str]]:
    """(served id -> engine, app id -> served id) for the app's loaded models
    (app id -> engine): each served under its shown name's slug (`name_of(app
    id)`), a second model of the same name with "-2" added; `first` (the
    default model) first, so that `default` reaches it."""
    order = sorted(loaded, key=lambda model_id: model_id != first)
    engines: dict[str, Engine] = {}
    aliases: dict[str, str] = {}
    for model_id in order:
        base = served_model_id(name_of(model_id))
        served, number = base, 2
        while served in engines:
            served, number = f"{base}-{number}", number + 1
        engines[served] = loaded[model_id]
        if model_id != served:
            aliases[model_id] = served
    return engines, aliases


class LocalServer:
    """The app's OpenAI-compatible server: off until `start()`, then serving
    the engines it was given (and later `set_engines`) until `stop()`.

    Call it from one thread (the window's); the server itself runs on a
    background thread and never blocks the caller after `start()` returns.
    `where` names the place in the window where the user picks the port, for
    the message of a PortInUseError.
    """

    def __init__(self, *, where: str = "the server settings") -> None:
        self._where = where
        self._models: ServedModels = ServedModels()
        self._server: RunningServer | None = None
        self._api_key: str | None = None
        self._lock = threading.Lock()

    # -- state -----------------------------------------------------------------

    @property
    def running(self) -> bool:
        server = self._server
        return server is not None and server.running

    @property
    def url(self) -> str | None:
        """The base URL clients use (`http://127.0.0.1:8000/v1`), None when stopped."""
        server = self._server
        return server.base_url if server is not None else None

    @property
    def host(self) -> str | None:
        server = self._server
        return server.host if server is not None else None

    @property
    def port(self) -> int | None:
        """The port it listens on (the one the OS chose when started with port 0)."""
        server = self._server
        return server.port if server is not None else None

    @property
    def api_key_required(self) -> bool:
        return self._server is not None and self._api_key is not None

    @property
    def model_ids(self) -> list[str]:
        """The model ids served now (an engine that was closed is not)."""
        return self._models.ids()

    # -- control ---------------------------------------------------------------

    def start(
        self,
        engines: Mapping[str, Engine],
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        *,
        aliases: Mapping[str, str] | None = None,
        allowed_hosts: Iterable[str] = (),
        allowed_origins: Iterable[str] = (),
        on_request: RequestCallback | None = None,
    ) -> str:
        """Serve `engines` (model id -> Engine; `aliases`: other names for
        them) on host:port; port 0 takes a free one. An empty `api_key`
        means none. Returns the base URL. `allowed_hosts` and
        `allowed_origins` widen the gate (create_app's); an address beyond
        loopback needs `api_key`. `on_request(record)` is called on the
        server's thread after each answer (a RequestRecord: time, model,
        tokens, status).

        Raises PortInUseError when the port is taken, LocalServerError for
        any other address that cannot be used (or one beyond loopback
        without a key), RuntimeError when running.
        """
        with self._lock:
            if self._server is not None:
                if self._server.running:
                    raise RuntimeError("The server is already running; stop() it first")
                self._server.close()  # its thread ended on its own (logged there): start afresh
                self._server = None
            if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
                raise LocalServerError(
                    f"{port!r} is not a port number; choose one from 1024 to 65535 in {self._where} "
                    "(0 picks a free one)."
                )
            key = api_key.strip() if api_key is not None else None
            key = key or None
            self._models.set(engines, aliases)
            sock = self._bind(host, port)
            bound = sock.getsockname()[0]
            try:
                require_key_beyond_loopback(
                    bound, key, f"set an API key in {self._where}, or serve on 127.0.0.1 (this computer only)")
                hosts = list(allowed_hosts)
                if not is_loopback(bound) and bound not in ("0.0.0.0", "::"):
                    hosts.append(bound)  # one address: clients reach it by that address
                app = create_app(self._models, api_key=key, allowed_hosts=hosts, allowed_origins=allowed_origins,
                                 on_request=on_request)
                server = RunningServer(app, sock, grace_s=STOP_GRACE_S)
            except (ExposedWithoutKeyError, ValueError) as exc:  # no key; a host or origin that is none
                sock.close()
                raise LocalServerError(str(exc)) from None
            except OSError as exc:  # uvicorn failed on its thread; bind() already worked
                raise LocalServerError(f"The server could not start on {host}:{port}: {exc}") from None
            self._server, self._api_key = server, key
        log.info("serving %s on %s%s", ", ".join(self._models.ids()) or "no model",
                 server.base_url, " (API key required)" if key else "")
        return server.base_url

    def set_engines(self, engines: Mapping[str, Engine], aliases: Mapping[str, str] | None = None) -> None:
        """Serve exactly `engines` (and `aliases`) from now on (also while
        stopped: the next `start()` is given its own). Requests running on an
        engine that is left out keep it until they end; the caller may then
        close it, which ends them with an error instead."""
        self._models.set(engines, aliases)

    def stop(self) -> None:
        """Stop serving: requests still running get about a second to end,
        then they are cut off and their engine requests aborted. Returns once
        the port is free. Does nothing when stopped; closes no engine."""
        with self._lock:
            server, self._server, self._api_key = self._server, None, None
        if server is not None:
            server.close()
            log.info("stopped serving on %s", server.base_url)

    # -- binding ----------------------------------------------------------------

    def _bind(self, host: str, port: int) -> socket.socket:
        try:
            return bind(host, port)
        except socket.gaierror:
            raise LocalServerError(
                f"'{host}' is not an address this computer knows; use 127.0.0.1 (this computer "
                "only) or 0.0.0.0 (every network it is on)."
            ) from None
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, getattr(errno, "WSAEADDRINUSE", -1)):
                raise PortInUseError(host, port, self._where) from None
            if exc.errno in (errno.EACCES, errno.EPERM, getattr(errno, "WSAEACCES", -1)):
                raise LocalServerError(
                    f"Tandem may not listen on port {port}: ports below 1024 need administrator "
                    f"rights on most systems. Choose a port from 1024 to 65535 in {self._where}."
                ) from None
            if exc.errno == errno.EADDRNOTAVAIL:
                raise LocalServerError(
                    f"{host} is not an address of this computer; use 127.0.0.1 (this computer "
                    "only) or 0.0.0.0 (every network it is on)."
                ) from None
            raise LocalServerError(
                f"The server cannot listen on {host}:{port} ({exc.strerror or exc})."
            ) from None

    def __enter__(self) -> LocalServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
