"""Structured output and tools in the chat API: `response_format`, `tools`,
`tool_choice`, `parallel_tool_calls`, tool turns in `messages`, and the
`tool_calls` of an answer (whole, or as stream deltas).

- `response_format` `json_object` / `json_schema` becomes a `Constraint` the
  engine decodes under (engine.structured); a schema feature it cannot run is
  a 400 naming it (`Engine.check_constraint`, before anything is queued).
- `tools` are rendered through the model's chat template
  (`Tokenizer.render_chat(tools=...)`); with `tool_choice` "auto" the model
  decodes freely and its reply is parsed for calls in its family's format
  (engine.model.tool_calls), as vLLM does; "required" or a named function
  makes that format a grammar (the arguments valid against the tool's
  schema), so even a weak model replies with a valid call; "none" leaves the
  tools out of the prompt.

This module reads plain values and raises `ToolFieldError`; protocol.py
turns that into the API's 400 (it imports this module, never the reverse).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.model.tool_calls import ArgumentsFragment, ToolCall, ToolCallFormat, ToolCallParser, parse_tool_calls
from engine.structured import Constraint, InvalidConstraint

# OpenAI's own bounds on tools: 128 of them, names of 64 letters, digits, _ and -.
MAX_TOOLS = 128
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# A tool's description and schema reach the prompt whole: the context bounds them in
# the end, these before any of it is rendered or compiled.
MAX_DESCRIPTION_CHARS = 8192
MAX_SCHEMA_CHARS = 64 << 10  # one tool's parameters, or a response_format schema
MAX_TOOLS_CHARS = 256 << 10  # all the tools of a request
MAX_SCHEMA_DEPTH = 32
MAX_TOOL_CALLS_PER_MESSAGE = 128
MAX_CALL_ID_CHARS = 64


class ToolFieldError(ValueError):
    """A field of the request that is wrong; protocol.py answers it with a 400."""

    def __init__(self, param: str, message: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param = param
        self.code = code


class ToolTypeError(ToolFieldError):
    """A field of the wrong JSON type; protocol.py words it as for every other field."""

    def __init__(self, param: str, expected: str, value: Any) -> None:
        super().__init__(param, f"Invalid type for '{param}': expected {expected}.", "invalid_type")
        self.expected = expected
        self.value = value


@dataclass(frozen=True, slots=True)
class ToolRequest:
    """The tools a request offers and how the model may use them."""

    tools: tuple[dict[str, Any], ...]  # OpenAI tool objects, checked
    choice: str  # "auto", "required" or "none"
    function: str | None  # the one function tool_choice names (choice "required")
    parallel: bool

    @property
    def offered(self) -> tuple[dict[str, Any], ...]:
        """The tools the prompt shows the model (none for tool_choice "none")."""
        return () if self.choice == "none" else self.tools

    @property
    def forced(self) -> tuple[dict[str, Any], ...]:
        """The tools a grammar must call ("required" or a named one), else ()."""
        if self.choice != "required":
            return ()
        return tuple(t for t in self.tools if self.function in (None, t["function"]["name"]))


# -- the request -------------------------------------------------------------------


def parse_tools(body: Mapping[str, Any]) -> ToolRequest | None:
    """The request's tools, tool_choice and parallel_tool_calls; None without tools."""
    if body.get("functions") not in (None, []) or body.get("function_call") is not None:
        raise ToolFieldError("functions", "'functions' and 'function_call' are deprecated and not supported; "
                             "send 'tools' and 'tool_choice'.", "unsupported_parameter")
    raw = body.get("tools")
    choice_value = body.get("tool_choice")
    parallel = body.get("parallel_tool_calls", True)
    if parallel is not None and not isinstance(parallel, bool):
        raise _wrong_type("parallel_tool_calls", "a boolean", parallel)
    if raw in (None, []):
        if choice_value not in (None, "none", "auto"):
            raise ToolFieldError("tool_choice", "'tool_choice' needs 'tools' to choose from.")
        return None
    if not isinstance(raw, list):
        raise _wrong_type("tools", "an array of tool objects", raw)
    if len(raw) > MAX_TOOLS:
        raise ToolFieldError("tools", f"'tools' holds {len(raw):,} tools; at most {MAX_TOOLS} are allowed "
                             "per request.", "array_above_max_length")
    tools = tuple(_tool(tool, f"tools[{i}]") for i, tool in enumerate(raw))
    names = [t["function"]["name"] for t in tools]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate is not None:
        raise ToolFieldError("tools", f"Two tools are named {duplicate!r}; tool names must be unique.")
    total = sum(len(json.dumps(t, ensure_ascii=False)) for t in tools)
    if total > MAX_TOOLS_CHARS:
        raise ToolFieldError("tools", f"The tools are {total:,} characters of JSON together; at most "
                             f"{MAX_TOOLS_CHARS:,} are allowed per request.", "string_above_max_length")
    choice, function = _tool_choice(choice_value, names)
    return ToolRequest(tools, choice, function, True if parallel is None else parallel)


