"""'Reply as JSON' in the app layer: the validator on both sides of every
rule (valid, wrong type, missing key, cut off, not JSON, too deep, too
large), saved schemas on a real file (kept, a corrupt file set aside), the
turn summary's JSON column in its exports, sweeps keeping the constraint,
and a remote pane's request carrying it as response_format."""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

import pytest

from app.remote.openai_client import request_params
from app.settings import Settings
from app.workspace.json_reply import (
    CUT_OFF,
    MAX_CHECKED_CHARS,
    MAX_DEPTH,
    check_reply,
    display_markdown,
    schema_label,
)
from app.workspace.saved_schemas import MAX_SAVED_SCHEMAS, SavedSchemaError, SavedSchemas
from app.workspace.sweep import open_sweep
from app.workspace.turn_summary import TurnReply, figures_of, header, json_valid_count, rows, to_csv, to_markdown
from app.workspace.workspace import Workspace
from engine import Engine, SamplingParams
from engine.structured import Constraint

MOVIE = json.dumps({
    "title": "movie",
    "type": "object",
    "properties": {"title": {"type": "string"}, "year": {"type": "integer"},
                   "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["title", "year"],
})
SCHEMA = Constraint("json_schema", MOVIE)
OBJECT = Constraint("json_object")


# -- the validator -------------------------------------------------------------------------


def test_a_reply_that_follows_the_schema_is_valid_and_shown_indented() -> None:
    verdict = check_reply('{"title": "Alien", "year": 1979, "tags": ["space"]}', SCHEMA, "stop")
    assert verdict.valid and verdict.mark == "✓ matches the schema" and verdict.cell == "valid"
    assert verdict.pretty == '{\n  "title": "Alien",\n  "year": 1979,\n  "tags": [\n    "space"\n  ]\n}'
    assert check_reply('{"a": 1}', OBJECT).mark == "✓ valid JSON"


@pytest.mark.parametrize(("text", "reason"), [
    ('{"title": "Alien", "year": "1979"}', "at $.year: '1979' is not of type 'integer'"),
    ('{"title": "Alien"}', "'year' is a required property"),
    ('{"title": "Alien", "year": 1979, "tags": [3]}', "at $.tags[0]: 3 is not of type 'string'"),
    ("[1, 2]", "[1, 2] is not of type 'object'"),
])
def test_a_reply_that_breaks_the_schema_says_where(text: str, reason: str) -> None:
    verdict = check_reply(text, SCHEMA, "stop")
    assert not verdict.valid and verdict.reason == reason
    assert verdict.mark == f"✗ invalid: {reason}" and verdict.pretty is not None  # it parsed: shown indented


def test_a_cut_off_or_stopped_reply_ends_before_the_json_is_complete() -> None:
    cut = check_reply('{"title": "Ali', SCHEMA, "length")
    assert not cut.valid and cut.reason == f"{CUT_OFF} (it reached the token limit)" and cut.pretty is None
    assert check_reply('{"title": "Alien", ', SCHEMA, "abort").reason == f"{CUT_OFF} (it was stopped)"
    # Cut off whatever the reason says: the text ends inside the JSON.
    assert check_reply('{"title": ', SCHEMA, "stop").reason == CUT_OFF
    assert check_reply("", SCHEMA, "length").reason == CUT_OFF


def test_text_that_is_not_json_says_so() -> None:
    assert check_reply("Sure! Here is the film.", SCHEMA, "stop").reason == "not JSON: Expecting value at character 1"
    assert check_reply('{"a": 1} and more', OBJECT, "stop").reason == "more text after the JSON (at character 10)"
    assert check_reply('"just a string"', OBJECT).reason == "a JSON string, not an object"
    assert check_reply("   ", OBJECT, "stop").reason == "the reply is empty"


def test_nesting_and_size_are_bounded_on_both_sides() -> None:
    at_limit = "[" * (MAX_DEPTH - 1) + "{}" + "]" * (MAX_DEPTH - 1)
    assert check_reply('{"a": %s}' % at_limit, OBJECT).valid is False  # depth MAX_DEPTH + 1 counting the object
    assert check_reply('{"a": %s}' % at_limit[1:-1], OBJECT).valid  # exactly MAX_DEPTH levels
    assert "nested more than" in check_reply('{"a": %s}' % at_limit, OBJECT).reason
    # Past Python's own recursion limit: a verdict, not a RecursionError.
    assert "nested more than" in check_reply("[" * 100_000 + "]" * 100_000, OBJECT).reason
    huge = '{"a": "' + "x" * MAX_CHECKED_CHARS + '"}'
    assert check_reply(huge, OBJECT).reason.startswith("too large to check")
    fits = '{"a": "' + "x" * (MAX_CHECKED_CHARS - 20) + '"}'
    assert check_reply(fits, OBJECT).valid


def test_a_schema_that_cannot_be_used_is_a_verdict_not_an_exception() -> None:
    assert check_reply("{}", Constraint("json_schema", '{"type": "nonsense"}')).reason.startswith(
        "the schema is not valid")
    remote = Constraint("json_schema", '{"$ref": "https://example.com/schema.json"}')
    assert check_reply("{}", remote).reason.startswith("the schema cannot be checked here")


def test_the_display_keeps_a_fence_the_reply_cannot_close() -> None:
    verdict = check_reply('{"code": "```python```"}', OBJECT)
    shown = display_markdown(verdict, '{"code": "```python```"}')
    assert shown.startswith("````json\n") and shown.endswith("\n````")
    assert display_markdown(None, ' {"a": ') == '```json\n{"a":\n```'


def test_the_summary_names_the_schema() -> None:
    assert schema_label(OBJECT) == "JSON: object"
    assert schema_label(SCHEMA) == "JSON: movie"  # its title
    assert schema_label(SCHEMA, "films") == "JSON: films"  # the saved name first
    assert schema_label(Constraint("json_schema", '{"type": "object"}')) == "JSON: schema"


# -- saved schemas --------------------------------------------------------------------------


def test_saved_schemas_are_kept_in_a_private_file(tmp_path: Path) -> None:
    path = tmp_path / "config" / "json-schemas.json"
    store = SavedSchemas.load(path)
    assert store.names() == [] and store.load_warning is None
    store.save_as("movie", MOVIE)
    store.save_as("any", '{"type": "object"}')
    store.save_as("movie", MOVIE.replace("movie", "film"))  # replaced under its name
    assert os.stat(path).st_mode & 0o777 == 0o600
    again = SavedSchemas.load(path)
    assert again.names() == ["movie", "any"] and again.schemas["movie"] == MOVIE.replace("movie", "film")
    assert again.name_of('{"type": "object"}') == "any" and again.name_of("{}") is None
    again.delete("any")
    assert SavedSchemas.load(path).names() == ["movie"]


@pytest.mark.parametrize(("name", "spec", "message"), [
    ("", MOVIE, "Give the schema a name."),
    ("x" * 81, MOVIE, "at most 80 characters"),
    ("two\nlines", MOVIE, "one line"),
    ("bad", "{not json", "not valid JSON"),
    ("list", "[1]", "is a JSON object"),
    ("empty", "  ", "needs a spec"),
])
def test_a_schema_that_cannot_be_saved_says_why(tmp_path: Path, name: str, spec: str, message: str) -> None:
    store = SavedSchemas.load(tmp_path / "s.json")
    with pytest.raises(SavedSchemaError, match=message):
        store.save_as(name, spec)
    assert not (tmp_path / "s.json").exists()


def test_at_most_so_many_schemas_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    entries = [{"name": f"s{i}", "schema": "{}"} for i in range(MAX_SAVED_SCHEMAS + 1)]
    path.write_text(json.dumps({"schemas": entries}))
    store = SavedSchemas.load(path)
    assert len(store.names()) == MAX_SAVED_SCHEMAS and "1 saved JSON schema" in (store.load_warning or "")
    with pytest.raises(SavedSchemaError, match=f"At most {MAX_SAVED_SCHEMAS}"):
        store.save_as("one more", "{}")
    store.save_as("s0", '{"type": "object"}')  # replacing one is still allowed


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b'{"schemas": 3}', b"\xff\xfe", b"9" * 5000])
def test_a_corrupt_file_is_set_aside_with_a_warning(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "json-schemas.json"
    path.write_bytes(content)
    store = SavedSchemas.load(path)
    assert store.names() == [] and "were not used because" in (store.load_warning or "")
    assert (tmp_path / "json-schemas.json.bad").read_bytes() == content
    store.save_as("movie", MOVIE)  # the next save starts a good file
    assert SavedSchemas.load(path).names() == ["movie"]


def test_bad_entries_are_left_out_one_by_one(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"schemas": [
        {"name": "good", "schema": MOVIE}, {"name": 3, "schema": MOVIE}, {"name": "no schema"},
        {"name": "huge", "schema": "{" + " " * 1_000_001 + "}"}, "text", {"name": "good", "schema": "{}"},
    ]}))
    store = SavedSchemas.load(path)
    assert store.names() == ["good"] and store.schemas["good"] == MOVIE
    assert store.load_warning is not None and "5 saved JSON schemas" in store.load_warning


