"""Files written safely: exports never replace a link, a FIFO or a device, and take any name the
folder takes; CSV cells a spreadsheet would run are text; Tandem's folders and files are
private; API keys never reach the chat store's file."""

from __future__ import annotations

import csv
import io
import json
import os
import sqlite3
import stat
from pathlib import Path

import pytest

from app.arena.export import leaderboard_csv
from app.arena.leaderboard import LeaderboardRow
from app.files import UnsafeOutputError, csv_text, make_private_file, write_text_atomically
from app.workspace.turn_summary import ReplyFigures, to_csv
from app.secrets import FileSecrets, default_secrets
from app.settings import Settings, settings_path
from app.store import migrations
from app.store.chat_store import ChatStore, PaneLayout
from app.store.cli import main
from engine.formats.default_model import ensure_data_dir
from tests.app.fixtures.chats import build_conversation
from tests.app.fixtures.make_chats_v1 import SCHEMA_V1

KEY = "sk-live-7f3a9c0e1b2d4f6a8c0e2b4d6f8a0c2e"


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(args), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "data"
    monkeypatch.setenv("TANDEM_DATA_DIR", str(folder))
    return folder


@pytest.fixture
def saved_id(data_dir: Path) -> str:
    conversation = build_conversation("Lyon")
    with ChatStore.open() as store:
        store.save_conversation(conversation)
    return conversation.id


def a_device(tmp_path: Path) -> Path:
    """A character device to write to. As root, a null device made here (the old code
    replaced /dev/full as root, and a regression must not break this machine); as
    anyone else /dev/full itself, which they cannot replace anyway."""
    if os.geteuid() != 0:
        return Path("/dev/full")
    device = tmp_path / "full"
    os.mknod(device, stat.S_IFCHR | 0o600, os.makedev(1, 7))  # /dev/full's numbers on Linux
    return device


# -- exports --------------------------------------------------------------------------


def test_export_replaces_a_regular_file_atomically(tmp_path: Path, saved_id: str) -> None:
    target = tmp_path / "out.md"
    target.write_text("old", encoding="utf-8")
    assert run("export", saved_id[:8], "-o", str(target)) == (0, "", "")
    assert target.read_text(encoding="utf-8").startswith("# Lyon")
    assert mode(target) == 0o600
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_export_onto_a_symlink_is_refused(tmp_path: Path, saved_id: str) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me", encoding="utf-8")
    link = tmp_path / "out.md"
    link.symlink_to(victim)
    code, out, err = run("export", saved_id[:8], "-o", str(link))
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "is a symbolic link, not a regular file" in err and "Traceback" not in err
    assert link.is_symlink() and os.readlink(link) == str(victim)
    assert victim.read_text(encoding="utf-8") == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "out.md", "victim.txt"]  # no temporary left


def test_export_onto_a_dangling_symlink_is_refused(tmp_path: Path, saved_id: str) -> None:
    link = tmp_path / "out.md"
    link.symlink_to(tmp_path / "nowhere")
    code, _, err = run("export", saved_id[:8], "-o", str(link))
    assert code == 1 and "symbolic link" in err
    assert link.is_symlink() and not (tmp_path / "nowhere").exists()


def test_export_onto_a_fifo_is_refused(tmp_path: Path, saved_id: str) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    code, _, err = run("export", saved_id[:8], "--format", "json", "-o", str(fifo))
    assert code == 1 and "is a named pipe (FIFO), not a regular file" in err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_export_onto_a_device_is_refused(tmp_path: Path, saved_id: str) -> None:
    device = a_device(tmp_path)
    before = os.lstat(device)
    code, _, err = run("export", saved_id[:8], "-o", str(device))
    assert code == 1 and "is a device, not a regular file" in err
    after = os.lstat(device)
    assert stat.S_ISCHR(after.st_mode) and (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev)


def test_export_onto_a_folder_is_refused(tmp_path: Path, saved_id: str) -> None:
    code, _, err = run("export", saved_id[:8], "-o", str(tmp_path))
    assert code == 1 and "is a folder" in err


def test_the_atomic_write_itself_refuses_every_special_file(tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "target")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, what in ((link, "a symbolic link"), (fifo, "a named pipe (FIFO)"), (a_device(tmp_path), "a device")):
        with pytest.raises(UnsafeOutputError, match="not a regular file") as caught:
            write_text_atomically(path, "x")
        assert caught.value.path == path and caught.value.what == what
    assert not (tmp_path / "target").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.parametrize("length", [250, 255])
