"""Tool calls as models write them: each format's syntax, a parser that finds
the calls in a reply (whole or streamed), and the grammar that forces one.

A model calls tools in the format it was tuned on, and that is a property of
the model rather than of its architecture, so a format is found the way
llama.cpp finds it: by the markers its chat template writes (`<tool_call>`,
`[TOOL_CALLS]`, `<|tool_call|>`, Llama 3's `ipython` turn), else ChatML's
(`<|im_start|>`: Hermes, the ChatML tool format), else the family's own
(`Family.tool_calls`, engine/model/families).

- `hermes` (Qwen2.5, Qwen3, Hermes, ChatML models): one
  `<tool_call>\\n{"name": .., "arguments": {..}}\\n</tool_call>` per call;
- `llama3_json` (Llama 3.1-3.3): `{"name": .., "parameters": {..}}`, after
  `<|python_tag|>` or alone, `; ` between calls;
- `mistral` (Mistral, Mistral Nemo): `[TOOL_CALLS][{"name": .., "arguments": {..}}, ..]`;
- `tool_call_tag` (Phi-4-mini, Granite 3): `<|tool_call|>[{..}, ..]<|/tool_call|>`;
- `json` (Gemma): the reply is the call (or a list of them), perhaps in a ```json fence.

The parser keeps text that may still become a call (a marker's first
characters, an unfinished JSON value) until it knows; a call is handed over
once its JSON is complete and well formed (a name, an arguments object), so a
malformed one is returned as the text it was, or, streaming, as soon as its
name and the start of its arguments are read. Torch-free.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# The most calls a forced reply may hold: a weak model, given the choice between
# another call and its end-of-turn token, may otherwise repeat its call until max_tokens.
MAX_FORCED_CALLS = 8
# The bytes a call's JSON may grow to before the parser stops waiting for its end
# and returns it as text: no tool takes arguments this large.
MAX_CALL_CHARS = 1 << 20
# Whitespace a reply may open with while it may still be a bare JSON call.
_MAX_HELD_WHITESPACE = 256

_ALPHANUMERIC = string.ascii_letters + string.digits


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object, as text (OpenAI's `function.arguments`)


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    """A streamed call has begun: its name is known, its arguments follow as fragments."""

    name: str


@dataclass(frozen=True, slots=True)
class ArgumentsFragment:
    """The next piece of the streamed call's arguments (JSON text, as the model writes it)."""

    text: str


Piece = str | ToolCall | ToolCallStart | ArgumentsFragment

# A call that opens `{"name": "...", "arguments": {` is committed to once that much is
# read, and its arguments stream from there (how Qwen, Llama and Gemma write calls, and
# the forcing grammar too); any other shape arrives whole once its JSON is complete.
_CALL_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')
# The most of a call read while waiting for its head.
_MAX_HEAD_CHARS = 1024


@dataclass(frozen=True, slots=True)
class ToolCallFormat:
    """How one family of models writes tool calls.

    `starts`: the markers that open a call (or a list of calls); "" is a reply
    that is itself the JSON (only at its start). `end`: what may close it, left
    out where the JSON's own end does. `array`: the JSON after a marker is a
    list of calls rather than one. `arguments_key`: what the call names its
    arguments ("parameters" for Llama 3); both names are read. `separator`:
    what goes between the calls of one reply. `fences`: a Markdown code fence
    may wrap the call (Gemma)."""

    name: str
    starts: tuple[str, ...]
    end: str = ""
    array: bool = False
    arguments_key: str = "arguments"
    separator: str = "\n"
    fences: bool = False
    # Whether a forced call writes `end` even where it is no special token of the
    # vocabulary (Granite has no <|/tool_call|>; Phi-4-mini does).
    end_required: bool = True

    def write(self, calls: Sequence[ToolCall]) -> str:
        """`calls` as this format writes them (a reply in a prompt, an example for the model)."""
        objects = [_call_json(call, self.arguments_key) for call in calls]
        start = self.starts[0]
        if self.array:
            return f"{start}[{', '.join(objects)}]{self.end}"
        return self.separator.join(f"{start}{body}{self.end}" for body in objects)

    def new_call_id(self) -> str:
        # Mistral's template refuses ids other than nine letters and digits.
        if self.name == "mistral":
            return "".join(secrets.choice(_ALPHANUMERIC) for _ in range(9))
        return f"call_{secrets.token_hex(12)}"

    def grammar(self, tools: Sequence[Mapping[str, Any]], parallel: bool,
                special_ids: Mapping[str, int] | None = None) -> str:
        """A Lark grammar (llguidance's dialect) for a reply that is nothing but
        calls to `tools` (OpenAI tool objects) in this format, each call's
        arguments valid against its tool's parameters schema; one call unless
        `parallel` (then up to MAX_FORCED_CALLS). `special_ids`: the markers
        that are special tokens, by text, written as `<[id]>` (the model writes
        them as one token, never as text)."""
        one_call = {"anyOf": [_call_schema(tool, self.arguments_key) for tool in tools]}
        many = {"type": "array", "items": one_call, "minItems": 1, "maxItems": MAX_FORCED_CALLS if parallel else 1}
        body = f"%json{json.dumps({**(many if self.array else one_call), **_COMPACT_JSON})}"
        special_ids = special_ids or {}

        def literal(text: str) -> str:
            if not text:
                return ""
            token = special_ids.get(text)
            return f"<[{token}]>" if token is not None else json.dumps(text)

        end = self.end if self.end_required or self.end in special_ids else ""
        call = " ".join(part for part in (literal(self.starts[0]), "body", literal(end)) if part)
        repeat = "" if self.array or not parallel else \
            f" ({json.dumps(self.separator)} call){{0,{MAX_FORCED_CALLS - 1}}}"
        return f"%llguidance {{}}\nstart: call{repeat}\ncall: {call}\nbody: {body}\n"


