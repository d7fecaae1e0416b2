"""A document in a prompt, on a real engine (the tiny model): the same ids for every pane and
question, a broadcast computed once and its follow-ups served from the cache; and the OpenAI
server's `file` content parts, against a real server on 127.0.0.1: a PDF sent as a data URL
becomes the same user turn the window sends (engine.documents), and a bad part gets a 400
naming it."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine import SamplingParams
from engine.documents import Document, document_from_bytes, user_message_with_documents
from engine.entrypoints.openai.file_parts import MAX_FILE_PARTS
from engine.entrypoints.openai.server import serve_in_thread
from engine.llm import Engine
from tests.engine.document_files import pdf_bytes

PAGE_SIZE = 16
REPORT = pdf_bytes(["Quarterly report: revenue rose twelve percent.", "Costs fell by a third; staff grew."])


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[Engine]:
    with Engine(str(tiny_model_dir), device="cpu", dtype="float32", kv_pages=512, threads=1,
                max_context=2048, page_size=PAGE_SIZE) as eng:
        yield eng


@pytest.fixture(scope="module")
def http(engine: Engine) -> Iterator[httpx.Client]:
    with serve_in_thread(engine, "tiny") as server, httpx.Client(base_url=server.base_url, timeout=120) as client:
        yield client


def _report_of(sections: int) -> Document:
    text = "\n\n".join(f"## Section {i}\n\nIn quarter {i % 4 + 1} revenue moved {i * 7 % 23 - 6}% in region {i}, "
                       f"and the team names staff turnover as the main risk." for i in range(sections))
    return document_from_bytes("report.md", text.encode())


def test_same_document_gives_the_same_ids_and_questions_share_its_pages(engine: Engine) -> None:
    document = _report_of(3)

    def ids(question: str) -> list[int]:
        content = user_message_with_documents(question, [document])
        return engine.tokenizer.encode_chat([{"role": "user", "content": content}])

    q1, q2 = ids("Summarise it."), ids("What is the main risk?")
    assert ids("Summarise it.") == q1  # every pane on the model, every resend
    block = engine.tokenizer.encode(user_message_with_documents("", [document]))
    start = next(i for i in range(len(q1)) if q1[i:i + len(block)] == block)
    shared = next(i for i, (x, y) in enumerate(zip(q1, q2)) if x != y)
    assert shared >= start + len(block)  # every id of the document is a prefix-cache hit for the next question


def test_a_broadcast_document_is_computed_once_and_follow_ups_come_from_the_cache(engine: Engine) -> None:
    document = _report_of(40)  # about 1,500 tokens: the tiny model's context is 2,048
    messages = [{"role": "user", "content": user_message_with_documents("Summarise it.", [document])}]
    prompt = engine.tokenizer.encode_chat(messages)
    assert len(prompt) > 1200
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    engine.reset_prefix_cache()
    before = engine.stats().prompt_tokens_computed
    first = engine.generate_outputs([prompt] * 3, params)  # three panes at once
    # Once, but for the last page, which each other pane writes itself.
    assert engine.stats().prompt_tokens_computed - before <= len(prompt) + 2 * PAGE_SIZE
    assert sorted(o.metrics.cached_prompt_tokens for o in first)[1:] >= [len(prompt) - PAGE_SIZE] * 2
    follow_ups = [engine.tokenizer.encode_next_turn(prompt + o.token_ids, [
        *messages, {"role": "assistant", "content": o.text}, {"role": "user", "content": "What is the main risk?"}])
        for o in first]
    before = engine.stats().prompt_tokens_computed
    second = engine.generate_outputs(follow_ups, params)
    assert all(o.metrics.cached_prompt_tokens >= len(prompt) - PAGE_SIZE for o in second)
    assert engine.stats().prompt_tokens_computed - before < 3 * 64  # only the questions


def _file(name: str | None, data: bytes, media_type: str = "application/pdf") -> dict[str, Any]:
    file: dict[str, Any] = {"file_data": f"data:{media_type};base64,{base64.b64encode(data).decode()}"}
    if name is not None:
        file["filename"] = name
    return {"type": "file", "file": file}


def _chat(http: httpx.Client, content: Any, role: str = "user") -> httpx.Response:
    messages = [{"role": role, "content": content}]
    if role != "user":
        messages.append({"role": "user", "content": "Go on."})
    return http.post("/chat/completions", json={"model": "tiny", "messages": messages, "max_tokens": 1,
                                                "temperature": 0})


def test_file_parts_become_the_windows_user_turn_and_hit_the_cache(engine: Engine, http: httpx.Client) -> None:
    question = "What rose?"
    sent = _chat(http, [_file("report.pdf", REPORT), {"type": "text", "text": question}])
    assert sent.status_code == 200, sent.text
    report = document_from_bytes("report.pdf", REPORT)
    typed = _chat(http, user_message_with_documents(question, [report]))  # what the window sends
    assert typed.json()["usage"]["prompt_tokens"] == sent.json()["usage"]["prompt_tokens"]
    # The same document with another question: its ids are a prefix the cache holds.
    again = _chat(http, [_file("report.pdf", REPORT), {"type": "text", "text": "What fell?"}]).json()["usage"]
    block = engine.tokenizer.encode(user_message_with_documents("", [report]))
    # Whole pages are cached: all of the document's but the page it shares with the question.
    assert again["prompt_tokens_details"]["cached_tokens"] >= len(block) - PAGE_SIZE


def test_documents_come_first_in_order_and_a_name_follows_the_media_type(http: httpx.Client) -> None:
    notes, table = b"# Notes\n\nMeeting moved to Friday.\n", b"name,votes\nada,3\n"
    sent = _chat(http, [{"type": "text", "text": "Compare."}, _file("notes.md", notes, "text/markdown"),
                        _file(None, table, "text/csv")])
    documents = [document_from_bytes("notes.md", notes), document_from_bytes("document.csv", table)]
    typed = _chat(http, user_message_with_documents("Compare.", documents))
    assert sent.status_code == 200, sent.text
    assert typed.json()["usage"]["prompt_tokens"] == sent.json()["usage"]["prompt_tokens"]


@pytest.mark.parametrize(("content", "role", "param", "says"), [
    ([{"type": "file", "file": "report.pdf"}], "user", "messages[0].content[0].file", "must be an object"),
    ([{"type": "file", "file": {"file_id": "file-abc"}}], "user", "messages[0].content[0].file.file_id",
     "not supported"),
    ([{"type": "text", "text": "x"},
      {"type": "file", "file": {"filename": "a.pdf", "file_data": "data:application/pdf;base64,%%%"}}],
     "user", "messages[0].content[1].file.file_data", "not valid base64"),
    ([{"type": "file", "file": {"filename": "a.pdf", "file_data": "data:application/pdf,plain"}}], "user",
     "messages[0].content[0].file.file_data", "base64 data URL"),
    ([_file("junk.txt", bytes(range(256)), "text/plain")], "user", "messages[0].content[0]",
     "messages[0].content[0]: junk.txt holds binary data"),
    ([_file("report.pdf", REPORT)], "system", "messages[0].content[0].type", "user messages only"),
])
def test_a_bad_file_part_gets_a_400_naming_it(http: httpx.Client, content: Any, role: str, param: str,
                                              says: str) -> None:
    r = _chat(http, content, role)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and says in error["message"], error
    assert "\n" not in error["message"]


def test_too_many_file_parts_are_refused_before_any_is_read(http: httpx.Client) -> None:
    part = _file("notes.txt", b"hello", "text/plain")
    r = _chat(http, [part] * (MAX_FILE_PARTS + 1))
    assert r.status_code == 400 and r.json()["error"]["code"] == "array_above_max_length", r.text