def test_export_to_the_longest_name_the_folder_takes(tmp_path: Path, saved_id: str, length: int) -> None:
    target = tmp_path / ("é" * ((length - 3) // 2) + "x" * ((length - 3) % 2) + ".md")  # bytes, as NAME_MAX counts
    assert len(os.fsencode(target.name)) == length
    assert run("export", saved_id[:8], "-o", str(target)) == (0, "", "")
    assert target.read_text(encoding="utf-8").startswith("# Lyon")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["data", target.name])  # no temporary left


# -- CSV a spreadsheet opens ------------------------------------------------------------------

CALC = "x;=cmd|' /C calc'!A0"
FORMULAS = ["=1+1", "+1+1", "-1+1", "@SUM(A1)", "\t=1", "\r=1"]


def cells_a_spreadsheet_sees(text: str, delimiter: str) -> list[str]:
    return [cell for row in csv.reader(io.StringIO(text), delimiter=delimiter) for cell in row]


def test_csv_cells_never_start_a_formula_whatever_the_separator() -> None:
    text = csv_text([["name", "rating"], [CALC, -3.25], *([f, "-0.5"] for f in FORMULAS)])
    for delimiter in (",", ";", "\t"):
        for cell in cells_a_spreadsheet_sees(text, delimiter):
            assert not cell.startswith(("=", "+", "-", "@", "\t", "\r")) or cell in ("-3.25", "-0.5"), (delimiter, cell)
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[1] == [CALC, "-3.25"]  # quoted: one cell for a reader that splits on ";" too
    assert [r[0] for r in rows[2:]] == ["'" + f for f in FORMULAS]  # shown as text, nothing lost


def test_every_csv_tandem_writes_goes_through_the_same_cells() -> None:
    row = LeaderboardRow(name=CALC, contender="=HYPERLINK(1)", rating=1000.0, low=990.0, high=1010.0, votes=1,
                         wins=1, losses=0, ties=0, both_bad=0, win_rate=1.0)
    board = list(csv.reader(io.StringIO(leaderboard_csv([row]))))
    assert board[1][1] == CALC and board[1][-1] == "'=HYPERLINK(1)"
    assert f'"{CALC}"' in leaderboard_csv([row])
    figures = ReplyFigures(pane_id=1, title=CALC, model="@evil", words=3, tokens=None, tokens_per_s=None,
                           ttft_s=None, shared={})
    summary = to_csv([figures])
    assert f'"{CALC}"' in summary and list(csv.reader(io.StringIO(summary)))[1][:2] == [CALC, "'@evil"]


# -- private folders and files ------------------------------------------------------------


def test_the_data_folder_and_the_store_are_private(data_dir: Path) -> None:
    with ChatStore.open() as store:
        store.save_conversation(build_conversation())
        assert mode(data_dir) == 0o700
        for name in ("chats.sqlite3", "chats.sqlite3-wal", "chats.sqlite3-shm"):
            assert mode(data_dir / name) == 0o600, name


def test_an_existing_loose_data_folder_and_store_are_tightened(data_dir: Path) -> None:
    with ChatStore.open() as store:
        store.save_conversation(build_conversation())
    os.chmod(data_dir, 0o755)
    os.chmod(data_dir / "chats.sqlite3", 0o644)
    with ChatStore.open():
        assert mode(data_dir) == 0o700 and mode(data_dir / "chats.sqlite3") == 0o600
    os.chmod(data_dir, 0o755)
    assert ensure_data_dir() == data_dir and mode(data_dir) == 0o700


def test_a_folder_given_for_the_store_keeps_its_mode(tmp_path: Path) -> None:
    """Only Tandem's own folders are tightened; the store's file always is."""
    os.chmod(tmp_path, 0o755)
    with ChatStore.open(tmp_path / "mine.sqlite3"):
        pass
    assert mode(tmp_path) == 0o755 and mode(tmp_path / "mine.sqlite3") == 0o600


def test_the_config_folder_and_settings_are_private(private_config: Path) -> None:
    Settings(theme="dark").save()
    assert mode(private_config) == 0o700 and mode(settings_path()) == 0o600
    os.chmod(private_config, 0o755)
    os.chmod(settings_path(), 0o644)
    assert Settings.load().theme == "dark"
    assert mode(private_config) == 0o700 and mode(settings_path()) == 0o600


def test_tightening_never_follows_a_link(tmp_path: Path) -> None:
    other = tmp_path / "someone-elses"
    other.write_text("x", encoding="utf-8")
    os.chmod(other, 0o644)
    link = tmp_path / "settings.json"
    link.symlink_to(other)
    assert not make_private_file(link)
    assert mode(other) == 0o644


# -- secrets out of the chat store ----------------------------------------------------------


def store_bytes(path: Path) -> bytes:
    """Everything SQLite keeps for the store: the file and its journals."""
    return b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))


