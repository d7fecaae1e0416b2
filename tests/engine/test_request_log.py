"""The server's request log: one record per answered request, read from the
real answers of a real server on loopback (a tiny random-weight engine)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from engine.entrypoints.openai.request_log import RequestRecord
from engine.entrypoints.openai.server import RunningServer, bind, create_app
from engine.llm import Engine


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> Iterator[Engine]:
    with Engine(str(tiny_model_dir), device="cpu", dtype="float32", kv_pages=256, threads=1) as eng:
        yield eng


def _wait_for(records: list[RequestRecord], count: int) -> None:
    deadline = time.monotonic() + 10
    while len(records) < count and time.monotonic() < deadline:
        time.sleep(0.01)


def test_each_answer_is_logged_with_its_model_tokens_and_status(tiny: Engine) -> None:
    records: list[RequestRecord] = []
    app = create_app({"tiny-model": tiny}, on_request=records.append)
    started = time.time()
    with RunningServer(app, bind()) as server, \
            openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=60) as client:
        reply = client.chat.completions.create(
            model="Tiny-Model", messages=[{"role": "user", "content": "Hi"}], temperature=0, max_tokens=3,
            extra_body={"ignore_eos": True})
        _wait_for(records, 1)
        (answer,) = records
        assert answer.method == "POST" and answer.path == "/v1/chat/completions"
        assert answer.status == 200 and answer.model == "Tiny-Model"
        assert answer.prompt_tokens == reply.usage.prompt_tokens > 0
        assert answer.completion_tokens == 3 and answer.tokens_exact
        assert started <= answer.started <= time.time() and answer.duration_s > 0

        # A stream without a usage chunk: its text chunks are counted.
        stream = client.completions.create(model="tiny-model", prompt="Once", max_tokens=4, temperature=0,
                                           stream=True, extra_body={"ignore_eos": True})
        text = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
        _wait_for(records, 2)
        streamed = records[1]
        assert streamed.status == 200 and streamed.model == "tiny-model" and text
        assert 1 <= streamed.completion_tokens <= 4 and not streamed.tokens_exact

        # With the usage chunk the count is exact.
        stream = client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0,
            stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        list(stream)
        _wait_for(records, 3)
        assert records[2].completion_tokens == 4 and records[2].tokens_exact and records[2].model == "default"

        # Refusals are logged too: an unknown model, and the gate's.
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "Hi"}])
        refused = httpx.get(f"{server.base_url}/models", headers={"Host": "evil.example"})
        _wait_for(records, 5)
        assert (records[3].status, records[3].model, records[3].completion_tokens) == (404, "nope", None)
        assert records[4].status == refused.status_code == 403 and records[4].model is None


def test_a_failing_callback_does_not_break_the_answer(tiny: Engine) -> None:
    def broken(record: RequestRecord) -> None:
        raise RuntimeError("the log's owner has a bug")

    app = create_app(tiny, "tiny", on_request=broken)
    with RunningServer(app, bind()) as server:
        assert httpx.get(f"{server.base_url}/models").status_code == 200
