"""`python -m engine serve`: load one engine and serve it over the OpenAI API
until Ctrl-C (the HTTP side: engine.entrypoints.openai.server)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from engine.entrypoints.openai.server import bind, create_app, model_name_for


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is between 0 and 65535, got {value}")
    return value


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
        epilog="example:\n  curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\\n"
        "    -d '{\"model\": \"SmolLM2-135M-Instruct\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}'",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = serve.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1",
                   help="address to listen on; 0.0.0.0 exposes the model to your network, so "
                   "set --api-key then (default: %(default)s)")
    g.add_argument("--port", type=_port, default=8000,
                   help="TCP port; 0 picks a free one (default: %(default)s)")
    g.add_argument("--api-key", default=None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on every /v1 request "
                   "(default: $TANDEM_API_KEY, else no key)")
    g.add_argument("--served-model-name", default=None, metavar="NAME",
                   help="the model id clients send (default: the model folder's name)")
    serve.set_defaults(run=lambda args: run_serve(args, open_engine))
    return serve


def run_serve(args: argparse.Namespace, open_engine: Callable[[argparse.Namespace], Any]) -> int:
    """Load the engine, serve until Ctrl-C, close the engine. Exit status."""
    import os

    import uvicorn

    api_key = args.api_key if args.api_key is not None else os.environ.get("TANDEM_API_KEY") or None
    if args.api_key == "":
        print("error: --api-key must not be empty", file=sys.stderr)
        return 2
    try:
        sock = bind(args.host, args.port)
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port} ({exc.strerror or exc}); "
              "pick another --port or stop what uses it", file=sys.stderr)
        return 1
    with sock:
        engine = open_engine(args)
        try:
            name = args.served_model_name or model_name_for(engine)
            app = create_app(engine, name, api_key=api_key)
            host, port = sock.getsockname()[:2]
            shown = f"[{host}]" if ":" in host else host
            print(f"Serving {name} on http://{shown}:{port}/v1 "
                  f"({engine.device.type}, {str(engine.dtype).removeprefix('torch.')})"
                  f"{'; API key required' if api_key else ''}. Ctrl-C stops.", file=sys.stderr, flush=True)
            config = uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=2)
            # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the
            # signal; stopping a server that way is its normal end, so exit 0.
            main_thread = threading.current_thread() is threading.main_thread()
            previous = signal.signal(signal.SIGTERM, _raise_interrupt) if main_thread else None
            try:
                uvicorn.Server(config).run(sockets=[sock])
            except KeyboardInterrupt:
                pass
            finally:
                if main_thread:
                    signal.signal(signal.SIGTERM, previous)
        finally:
            engine.close()
    print("Server stopped.", file=sys.stderr)
    return 0


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