def test_a_remote_key_never_reaches_the_store_file(data_dir: Path, private_config: Path) -> None:
    conversation = build_conversation()
    with ChatStore.open() as store:
        store.save_conversation(conversation)
        store.save_layout([PaneLayout(conversation.id, "Remote", "http://localhost:8080/v1", "llama", KEY)])
        assert KEY.encode() not in store_bytes(store.path)
        path = store.path
    assert KEY.encode() not in store_bytes(path)
    # It went to the secrets file (no keyring here): 0600 in the 0700 config folder.
    secrets_file = private_config / "secrets.json"
    assert KEY in json.loads(secrets_file.read_text(encoding="utf-8"))["secrets"].values()
    assert mode(secrets_file) == 0o600 and mode(private_config) == 0o700

    # A restart restores the key, under the same id.
    with ChatStore.open() as store:
        [pane] = store.load_layout()
    assert pane.remote_api_key == KEY and pane.remote_key_id is not None
    assert default_secrets().get(pane.remote_key_id) == KEY

    # A layout without the pane forgets its key.
    with ChatStore.open() as store:
        store.save_layout([PaneLayout(conversation.id, "Local")])
    assert default_secrets().get(pane.remote_key_id) is None
    assert KEY not in secrets_file.read_text(encoding="utf-8")


def build_v2_with_a_key(path: Path) -> None:
    """A version-2 store as Tandem wrote it: the remote pane's key in plain text in the layout."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript(SCHEMA_V1)
    conn.execute("BEGIN")
    migrations.migrate_v1_to_v2(conn)
    conn.execute(
        "INSERT INTO conversations (id, title, created_at, updated_at) VALUES (?, 'Remote', 1.0, 2.0)", ("c" * 32,)
    )
    conn.execute(
        """INSERT INTO layout (position, conversation_id, title, remote_base_url, remote_model, remote_api_key, width)
           VALUES (0, ?, 'Remote', 'http://localhost:8080/v1', 'llama', ?, 480),
                  (1, ?, 'Local', NULL, NULL, NULL, NULL)""",
        ("c" * 32, KEY, "c" * 32),
    )
    conn.execute("PRAGMA user_version = 2")
    conn.execute("COMMIT")
    conn.close()
    os.chmod(path, 0o644)


def test_v2_to_v3_moves_a_plain_text_key_out(tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"
    build_v2_with_a_key(path)
    assert KEY.encode() in path.read_bytes()
    secrets = FileSecrets(tmp_path / "config" / "secrets.json")
    with ChatStore.open(path, secrets=secrets) as store:
        # v3, then v4 (reply versions), v5 (arena votes), v6 (each reply's system prompt), v7 (attachments)
        assert store.schema_version == 8
        remote, local = store.load_layout()
        assert (remote.remote_base_url, remote.remote_model, remote.remote_api_key, remote.width) == (
            "http://localhost:8080/v1", "llama", KEY, 480,
        )
        assert remote.remote_key_id is not None and secrets.get(remote.remote_key_id) == KEY
        assert local.remote_api_key is None and local.remote_key_id is None
        columns = [r[1] for r in sqlite3.connect(path).execute("PRAGMA table_info(layout)")]
        assert "remote_api_key" not in columns and "remote_key_id" in columns
    # Not in the file's bytes, its free pages or its journal, and the file is private now.
    assert KEY.encode() not in store_bytes(path)
    assert mode(path) == 0o600


def test_v2_to_v3_step_alone_and_retried(tmp_path: Path) -> None:
    path = tmp_path / "v2.sqlite3"
    build_v2_with_a_key(path)
    secrets = FileSecrets(tmp_path / "secrets.json")
    conn = sqlite3.connect(path, isolation_level=None)
    # A migration that failed later on (rolled back) and is tried again: one copy of the key.
    conn.execute("BEGIN")
    migrations.migrate_v2_to_v3(conn, secrets)
    conn.execute("ROLLBACK")
    conn.execute("BEGIN")
    migrations.migrate(conn, 2, secrets)
    conn.execute("COMMIT")
    rows = conn.execute("SELECT position, remote_key_id FROM layout ORDER BY position").fetchall()
    assert rows[1] == (1, None)
    assert rows[0][1] is not None and secrets.get(rows[0][1]) == KEY
    stored = json.loads((tmp_path / "secrets.json").read_text(encoding="utf-8"))["secrets"]
    assert list(stored.values()) == [KEY]


def test_a_restart_restores_a_remote_pane_with_its_key(data_dir: Path) -> None:
    """Through the recorder and the session: the pane's key id round-trips, the key comes back."""
    from app.remote.remote_pane import RemoteBackend
    from app.store.recorder import layout_of

    backend = RemoteBackend.create("http://localhost:9/v1", "llama", KEY)
    assert backend.key_id is not None and backend.copy().key_id == backend.key_id
    assert RemoteBackend.create("http://localhost:9/v1", "llama").key_id is None

    class Pane:
        def __init__(self) -> None:
            self.conversation = build_conversation()
            self.title = "Remote"
            self.remote = backend

    pane = Pane()
    with ChatStore.open() as store:
        store.save_conversation(pane.conversation)
        store.save_layout(layout_of([pane]))  # type: ignore[list-item]
        assert KEY.encode() not in store_bytes(store.path)
    with ChatStore.open() as store:
        [entry] = store.load_layout()
    restored = RemoteBackend.create(entry.remote_base_url, entry.remote_model, entry.remote_api_key,
                                    key_id=entry.remote_key_id)
    assert restored.api_key == KEY and restored.key_id == backend.key_id