# Compact JSON as the models write it: ", " and ": ", no free whitespace (which a
# weak model could otherwise fill until max_tokens).
_COMPACT_JSON = {"x-guidance": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}}

FORMATS: dict[str, ToolCallFormat] = {
    f.name: f for f in (
        ToolCallFormat("hermes", starts=("<tool_call>\n", "<tool_call>"), end="\n</tool_call>"),
        ToolCallFormat("llama3_json", starts=("", "<|python_tag|>"), arguments_key="parameters", separator="; "),
        ToolCallFormat("mistral", starts=("[TOOL_CALLS]",), array=True),
        ToolCallFormat("tool_call_tag", starts=("<|tool_call|>", "functools"), end="<|/tool_call|>", array=True,
                       end_required=False),
        ToolCallFormat("json", starts=("",), fences=True),
    )
}

# Markers a chat template writes, and the format they belong to; the first found wins.
_TEMPLATE_MARKERS = (
    ("[TOOL_CALLS]", "mistral"),
    ("<|tool_call|>", "tool_call_tag"),
    ("<tool_call>", "hermes"),
    ("<|python_tag|>", "llama3_json"),
    ("ipython", "llama3_json"),
    ("<|im_start|>", "hermes"),
)


def format_for(template: str | None, family_default: str) -> ToolCallFormat:
    """The format a model writes tool calls in: the one whose markers its chat
    template writes, else its family's (`Family.tool_calls`)."""
    for marker, name in _TEMPLATE_MARKERS:
        if template and marker in template:
            return FORMATS[name]
    return FORMATS[family_default]


def _call_json(call: ToolCall, arguments_key: str) -> str:
    try:
        arguments = json.loads(call.arguments)
    except ValueError:
        arguments = call.arguments
    return json.dumps({"name": call.name, arguments_key: arguments}, ensure_ascii=False)


def _call_schema(tool: Mapping[str, Any], arguments_key: str) -> dict[str, Any]:
    function = tool["function"]
    parameters = function.get("parameters") or {"type": "object", "properties": {}}
    return {
        "type": "object",
        "properties": {"name": {"const": function["name"]}, arguments_key: parameters},
        "required": ["name", arguments_key],
        "additionalProperties": False,
    }


# -- finding the calls in a reply ----------------------------------------------------


@dataclass(slots=True)
class ParsedReply:
    """A reply's text apart from its calls."""

    content: str
    calls: list[ToolCall]


def parse_tool_calls(fmt: ToolCallFormat, text: str) -> ParsedReply:
    """The calls in a whole reply, and the text around them."""
    parser = ToolCallParser(fmt)
    pieces = [*parser.feed(text), *parser.finish()]
    return ParsedReply(
        "".join(p for p in pieces if isinstance(p, str)), [p for p in pieces if isinstance(p, ToolCall)]
    )


