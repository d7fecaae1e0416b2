"""Hostile chat files and what they leave in the store: a time that is no date, titles that
would steer a terminal, files past the import's caps. Every case through the real CLI
(`app.store.cli.main`, in a process of its own where a hang or memory is the point) on a
real SQLite file, and the window's sidebar on a store that already holds a bad row."""

from __future__ import annotations

import io
import json
import os
import re
import resource
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from app.store import export as chat_export
from app.store.chat_store import ChatStore
from app.store.cli import main
from app.store.records import LATEST_TIME, UNKNOWN_TIME_TEXT, local_time_text
from tests.app.fixtures.chats import build_conversation

REPO = Path(__file__).resolve().parents[2]
BAD_TIME = 1e12  # finite, but the year 33658: no datetime holds it


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "data"
    monkeypatch.setenv("TANDEM_DATA_DIR", str(folder))
    return folder


def run(*args: str, stdout: io.StringIO | None = None) -> tuple[int, str, str]:
    out, err = stdout or io.StringIO(), io.StringIO()
    code = main(list(args), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def stored_ids(data_dir: Path) -> list[str]:
    path = data_dir / "chats.sqlite3"
    if not path.exists():
        return []
    with ChatStore.open(path, recover=False) as store:
        return [s.id for s in store.list_conversations()]


def message(role: str = "user", text: str = "hi", created_at: float = 1_767_225_600.0, **extra: Any) -> dict[str, Any]:
    return {"role": role, "text": text, "state": "complete", "created_at": created_at, **extra}


def chat_file(messages: list[dict[str, Any]], **conversation: Any) -> dict[str, Any]:
    return {
        "format": "tandem-chat", "version": 1,
        "conversation": {"title": "t", "created_at": 1_767_225_600.0, "system_prompt": "", "model_id": "default",
                         "context_policy": "stop", "params": {}, "messages": messages, **conversation},
    }


def reply_with_versions(count: int) -> dict[str, Any]:
    others = [{"version": n, "user_text": "hi", "messages": [message("assistant", f"take {n}")]}
              for n in range(2, count + 1)]
    return message("assistant", "take 1", versions={"shown": 1, "count": count, "others": others})


def write(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


# -- a time that is no date -------------------------------------------------------------


NO_DATES = {
    "conversation created 1e12": lambda: chat_file([message()], created_at=BAD_TIME),
    "message time 1e12": lambda: chat_file([message(), message("assistant", created_at=BAD_TIME)]),
    "a version's message time 1e12": lambda: chat_file([message(), {
        **reply_with_versions(2),
        "versions": {"shown": 1, "count": 2, "others": [
            {"version": 2, "user_text": "hi", "messages": [message("assistant", created_at=BAD_TIME)]}]},
    }]),
    "the year 10000": lambda: chat_file([message(created_at=253_402_300_800.0)]),
    "before 1970": lambda: chat_file([message(created_at=-1.0)]),
}


@pytest.mark.parametrize("case", sorted(NO_DATES))
def test_a_time_that_is_no_date_is_refused_at_import(case: str, tmp_path: Path, data_dir: Path) -> None:
    code, out, err = run("import", str(write(tmp_path / "chat.json", NO_DATES[case]())))
    assert (code, out) == (2, ""), err
    assert err.count("\n") == 1 and '"created_at" must be a time' in err and "9999" in err, err
    assert stored_ids(data_dir) == []


def test_the_last_time_a_date_can_be_imports_and_lists(tmp_path: Path, data_dir: Path) -> None:
    code, out, err = run("import", str(write(tmp_path / "chat.json", chat_file([message(created_at=LATEST_TIME)]))))
    assert code == 0, err
    code, out, err = run("list")
    assert (code, err) == (0, "") and "9999-12-3" in out


@pytest.fixture
def bad_store(data_dir: Path) -> tuple[str, str]:
    """A store an older version wrote: one conversation whose start and one message's time
    are 1e12 (it imported them), and one ordinary conversation. Returns (bad id, good id)."""
    bad, good = build_conversation("Far future"), build_conversation("Ordinary")
    with ChatStore.open(data_dir / "chats.sqlite3") as store:
        store.save_conversation(bad)
        store.save_conversation(good)
    with sqlite3.connect(data_dir / "chats.sqlite3") as conn:
        conn.execute("UPDATE conversations SET created_at = ? WHERE id = ?", (BAD_TIME, bad.id))
        conn.execute("UPDATE messages SET created_at = ? WHERE conversation_id = ? AND position = 1",
                     (BAD_TIME, bad.id))
    conn.close()
    return bad.id, good.id


def test_a_store_holding_such_a_time_still_lists_with_a_warning(bad_store: tuple[str, str]) -> None:
    bad, good = bad_store
    code, out, err = run("list")
    assert code == 0, err
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert set(rows) == {bad[:8], good[:8]}
    assert UNKNOWN_TIME_TEXT in rows[bad[:8]] and rows[bad[:8]].endswith("Far future")
    assert UNKNOWN_TIME_TEXT not in rows[good[:8]]
    assert err.startswith(f"tandem chats: warning: Conversation {bad[:8]}") and "1000000000000.0" in err, err
    assert err.count("\n") == 1  # one warning: the good row has none

    code, out, err = run("list", "--json")
    items = {item["id"]: item for item in json.loads(out)}
    assert code == 0 and "warning" in err
    assert items[bad]["created_at"] is None and items[bad]["updated_at"] is None  # no date: null
    assert isinstance(items[good]["updated_at"], float)


def test_a_store_holding_such_a_time_still_exports(bad_store: tuple[str, str], tmp_path: Path) -> None:
    bad, _ = bad_store
    code, out, err = run("export", bad[:8], "--format", "md")
    assert code == 0 and f"- Started: {UNKNOWN_TIME_TEXT}" in out and "warning" in err, err
    code, out, err = run("export", bad[:8], "--format", "json", "-o", str(tmp_path / "out.json"))
    assert code == 0 and out == "", err
    assert json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))["conversation"]["created_at"] == BAD_TIME


