"""Remote panes: a pane served by an OpenAI-compatible server, next to local
panes. Against Tandem's own server over loopback (the app as a client of
itself) and against a small local HTTP server that misbehaves on purpose."""

from __future__ import annotations

import asyncio
import dataclasses
import http.server
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.events import ReplyDelta, ReplyFinished, WorkspaceEvent
from app.remote.openai_client import ModelNotServedError, RemoteConnectionError
from app.settings import Settings
from app.workspace.workspace import Workspace
from engine.llm import Engine
from engine.params import SamplingParams
from engine.entrypoints.openai.server import RunningServer, serve_in_thread
from tests.app.test_openai_client import _chunk, _Misbehaving

PROMPT = "Hello there"
MAX_TOKENS = 8
KEY = "sk-secret-k3y"


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[Engine]:
    with Engine(str(tiny_model_dir), device="cpu", dtype="float32", kv_pages=256, threads=1) as eng:
        yield eng


@pytest.fixture(scope="module")
def server(engine: Engine) -> Iterator[RunningServer]:
    with serve_in_thread(engine, "tiny", api_key=KEY) as srv:
        yield srv


class _Checkable(_Misbehaving):
    """_Misbehaving whose /v1/models always answers, so that a pane can be
    set to any scenario and the failure comes with the reply."""

    def do_GET(self) -> None:
        if self.path.endswith("/v1/models"):
            self._send(200, json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode())
        else:
            super().do_GET()

    def do_POST(self) -> None:
        if self.path.split("/")[1] != "trickle":
            super().do_POST()
            return
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        # A reply that goes on far longer than the test: only a stop ends it.
        try:
            for _ in range(600):
                self.wfile.write(_chunk("la "))
                self.wfile.flush()
                time.sleep(0.05)
        except (BrokenPipeError, ConnectionResetError):
            pass


def _start(handler: type[http.server.BaseHTTPRequestHandler]) -> tuple[http.server.ThreadingHTTPServer, threading.Thread]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    return httpd, thread


def _stop(httpd: http.server.ThreadingHTTPServer, thread: threading.Thread) -> None:
    httpd.shutdown()
    httpd.server_close()
    thread.join()


@pytest.fixture(scope="module")
def bad_server() -> Iterator[str]:
    httpd, thread = _start(_Checkable)
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        _stop(httpd, thread)


def _workspace(engine: Engine, panes: int = 2) -> Workspace:
    """A workspace on its own engine (shutdown closes it), not the server's."""
    settings = Settings()
    settings.default_params = dataclasses.replace(SamplingParams(), temperature=0.0, max_tokens=MAX_TOKENS)
    workspace = Workspace(settings, engine=engine)
    for _ in range(panes):
        workspace.add_pane()
    return workspace


def test_a_pane_against_the_apps_own_server(engine: Engine, server: RunningServer, tiny_engine: Engine) -> None:
    expected = engine.generate_outputs([[{"role": "user", "content": PROMPT}]], temperature=0.0, max_tokens=MAX_TOKENS)[0]

    async def main() -> tuple[Workspace, list[WorkspaceEvent], Any]:
        workspace = _workspace(tiny_engine)
        local, remote = workspace.panes
        events: list[WorkspaceEvent] = []
        workspace.subscribe(events.append)
        backend = await workspace.set_remote(remote.id, server.base_url, "tiny", KEY)
        turn = await workspace.send(PROMPT)
        # The local pane alone makes the engine batch; the remote one is a request of its own.
        assert turn.pane_ids == [local.id, remote.id] and len(turn.request_ids) == 1
        assert remote.busy
        await turn.wait()
        await workspace.shutdown()
        return workspace, events, backend

    workspace, events, backend = asyncio.run(main())
    local, remote = workspace.panes
    assert remote.backend == "remote" and local.backend == "local"
    reply = remote.conversation.messages[-1]
    assert reply.state == "complete" and reply.error is None
    assert reply.text == expected.text == local.conversation.messages[-1].text
    assert reply.token_ids == [] and remote.conversation.kept_ids == []
    deltas = [e.text for e in events if isinstance(e, ReplyDelta) and e.pane_id == remote.id]
    assert "".join(deltas) == expected.text
    assert ReplyFinished(remote.id, 1) in events
    stats = reply.stats
    assert stats is not None and stats.finish_reason == expected.finish_reason
    assert stats.generated_tokens == len(expected.token_ids)
    assert stats.prompt_tokens == len(expected.prompt_token_ids)
    assert stats.ttft_s is not None and 0 < stats.ttft_s <= stats.elapsed_s
    # The key is kept for the requests but never shown.
    assert backend.api_key == KEY
    assert KEY not in repr(remote) and KEY not in str(backend)
    assert backend.host == server.base_url.split("/")[2]


