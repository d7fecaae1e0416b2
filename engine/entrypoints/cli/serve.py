"""`python -m engine serve`: load one engine and serve it over the OpenAI API
until Ctrl-C (the HTTP side: engine.entrypoints.openai.server)."""

from __future__ import annotations

import argparse
import errno
import signal
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

from engine.entrypoints.openai.gate import allowed_host, allowed_origin
from engine.entrypoints.openai.models import served_model_id
from engine.entrypoints.openai.server import (
    ExposedWithoutKeyError,
    GatePolicy,
    bind,
    create_app,
    is_loopback,
    model_name_for,
    require_key_beyond_loopback,
    uvicorn_server,
)

# Said wherever the server refuses to listen beyond loopback without a key.
_HOW_TO_GIVE_A_KEY = ("start it with --api-key KEY, or set TANDEM_API_KEY=KEY in the environment "
                      "(which keeps the key out of the process list); clients then send "
                      "'Authorization: Bearer KEY'")


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is between 0 and 65535, got {value}")
    return value


def _checked(check: Callable[[str], str]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        try:
            return check(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def add_serve_parser(
    sub: Any,
    engine_options: argparse.ArgumentParser,
    open_engine: Callable[[argparse.Namespace], Any],
) -> argparse.ArgumentParser:
    """Add `serve` to the CLI's subparsers. `engine_options` is the parent
    parser with every engine option (engine.config's flags, --max-context
    included); `open_engine(args)` builds the Engine from them (with the
    CLI's loading progress)."""
    serve = sub.add_parser(
        "serve",
        parents=[engine_options],
        help="serve the model over an OpenAI-compatible HTTP API",
        description="Serve the model over an OpenAI-compatible HTTP API: GET /v1/models, "
        "POST /v1/chat/completions, POST /v1/completions (streaming or not). "
        "Concurrent requests share one continuous batch and one prefix cache.",
        epilog="The model id is the model's name as a slug (SmolLM2-135M-Instruct: smollm2-135m-instruct); "
        "requests may also use the name as shown, or 'default'.\n\n"
        "example:\n  curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\\n"
        "    -d '{\"model\": \"smollm2-135m-instruct\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}'",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = serve.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1",
                   help="address to listen on; an address beyond this computer (0.0.0.0: every "
                   "network it is on) needs an API key (default: %(default)s)")
    g.add_argument("--port", type=_port, default=8000,
                   help="TCP port; 0 picks a free one (default: %(default)s)")
    g.add_argument("--api-key", default=None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on every /v1 request "
                   "(default: $TANDEM_API_KEY, else no key; the variable keeps it out of `ps`)")
    g.add_argument("--allow-host", action="append", default=[], type=_checked(allowed_host), metavar="NAME",
                   help="also answer requests addressed to NAME (a host name or IP address clients "
                   "use to reach this server); loopback names always work (repeatable)")
    g.add_argument("--allow-origin", action="append", default=[], type=_checked(allowed_origin),
                   metavar="ORIGIN",
                   help="let web pages from ORIGIN (exact, e.g. https://app.example) call the server, "
                   "with CORS headers; other pages are refused (repeatable)")
    g.add_argument("--served-model-name", default=None, metavar="NAME",
                   help="the model id clients send, as a slug (default: the model folder's name as a slug, "
                   "e.g. smollm2-135m-instruct; 'default' also reaches it)")
    serve.set_defaults(run=lambda args: run_serve(args, open_engine))
    return serve


def run_serve(args: argparse.Namespace, open_engine: Callable[[argparse.Namespace], Any]) -> int:
    """Load the engine, serve until Ctrl-C, close the engine. Exit status."""
    import os

    api_key = args.api_key if args.api_key is not None else os.environ.get("TANDEM_API_KEY") or None
    if args.api_key == "":
        print("error: --api-key must not be empty", file=sys.stderr)
        return 2
    try:
        sock = bind(args.host, args.port)
    except OSError as exc:
        print(f"error: {_bind_error(args.host, args.port, exc)}", file=sys.stderr)
        return 1
    with sock:
        bound = sock.getsockname()[0]
        try:
            require_key_beyond_loopback(bound, api_key, _HOW_TO_GIVE_A_KEY)
        except ExposedWithoutKeyError as exc:
            print(f"error: --host {args.host}: {exc}", file=sys.stderr)
            return 2
        allowed_hosts = list(args.allow_host)
        if not is_loopback(bound) and bound not in ("0.0.0.0", "::"):
            allowed_hosts.append(bound)  # listening on one address: clients reach it by that address
        policy = GatePolicy.of(allowed_hosts, args.allow_origin)
        engine = open_engine(args)
        try:
            name = served_model_id(args.served_model_name) if args.served_model_name else model_name_for(engine)
            app = create_app(engine, name, api_key=api_key, allowed_hosts=policy.allowed_hosts,
                             allowed_origins=policy.allowed_origins)
            host, port = sock.getsockname()[:2]
            shown = f"[{host}]" if ":" in host else host
            print(f"Serving {name} on http://{shown}:{port}/v1 "
                  f"({engine.device.type}, {str(engine.dtype).removeprefix('torch.')})"
                  f"{'; API key required' if api_key else ''}. Ctrl-C stops.", file=sys.stderr, flush=True)
            if bound in ("0.0.0.0", "::") and not policy.allowed_hosts:
                print("Requests must be addressed to localhost or 127.0.0.1 (or [::1]) unless you name "
                      "the others: add --allow-host NAME for each host name or IP address clients use "
                      "to reach this computer.", file=sys.stderr, flush=True)
            # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the
            # signal; stopping a server that way is its normal end, so exit 0.
            main_thread = threading.current_thread() is threading.main_thread()
            previous = signal.signal(signal.SIGTERM, _raise_interrupt) if main_thread else None
            try:
                uvicorn_server(app, grace_s=2).run(sockets=[sock])
            except KeyboardInterrupt:
                pass
            finally:
                if main_thread:
                    signal.signal(signal.SIGTERM, previous)
        finally:
            engine.close()
    print("Server stopped.", file=sys.stderr)
    return 0


def _bind_error(host: str, port: int, exc: OSError) -> str:
    """Why host:port cannot be listened on, naming the option to change."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
        known = ("is neither an IP address nor a name this computer can resolve"
                 if isinstance(exc, socket.gaierror) else "is not an address of this computer")
        return (f"cannot listen on {where}: --host {host} {known}; use --host 127.0.0.1 (this "
                "computer only) or --host 0.0.0.0 (every network it is on, with --api-key)")
    if exc.errno in (errno.EADDRINUSE, getattr(errno, "WSAEADDRINUSE", -1)):
        return (f"cannot listen on {where}: the port is in use; pick another --port (0 picks a "
                "free one) or stop what uses it")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return (f"cannot listen on {where}: ports below 1024 need administrator rights on most "
                "systems; pick another --port from 1024 to 65535")
    return f"cannot listen on {where} ({exc.strerror or exc}); check --host and --port"


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