def test_the_installed_command_lists_such_a_store_in_any_timezone(bad_store: tuple[str, str], data_dir: Path) -> None:
    """`tandem chats list` as a terminal runs it, where the last showable time is
    14 hours ahead of UTC (Kiritimati) or 12 behind: no traceback, no crash log."""
    with ChatStore.open(data_dir / "chats.sqlite3") as store:
        edge = build_conversation("Edge of time")
        edge.created_at = LATEST_TIME
        store.save_conversation(edge)
    script = "import sys; from ui.main import main; sys.exit(main(sys.argv[1:]))"
    for zone in ("Pacific/Kiritimati", "Etc/GMT+12"):
        logs = data_dir.parent / f"logs-{zone.replace('/', '-')}"
        done = subprocess.run(
            [sys.executable, "-c", script, "chats", "list"], cwd=REPO, capture_output=True, text=True, timeout=60,
            env=dict(os.environ, TANDEM_DATA_DIR=str(data_dir), TANDEM_LOG_DIR=str(logs), TZ=zone),
        )
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        assert len(done.stdout.splitlines()) == 4 and "Edge of time" in done.stdout
        assert re.search(r"9999-12-3[01] \d\d:\d\d", done.stdout), done.stdout
        assert not logs.exists() or not any(logs.iterdir())


def test_the_window_sidebar_lists_a_store_holding_such_a_time(
    bad_store: tuple[str, str], data_dir: Path, qtbot: Any, qapp: Any
) -> None:
    from ui.widgets.sidebar import ChatSidebar, relative_time

    bad, good = bad_store
    assert relative_time(BAD_TIME) == UNKNOWN_TIME_TEXT and local_time_text(float("nan")) == UNKNOWN_TIME_TEXT
    store = ChatStore.open(data_dir / "chats.sqlite3")
    try:
        sidebar = ChatSidebar(store, undo_seconds=10.0)
        qtbot.addWidget(sidebar)
        sidebar.resize(340, 480)
        sidebar.show()
        qtbot.waitExposed(sidebar)
        assert [s.id for s in sidebar.summaries()] == [bad, good]  # 1e12 sorts first
        sidebar.grab()  # every row painted: the delegate writes each row's time
        assert f"started {UNKNOWN_TIME_TEXT}" in sidebar.list.item(0).toolTip()
        assert sidebar.select(bad)
    finally:
        store.close()


# -- titles that would steer a terminal --------------------------------------------------

STEERING = {
    "osc title": "\x1b]0;owned\x07Plan",
    "clear screen": "\x1b[2J\x1b[HPlan",
    "c1 csi": "\x9b31mred",
    "right-to-left override": "file\u202egpj.exe",
    "carriage return": "innocent\rEVIL",
    "backspace and del": "ab\x08\x08\x7fcd",
}
# Anything a terminal acts on, the line breaks between rows aside.
RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


@pytest.fixture
def steering_store(data_dir: Path) -> dict[str, str]:
    """A conversation per hostile title (as an import or a model's auto-title left it). Returns id -> title."""
    titles = {}
    with ChatStore.open(data_dir / "chats.sqlite3") as store:
        for title in STEERING.values():
            conversation = build_conversation(title)
            conversation.messages[0].text = "Body \x1b]52;c;cGF5bG9hZA==\x07 text\twith a tab"
            store.save_conversation(conversation)
            titles[conversation.id] = title
    return titles


