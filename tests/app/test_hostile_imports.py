"""Imports survive any JSON: `tandem chats import` and the window's import (both
`app.store.export.read_chat_file`) end every hostile file in one clear line, store
nothing and leave no crash log."""

from __future__ import annotations

import copy
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.store import export as chat_export
from app.store.chat_store import ChatStore
from app.store.cli import main
from app.store.export import ChatImportError, from_json, parse_chat_json, read_chat_file
from tests.app.fixtures.chats import build_conversation

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "data"
    monkeypatch.setenv("TANDEM_DATA_DIR", str(folder))
    return folder


@pytest.fixture(scope="module")
def valid_export() -> dict[str, Any]:
    return chat_export.to_json(build_conversation("Lyon"))


def run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(args), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def stored_count(data_dir: Path) -> int:
    path = data_dir / "chats.sqlite3"
    if not path.exists():
        return 0
    with ChatStore.open(path, recover=False) as store:
        return len(store.list_conversations())


def export_text(valid: dict[str, Any], **conversation: Any) -> str:
    data = copy.deepcopy(valid)
    data["conversation"].update(conversation)
    return json.dumps(data)


HOSTILE = {
    # JSON's escapes make a lone surrogate, which no file or database can hold.
    "lone surrogate": (lambda v: export_text(v, title="\\ud800 x").replace("\\\\ud800", "\\ud800"),
                       "not valid Unicode (a lone surrogate, \\ud800)"),
    "surrogate in a key": (lambda v: '{"\\udfff": 1}', "lone surrogate"),
    "nested 100,000 deep": (lambda v: "[" * 100_000 + "]" * 100_000, "nested too deeply"),
    "nested objects": (lambda v: '{"a":' * 100_000 + "1" + "}" * 100_000, "nested too deeply"),
    "5,001-digit integer": (lambda v: export_text(v).replace('"version": 1', '"version": ' + "7" * 5001),
                            "a number of more than 4300 digits"),
    "huge created_at": (lambda v: export_text(v, created_at=10**400), "\"created_at\" must be a time"),
    "NaN time": (lambda v: export_text(v, created_at=float("nan")), "\"created_at\" must be a time"),
    "seed beyond 64 bits": (lambda v: export_text(v, params={"seed": 2**80}), "fit in 64 bits"),
    "messages not a list": (lambda v: export_text(v, messages={"0": "x"}), "\"messages\" must be a list"),
    "message not an object": (lambda v: export_text(v, messages=[1]), "must be a JSON object"),
    "title a number": (lambda v: export_text(v, title=3), "\"title\" must be text"),
    "params a list": (lambda v: export_text(v, params=[0.5]), "\"params\" must be an object"),
    "top level a list": (lambda v: "[]", "must be a JSON object"),
    "top level a string": (lambda v: '"tandem-chat"', "must be a JSON object"),
    "not UTF-8": (lambda v: b"\xff\xfe{}".decode("latin-1"), "not a text file"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_each_hostile_file_is_one_clear_line_and_nothing_stored(
    case: str, valid_export: dict[str, Any], tmp_path: Path, data_dir: Path
) -> None:
    make, expected = HOSTILE[case]
    file = tmp_path / "hostile.json"
    text = make(valid_export)
    if case == "not UTF-8":
        file.write_bytes(text.encode("latin-1"))
    else:
        file.write_text(text, encoding="utf-8", errors="surrogatepass")
    code, out, err = run("import", str(file))
    assert code == 2 and out == "", err  # an import file that is not a chat: a wrong argument (see app.store.cli)
    assert err.startswith(f"tandem chats: {file}") and err.count("\n") == 1, err
    assert expected in err and "Traceback" not in err
    assert stored_count(data_dir) == 0


def test_a_fifo_or_a_device_is_not_read(tmp_path: Path, data_dir: Path) -> None:
    fifo = tmp_path / "chat.json"
    os.mkfifo(fifo)  # reading it would wait for a writer forever
    for path in (fifo, Path("/dev/zero")):  # /dev/zero would never end
        code, _, err = run("import", str(path))
        assert code == 2 and "not a regular file" in err and err.count("\n") == 1, err
    assert stored_count(data_dir) == 0


def test_a_file_too_big_to_be_a_chat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chat_export, "MAX_IMPORT_BYTES", 1000)
    big = tmp_path / "big.json"
    big.write_text(" " * 1001 + "{}", encoding="utf-8")
    with pytest.raises(ChatImportError, match="holds 1,003 bytes, more than the 1,000 bytes"):
        read_chat_file(big)


def test_the_installed_command_leaves_no_crash_log(tmp_path: Path, data_dir: Path) -> None:
    file = tmp_path / "deep.json"
    file.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    logs = tmp_path / "logs"
    script = "import sys; from ui.main import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run(
        [sys.executable, "-c", script, "chats", "import", str(file)], cwd=REPO, capture_output=True, text=True,
        timeout=120, env=dict(os.environ, TANDEM_DATA_DIR=str(data_dir), TANDEM_LOG_DIR=str(logs)),
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "nested too deeply" in done.stderr, done.stderr
    assert not logs.exists() or not any(logs.iterdir())
    assert stored_count(data_dir) == 0


# -- any JSON ------------------------------------------------------------------------------

# Every JSON value, lone surrogates and long integers included (Python's json reads both).
texts = st.text(st.characters(exclude_categories=()), max_size=8)
leaves = st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30) | st.floats() | texts
json_values = st.recursive(
    leaves, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4), max_leaves=20
)


def paths_of(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON value a hostile file could put something else."""
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths_of(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += paths_of(item, (*prefix, i))
    return found


def replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    out = copy.copy(value)
    out[path[0]] = replaced(value[path[0]], path[1:], new)
    return out


def import_or_refuse(text: str, store: ChatStore) -> None:
    """The import's contract: a conversation that stores and loads, or ChatImportError; nothing else."""
    try:
        conversation = from_json(parse_chat_json(text))
    except ChatImportError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    store.save_conversation(conversation)
    assert store.load_conversation(conversation.id).messages == conversation.messages


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=json_values)
def test_any_json_value_imports_or_is_refused(value: Any, tmp_path: Path) -> None:
    with ChatStore.open(tmp_path / "any.sqlite3") as store:
        import_or_refuse(json.dumps(value), store)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), new=json_values)
def test_a_valid_export_with_any_value_anywhere(
    data: st.DataObject, new: Any, valid_export: dict[str, Any], tmp_path: Path
) -> None:
    """Wrong types anywhere: one value of a real export replaced by any JSON value."""
    path = data.draw(st.sampled_from(paths_of(valid_export)))
    with ChatStore.open(tmp_path / "any.sqlite3") as store:
        import_or_refuse(json.dumps(replaced(valid_export, path, new)), store)