def test_setting_a_pane_remote_checks_the_server(server: RunningServer, tiny_engine: Engine) -> None:
    with socket.socket() as s:  # free a moment ago, nobody listening now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def main() -> Workspace:
        workspace = _workspace(tiny_engine, panes=1)
        pane = workspace.panes[0]
        with pytest.raises(RemoteConnectionError, match="refused"):
            await workspace.set_remote(pane.id, f"http://127.0.0.1:{port}", "m")
        with pytest.raises(ModelNotServedError, match="tiny"):
            await workspace.set_remote(pane.id, server.base_url, "gpt-4o", KEY)
        assert pane.backend == "local" and pane.remote is None
        await workspace.set_remote(pane.id, server.base_url, "tiny", KEY)
        assert pane.conversation.context_limit == 0
        workspace.set_local(pane.id)
        assert pane.backend == "local" and pane.conversation.context_limit == tiny_engine.max_context
        await workspace.shutdown()
        return workspace

    asyncio.run(main())


@pytest.mark.parametrize(
    ("scenario", "message", "kept"),
    [
        ("refused", "connection was refused", ""),
        ("fail", "HTTP 500", ""),
        ("halfway", "stopped halfway", "Hello wor"),
    ],
)
def test_a_misbehaving_server_fails_only_its_pane(
    tiny_engine: Engine, bad_server: str, scenario: str, message: str, kept: str
) -> None:
    async def main() -> Workspace:
        workspace = _workspace(tiny_engine)
        remote = workspace.panes[1]
        if scenario == "refused":
            # The server passes the check, then goes away before the reply.
            httpd, thread = _start(_Checkable)
            await workspace.set_remote(remote.id, f"http://127.0.0.1:{httpd.server_address[1]}", "m")
            await asyncio.to_thread(_stop, httpd, thread)
        else:
            await workspace.set_remote(remote.id, f"{bad_server}/{scenario}/v1", "m")
        turn = await workspace.send(PROMPT)
        await turn.wait()
        # The app keeps going: the failed pane takes its next message.
        again = await workspace.send("and again", targets=[workspace.panes[0].id])
        await again.wait()
        await workspace.shutdown()
        return workspace

    workspace = asyncio.run(main())
    local, remote = workspace.panes
    failed = remote.conversation.messages[-1]
    assert failed.state == "error" and not remote.busy
    assert failed.error is not None and message in failed.error
    assert failed.text == kept
    assert [m.state for m in local.conversation.messages if m.role == "assistant"] == ["complete", "complete"]


def test_stopping_a_remote_pane(tiny_engine: Engine, bad_server: str) -> None:
    async def main() -> Workspace:
        workspace = _workspace(tiny_engine)
        local, remote = workspace.panes
        await workspace.set_remote(remote.id, f"{bad_server}/trickle/v1", "m")
        turn = await workspace.send(PROMPT)
        while "la la" not in remote.conversation.messages[-1].text:
            await asyncio.sleep(0.02)
        workspace.stop(remote.id)
        await turn.wait()
        await workspace.shutdown()
        return workspace

    workspace = asyncio.run(main())
    local, remote = workspace.panes
    reply = remote.conversation.messages[-1]
    assert reply.state == "stopped" and reply.error is None and not remote.busy
    assert reply.text.startswith("la la") and reply.stats is not None and reply.stats.finish_reason == "abort"
    assert local.conversation.messages[-1].state == "complete"


def test_stopping_a_remote_pane_before_its_request_is_sent(tiny_engine: Engine, bad_server: str) -> None:
    async def main() -> Workspace:
        workspace = _workspace(tiny_engine, panes=1)
        pane = workspace.panes[0]
        await workspace.set_remote(pane.id, f"{bad_server}/trickle/v1", "m")
        turn = await workspace.send(PROMPT)
        turn.stop()  # in the same loop turn: the reply's task has not run yet
        await turn.wait()
        await workspace.shutdown()
        return workspace

    pane = asyncio.run(main()).panes[0]
    assert pane.conversation.messages[-1].state == "stopped" and not pane.busy
