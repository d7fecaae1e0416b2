"""The remote-server client: against Tandem's own server over loopback (the
app as a client of itself), and against a small local HTTP server that
misbehaves on purpose."""

from __future__ import annotations

import asyncio
import gc
import http.server
import json
import socket
import sys
import threading
import time
import warnings
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from app.remote.openai_client import (
    ClientTimeouts,
    ModelNotServedError,
    OpenAIClient,
    RemoteAuthError,
    RemoteConnectionError,
    RemoteHTTPError,
    RemoteProtocolError,
    RemoteStreamError,
    RemoteTimeoutError,
    normalize_base_url,
    request_params,
)
from engine.llm import Engine
from engine.entrypoints.openai.server import RunningServer, serve_in_thread

MESSAGES = [{"role": "user", "content": "Hello there"}]


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[Engine]:
    # What the text says does not matter here, only that it arrives intact.
    with Engine(str(tiny_model_dir), device="cpu", dtype="float32", kv_pages=256) as eng:
        yield eng


@pytest.fixture(scope="module")
def server(engine: Engine) -> Iterator[RunningServer]:
    with serve_in_thread(engine, "tiny") as srv:
        yield srv


async def _collect(stream: Any) -> list[str]:
    return [delta async for delta in stream]


def _run_leaving_nothing_open(main: Callable[[], Awaitable[Any]]) -> Any:
    """Run main() as the window does, then fail if anything it opened was
    left for the garbage collector to close: an async generator of httpx
    finalized outside its task ("async generator ignored GeneratorExit",
    "cancel scope in a different task") or an unclosed socket
    (ResourceWarning). pytest would only report those as warnings, after the
    test passed.

    The window's loop (qasync) installs no async-generator hooks, so a
    generator left suspended is closed synchronously whenever it is
    collected, and one that must await while closing breaks; asyncio's own
    loop would hide that by closing it on a task of its own."""

    async def without_asyncgen_hooks() -> Any:
        sys.set_asyncgen_hooks(firstiter=None, finalizer=None)
        try:
            return await main()
        finally:
            gc.collect()  # while the loop still runs, as in the window

    ignored: list[Any] = []
    previous_hook = sys.unraisablehook
    sys.unraisablehook = ignored.append
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            result = asyncio.run(without_asyncgen_hooks())
            gc.collect()
    finally:
        sys.unraisablehook = previous_hook
    assert not ignored, [f"{u.exc_type.__name__}: {u.exc_value} in {u.object!r}" for u in ignored]
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)], [str(w.message) for w in caught]
    return result


def test_base_url_forms() -> None:
    assert normalize_base_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000/v1"
    assert normalize_base_url("127.0.0.1:8000/") == "http://127.0.0.1:8000/v1"
    assert normalize_base_url("https://host/api/v1/") == "https://host/api/v1"
    with pytest.raises(ValueError):
        normalize_base_url("ftp://host")


def test_request_params_from_engine_sampling_params() -> None:
    from engine.params import SamplingParams

    p = SamplingParams(temperature=0.3, top_p=0.9, max_tokens=20, seed=4, stop=("\n",), top_k=40, min_p=0.05)
    assert request_params(p) == {
        "temperature": 0.3, "top_p": 0.9, "max_tokens": 20, "seed": 4, "stop": ["\n"], "top_k": 40,
        "min_p": 0.05,
    }
    # Neutral values of options OpenAI itself does not know are not sent.
    neutral = SamplingParams(temperature=0.3, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0)
    assert not {"top_k", "min_p", "repetition_penalty"} & set(request_params(neutral))


def test_the_app_as_a_client_of_its_own_server(server: RunningServer, engine: Engine) -> None:
    expected = engine.generate_outputs([MESSAGES], temperature=0.0, max_tokens=12)[0]

    async def main() -> tuple[list[str], Any, list[str]]:
        async with OpenAIClient(server.base_url.removesuffix("/v1"), model="tiny") as client:
            models = await client.check()
            stream = client.stream_chat(MESSAGES, {"temperature": 0.0, "max_tokens": 12})
            deltas = await _collect(stream)
            return deltas, stream.stats, models

    deltas, stats, models = asyncio.run(main())
    assert models == ["tiny"]
    assert "".join(deltas) == expected.text
    assert stats.finish_reason == expected.finish_reason
    assert stats.completion_tokens == len(expected.token_ids)
    assert stats.prompt_tokens == len(expected.prompt_token_ids)
    assert stats.cached_prompt_tokens is not None
    assert stats.ttft_s is not None and 0 < stats.ttft_s <= stats.elapsed_s
    assert stats.tokens_per_s > 0


def test_stopping_a_stream_aborts_the_request_on_the_server(server: RunningServer, engine: Engine) -> None:
    limit = 2000  # nearly the tiny model's whole context: far more than the stream lives
    before = engine.stats().generated_tokens

    async def main() -> list[str]:
        async with OpenAIClient(server.base_url, model="tiny") as client:
            stream = client.stream_chat(MESSAGES, {"temperature": 0.0, "max_tokens": limit},
                                        extra={"ignore_eos": True})
            got = []
            async for delta in stream:
                got.append(delta)
                if len(got) == 3:
                    break
            await stream.aclose()
            return got

    assert len(asyncio.run(main())) == 3
    deadline = time.monotonic() + 60
    while engine.stats().pages_used and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.stats().pages_used == 0
    assert engine.stats().generated_tokens - before < limit


