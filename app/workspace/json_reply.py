"""A reply held to JSON ("Reply as JSON"): whether it is what was asked for.

A pane may ask its model for a JSON object or for JSON that follows a schema
(an `engine.structured.Constraint` in its SamplingParams). The engine keeps a
local model's reply to the grammar, but the reply can still come out wrong:
cut off at the token limit, stopped by the user, or written by a remote
server that ignored `response_format`. `check_reply` says which, with a real
JSON Schema validation (jsonschema, the reference validator for Python),
and gives the reply indented for display. The stored reply stays the text
the model wrote; the indenting is for the screen only.

Everything here is bounded: a reply past MAX_CHECKED_CHARS or nested past
MAX_DEPTH is not parsed further ("too large to check"), so a hostile chat
file cannot make the window recurse or stall on one message.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from engine.structured import Constraint

# The constraint kinds that ask for JSON.
JSON_KINDS = ("json_schema", "json_object")
# A longer reply is shown as it is, unchecked: checking is for the screen and must stay quick.
MAX_CHECKED_CHARS = 1_000_000
# As deep as the engine's JSON reader goes (docs/design.md, "Structured output"), and below
# Python's recursion limit for the validator.
MAX_DEPTH = 127
# How long a reason may be in a mark or a table cell.
MAX_REASON_CHARS = 160

CUT_OFF = "ends before the JSON is complete"


@dataclass(frozen=True, slots=True)
class JsonVerdict:
    """What a JSON reply is: `valid`, the reason when it is not, and the reply indented (None when it did not parse)."""

    valid: bool
    reason: str  # invalid: why, one line; valid: "valid JSON" or "matches the schema"
    pretty: str | None

    @property
    def mark(self) -> str:
        """The line under the reply: "✓ matches the schema", "✗ invalid: ends before the JSON is complete"."""
        return f"✓ {self.reason}" if self.valid else f"✗ invalid: {self.reason}"

    @property
    def cell(self) -> str:
        """The turn summary's JSON column: "valid" or "invalid: <why>"."""
        return "valid" if self.valid else f"invalid: {self.reason}"


def is_json_constraint(constraint: Constraint | None) -> bool:
    return constraint is not None and constraint.kind in JSON_KINDS


def check_reply(text: str, constraint: Constraint, finish_reason: str | None = None) -> JsonVerdict:
    """Whether `text` (a reply's answer, reasoning left out) is the JSON
    `constraint` asks for. `finish_reason` ("length", "abort", ...) names why
    a reply that does not parse ended early."""
    if not is_json_constraint(constraint):
        raise ValueError(f"{constraint.kind} is not a JSON constraint")
    body = text.strip()
    if len(body) > MAX_CHECKED_CHARS:
        return JsonVerdict(False, f"too large to check ({len(body):,} characters; at most {MAX_CHECKED_CHARS:,})", None)
    if not body:
        return JsonVerdict(False, "the reply is empty" if finish_reason != "length" else CUT_OFF, None)
    try:
        value = json.loads(body)
    except RecursionError:
        return JsonVerdict(False, f"nested more than {MAX_DEPTH} levels deep; not checked", None)
    except json.JSONDecodeError as exc:
        return JsonVerdict(False, _parse_failure(body, exc, finish_reason), None)
    if _depth_past(value, MAX_DEPTH):
        return JsonVerdict(False, f"nested more than {MAX_DEPTH} levels deep; not checked", None)
    pretty = json.dumps(value, indent=2, ensure_ascii=False)
    if constraint.kind == "json_object":
        if not isinstance(value, dict):
            return JsonVerdict(False, f"a JSON {_json_type(value)}, not an object", pretty)
        return JsonVerdict(True, "valid JSON", pretty)
    problem = schema_problem(constraint.spec, value)
    if problem is not None:
        return JsonVerdict(False, problem, pretty)
    return JsonVerdict(True, "matches the schema", pretty)


def schema_problem(spec: str, value: Any) -> str | None:
    """The first way `value` breaks the JSON schema `spec`, one line; None when it follows it.

    `spec` is a Constraint's, so no larger than engine.structured allows."""
    from jsonschema import exceptions, validators

    try:
        schema = json.loads(spec)
    except (json.JSONDecodeError, RecursionError):
        return "the schema is not valid JSON"
    if not isinstance(schema, (dict, bool)) or _depth_past(schema, MAX_DEPTH):
        return "the schema is not a JSON object"
    try:
        validator_class = validators.validator_for(schema)
        validator_class.check_schema(schema)
        error = exceptions.best_match(validator_class(schema).iter_errors(value))
    except exceptions.SchemaError as exc:
        return _clip(f"the schema is not valid: {exc.message}")
    except RecursionError:
        return "the schema refers to itself too deeply to check"
    except Exception as exc:  # noqa: BLE001 - a $ref to elsewhere (never fetched), or a schema the validator chokes on
        return _clip(f"the schema cannot be checked here: {exc}")
    if error is None:
        return None
    where = error.json_path
    return _clip(error.message if where == "$" else f"at {where}: {error.message}")


def schema_label(constraint: Constraint, saved_name: str | None = None) -> str:
    """How a pane's summary names its constraint: "JSON: object", "JSON: movie" (the
    saved name, else the schema's own "title"), "JSON: schema"; "regex", "grammar" for the others."""
    if constraint.kind == "json_object":
        return "JSON: object"
    if constraint.kind != "json_schema":
        return "regex" if constraint.kind == "regex" else "grammar"
    name = saved_name or _schema_title(constraint.spec) or "schema"
    return f"JSON: {name if len(name) <= 40 else name[:39] + '…'}"


@functools.lru_cache(maxsize=32)
def _schema_title(spec: str) -> str | None:
    try:
        schema = json.loads(spec)
    except (json.JSONDecodeError, RecursionError):
        return None
    title = schema.get("title") if isinstance(schema, dict) else None
    return " ".join(title.split()) or None if isinstance(title, str) else None


def display_markdown(verdict: JsonVerdict | None, text: str) -> str:
    """The reply as a JSON code block: indented when it parsed, as written when not."""
    shown = verdict.pretty if verdict is not None and verdict.pretty is not None else text.strip()
    fence = "```"
    while fence in shown:  # a string holding ``` would end a shorter fence
        fence += "`"
    return f"{fence}json\n{shown}\n{fence}"


def _parse_failure(body: str, exc: json.JSONDecodeError, finish_reason: str | None) -> str:
    # A parse that failed at the end of the text is a reply that stopped early.
    at_end = exc.pos >= len(body) or exc.msg.startswith("Unterminated string")
    if at_end or finish_reason in ("length", "abort"):
        why = {"length": " (it reached the token limit)", "abort": " (it was stopped)"}.get(finish_reason or "", "")
        if at_end or finish_reason == "length":
            return CUT_OFF + why
    if exc.msg == "Extra data":
        return _clip(f"more text after the JSON (at character {exc.pos + 1})")
    return _clip(f"not JSON: {exc.msg} at character {exc.pos + 1}")


def _depth_past(value: Any, limit: int) -> bool:
    """Whether `value` nests deeper than `limit` (walked without recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "null" if value is None else "value"


def _clip(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MAX_REASON_CHARS else line[: MAX_REASON_CHARS - 1] + "…"
