"""The app's own server: real tiny engines served on loopback, driven by the
official `openai` client as another program on the machine would."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from app.errors import AppError
from app.remote.local_server import LocalServer, LocalServerError, PortInUseError
from engine.llm import Engine

HI = [{"role": "user", "content": "Hello there"}]


def _engine(tiny_model_dir: Path) -> Engine:
    return Engine(str(tiny_model_dir), device="cpu", dtype="float32", kv_pages=256, threads=1)


@pytest.fixture(scope="module")
def first(tiny_model_dir: Path) -> Iterator[Engine]:
    with _engine(tiny_model_dir) as eng:
        yield eng


@pytest.fixture(scope="module")
def second(tiny_model_dir: Path) -> Iterator[Engine]:
    with _engine(tiny_model_dir) as eng:
        yield eng


@pytest.fixture()
def server() -> Iterator[LocalServer]:
    srv = LocalServer(where="Settings > Server")
    yield srv
    srv.stop()


def _client(url: str, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=60)


def _wait_for_idle(engine: Engine, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while engine.stats().pages_used and time.monotonic() < deadline:
        time.sleep(0.02)
    return engine.stats().pages_used


def test_serves_the_apps_engines_and_follows_loads_and_unloads(
    server: LocalServer, first: Engine, second: Engine
) -> None:
    assert not server.running and server.url is None
    url = server.start({"default": first})
    assert server.running and server.url == url
    assert url == f"http://127.0.0.1:{server.port}/v1" and server.port
    assert not server.api_key_required

    expected = first.generate_outputs([HI], temperature=0.0, max_tokens=8)[0]
    with _client(url) as client:
        assert [m.id for m in client.models.list().data] == ["default"]
        chunks = list(client.chat.completions.create(
            model="default", messages=HI, temperature=0, max_tokens=8, stream=True,
            stream_options={"include_usage": True},
        ))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected.text
        assert chunks[-1].usage.completion_tokens == len(expected.token_ids)

        # The app loads a second model: served under its id, on its own engine.
        server.set_engines({"default": first, "my-qwen": second})
        assert [m.id for m in client.models.list().data] == ["default", "my-qwen"]
        assert server.model_ids == ["default", "my-qwen"]
        before = (first.stats().generated_tokens, second.stats().generated_tokens)
        reply = client.chat.completions.create(model="my-qwen", messages=HI, temperature=0, max_tokens=3)
        assert reply.model == "my-qwen" and reply.usage.completion_tokens == 3
        assert first.stats().generated_tokens == before[0]
        assert second.stats().generated_tokens == before[1] + 3

        # ...and unloads it: a 404 with OpenAI's error body, naming what is served.
        server.set_engines({"default": first})
        with pytest.raises(openai.NotFoundError) as info:
            client.chat.completions.create(model="my-qwen", messages=HI, max_tokens=2)
        assert info.value.body["code"] == "model_not_found"
    r = httpx.post(f"{url}/chat/completions", json={"model": "my-qwen", "messages": HI})
    assert r.status_code == 404
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == "model"
    assert "'my-qwen'" in error["message"] and "'default'" in error["message"]


def test_stop_is_quick_cuts_open_streams_and_frees_the_port(server: LocalServer, first: Engine) -> None:
    url = server.start({"default": first})
    port = server.port
    with _client(url) as client:
        stream = client.chat.completions.create(
            model="default", messages=HI, temperature=0, max_tokens=1900, stream=True,
            extra_body={"ignore_eos": True},
        )
        chunks = iter(stream)
        next(chunks)
        started = time.monotonic()
        server.stop()
        # About a second of grace for the open stream, not the minute it would take to finish.
        assert time.monotonic() - started < 3.0
        assert not server.running and server.url is None and server.port is None
        with pytest.raises((openai.APIError, httpx.HTTPError)):
            for _ in chunks:
                pass
    assert _wait_for_idle(first) == 0  # the cut-off request was aborted
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/models")

    server.stop()  # stopping twice is harmless
    # The same port right away, as a user toggling the server off and on would.
    assert server.start({"default": first}, port=port) == url
    with _client(url) as client:
        assert [m.id for m in client.models.list().data] == ["default"]


def test_a_port_in_use_says_so(server: LocalServer, first: Engine) -> None:
    with socket.socket() as other:  # another program, listening
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(PortInUseError) as info:
            server.start({"default": first}, port=port)
        assert isinstance(info.value, AppError)
        assert str(info.value).startswith(f"Port {port} is in use by another program; choose another port in "
                                          "Settings > Server")
        assert info.value.port == port
        assert not server.running
        # Nothing was left half-started: another port works.
        assert server.start({"default": first}, port=0) != f"http://127.0.0.1:{port}/v1"
    assert server.running


@pytest.mark.parametrize(("host", "port", "words"), [
    ("127.0.0.1", 70000, "is not a port number"),
    ("192.0.2.1", 0, "is not an address of this computer"),  # TEST-NET-1: never a local address
    ("no-such-host.invalid", 0, "is not an address this computer knows"),
])
def test_unusable_addresses_say_what_to_do(
    server: LocalServer, first: Engine, host: str, port: int, words: str
) -> None:
    with pytest.raises(LocalServerError, match=words):
        server.start({"default": first}, host=host, port=port)
    assert not server.running


def test_the_api_key_is_enforced(server: LocalServer, first: Engine) -> None:
    url = server.start({"default": first}, api_key="s3cret")
    assert server.api_key_required
    for key in ("wrong", ""):
        with _client(url, key or "none") as bad, pytest.raises(openai.AuthenticationError):
            bad.models.list()
    assert httpx.get(f"{url}/models").status_code == 401
    with _client(url, "s3cret") as good:
        reply = good.chat.completions.create(model="default", messages=HI, temperature=0, max_tokens=2)
        assert reply.usage.completion_tokens == 2


def test_starting_twice_is_a_programming_error(server: LocalServer, first: Engine) -> None:
    server.start({"default": first})
    with pytest.raises(RuntimeError, match="already running"):
        server.start({"default": first})


def test_the_windows_server_has_the_gate(server: LocalServer, first: Engine) -> None:
    url = server.start({"default": first})
    # Its own clients (no Origin, a loopback Host) pass; a rebinding page and a foreign origin do not.
    assert httpx.get(f"{url}/models").status_code == 200
    r = httpx.get(f"{url}/models", headers={"Host": "attacker.example"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed"
    r = httpx.post(f"{url}/chat/completions", json={"model": "default", "messages": HI},
                   headers={"Origin": "https://evil.example"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
    r = httpx.post(f"{url}/chat/completions", content=b'{"model": "default"}', headers={"Content-Type": "text/plain"})
    assert r.status_code == 415


def test_serving_beyond_loopback_needs_a_key(server: LocalServer, first: Engine) -> None:
    with pytest.raises(LocalServerError, match="without a key; set an API key in Settings > Server"):
        server.start({"default": first}, host="0.0.0.0")
    assert not server.running
    server.start({"default": first}, host="0.0.0.0", api_key="s3cret", allowed_hosts=["myhost.lan"])
    local = f"http://127.0.0.1:{server.port}/v1"
    auth = {"Authorization": "Bearer s3cret"}
    assert httpx.get(f"{local}/models", headers=auth).status_code == 200
    assert httpx.get(f"{local}/models", headers={**auth, "Host": "myhost.lan:1"}).status_code == 200
    assert httpx.get(f"{local}/models", headers={**auth, "Host": "other.lan"}).status_code == 403
    server.stop()
    with pytest.raises(LocalServerError, match="expected an origin"):
        server.start({"default": first}, allowed_origins=["app.example"])
    assert not server.running


def test_the_apps_models_are_served_by_their_shown_names_with_their_ids_as_aliases(
    server: LocalServer, first: Engine, second: Engine
) -> None:
    from app.remote.local_server import served_mapping

    names = {"default": "SmolLM2-135M-Instruct", "qwen": "Qwen2.5 0.5B", "/models/qwen-copy": "Qwen2.5 0.5B"}
    loaded = {"qwen": second, "default": first}
    engines, aliases = served_mapping(loaded, names.__getitem__, "default")
    assert list(engines) == ["smollm2-135m-instruct", "qwen2.5-0.5b"]  # the default model first
    assert aliases == {"default": "smollm2-135m-instruct", "qwen": "qwen2.5-0.5b"}
    same_name, _ = served_mapping({"qwen": second, "/models/qwen-copy": first}, names.__getitem__)
    assert list(same_name) == ["qwen2.5-0.5b", "qwen2.5-0.5b-2"]

    url = server.start(engines, aliases=aliases)
    with _client(url) as client:
        assert [m.id for m in client.models.list().data] == ["smollm2-135m-instruct", "qwen2.5-0.5b"]
        for asked in ("SmolLM2-135M-Instruct", "default", "qwen", "Qwen2.5 0.5B"):
            reply = client.chat.completions.create(model=asked, messages=HI, temperature=0, max_tokens=2)
            assert reply.model == asked and reply.choices
        server.set_engines({"qwen2.5-0.5b": second}, {"qwen": "qwen2.5-0.5b"})
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=HI, max_tokens=2)
        # `default` reaches the first model served when no model has that id.
        assert client.chat.completions.create(model="default", messages=HI, max_tokens=2).choices


def test_new_api_keys_are_long_and_random() -> None:
    from app.remote.local_server import new_api_key

    keys = {new_api_key() for _ in range(20)}
    assert len(keys) == 20 and all(k.startswith("tandem-") and len(k) >= 38 for k in keys)