# -- the turn summary -----------------------------------------------------------------------------


def _reply(pane_id: int, text: str, constraint: Constraint | None, finish: str = "stop") -> TurnReply:
    return TurnReply(pane_id, f"Pane {pane_id}", "Tiny", text, None, None, constraint, finish)


def test_the_turn_summary_has_a_json_column_in_its_exports() -> None:
    replies = [
        _reply(1, '{"title": "Alien", "year": 1979}', SCHEMA),
        _reply(2, '{"title": "Alien"', SCHEMA, "length"),
        _reply(3, "A film about space.", None),
    ]
    figures = figures_of(replies)
    assert [f.json for f in figures] == ["valid", f"invalid: {CUT_OFF} (it reached the token limit)", None]
    assert json_valid_count(figures) == (1, 2)
    head = header(figures)
    assert head[:7] == ["Pane", "Model", "Words", "Tokens", "Tok/s", "TTFT (s)", "JSON"]
    assert [row[6] for row in rows(figures)] == ["valid", figures[1].json, "—"]
    table = list(csv.reader(io.StringIO(to_csv(figures))))
    assert table[0][6] == "JSON" and table[2][6] == figures[1].json
    markdown = to_markdown("Describe Alien", figures)
    assert "| JSON |" in markdown and "| valid |" in markdown and "JSON valid in 1 of 2." in markdown
    # No reply asked for JSON: no column, no count.
    plain = figures_of([_reply(1, "a", None), _reply(2, "b", None)])
    assert "JSON" not in header(plain) and json_valid_count(plain) is None and "JSON" not in to_markdown("q", plain)


