"""Clients that attack the server itself, against a real server on 127.0.0.1,
with /health timed while each attack runs.

Slowloris (connections that never finish a request head, past the file-descriptor
limit), a body that trickles in, request framing that a proxy could read another
way, bodies whose decoding once held the event loop for seconds (16 M token ids,
a 30 MB model name, thousands of 4,300-digit numbers), and requests asking for
unbounded work (prompts x n, stop strings, messages, content parts). Limits are
the modules' constants, made small here where the real ones would make a test slow.
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.entrypoints.openai import connections, protocol, request_body
from engine.entrypoints.openai.server import MAX_BODY_BYTES, RunningServer, serve_in_thread
from engine.llm import Engine

REPO_ROOT = Path(__file__).resolve().parents[2]
HI = [{"role": "user", "content": "Hi"}]
JSON = {"Content-Type": "application/json"}
# How long /health may take while an attack runs (a quiet machine answers in milliseconds).
HEALTH_BOUND_S = 2.0


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[Engine]:
    with Engine(str(tiny_model_dir), device="cpu", dtype="float32", kv_pages=1024, threads=1,
                max_context=64) as eng:
        yield eng


@pytest.fixture(scope="module")
def server(engine: Engine) -> Iterator[RunningServer]:
    with serve_in_thread(engine, "tiny") as srv:
        yield srv


def _root(server: RunningServer) -> str:
    return server.base_url.removesuffix("/v1")


def _assert_error(r: httpx.Response, status: int, code: str, param: str | None = None) -> str:
    assert r.status_code == status, r.text[:500]
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code and error["param"] == param, error
    assert len(r.content) < 2_000  # nothing of a huge input is echoed back
    return error["message"]


def _health_while(server: RunningServer, attack: Callable[[], Any]) -> tuple[Any, float]:
    """What `attack()` returns, run on a thread, and the longest /health took meanwhile."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = attack()
        except BaseException as exc:  # re-raised below, on the test's thread
            result["error"] = exc

    thread = threading.Thread(target=run)
    waits: list[float] = []
    with httpx.Client() as client:
        thread.start()
        while thread.is_alive() or not waits:
            started = time.monotonic()
            assert client.get(f"{_root(server)}/health", timeout=30).status_code == 200
            waits.append(time.monotonic() - started)
            time.sleep(0.02)
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"], max(waits)


