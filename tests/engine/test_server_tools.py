"""Structured output and tools through the server, driven by the official
`openai` client over loopback against the default model: `parse` with a
Pydantic model, `response_format` json_schema streamed and not, tools with
tool_choice auto / required / named (the grammar makes even a 135M model's
call valid), calls streamed as deltas, a full round trip, and hostile tool
sets and schemas refused with a 400 that names the field."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any, Literal

import httpx
import openai
import pytest
from pydantic import BaseModel, ConfigDict, Field

from engine.entrypoints.openai import responses
from engine.entrypoints.openai.server import RunningServer
from engine.model.tool_calls import FORMATS
from tests.engine.test_server import engine, model, server  # noqa: F401 - the default model, served


class Person(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a strict schema: no properties beyond these

    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=120)


class Weather(BaseModel):
    city: str = Field(max_length=12)
    unit: Literal["C", "F"]


class Time(BaseModel):
    zone: Literal["UTC", "CET", "PST"]


# The official client's helper: strict schemas (no properties beyond these).
TOOLS = [openai.pydantic_function_tool(Weather, name="get_weather", description="The weather in a city"),
         openai.pydantic_function_tool(Time, name="get_time", description="The time in a zone")]
ARGUMENTS = {"get_weather": Weather, "get_time": Time}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
# Few tokens per call: the machine running the suite may be a busy laptop CPU.
CALL_TOKENS = 40


@pytest.fixture(scope="module")
def client(server: RunningServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=300) as c:
        yield c


# Every call the tests below look at, sent at once: the engine decodes them as one
# batch, which costs a CPU little more than one of them.
def _calls(model: str) -> dict[str, Callable[[openai.OpenAI], Any]]:
    weather = {"type": "function", "function": {"name": "get_weather"}}
    return {
        "parse": lambda c: c.chat.completions.parse(
            model=model, messages=[{"role": "user", "content": "Invent a person."}], response_format=Person,
            max_tokens=CALL_TOKENS, temperature=0),
        "schema_stream": lambda c: list(c.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Another person, please."}],
            response_format={"type": "json_schema", "json_schema": {
                "name": "person", "schema": Person.model_json_schema(), "strict": True}},
            max_tokens=CALL_TOKENS, temperature=0.7, seed=3, stream=True)),
        "required": lambda c: c.chat.completions.create(
            model=model, messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
            max_tokens=CALL_TOKENS, temperature=0),
        "named_stream": lambda c: list(c.chat.completions.create(
            model=model, messages=ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}},
            max_tokens=CALL_TOKENS, temperature=1.0, seed=1, stream=True)),
        "auto": lambda c: c.chat.completions.create(
            model=model, messages=ASK, tools=TOOLS, max_tokens=8, temperature=0),
        "round_trip": lambda c: _round_trip(c, model, weather),
    }


def _round_trip(client: openai.OpenAI, model: str, choice: dict[str, Any]) -> tuple[Any, Any]:
    first = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice=choice,
                                           max_tokens=CALL_TOKENS, temperature=0)
    message = first.choices[0].message
    results = [{"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18, "sky": "sunny"})}
               for call in message.tool_calls or []]
    follow_up = [*ASK, message.model_dump(exclude_none=True), *results]
    return first, client.chat.completions.create(model=model, messages=follow_up, tools=TOOLS, max_tokens=4,
                                                 temperature=0)


@pytest.fixture(scope="module")
def replies(client: openai.OpenAI, model: str) -> dict[str, Any]:
    calls = _calls(model)
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = {name: pool.submit(call, client) for name, call in calls.items()}
    return {name: future.result() for name, future in futures.items()}


def _valid_call(call: Any) -> str:
    """The call's function name, once its arguments validate against the tool's schema."""
    ARGUMENTS[call.function.name].model_validate_json(call.function.arguments)
    assert call.type == "function" and call.id
    return call.function.name


# -- response_format --------------------------------------------------------------------


def test_parse_with_a_pydantic_model(replies: dict[str, Any]) -> None:
    choice = replies["parse"].choices[0]
    assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, Person)


def test_a_json_schema_streamed(replies: dict[str, Any]) -> None:
    chunks = replies["schema_stream"]
    Person.model_validate_json("".join(c.choices[0].delta.content or "" for c in chunks))
    assert chunks[-1].choices[0].finish_reason == "stop"


# -- tools -----------------------------------------------------------------------------


def test_required_gives_a_valid_call(replies: dict[str, Any]) -> None:
    choice = replies["required"].choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert len(choice.message.tool_calls) == 1 and _valid_call(choice.message.tool_calls[0]) in ARGUMENTS


def test_a_named_call_streams_as_openai_streams_calls(replies: dict[str, Any]) -> None:
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    for chunk in replies["named_stream"]:
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        for delta in choice.delta.tool_calls or []:
            if delta.index not in calls:  # a call's first delta names it
                assert delta.id and delta.type == "function" and delta.function.name
                calls[delta.index] = {"name": delta.function.name, "arguments": ""}
            calls[delta.index]["arguments"] += delta.function.arguments or ""
    assert finish == "tool_calls" and list(calls) == [0] and calls[0]["name"] == "get_time"
    Time.model_validate_json(calls[0]["arguments"])


def test_auto_decodes_freely_and_returns_text_or_valid_calls(replies: dict[str, Any]) -> None:
    choice = replies["auto"].choices[0]
    if choice.message.tool_calls:
        assert choice.finish_reason == "tool_calls" and all(_valid_call(c) for c in choice.message.tool_calls)
    else:
        assert choice.message.content and choice.finish_reason in ("stop", "length")


def test_a_full_round_trip(replies: dict[str, Any]) -> None:
    first, answer = replies["round_trip"]
    (call,) = first.choices[0].message.tool_calls
    assert _valid_call(call) == "get_weather" and first.choices[0].finish_reason == "tool_calls"
    assert answer.choices[0].message.content or answer.choices[0].message.tool_calls
    # The call and its result reached the model: the prompt grew by them.
    assert answer.usage.prompt_tokens > first.usage.prompt_tokens + 10


# -- refusals ----------------------------------------------------------------------------


def _post(server: RunningServer, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=120)


def _nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def _function(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


@pytest.mark.parametrize(("extra", "param", "words"), [
    ({"tools": [_function(f"f{i}", {"type": "object"}) for i in range(500)]}, "tools", "at most 128"),
    ({"tools": [_function("big", {"type": "object", "description": "x" * 70_000})]},
     "tools[0].function.parameters", "at most 65,536"),
    ({"tools": [_function(f"f{i}", {"type": "object", "description": "x" * 60_000}) for i in range(5)]},
     "tools", "at most 262,144"),
    ({"tools": [_function("deep", _nested(40))]}, "tools[0].function.parameters", "deeper than 32"),
    ({"tools": [_function("bad name!", {})]}, "tools[0].function.name", "letters, digits"),
    ({"tools": [_function("f", {}), _function("f", {})]}, "tools", "unique"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type", "'function'"),
    ({"tools": [_function("f", {})], "tool_choice": {"type": "function", "function": {"name": "g"}}},
     "tool_choice", "not among"),
    ({"tool_choice": "required"}, "tool_choice", "needs 'tools'"),
    ({"tools": [_function("f", {})], "response_format": {"type": "json_object"}}, "response_format", "together"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": _nested(40)}}},
     "response_format.json_schema.schema", "deeper than 32"),
    ({"response_format": {"type": "xml"}}, "response_format", "'json_schema'"),
    ({"messages": [*ASK, {"role": "tool", "content": "18 C"}]}, "messages[1].tool_call_id", "tool_call_id"),
    ({"messages": [*ASK, {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]}]},
     "messages[1].tool_calls[0].function.arguments", "JSON"),
])
def test_hostile_or_malformed_tool_requests_get_a_400_naming_the_field(
    server: RunningServer, model: str, extra: dict[str, Any], param: str, words: str
) -> None:
    r = _post(server, {"model": model, "messages": ASK, "max_tokens": 4, **extra})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error


@pytest.mark.parametrize(("schema", "words"), [
    ({"not": {"type": "string"}}, '"not"'),  # an unsupported feature, named
    ({"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}}, "/$defs/missing"),
    ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, "$ref"),
])
def test_schemas_the_grammar_cannot_run_are_refused_and_the_server_goes_on(
    server: RunningServer, model: str, schema: dict[str, Any], words: str
) -> None:
    for body in ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}},
                 {"tools": [_function("f", schema)], "tool_choice": "required"}):
        r = _post(server, {"model": model, "messages": ASK, "max_tokens": 8, **body})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"].startswith(("response_format", "tools")) and words in error["message"], error
    r = _post(server, {"model": model, "messages": ASK, "max_tokens": 2})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]


# -- the answer's shape, without a model ----------------------------------------------------


def test_stream_chunks_hold_a_possible_call_and_send_each_call_whole() -> None:
    head = responses.ResponseHead("chatcmpl-1", 1, "m")
    chunks = responses.ChatChunks(head, include_usage=False, tools=FORMATS["mistral"], markers={7: "[TOOL_CALLS]"})
    deltas = [chunks.text(0, "Sure. "), chunks.text(0, "", [7]), chunks.text(0, '[{"name": "get_time", '),
              chunks.text(0, '"arguments": {"zone": "UTC"}}, {"name": "get_time", "arguments": {"zone": "CET"}}]'),
              chunks.finish(0, "stop")]
    assert deltas[0]["choices"][0]["delta"] == {"role": "assistant", "content": "Sure. "}
    assert deltas[1] is None and deltas[2] is None  # the marker (a special token, from the ids) and half a call
    calls = deltas[3]["choices"][0]["delta"]["tool_calls"]
    assert [(c["index"], c["type"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        (0, "function", "get_time", {"zone": "UTC"}), (1, "function", "get_time", {"zone": "CET"})]
    assert all(len(c["id"]) == 9 and c["id"].isalnum() for c in calls)  # Mistral's template checks its ids
    assert deltas[4]["choices"][0]["finish_reason"] == "tool_calls"

    # A call that names itself first streams its arguments as they come.
    hermes = responses.ChatChunks(head, include_usage=False, tools=FORMATS["hermes"])
    first = hermes.text(0, '<tool_call>\n{"name": "f", "arguments": {"a"')["choices"][0]["delta"]["tool_calls"]
    assert [(c["index"], c["type"], c["function"]) for c in first] == [
        (0, "function", {"name": "f", "arguments": '{"a"'})]
    more = hermes.text(0, ': 1}}\n</tool_call>')["choices"][0]["delta"]["tool_calls"]
    assert more == [{"index": 0, "function": {"arguments": ": 1}"}}]
    assert hermes.finish(0, "stop")["choices"][0]["finish_reason"] == "tool_calls"

    whole = responses.chat_completion(head, [_answer('Sure. [TOOL_CALLS][{"name": "f", "arguments": {}}]')],
                                  {}, None, FORMATS["mistral"])
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Sure."
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "f", "arguments": "{}"}


def test_parallel_tool_calls_false_keeps_a_replys_first_call_only() -> None:
    # tool_choice "auto" decodes freely: a model may call two tools though the request asked for one.
    head = responses.ResponseHead("chatcmpl-1", 1, "m")
    two = ('<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n'
           '<tool_call>\n{"name": "g", "arguments": {"b": 2}}\n</tool_call>')
    for one_call, names in ((False, ["f", "g"]), (True, ["f"])):
        whole = responses.chat_completion(head, [_answer(two)], {}, None, FORMATS["hermes"], one_call)
        choice = whole["choices"][0]
        assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == names
        assert choice["finish_reason"] == "tool_calls"
        chunks = responses.ChatChunks(head, include_usage=False, tools=FORMATS["hermes"], one_call=one_call)
        streamed: dict[int, dict[str, str]] = {}
        for piece in [two[i : i + 7] for i in range(0, len(two), 7)]:
            chunk = chunks.text(0, piece)
            for entry in (chunk or {"choices": [{"delta": {}}]})["choices"][0]["delta"].get("tool_calls", []):
                call = streamed.setdefault(entry["index"], {"name": "", "arguments": ""})
                call["name"] += entry["function"].get("name", "")
                call["arguments"] += entry["function"]["arguments"]
        assert chunks.finish(0, "stop")["choices"][0]["finish_reason"] == "tool_calls"
        assert [c["name"] for c in streamed.values()] == names
        assert json.loads(streamed[0]["arguments"]) == {"a": 1}


def _answer(text: str, finish_reason: str = "stop") -> Any:
    return SimpleNamespace(text=text, finish_reason=finish_reason)