# -- sweeps and remote panes -------------------------------------------------------------------------


@pytest.mark.parametrize("keep", [True, False])
def test_a_sweep_keeps_the_json_constraint_unless_told_not_to(tiny_engine: Engine, keep: bool) -> None:
    workspace = Workspace(Settings(), engine=tiny_engine)
    source = workspace.add_pane()
    workspace.set_params(source.id, SamplingParams(max_tokens=4, constraint=SCHEMA))
    panes = open_sweep(workspace, source.id, "temperature", [0.2, 0.9], keep_constraint=keep)
    assert [p.conversation.params.temperature for p in panes] == [0.2, 0.9]
    assert [p.conversation.params.constraint for p in panes] == [SCHEMA if keep else None] * 2
    assert source.conversation.params.constraint == SCHEMA


def test_a_remote_pane_asks_for_json_through_response_format() -> None:
    assert request_params(SamplingParams(constraint=OBJECT))["response_format"] == {"type": "json_object"}
    sent = request_params(SamplingParams(constraint=SCHEMA))["response_format"]
    assert sent == {"type": "json_schema", "json_schema": {"name": "movie", "schema": json.loads(MOVIE)}}
    assert "response_format" not in request_params(SamplingParams())
    assert "response_format" not in request_params(SamplingParams(constraint=Constraint("regex", "a+")))
