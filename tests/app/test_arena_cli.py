"""`tandem arena list/export` on a real store, in this process and as `tandem` from a terminal."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from app.arena.cli import main
from app.arena.export import CSV_COLUMNS, VOTES_FORMAT
from app.arena.leaderboard import leaderboard
from app.arena.votes import ArenaSide, ArenaVote
from app.store.chat_store import SCHEMA_VERSION, ChatStore
from engine.params import SamplingParams

REPO = Path(__file__).resolve().parents[2]
SMOL = "SmolLM2-135M-Instruct"


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "data"
    monkeypatch.setenv("TANDEM_DATA_DIR", str(folder))
    return folder


def side(label: str, temperature: float, reply: str, model: str = SMOL) -> ArenaSide:
    return ArenaSide(label, model, {"temperature": temperature, "system_prompt": ""}, reply)


@pytest.fixture
def saved(data_dir: Path) -> list[ArenaVote]:
    """Eight votes: temperature 0.2 wins most against 1.2; a third contender in a three-way tie and an all-bad vote."""
    votes = []
    for t in range(6):
        cold_label, hot_label = ("B", "A") if t % 2 else ("A", "B")  # which side shows first changes
        cold, hot = side(cold_label, 0.2, f"Reply {t}"), side(hot_label, 1.2, f"Rèply ☕ {t}")
        votes.append(ArenaVote(f"Prompt {t}", (cold, hot), "win", hot_label if t == 4 else cold_label, 1000.0 + t))
    other = side("C", SamplingParams().temperature, "Hello", model='=HYPERLINK("http://x")\x1b[2J')  # a formula, a terminal's escape
    votes.append(ArenaVote("Three", (side("A", 0.2, "x"), side("B", 1.2, "y"), other), "tie", None, 1010.0))
    votes.append(ArenaVote("Bad", (side("A", 1.2, "no"), other), "both_bad", None, 1011.0))
    with ChatStore.open(data_dir / "chats.sqlite3") as store:
        return [dataclasses.replace(vote, id=store.add_arena_vote(vote)) for vote in votes]


def run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(args), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_list_table(saved: list[ArenaVote]) -> None:
    code, out, err = run("list", "--rounds", "200")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == ["RANK", "RATING", "95%", "INTERVAL", "VOTES", "W/L/T/BAD", "WIN", "RATE", "MODEL",
                                "AND", "SETTINGS"]
    assert lines[1].split()[0] == "1" and lines[1].endswith(f"{SMOL} · temperature 0.2")
    assert lines[1].split()[5:8] == ["7", "5/1/1/0", "71%"]
    assert lines[2].endswith('  =HYPERLINK("http://x")\\x1b[2J') and "\x1b" not in out  # the escape spelled out
    assert lines[2].split()[5:8] == ["2", "0/0/1/1", "0%"]
    assert lines[3].endswith(f"{SMOL} · temperature 1.2") and lines[3].split()[5:8] == ["8", "1/5/1/1", "12%"]
    assert lines[-1] == "8 votes; 95% intervals from 200 bootstrap rounds (seed 0)."


def test_list_json_is_the_leaderboard(saved: list[ArenaVote]) -> None:
    code, out, err = run("list", "--json", "--rounds", "100", "--seed", "3")
    assert (code, err) == (0, "")
    items = json.loads(out)
    rows = leaderboard(saved, rounds=100, seed=3)
    assert [i["contender"] for i in items] == [r.contender for r in rows]
    assert [(i["rank"], i["rating"], i["low"], i["high"], i["votes"], i["both_bad"]) for i in items] == [
        (n, r.rating, r.low, r.high, r.votes, r.both_bad) for n, r in enumerate(rows, 1)]
    assert set(items[0]) == set(CSV_COLUMNS)
    assert run("list", "--json", "--rounds", "100", "--seed", "3")[1] == out  # seeded: the same intervals


def test_export_csv_and_json(saved: list[ArenaVote], tmp_path: Path) -> None:
    code, out, err = run("export", "--format", "csv", "--rounds", "100")
    assert (code, err) == (0, "")
    table = list(csv.DictReader(io.StringIO(out)))
    rows = leaderboard(saved, rounds=100)
    assert tuple(table[0]) == CSV_COLUMNS and len(table) == 3
    assert [(t["name"].lstrip("'"), float(t["rating"]), int(t["wins"]), int(t["both_bad"])) for t in table] == [
        (r.name, round(r.rating, 2), r.wins, r.both_bad) for r in rows]
    # A cell a spreadsheet would run as a formula is quoted as text.
    assert table[1]["name"] == "'" + rows[1].name and rows[1].name.startswith("=HYPERLINK(")

    target = tmp_path / "out" / "board.json"
    target.parent.mkdir()
    code, out, err = run("export", "--format", "json", "--rounds", "100", "-o", str(target))
    assert (code, out, err) == (0, "", "")
    assert [p.name for p in target.parent.iterdir()] == ["board.json"]  # no temporary file left
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert [i["name"] for i in json.loads(target.read_text(encoding="utf-8"))] == [r.name for r in rows]


def test_export_votes_keeps_what_each_side_hid(saved: list[ArenaVote], tmp_path: Path) -> None:
    target = tmp_path / "votes.json"
    code, out, err = run("export", "--votes", "--format", "json", "-o", str(target))
    assert (code, out, err) == (0, "", "")
    document = json.loads(target.read_text(encoding="utf-8"))
    assert document["format"] == VOTES_FORMAT and document["version"] == 1
    exported = document["votes"]
    assert [v["id"] for v in exported] == [v.id for v in saved]
    assert [v["prompt"] for v in exported] == [v.prompt for v in saved]
    assert exported[4]["outcome"] == "win" and exported[4]["winner"] == "B"
    last = exported[-1]
    assert last["outcome"] == "both_bad" and last["winner"] is None
    assert [(s["label"], s["model"], s["settings"], s["reply"]) for s in last["sides"]] == [
        (s.label, s.model, s.settings, s.reply) for s in saved[-1].sides]
    assert last["sides"][0]["name"] == f"{SMOL} · temperature 1.2"
    code, _, err = run("export", "--votes", "--format", "csv")
    assert code == 2 and "--votes is written as JSON only" in err


def test_export_never_writes_through_a_link_or_into_a_fifo(saved: list[ArenaVote], tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me", encoding="utf-8")
    link = tmp_path / "board.csv"
    link.symlink_to(victim)
    code, out, err = run("export", "--rounds", "10", "-o", str(link))
    assert code == 1 and out == "" and "a symbolic link, not a regular file" in err
    assert link.is_symlink() and victim.read_text(encoding="utf-8") == "keep me"
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    code, _, err = run("export", "--rounds", "10", "-o", str(fifo))
    assert code == 1 and "a named pipe (FIFO)" in err and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_without_a_store(data_dir: Path) -> None:
    assert run("list") == (0, "No arena votes yet: vote in the window (View > Arena).\n", "")
    assert run("list", "--json") == (0, "[]\n", "")
    assert run("export") == (0, ",".join(CSV_COLUMNS) + "\n", "")
    assert json.loads(run("export", "--votes", "--format", "json")[1])["votes"] == []
    assert not data_dir.exists()  # reading created nothing


def test_a_damaged_vote_is_a_warning_and_the_rest_still_counts(saved: list[ArenaVote], data_dir: Path) -> None:
    conn = sqlite3.connect(data_dir / "chats.sqlite3")
    conn.execute("UPDATE arena_votes SET sides = '[{\"label\": \"A\", ' WHERE id = ?", (saved[0].id,))
    conn.commit()
    conn.close()
    code, out, err = run("list", "--json", "--rounds", "50")
    assert code == 0
    assert err.startswith(f"tandem arena: warning: Arena vote {saved[0].id} in ") and "not valid JSON" in err
    assert sum(i["votes"] for i in json.loads(out)) == sum(r.votes for r in leaderboard(saved[1:], rounds=1))


def test_wrong_arguments_and_store_errors(saved: list[ArenaVote], data_dir: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["list", "--rounds", "0"], ["list", "--seed", "-1"], ["export", "--format", "xml"], []):
        with pytest.raises(SystemExit) as exit_:
            main(args)
        assert exit_.value.code == 2
    assert "expected a whole number, 0 or more, got '-1'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["list", "--rounds", "many"])
    assert "--rounds: expected a whole number from 1 to 100000, got 'many'" in capsys.readouterr().err
    with ChatStore.open(data_dir / "chats.sqlite3") as store:
        store._conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    code, out, err = run("list")
    assert code == 1 and out == "" and "newer version of Tandem" in err


def test_the_tandem_command_without_qt_or_torch(saved: list[ArenaVote], data_dir: Path, tmp_path: Path) -> None:
    """As a terminal runs it: through ui.main's subcommands, in a process of its own."""
    target = tmp_path / "board.csv"
    script = (
        "import sys; from ui.main import main;"
        "code = main(['arena', 'list', '--json', '--rounds', '50']) or "
        f"main(['arena', 'export', '--format', 'csv', '--rounds', '50', '-o', {str(target)!r}]);"
        "heavy = [m for m in ('torch', 'PySide6') if m in sys.modules]; print(heavy); sys.exit(code)"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, TANDEM_DATA_DIR=str(data_dir)))
    assert done.returncode == 0, done.stderr
    listing, heavy = done.stdout.rsplit("\n[", 1)
    assert heavy.strip() == "]"  # neither Qt nor torch was imported
    assert len(json.loads(listing)) == 3
    assert target.read_text(encoding="utf-8").startswith(",".join(CSV_COLUMNS) + "\n1,")

    tandem = Path(sys.executable).with_name("tandem")
    if not tandem.exists():
        pytest.skip("the tandem entry point is not installed next to this Python")
    env = dict(os.environ, TANDEM_DATA_DIR=str(data_dir))
    helped = subprocess.run([tandem, "arena", "--help"], env=env, capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and "usage: tandem arena" in helped.stdout and "Bradley-Terry" in helped.stdout
    assert "list" in helped.stdout and "export" in helped.stdout
    exported = subprocess.run([tandem, "arena", "export", "--format", "json", "--rounds", "50"], env=env,
                              capture_output=True, text=True, timeout=60)
    assert exported.returncode == 0, exported.stderr
    assert [i["rank"] for i in json.loads(exported.stdout)] == [1, 2, 3]


def test_one_vote_has_no_interval_yet_and_counts_in_the_singular(data_dir: Path) -> None:
    vote = ArenaVote("Only", (side("A", 0.2, "x"), side("B", 1.2, "y")), "win", "A", 1000.0)
    with ChatStore.open(data_dir / "chats.sqlite3") as store:
        store.add_arena_vote(vote)
    code, out, err = run("list", "--rounds", "50")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    # Resampling one vote always draws that vote: a zero-width interval would claim a certainty it lacks.
    assert "needs more votes" in lines[1] and "needs more votes" in lines[2]
    assert lines[-1] == "1 vote; 95% intervals from 50 bootstrap rounds (seed 0)."