def _post(server: RunningServer, endpoint: str, raw: bytes) -> httpx.Response:
    return httpx.post(f"{server.base_url}/{endpoint}", content=raw, headers=JSON, timeout=60)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _connect(port: int, head: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(head)
    return sock


def _read_until_closed(sock: socket.socket, within_s: float) -> tuple[bytes, bool]:
    """What the server sent on `sock` within `within_s`, and whether it closed the connection."""
    data = b""
    deadline = time.monotonic() + within_s
    sock.setblocking(False)
    while (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select([sock], [], [], left)
        if not readable:
            break
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data, True
        if not chunk:
            return data, True
        data += chunk
    return data, False


# -- slowloris -------------------------------------------------------------------------------

PARTIAL_HEAD = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


def test_unfinished_request_heads_never_lock_clients_out(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connections, "MAX_CONNECTIONS", 40)
    # As the attack was found: open to the network, with a key the attacker does not have.
    with serve_in_thread(engine, "tiny", host="0.0.0.0", api_key="k") as srv:
        before = _open_fds()
        attackers = [_connect(srv.port, PARTIAL_HEAD) for _ in range(80)]
        try:
            started = time.monotonic()
            r = httpx.get(f"http://127.0.0.1:{srv.port}/health", timeout=10)
            assert r.status_code == 200 and time.monotonic() - started < HEALTH_BOUND_S
            r = httpx.get(f"http://127.0.0.1:{srv.port}/v1/models", headers={"Authorization": "Bearer k"},
                          timeout=10)
            assert r.status_code == 200
            # The server holds at most its limit: 80 sockets here, at most 40 there (a
            # server without a limit held all 80), having let go of the oldest.
            assert _open_fds() - before <= 80 + 40 + 4
            let_go = [_read_until_closed(sock, 2.0) for sock in attackers[:40]]
            assert let_go == [(b"", True)] * 40
        finally:
            for sock in attackers:
                sock.close()


def test_a_request_head_must_arrive_in_time(server: RunningServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connections, "REQUEST_HEAD_TIMEOUT_S", 0.5)
    idle = [_connect(server.port, b"") for _ in range(2)]
    slow = [_connect(server.port, PARTIAL_HEAD) for _ in range(3)]
    try:
        time.sleep(0.3)
        for sock in slow:  # a byte now and then does not keep a connection open
            sock.sendall(b"x")
        answers = [_read_until_closed(sock, 0.5 + 2.0) for sock in idle + slow]
    finally:
        for sock in idle + slow:
            sock.close()
    # Partial heads learn why; idle connections are closed as a keep-alive one is.
    assert answers[:2] == [(b"", True)] * 2
    for data, closed in answers[2:]:
        assert closed and data.startswith(b"HTTP/1.1 408 ") and b'"code": "request_timeout"' in data
    # And a connection that asks in time is answered as ever.
    assert httpx.get(f"{_root(server)}/health", timeout=10).status_code == 200


def test_a_full_server_refuses_new_connections_with_a_503(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connections, "MAX_CONNECTIONS", 2)
    monkeypatch.setattr(request_body, "BODY_TIMEOUT_S", 5.0)
    with serve_in_thread(engine, "tiny") as srv:
        # Two requests being answered (their bodies still coming) cannot be let go.
        head = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100\r\n\r\n{")
        busy = [_connect(srv.port, head) for _ in range(2)]
        try:
            time.sleep(0.2)
            r = httpx.get(f"{srv.base_url}/models", timeout=10)
            _assert_error(r, 503, "too_many_connections")
        finally:
            for sock in busy:
                sock.close()
        # Once they are gone, the server answers again.
        deadline = time.monotonic() + 5
        while httpx.get(f"{srv.base_url}/models", timeout=10).status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)


# The server alone (no model: /health needs none), as `serve` and the window run it,
# in a process of its own so that its file-descriptor limit is its own.
_SERVER_UNDER_FD_LIMIT = """
import resource, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[1])))
from engine.entrypoints.openai.server import ServedModels, serve_in_thread
server = serve_in_thread(ServedModels(), host="0.0.0.0", api_key="k")
print(server.port, flush=True)
time.sleep(120)
"""


def test_more_unfinished_requests_than_file_descriptors_never_lock_clients_out(tmp_path: Path) -> None:
    # The attack as found: 1,100 connections against 1,024 descriptors; here 300 against 256.
    log = tmp_path / "server.log"
    with log.open("w") as stderr:
        proc = subprocess.Popen([sys.executable, "-c", _SERVER_UNDER_FD_LIMIT, "256"], stdout=subprocess.PIPE,
                                stderr=stderr, text=True, cwd=REPO_ROOT)
    attackers: list[socket.socket] = []
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        for _ in range(300):
            attackers.append(_connect(port, PARTIAL_HEAD))
        for _ in range(3):
            started = time.monotonic()
            r = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10)
            assert r.status_code == 200 and time.monotonic() - started < HEALTH_BOUND_S
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": "Bearer k"},
                         timeout=10).status_code == 200
        assert proc.poll() is None
    finally:
        for sock in attackers:
            sock.close()
        proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
    # Not even for a moment: asyncio logs each accept() that fails for want of a descriptor.
    assert "Too many open files" not in log.read_text()


def test_a_trickling_body_is_answered_408(server: RunningServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(request_body, "BODY_TIMEOUT_S", 0.5)
    sock = _connect(server.port, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                 b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\"")
    with sock:
        data, _ = _read_until_closed(sock, 3.0)
    assert data.startswith(b"HTTP/1.1 408 "), data[:200]
    assert b"request_timeout" in data


# -- framing ---------------------------------------------------------------------------------


def test_a_request_framed_two_ways_is_refused_and_its_connection_closed(server: RunningServer, engine: Engine) -> None:
    body = json.dumps({"model": "tiny", "prompt": "Hi", "max_tokens": 1}).encode()
    smuggled = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    before = engine.stats().generated_tokens
    request = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"
               % (len(body), len(body), body))
    with _connect(server.port, request + smuggled) as sock:
        data, closed = _read_until_closed(sock, 3.0)
    assert closed, "the connection stayed open after an ambiguously framed request"
    assert data.count(b"HTTP/1.1 ") == 1, data  # the pipelined request got no answer
    assert data.startswith(b"HTTP/1.1 400 ") and b"invalid_framing" in data
    assert engine.stats().generated_tokens == before
    # Pipelining itself still works.
    plain = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    last = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    with _connect(server.port, plain + last) as sock:
        data, closed = _read_until_closed(sock, 3.0)
    assert closed and data.count(b"HTTP/1.1 200 ") == 2


# -- decoding off the event loop ---------------------------------------------------------------


def _token_ids_body(count: int) -> bytes:
    return b'{"model": "tiny", "max_tokens": 1, "prompt": [' + b"1," * (count - 1) + b"1]}"


# Built when their test runs: together they are 120 MB.
_SLOW_BODIES: dict[str, Callable[[], bytes]] = {
    # 16 M token ids: held the loop 13.3 s before it was refused for length.
    "token ids": lambda: _token_ids_body(16_000_000),
    # A 30 MB model name: 1.4-3.2 s, then a 404 quoting all of it.
    "model name": lambda: b'{"model": "' + b"x" * (30 << 20) + b'", "prompt": "Hi"}',
    # 7,000 numbers of 4,300 digits (Python's limit): 1.2 s of conversions.
    "long numbers": lambda: b'{"model": "tiny", "prompt": [' + b",".join([b"1" * 4300] * 7000) + b"]}",
    # 10 M empty arrays: 6 s to build.
    "empty arrays": lambda: b'{"model": "tiny", "prompt": [' + b"[]," * 10_000_000 + b"[]]}",
}