def test_unknown_model_names_what_is_served(server: RunningServer) -> None:
    async def main() -> None:
        async with OpenAIClient(server.base_url, model="gpt-4o") as client:
            await client.check()

    with pytest.raises(ModelNotServedError) as info:
        asyncio.run(main())
    assert info.value.available == ["tiny"]
    assert "tiny" in str(info.value) and "gpt-4o" in str(info.value)


def test_api_key(engine: Engine) -> None:
    async def check(key: str | None) -> list[str]:
        async with OpenAIClient(srv.base_url, model="tiny", api_key=key) as client:
            return await client.check()

    with serve_in_thread(engine, "tiny", api_key="k3y") as srv:
        for key in (None, "wrong"):
            with pytest.raises(RemoteAuthError) as info:
                asyncio.run(check(key))
            assert info.value.status == 401
            assert info.value.server_message  # the server's own words are kept
            assert "API key" in str(info.value)
        assert asyncio.run(check("k3y")) == ["tiny"]


def test_server_errors_in_the_request_keep_the_servers_message(server: RunningServer) -> None:
    async def main() -> None:
        async with OpenAIClient(server.base_url, model="tiny") as client:
            await _collect(client.stream_chat(MESSAGES, {"temperature": -1.0}))

    with pytest.raises(RemoteHTTPError) as info:
        asyncio.run(main())
    assert info.value.status == 400
    assert "temperature" in (info.value.server_message or "")
    assert "temperature" in str(info.value)


def test_connection_refused() -> None:
    with socket.socket() as s:  # a port that was free a moment ago, now with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def main() -> None:
        async with OpenAIClient(f"http://127.0.0.1:{port}/v1", model="m") as client:
            await client.check()

    with pytest.raises(RemoteConnectionError) as info:
        asyncio.run(main())
    assert "refused" in str(info.value)
    assert f"127.0.0.1:{port}" in str(info.value)

    async def stream() -> None:
        async with OpenAIClient(f"http://127.0.0.1:{port}/v1", model="m") as client:
            await _collect(client.stream_chat(MESSAGES))

    with pytest.raises(RemoteConnectionError):
        asyncio.run(stream())


# -- a server that misbehaves ----------------------------------------------------------


def _chunk(text: str, field: str = "content", finish: str | None = None) -> bytes:
    body = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": {field: text}, "finish_reason": finish}]}
    return f"data: {json.dumps(body)}\n\n".encode()


class _Misbehaving(http.server.BaseHTTPRequestHandler):
    """Each scenario lives under its own path prefix: /<scenario>/v1/..."""

    protocol_version = "HTTP/1.0"  # the body ends when the connection closes

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        scenario = self.path.split("/")[1]
        if scenario == "fail":
            self._send(500, json.dumps({"error": {"message": "database on fire", "type": "server_error"}}).encode())
        elif scenario == "html":
            self._send(200, b"<html><body>Welcome to my router</body></html>", "text/html")
        elif self.path.endswith("/v1/models"):
            self._send(200, json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode())
        else:
            self._send(404, b"not found", "text/plain")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        scenario = self.path.split("/")[1]
        if scenario == "fail":
            self._send(500, b"Internal Server Error", "text/plain")
            return
        if scenario == "slow":
            time.sleep(2.0)
            try:
                self._send(200, b"{}")
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up waiting, as it should
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        if scenario in ("reasoning_content", "reasoning"):
            # A reasoning model behind vLLM / llama.cpp (`reasoning_content`) or Ollama (`reasoning`).
            self.end_headers()
            self.wfile.write(_chunk("The user", scenario) + _chunk(" greets me.", scenario) + _chunk("Hello")
                             + _chunk("!", finish="stop") + b"data: [DONE]\n\n")
            return
        if scenario == "chunked":
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        first = _chunk("Hello") + _chunk(" wor")
        if scenario == "chunked":
            # One whole chunk, then the connection drops mid-body.
            self.wfile.write(f"{len(first):x}\r\n".encode() + first + b"\r\n")
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(first)
        if scenario == "error":
            self.wfile.write(b'data: {"error": {"message": "the model crashed", "type": "server_error"}}\n\n')
        self.wfile.flush()
        # "halfway": the connection closes with no finish_reason and no [DONE].


@pytest.fixture(scope="module")
def bad_server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Misbehaving)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def test_a_500_shows_the_servers_message(bad_server: str) -> None:
    async def main() -> None:
        async with OpenAIClient(f"{bad_server}/fail/v1", model="m") as client:
            await client.check()

    with pytest.raises(RemoteHTTPError) as info:
        asyncio.run(main())
    assert info.value.status == 500
    assert info.value.server_message == "database on fire"
    assert "HTTP 500" in str(info.value) and "database on fire" in str(info.value)