def test_titles_cannot_steer_the_terminal(steering_store: dict[str, str]) -> None:
    code, out, err = run("list")
    assert (code, err) == (0, "")
    assert not RAW_CONTROL.search(out), repr(out)
    for needle in ("\\x1b]0;owned\\x07Plan", "\\x9b31mred", "file\\u202egpj.exe", "innocent\\rEVIL", "\\x08\\x08\\x7f"):
        assert needle in out  # spelled out, so the user sees what the title holds

    code, out, err = run("list", "--json")
    assert (code, err) == (0, "") and not RAW_CONTROL.search(out), repr(out)
    assert {item["id"]: item["title"] for item in json.loads(out)} == steering_store  # the same JSON


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_an_export_to_a_terminal_is_spelled_out_and_to_a_file_kept(
    steering_store: dict[str, str], tmp_path: Path
) -> None:
    some_id = next(iter(steering_store))
    for fmt in ("md", "json"):
        code, out, err = run("export", some_id, "--format", fmt, stdout=Terminal())
        assert (code, err) == (0, "")
        assert not RAW_CONTROL.search(out.replace("\t", " ")), repr(out)
        assert "\\x1b]52;c;cGF5bG9hZA==\\x07" in out or "\\u001b]52;c;cGF5bG9hZA==\\u0007" in out
        if fmt == "json":
            assert json.loads(out)["conversation"]["title"] == steering_store[some_id]
    code, out, _ = run("export", some_id, "--format", "md")  # a pipe: the text as it is
    assert code == 0 and "Body \x1b]52;c;cGF5bG9hZA==\x07 text" in out
    target = tmp_path / "chat.md"
    assert run("export", some_id, "-o", str(target))[0] == 0
    assert "\x1b]52;" in target.read_text(encoding="utf-8")


# -- imports past the caps -----------------------------------------------------------------


def test_more_messages_than_the_cap_are_refused(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chat_export, "MAX_IMPORT_MESSAGES", 6)
    at_cap = chat_file([message(), message("assistant")] * 3)
    assert run("import", str(write(tmp_path / "six.json", at_cap)))[0] == 0
    code, _, err = run("import", str(write(tmp_path / "seven.json", chat_file([message()] * 7))))
    assert code == 2 and err.count("\n") == 1 and "more than 6 messages" in err, err
    # The versions of a reply count too: 2 + 5 set-aside versions' messages = 7.
    code, _, err = run("import", str(write(tmp_path / "v.json", chat_file([message(), reply_with_versions(6)]))))
    assert code == 2 and "more than 6 messages" in err, err
    assert len(stored_ids(data_dir)) == 1


def test_more_versions_of_a_reply_than_the_cap_are_refused(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chat_export, "MAX_REPLY_VERSIONS", 3)
    assert run("import", str(write(tmp_path / "three.json", chat_file([message(), reply_with_versions(3)]))))[0] == 0
    code, _, err = run("import", str(write(tmp_path / "four.json", chat_file([message(), reply_with_versions(4)]))))
    assert code == 2 and err.count("\n") == 1 and "has 4 versions" in err and "at most 3" in err, err
    assert len(stored_ids(data_dir)) == 1


CHILD = """
import io, sys, time
from app.store.cli import main
for path in sys.argv[1:]:
    err = io.StringIO()
    start = time.monotonic()
    code = main(["import", path], stdout=io.StringIO(), stderr=err)
    print(code, round(time.monotonic() - start, 2), err.getvalue().strip().replace("\\n", " | "), flush=True)
"""


def address_space_after_imports() -> int:
    probe = ("import app.store.cli, app.store.export, app.workspace.conversation, engine.params\n"
             "print(next(l for l in open('/proc/self/status') if l.startswith('VmPeak')))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    return int(out.stdout.split()[1]) * 1024


def test_files_past_the_real_caps_end_in_one_line_under_a_memory_limit(tmp_path: Path, data_dir: Path) -> None:
    """With the real caps: a file just past the message cap (3.5 MB), a reply just past the
    versions cap, a file past the byte cap (sparse: nothing is written) and /proc/kmsg (a
    regular file whose read waits forever) each end in one line, in one child under RLIMIT_AS."""
    messages = write(tmp_path / "messages.json", chat_file([message()] * (chat_export.MAX_IMPORT_MESSAGES + 1)))
    versions = write(tmp_path / "versions.json",
                     chat_file([message(), reply_with_versions(chat_export.MAX_REPLY_VERSIONS + 1)]))
    sparse = tmp_path / "big.json"
    with open(sparse, "wb") as file:
        file.truncate(chat_export.MAX_IMPORT_BYTES + 1)
    paths = [messages, versions, sparse] + ([Path("/proc/kmsg")] if Path("/proc/kmsg").exists() else [])
    limit = address_space_after_imports() + 256 * 2**20  # a parse of the 3.5 MB file needs ~30 MB

    def cap_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    done = subprocess.run(
        [sys.executable, "-c", CHILD, *map(str, paths)], cwd=REPO, capture_output=True, text=True, timeout=60,
        preexec_fn=cap_memory, env=dict(os.environ, TANDEM_DATA_DIR=str(data_dir)),
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == len(paths), done.stdout
    expected = [f"more than {chat_export.MAX_IMPORT_MESSAGES:,} messages",
                f"at most {chat_export.MAX_REPLY_VERSIONS:,} versions", "more than the 32.0 MiB", "Tandem chat"]
    for line, needle in zip(lines, expected):
        assert line.startswith("2 ") and needle in line and "|" not in line, line
    assert stored_ids(data_dir) == []