@pytest.mark.parametrize("what, code, param", [
    ("token ids", "request_too_large", None),
    ("model name", "string_above_max_length", "model"),
    ("long numbers", "invalid_json", None),
    ("empty arrays", "request_too_large", None),
])
def test_bodies_that_are_slow_to_decode_are_refused_while_health_answers(
    server: RunningServer, engine: Engine, what: str, code: str, param: str | None
) -> None:
    raw = _SLOW_BODIES[what]()
    assert len(raw) < MAX_BODY_BYTES
    r, slowest = _health_while(server, lambda: _post(server, "completions", raw))
    assert slowest < HEALTH_BOUND_S, (what, slowest)
    message = _assert_error(r, 400, code, param)
    if code == "request_too_large":
        assert f"{request_body.MAX_JSON_ITEMS:,}" in message
    assert engine.stats().pages_used == 0


def test_the_item_bound_leaves_room_for_a_batch_of_long_token_id_prompts(server: RunningServer) -> None:
    ids = [1] * 2000
    r = _post(server, "completions", json.dumps({"model": "tiny", "prompt": [ids] * 128, "max_tokens": 1}).encode())
    _assert_error(r, 400, "context_length_exceeded", "prompt")  # decoded and checked: too long for 64


# -- work per request ------------------------------------------------------------------------

_LIMITS = [
    # 400 one-token prompts x n=128 kept the engine busy 566 s.
    ("completions", {"prompt": ["a"] * 400, "n": 128}, "n", "128"),
    ("completions", {"prompt": ["a"] * 129}, "prompt", "128"),
    ("completions", {"prompt": ["a", "b"], "n": 65}, "n", "128"),
    # 250 k stop strings took 164 s, on the engine thread every client shares.
    ("chat/completions", {"stop": [f"s{i}" for i in range(protocol.MAX_STOP_SEQUENCES + 1)]}, "stop", "16"),
    ("chat/completions", {"stop": ["x" * (protocol.MAX_STOP_CHARS + 1)]}, "stop", "256"),
    ("completions", {"stop": [f"s{i}" for i in range(250_000)]}, "stop", "16"),
    ("chat/completions", {"logit_bias": {str(i): 1 for i in range(1000)}}, "logit_bias", "not supported"),
    ("chat/completions", {"messages": [{"role": "user", "content": ""}] * (protocol.MAX_MESSAGES + 1)},
     "messages", "4,096"),
    # 150 k empty messages once reached the chat template's limits: a 500.
    ("chat/completions", {"messages": [{"role": "user", "content": ""}] * 150_000}, None, "262,144"),
    ("chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 257}]},
     "messages[0].content", "256"),
    ("chat/completions", {"model": "m" * (protocol.MAX_MODEL_CHARS + 1)}, "model", "512"),
]


@pytest.mark.parametrize("endpoint, fields, param, limit", _LIMITS)
def test_work_per_request_is_bounded_with_a_400_naming_the_field_and_the_limit(
    server: RunningServer, engine: Engine, endpoint: str, fields: dict[str, Any], param: str | None, limit: str
) -> None:
    body = {"model": "tiny", "max_tokens": 1, **({"messages": HI} if endpoint.startswith("chat") else {"prompt": "Hi"}),
            **fields}
    before = engine.stats().generated_tokens
    r = _post(server, endpoint, json.dumps(body).encode())
    assert r.status_code == 400, r.text[:300]
    error = r.json()["error"]
    assert error["param"] == param and limit in error["message"], error
    assert engine.stats().generated_tokens == before


def test_requests_at_the_limits_are_served(server: RunningServer) -> None:
    stops = [chr(0x4E00 + i) * protocol.MAX_STOP_CHARS for i in range(protocol.MAX_STOP_SEQUENCES)]
    r = _post(server, "chat/completions", json.dumps(
        {"model": "tiny", "messages": HI, "max_tokens": 4, "stop": stops}).encode())
    assert r.status_code == 200, r.text
    r = _post(server, "completions", json.dumps(
        {"model": "tiny", "prompt": ["a", "b"], "n": protocol.MAX_CHOICES // 2, "max_tokens": 1}).encode())
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == protocol.MAX_CHOICES


def test_the_most_messages_allowed_render_without_a_server_error(server: RunningServer) -> None:
    messages = [{"role": "user", "content": ""}] * protocol.MAX_MESSAGES
    r = _post(server, "chat/completions", json.dumps({"model": "tiny", "messages": messages}).encode())
    # Rendered by the model's template, then too long for a context of 64 tokens.
    _assert_error(r, 400, "context_length_exceeded", "messages")
