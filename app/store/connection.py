"""Opening the chat store's SQLite file: where it is, checking it, migrating it, keeping a damaged one aside.

The file is `data_dir() / "chats.sqlite3"` ($TANDEM_DATA_DIR overrides the
folder). It runs in WAL mode with `synchronous=NORMAL`: a committed
transaction survives the app being killed (only a power cut may lose the
last ones), and readers never wait for the writer.

A store of an older schema version is migrated forward at open, all steps
in one transaction (app.store.migrations); a store of a newer version
(written by a later Tandem) is refused and left untouched. A file SQLite
cannot read (not a database, a failed `quick_check`) is moved aside as
`chats.sqlite3.corrupt-YYYYmmdd-HHMMSS` (with its -wal/-shm files) and a new
store is started, with a warning for the window to show.

The store is private: the file is created 0600 before SQLite opens it (its
-wal and -shm files take the same mode), a looser one is tightened at open,
and a data folder Tandem creates is 0700. Every connection runs with
`secure_delete`, so a deleted chat (or a migrated-away key) is zeroed in the
file instead of lingering in its free pages.
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from app.files import create_private_file, make_private_file, make_private_folder
from app.store.errors import NewerStoreError, StoreCorruptError, StoreIOError, store_error
from app.store.migrations import migrate
from app.store.schema import SCHEMA_VERSION, create_schema

if TYPE_CHECKING:
    from app.secrets import Secrets

STORE_FILENAME = "chats.sqlite3"
# How long a write waits for another connection's write to finish before
# reporting the store as locked. The writer thread is the only regular
# writer; this covers the CLI importing a chat while the window runs.
BUSY_TIMEOUT_S = 5.0


def default_path() -> Path:
    """The store in Tandem's data folder."""
    from engine.model_files import data_dir

    return data_dir() / STORE_FILENAME


@dataclass(slots=True)
class OpenedStore:
    """A connection to an intact store of the current schema version."""

    conn: sqlite3.Connection
    # Set when a damaged file was kept aside and a new store started: what
    # happened and where the old file is, in words for the window to show.
    warning: str | None = None


class _Unreadable(Exception):
    """The file is not a chat store SQLite can read; `reason` says why, for the warning."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def open_store_file(path: Path, *, recover: bool, secrets: Secrets | None = None) -> OpenedStore:
    """Open (creating or migrating as needed) the store file at `path`.

    A file SQLite cannot read is moved aside and a new store started when
    `recover`; otherwise StoreCorruptError. `secrets`: where a migration
    moves the secrets of an old store (default: app.secrets.default_secrets()).
    Raises StoreError.
    """
    _prepare_folder(path.parent)
    warning: str | None = None
    try:
        conn = _connect_checked(path)
    except _Unreadable as bad:
        if not recover:
            raise StoreCorruptError(path, bad.reason) from None
        aside = _move_aside(path)
        warning = (
            f"The chat store could not be read ({bad.reason}). It was kept aside as {aside} "
            "and a new, empty store was started; your earlier chats are still in that file."
        )
        try:
            conn = _connect_checked(path)
        except _Unreadable as again:  # a brand-new file cannot be damaged; the disk is misbehaving
            raise StoreIOError(path, again.reason) from None
    try:
        _configure_and_migrate(conn, path, secrets)
    except BaseException:
        conn.close()
        raise
    for suffix in ("", "-wal", "-shm"):  # a store an older Tandem (or SQLite) made 0644
        make_private_file(path.with_name(path.name + suffix))
    return OpenedStore(conn, warning)


def _prepare_folder(folder: Path) -> None:
    """The store's folder: created private (0700); Tandem's data folder is tightened to that.

    A folder that already exists and is not the data folder (a test's, one
    given on purpose) keeps its mode: it is not Tandem's to change."""
    from engine.model_files import data_dir

    try:
        if not folder.exists() or folder == data_dir():
            make_private_folder(folder)
    except OSError as exc:
        raise store_error(exc, folder) from exc


def _connect_checked(path: Path) -> sqlite3.Connection:
    """A connection to a file that is an intact store of a version we read; nothing written yet."""
    try:
        create_private_file(path)  # before SQLite makes it 0644 (its -wal/-shm copy the mode)
    except OSError as exc:
        raise store_error(exc, path) from exc
    try:
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=True)
    except sqlite3.Error as exc:
        raise store_error(exc, path) from exc
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        # Deleted content is zeroed, not left in free pages: a deleted chat,
        # or an API key a migration moved out, is gone from the file.
        conn.execute("PRAGMA secure_delete = ON")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise NewerStoreError(path, version)
        if version == 0 and conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
            raise _Unreadable("it is an SQLite database, but not a Tandem chat store")
        problems = [row[0] for row in conn.execute("PRAGMA quick_check(5)")]
        if problems != ["ok"]:
            raise _Unreadable("integrity check: " + "; ".join(problems))
    except sqlite3.DatabaseError as exc:
        conn.close()
        code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
        if code in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
            raise _Unreadable(str(exc)) from None
        raise store_error(exc, path) from exc
    except BaseException:
        conn.close()
        raise
    conn.create_function("tandem_contains", 2, contains_folded, deterministic=True)
    return conn


def _configure_and_migrate(conn: sqlite3.Connection, path: Path, secrets: Secrets | None) -> None:
    try:
        # A file system without shared memory (some network shares)
        # refuses WAL and SQLite keeps its rollback journal: as safe, only slower.
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version == SCHEMA_VERSION:
            conn.execute("PRAGMA foreign_keys = ON")
            return
        # Rebuilding tables needs foreign keys off (the pragma is a no-op
        # inside a transaction); foreign_key_check stands in for them.
        conn.execute("PRAGMA foreign_keys = OFF")
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Read again under the write lock: another process may have migrated meanwhile.
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            migrated = version != 0
            if version == 0:
                create_schema(conn)
            else:
                migrate(conn, version, secrets)
            broken = conn.execute("PRAGMA foreign_key_check").fetchall()
            if broken:
                raise StoreCorruptError(path, f"{len(broken)} messages belong to no conversation")
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("PRAGMA foreign_keys = ON")
        if migrated:
            # The old pages (an old version's plain-text keys among them) are
            # in the file until a checkpoint writes the new ones over them;
            # TRUNCATE also empties the WAL that held them.
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    except sqlite3.Error as exc:
        raise store_error(exc, path) from exc


def contains_folded(haystack: str | None, needle: str) -> bool:
    """SQL `tandem_contains(text, needle)`: whether `text` contains the already case-folded `needle`."""
    # Case-insensitive for every script (SQLite's LIKE folds ASCII only), and
    # % and _ in the search are plain characters, not wildcards.
    return haystack is not None and needle in haystack.casefold()


def _move_aside(path: Path) -> Path:
    """Rename a damaged store (and its -wal/-shm) to <name>.corrupt-<time>; returns the new path."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    try:
        # The journal files first: a store file without them is still a
        # consistent (older) database, a journal without its store is not.
        for suffix in ("-wal", "-shm", "-journal"):
            companion = path.with_name(path.name + suffix)
            if companion.exists():
                os.replace(companion, aside.with_name(aside.name + suffix))
        os.replace(path, aside)
    except OSError as exc:
        raise store_error(exc, path) from exc
    return aside