class MemoryKeyring:
    """A keyring backend in memory, failing on demand (a locked keyring, D-Bus gone)."""

    priority = 1

    def __init__(self) -> None:
        self.values: dict[tuple[str, str], str] = {}
        self.failing = False

    def _check(self) -> None:
        if self.failing:
            raise RuntimeError("the keyring is locked")

    def get_password(self, service: str, name: str) -> str | None:
        self._check()
        return self.values.get((service, name))

    def set_password(self, service: str, name: str, value: str) -> None:
        self._check()
        self.values[(service, name)] = value

    def delete_password(self, service: str, name: str) -> None:
        self._check()
        del self.values[(service, name)]


def test_keys_go_to_a_usable_keyring_and_to_the_file_when_it_fails(
    tmp_path: Path, private_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app import secrets as secrets_module

    backend = MemoryKeyring()
    monkeypatch.setattr(secrets_module, "usable_keyring", lambda: backend)
    monkeypatch.setenv("TANDEM_SECRETS", "")
    chosen = default_secrets()
    assert isinstance(chosen, secrets_module.KeyringSecrets) and "keyring" in chosen.where
    chosen.set("remote-pane/a", KEY)
    assert backend.values == {("Tandem", "remote-pane/a"): KEY}
    assert not (private_config / "secrets.json").exists()  # nothing on disk
    backend.failing = True
    chosen.set("remote-pane/b", "other")  # falls back to the 0600 file
    assert chosen.get("remote-pane/b") == "other" and mode(private_config / "secrets.json") == 0o600
    backend.failing = False
    chosen.delete("remote-pane/a")
    chosen.delete("remote-pane/b")
    assert backend.values == {} and chosen.get("remote-pane/b") is None
    # TANDEM_SECRETS=file forces the file.
    monkeypatch.setenv("TANDEM_SECRETS", "file")
    assert isinstance(default_secrets(), FileSecrets)


def test_no_keyring_backend_means_the_file() -> None:
    """Here (no Secret Service) keyring's own choice is its fail backend: refused."""
    import keyring
    from keyring.backends import fail

    from app.secrets import usable_keyring

    previous = keyring.get_keyring()
    if isinstance(previous, fail.Keyring):
        assert usable_keyring() is None
    keyring.set_keyring(fail.Keyring())
    try:
        assert usable_keyring() is None
    finally:
        keyring.set_keyring(previous)