def _tool(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _wrong_type(where, "a tool object", value)
    if value.get("type") != "function":
        raise ToolFieldError(f"{where}.type", f"Only tools of type 'function' are supported, not "
                             f"{_shown(value.get('type'))}.")
    function = value.get("function")
    if not isinstance(function, dict):
        raise _wrong_type(f"{where}.function", "an object", function)
    name = function.get("name")
    if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
        raise ToolFieldError(f"{where}.function.name", f"A tool's name must be 1 to 64 letters, digits, "
                             f"underscores or dashes, got {_shown(name)}.")
    checked: dict[str, Any] = {"name": name}
    description = function.get("description")
    if description is not None:
        if not isinstance(description, str):
            raise _wrong_type(f"{where}.function.description", "a string", description)
        if len(description) > MAX_DESCRIPTION_CHARS:
            raise ToolFieldError(f"{where}.function.description", f"A tool's description is "
                                 f"{len(description):,} characters; at most {MAX_DESCRIPTION_CHARS:,} are "
                                 "allowed.", "string_above_max_length")
        checked["description"] = description
    parameters = function.get("parameters")
    if parameters is not None:
        checked["parameters"] = check_schema(parameters, f"{where}.function.parameters")
    return {"type": "function", "function": checked}


def _tool_choice(value: Any, names: Sequence[str]) -> tuple[str, str | None]:
    if value is None:
        return "auto", None
    if isinstance(value, str):
        if value not in ("auto", "none", "required"):
            raise ToolFieldError("tool_choice", f"'tool_choice' must be 'auto', 'none', 'required' or a named "
                                 f"function, got {_shown(value)}.")
        return value, None
    if not isinstance(value, dict) or value.get("type") != "function" or not isinstance(value.get("function"), dict):
        raise _wrong_type("tool_choice", "'auto', 'none', 'required' or "
                          "{\"type\": \"function\", \"function\": {\"name\": ...}}", value)
    name = value["function"].get("name")
    if name not in names:
        raise ToolFieldError("tool_choice", f"'tool_choice' names the function {_shown(name)}, which is not "
                             "among 'tools'.")
    return "required", name


def check_schema(value: Any, where: str) -> dict[str, Any]:
    """A JSON schema as a request may give one: an object, bounded in size and depth."""
    if not isinstance(value, dict):
        raise _wrong_type(where, "a JSON Schema object", value)
    size = len(json.dumps(value, ensure_ascii=False))
    if size > MAX_SCHEMA_CHARS:
        raise ToolFieldError(where, f"The schema is {size:,} characters of JSON; at most {MAX_SCHEMA_CHARS:,} "
                             "are allowed.", "string_above_max_length")
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise ToolFieldError(where, f"The schema nests deeper than {MAX_SCHEMA_DEPTH} levels.")
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        pending.extend((child, depth + 1) for child in children)
    _check_ref_chains(value, where)
    return value


def _check_ref_chains(schema: dict[str, Any], where: str) -> None:
    """Refuse a schema that is only a `$ref` to itself, however many hops away
    (`a` -> `b` -> `a`): it describes no value, and the grammar would match nothing."""
    def target(node: Any) -> str | None:
        ref = node.get("$ref") if isinstance(node, dict) else None
        return ref if isinstance(ref, str) and ref.startswith("#") else None

    def resolve(pointer: str) -> Any:
        node: Any = schema
        for part in pointer[1:].split("/")[1:]:
            node = node.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(node, dict) else None
        return node

    def bare(node: Any) -> str | None:
        # Only a bare reference continues a chain: anything beside it describes a value.
        return target(node) if isinstance(node, dict) and set(node) <= {"$ref", "title", "description"} else None

    settled: set[str] = set()  # references known to reach a type
    pending: list[Any] = [schema]
    while pending:
        node = pending.pop()
        if isinstance(node, list):
            pending.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        pending.extend(node.values())
        ref, seen = target(node), []
        while ref is not None and ref not in settled:
            if ref in seen:
                chain = " -> ".join([*seen[seen.index(ref):], ref])
                raise ToolFieldError(where, f"The schema's $ref chain {chain} never reaches a type; it "
                                     "describes no value.")
            seen.append(ref)
            ref = bare(resolve(ref))
        settled.update(seen)


def parse_response_format(body: Mapping[str, Any]) -> Constraint | None:
    """The constraint `response_format` asks for; None for text."""
    value = body.get("response_format")
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise _wrong_type("response_format", "an object with a 'type'", value)
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint("json_object")
    if kind != "json_schema":
        raise ToolFieldError("response_format", f"'response_format' type must be 'text', 'json_object' or "
                             f"'json_schema', not {_shown(kind)}.")
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise _wrong_type("response_format.json_schema", "an object with a 'name' and a 'schema'", spec)
    name = spec.get("name")
    if name is not None and (not isinstance(name, str) or not _TOOL_NAME.fullmatch(name)):
        raise ToolFieldError("response_format.json_schema.name", "The schema's name must be 1 to 64 letters, "
                             f"digits, underscores or dashes, got {_shown(name)}.")
    if spec.get("strict") is not None and not isinstance(spec.get("strict"), bool):
        raise _wrong_type("response_format.json_schema.strict", "a boolean", spec.get("strict"))
    # Without a schema any JSON value will do; a strict schema is decoded under the grammar either way.
    schema = spec.get("schema")
    if schema is None:
        return Constraint("json_object")
    schema = check_schema(schema, "response_format.json_schema.schema")
    try:
        return Constraint("json_schema", json.dumps(schema, ensure_ascii=False))
    except InvalidConstraint as exc:
        raise ToolFieldError("response_format", str(exc)) from None


# -- tool turns in messages ------------------------------------------------------------


def tool_turn(value: Mapping[str, Any], where: str, content: str) -> dict[str, Any]:
    """An assistant message with `tool_calls`, or a `role: "tool"` result, as the
    template reads it (`content` already checked by the caller)."""
    if value["role"] == "tool":
        call_id = value.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id or len(call_id) > MAX_CALL_ID_CHARS:
            raise ToolFieldError(f"{where}.tool_call_id", "A tool message needs the 'tool_call_id' (a string of "
                                 f"1 to {MAX_CALL_ID_CHARS} characters) of the call it answers.")
        return {"role": "tool", "tool_call_id": call_id, "content": content}
    calls = value["tool_calls"]
    if not isinstance(calls, list):
        raise _wrong_type(f"{where}.tool_calls", "an array of tool calls", calls)
    if len(calls) > MAX_TOOL_CALLS_PER_MESSAGE:
        raise ToolFieldError(f"{where}.tool_calls", f"A message holds {len(calls):,} tool calls; at most "
                             f"{MAX_TOOL_CALLS_PER_MESSAGE} are allowed.", "array_above_max_length")
    return {"role": "assistant", "content": content,
            "tool_calls": [_call(call, f"{where}.tool_calls[{i}]") for i, call in enumerate(calls)]}


def _call(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict) or not isinstance(value.get("function"), dict):
        raise _wrong_type(where, "a tool call object with a 'function'", value)
    call_id = value.get("id")
    if not isinstance(call_id, str) or not call_id or len(call_id) > MAX_CALL_ID_CHARS:
        raise ToolFieldError(f"{where}.id", f"A tool call needs an 'id' of 1 to {MAX_CALL_ID_CHARS} characters.")
    name = value["function"].get("name")
    if not isinstance(name, str) or not name:
        raise _wrong_type(f"{where}.function.name", "a non-empty string", name)
    arguments = value["function"].get("arguments", "{}")
    # Templates read the arguments as an object (transformers' convention, and vLLM's);
    # OpenAI sends them as JSON text, transformers-style clients as the object itself.
    if isinstance(arguments, dict):
        return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    if not isinstance(arguments, str):
        raise _wrong_type(f"{where}.function.arguments", "a string of JSON", arguments)
    try:
        parsed: Any = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        raise ToolFieldError(f"{where}.function.arguments", "A tool call's 'arguments' must be JSON text "
                             f"(an object), got {_shown(arguments)}.") from None
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": parsed}}


# -- the model's side: the grammar of a forced call, markers that are special tokens -----


class SpecialTokens(Protocol):
    def special_token_id(self, text: str) -> int | None: ...


def special_markers(fmt: ToolCallFormat, tokenizer: SpecialTokens) -> dict[str, int]:
    """The format's markers that are special tokens of this vocabulary (text -> id):
    a reply's text leaves them out, and a grammar writes them as one token."""
    texts = {marker.strip() for marker in (*fmt.starts, fmt.end) if marker.strip()}
    found = {text: tokenizer.special_token_id(text) for text in texts}
    return {text: token_id for text, token_id in found.items() if token_id is not None}


def forced_call_constraint(request: ToolRequest, fmt: ToolCallFormat, tokenizer: SpecialTokens) -> Constraint | None:
    """The grammar of a reply that calls one of `request.forced` (tool_choice
    "required" or a named function) in `fmt`; None when the choice is free."""
    forced = request.forced
    if not forced:
        return None
    try:
        # A named function is called once (as vLLM does); "required" as parallel_tool_calls says.
        parallel = request.parallel and request.function is None
        return Constraint("lark", fmt.grammar(forced, parallel, special_markers(fmt, tokenizer)))
    except InvalidConstraint as exc:
        raise ToolFieldError("tools", str(exc)) from None


def text_with_markers(text: str, token_ids: Sequence[int], markers: Mapping[int, str],
                      decode: Callable[[list[int]], str]) -> str:
    """A whole reply's text with the special-token markers among its ids written in
    (`markers`: id -> text); `text` itself when it has none."""
    if not any(token_id in markers for token_id in token_ids):
        return text
    pieces, run = [], []
    for token_id in token_ids:
        if token_id in markers:
            pieces += [decode(run), markers[token_id]]
            run = []
        else:
            run.append(token_id)
    return "".join([*pieces, decode(run)])


# -- the answer ----------------------------------------------------------------------


def with_tool_calls(message: dict[str, Any], fmt: ToolCallFormat, *, one_call: bool = False) -> dict[str, Any]:
    """An answer's message with the calls in its content as `tool_calls`; its
    content null beside them unless the model wrote more, as OpenAI's.
    `one_call` (parallel_tool_calls false): a model that called several tools
    anyway gives only its first call."""
    parsed = parse_tool_calls(fmt, message["content"])
    if parsed.calls:
        message["content"] = parsed.content.strip() or None
        message["tool_calls"] = _call_objects(parsed.calls[:1] if one_call else parsed.calls, fmt)
    return message


@dataclass(slots=True)
class ToolCallDeltas:
    """The calls in each choice's streamed answer, as `delta.tool_calls` entries
    numbered within the choice: a call's first entry has its index, id, type
    and name, the next ones pieces of its arguments (engine.model.tool_calls
    streams them once the call is certain); text that may start a call waits.
    `one_call` (parallel_tool_calls false): calls after a choice's first are left out."""

    fmt: ToolCallFormat
    one_call: bool = False
    _parsers: dict[int, ToolCallParser] = field(default_factory=dict)
    _calls: dict[int, int] = field(default_factory=dict)  # calls begun, per choice

    def feed(self, index: int, answer: str, final: bool) -> tuple[str, list[dict[str, Any]]]:
        """(the text, the tool_calls entries) of choice `index`'s next answer
        delta; `final` for its last, which hands out whatever is held."""
        parser = self._parsers.setdefault(index, ToolCallParser(self.fmt, stream_arguments=True))
        pieces = parser.feed(answer) if answer else []
        if final:
            pieces += parser.finish()
            del self._parsers[index]
        text, entries = [], []
        for piece in pieces:
            if isinstance(piece, str):
                text.append(piece)
            elif isinstance(piece, ArgumentsFragment):
                if self.one_call and self._calls[index] > 1:
                    continue
                if entries and entries[-1]["index"] == self._calls[index] - 1:
                    entries[-1]["function"]["arguments"] += piece.text
                else:
                    entries.append({"index": self._calls[index] - 1, "function": {"arguments": piece.text}})
            else:  # a call begun (its arguments follow) or a whole one
                call = piece if isinstance(piece, ToolCall) else ToolCall(piece.name, "")
                if not (self.one_call and self._calls.get(index, 0) >= 1):
                    entries += _call_objects([call], self.fmt, first_index=self._calls.get(index, 0))
                self._calls[index] = self._calls.get(index, 0) + 1
        return "".join(text), entries

    def called(self, index: int) -> bool:
        return self._calls.get(index, 0) > 0


def _call_objects(
    calls: Sequence[ToolCall], fmt: ToolCallFormat, first_index: int | None = None
) -> list[dict[str, Any]]:
    """OpenAI `tool_calls` entries for `calls`: a message's (no index), or a stream
    delta's, numbered from `first_index` within the choice."""
    entries = []
    for i, call in enumerate(calls):
        entry: dict[str, Any] = {} if first_index is None else {"index": first_index + i}
        entry.update({"id": fmt.new_call_id(), "type": "function",
                      "function": {"name": call.name, "arguments": call.arguments}})
        entries.append(entry)
    return entries


def _wrong_type(param: str, expected: str, value: Any) -> ToolFieldError:
    return ToolTypeError(param, expected, value)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:80] + "..."