def test_a_500_on_a_stream(bad_server: str) -> None:
    async def main() -> None:
        async with OpenAIClient(f"{bad_server}/fail/v1", model="m") as client:
            await _collect(client.stream_chat(MESSAGES))

    with pytest.raises(RemoteHTTPError) as info:
        asyncio.run(main())
    assert info.value.status == 500
    assert info.value.server_message == "Internal Server Error"


def test_something_that_is_not_an_openai_server(bad_server: str) -> None:
    async def check(url: str) -> None:
        async with OpenAIClient(url, model="m") as client:
            await client.check()

    with pytest.raises(RemoteProtocolError, match="not with an OpenAI model list"):
        asyncio.run(check(f"{bad_server}/html/v1"))
    with pytest.raises(RemoteProtocolError, match="/v1"):
        asyncio.run(check(f"{bad_server}/elsewhere/api"))


@pytest.mark.parametrize("scenario", ["halfway", "chunked"])
def test_a_stream_that_stops_halfway(bad_server: str, scenario: str) -> None:
    async def main() -> tuple[list[str], BaseException | None, list[str]]:
        async with OpenAIClient(f"{bad_server}/{scenario}/v1", model="m") as client:
            got: list[str] = []
            error = None
            try:
                async for delta in client.stream_chat(MESSAGES):
                    got.append(delta)
            except RemoteStreamError as exc:
                error = exc
            # The client is still usable afterwards.
            return got, error, await client.check()

    got, error, models = asyncio.run(main())
    assert got == ["Hello", " wor"]  # what arrived is kept
    assert isinstance(error, RemoteStreamError)
    assert "broke off" in str(error) or "stopped halfway" in str(error)
    assert models == ["m"]


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_reasoning_sent_apart_arrives_as_a_think_block(bad_server: str, field: str) -> None:
    from app.workspace.messages import Message

    async def main() -> list[str]:
        async with OpenAIClient(f"{bad_server}/{field}/v1", model="m") as client:
            return [delta async for delta in client.stream_chat(MESSAGES)]

    deltas = asyncio.run(main())
    assert "".join(deltas) == "<think>The user greets me.</think>Hello!"
    parts = Message(role="assistant", text="".join(deltas)).parts
    assert (parts.reasoning, parts.answer) == ("The user greets me.", "Hello!")


def test_an_error_event_in_the_stream(bad_server: str) -> None:
    async def main() -> list[str]:
        got: list[str] = []
        async with OpenAIClient(f"{bad_server}/error/v1", model="m") as client:
            async for delta in client.stream_chat(MESSAGES):
                got.append(delta)
        return got

    with pytest.raises(RemoteStreamError, match="the model crashed"):
        asyncio.run(main())


def test_a_server_that_does_not_answer_in_time(bad_server: str) -> None:
    async def main() -> None:
        timeouts = ClientTimeouts(connect=5.0, read=0.3)
        async with OpenAIClient(f"{bad_server}/slow/v1", model="m", timeout=timeouts) as client:
            await _collect(client.stream_chat(MESSAGES))

    with pytest.raises(RemoteTimeoutError, match="did not answer in time"):
        asyncio.run(main())


# -- nothing left open ----------------------------------------------------------------


def test_a_finished_stream_leaves_nothing_open(server: RunningServer) -> None:
    async def main() -> tuple[str, str | None]:
        async with OpenAIClient(server.base_url, model="tiny") as client:
            # Twice on one client: a stream read to its end leaves its connection reusable.
            for _ in range(2):
                stream = client.stream_chat(MESSAGES, {"temperature": 0.0, "max_tokens": 4})
                text = "".join(await _collect(stream))
        return text, stream.stats.finish_reason

    text, finish = _run_leaving_nothing_open(main)
    assert text and finish == "length"


def test_a_stopped_stream_leaves_nothing_open(server: RunningServer, engine: Engine) -> None:
    async def main() -> int:
        async with OpenAIClient(server.base_url, model="tiny") as client:
            stream = client.stream_chat(MESSAGES, {"temperature": 0.0, "max_tokens": 500},
                                        extra={"ignore_eos": True})
            got = 0
            async for _ in stream:
                got += 1
                if got == 2:
                    break
            await stream.aclose()
            # A task cancelled mid-stream (the pane's stop button) closes it the same way.
            stream = client.stream_chat(MESSAGES, {"temperature": 0.0, "max_tokens": 500},
                                        extra={"ignore_eos": True})
            started = asyncio.Event()

            async def pump() -> None:
                async for _ in stream:
                    started.set()

            task = asyncio.create_task(pump())
            await started.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await stream.aclose()
            return got

    assert _run_leaving_nothing_open(main) == 2
    deadline = time.monotonic() + 60
    while engine.stats().pages_used and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.stats().pages_used == 0


@pytest.mark.parametrize("scenario", ["error", "halfway"])
def test_a_failed_stream_leaves_nothing_open(bad_server: str, scenario: str) -> None:
    async def main() -> None:
        async with OpenAIClient(f"{bad_server}/{scenario}/v1", model="m") as client:
            with pytest.raises(RemoteStreamError):
                await _collect(client.stream_chat(MESSAGES))

    _run_leaving_nothing_open(main)