@dataclass(slots=True)
class ToolCallParser:
    """Feeds a reply's text deltas, hands back text (str) and calls (ToolCall) in order.

    Text that could still be the start of a call is held until the next
    delta decides; `finish()` returns what is held when the reply ends (an
    unfinished call as the text it was).

    With `stream_arguments`, a call that opens with its name and then its
    arguments object comes as a ToolCallStart once that much is read, then
    ArgumentsFragments as they arrive (what `delta.tool_calls` streams); such a
    call is not taken back if its JSON then goes wrong (cut off by max_tokens,
    say), as a streamed OpenAI call is not. Other calls come whole."""

    fmt: ToolCallFormat
    stream_arguments: bool = False
    # Text not yet read (in the "call" state, only what came since the last delta).
    _pending: str = ""
    # "text": looking for a marker; "call": reading a call's JSON; "after": past a call
    # (its end marker, the separator, another call, or whitespace to drop).
    _state: str = "text"
    _marker: str = ""  # the text that opened the call being read
    # The call's text read so far, in pieces: each character is scanned once, so a
    # long call costs linear time however finely it streams.
    _body: list[str] = field(default_factory=list)
    _body_chars: int = 0
    _scan: _JSONScan = field(default_factory=lambda: _JSONScan())
    # While a call's arguments stream: their own scan (None before the call is committed to,
    # and once they are complete), and whether the call was committed to.
    _arguments: _JSONScan | None = None
    _streaming: bool = False
    _at_start: bool = True  # nothing but whitespace has been handed out yet

    def feed(self, text: str) -> list[Piece]:
        self._pending += text
        return self._advance(final=False)

    def finish(self) -> list[Piece]:
        out = self._advance(final=True)
        if self._state == "call" and not self._streaming:  # an unfinished call is text
            out.append(self._marker + "".join(self._body) + self._pending)
        elif self._state == "text" and self._pending:
            out.append(self._pending)
        self._pending, self._state = "", "text"
        return [piece for piece in out if piece != ""]

    def _advance(self, final: bool) -> list[Piece]:
        out: list[Piece] = []
        while True:
            before = (self._state, len(self._pending))
            if self._state == "text":
                self._find_start(out, final)
            elif self._state == "call":
                self._read_call(out)
            else:
                self._after_call(out, final)
            if (self._state, len(self._pending)) == before:
                return [piece for piece in out if piece != ""]

    # -- states

    def _find_start(self, out: list[Piece], final: bool) -> None:
        text = self._pending
        if self._at_start and "" in self.fmt.starts:
            stripped = text.lstrip()
            if self.fmt.fences and stripped.startswith("```"):
                newline = stripped.find("\n")
                if newline < 0:
                    if not final:
                        return  # the fence's info string is not complete yet
                elif stripped[3:newline].strip().lower() in ("json", "tool_code", ""):
                    self._open(stripped[newline + 1:], "", text[: len(text) - len(stripped) + newline + 1])
                    return
            elif self.fmt.fences and stripped and "```".startswith(stripped) and not final:
                return  # may open a fence
            elif stripped[:1] in ("{", "["):
                self._open(stripped, "", text[: len(text) - len(stripped)])
                return
            elif not stripped and not final and len(text) <= _MAX_HELD_WHITESPACE:
                return  # only whitespace so far
        markers = [m for m in self.fmt.starts if m]
        found = min(((text.find(m), -len(m), m) for m in markers if m in text), default=None)
        if found is not None:
            index, _, marker = found
            self._emit(out, text[:index])
            self._open(text[index + len(marker):], marker, marker)
            return
        keep = 0 if final else _partial_marker_suffix(text, markers)
        self._emit(out, text[: len(text) - keep])
        self._pending = text[len(text) - keep:]

    def _open(self, body: str, marker: str, raw_prefix: str) -> None:
        # `raw_prefix`: the text the call's JSON follows, returned with it if it is no call.
        self._state, self._marker, self._pending = "call", raw_prefix, body
        self._body, self._body_chars, self._scan = [], 0, _JSONScan()
        self._arguments, self._streaming = None, False

    def _read_call(self, out: list[Piece]) -> None:
        chunk, self._pending = self._pending, ""
        if not chunk:
            return
        end = self._scan.feed(chunk)
        taken = chunk if end is None else chunk[:max(end, 0)]
        self._body.append(taken)
        self._body_chars += len(taken)
        if self.stream_arguments and not self.fmt.array and end != -1:
            self._stream_arguments(out, taken)
        if end is None and (self._streaming or self._body_chars <= MAX_CALL_CHARS):
            return
        self._at_start = False
        rest = chunk[len(taken):]
        if self._streaming:  # its pieces are out; what follows the call is read as usual
            self._state, self._pending, self._body = "after", rest, []
            return
        calls = None if end is None or end < 0 else _calls_in("".join(self._body), self.fmt)
        if calls is None:
            # Handed out as text; what follows is searched again, from after this marker.
            self._emit(out, self._marker + "".join(self._body))
            self._state, self._marker, self._body, self._pending = "text", "", [], rest
            return
        out.extend(calls)
        self._state, self._pending, self._body = "after", rest, []

    def _stream_arguments(self, out: list[Piece], taken: str) -> None:
        """Commit to the call once its name and the start of its arguments object
        are read; from then on hand out each new piece of the arguments."""
        if self._arguments is not None:
            end = self._arguments.feed(taken)
            if taken:
                out.append(ArgumentsFragment(taken if end is None else taken[:end]))
            if end is not None:
                self._arguments = None  # complete: the rest is the call's closing brace
            return
        if self._streaming or self._body_chars > _MAX_HEAD_CHARS:
            return
        body = "".join(self._body)
        head = _CALL_HEAD.match(body)
        if head is None or body[head.end():head.end() + 1] != "{":
            return
        try:
            name = json.loads(f'"{head[1]}"')
        except ValueError:
            return
        self._streaming, self._arguments = True, _JSONScan()
        out.append(ToolCallStart(name))
        self._stream_arguments(out, body[head.end():])

    def _after_call(self, out: list[Piece], final: bool) -> None:
        text = self._pending
        rest = text.lstrip()
        closers = [c for c in (self.fmt.end.strip(), "```" if self.fmt.fences else "") if c]
        for closer in closers:
            if rest.startswith(closer):
                self._pending = rest[len(closer):]
                return
            if closer.startswith(rest) and rest and not final:
                return  # may be the end marker
        if "" in self.fmt.starts:  # a bare format: another call may follow its separator
            separator = self.fmt.separator.strip()
            if separator and rest.startswith(separator):
                self._open(rest[len(separator):], "", text[: len(text) - len(rest) + len(separator)])
                return
            if rest[:1] in ("{", "["):
                self._open(rest, "", text[: len(text) - len(rest)])
                return
        if not rest:
            self._pending = ""  # whitespace between and after calls is dropped
            return
        # Another call, or text after them.
        self._state, self._pending = "text", rest

    def _emit(self, out: list[Piece], text: str) -> None:
        if text:
            out.append(text)
            if text.strip():
                self._at_start = False


def _partial_marker_suffix(text: str, markers: Sequence[str]) -> int:
    """The length of the longest end of `text` that is the start of a marker."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:size]):
                longest = size
                break
    return longest


def _calls_in(text: str, fmt: ToolCallFormat) -> list[ToolCall] | None:
    """The calls a complete JSON value holds; None when it is not calls."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    items = value if isinstance(value, list) else [value]
    if not items or (isinstance(value, list) and not (fmt.array or "" in fmt.starts)):
        return None
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            return None
        arguments = next((item[k] for k in (fmt.arguments_key, "arguments", "parameters") if k in item), {})
        if isinstance(arguments, str):  # some models write the arguments as JSON text
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        if not isinstance(arguments, dict):
            return None
        calls.append(ToolCall(item["name"], json.dumps(arguments, ensure_ascii=False)))
    return calls


@dataclass(slots=True)
class _JSONScan:
    """Finds where a JSON object or array ends, reading each character once
    however the text arrives: its nesting, and whether it is inside a string."""

    started: bool = False
    depth: int = 0
    in_string: bool = False
    escaped: bool = False

    def feed(self, chunk: str) -> int | None:
        """The index in `chunk` just past the value's end; None while it is open;
        -1 when the value (after whitespace) is no object or array."""
        for index, char in enumerate(chunk, start=1):
            if not self.started:
                if char.isspace():
                    continue
                if char not in "{[":
                    return -1
                self.started = True
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif char == "\\":
                    self.escaped = True
                elif char == '"':
                    self.in_string = False
            elif char == '"':
                self.in_string = True
            elif char in "{[":
                self.depth += 1
            elif char in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return index
        return None
