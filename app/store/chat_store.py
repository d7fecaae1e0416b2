"""The chat store: every conversation, message and the pane layout, in one SQLite file.

The file is `data_dir() / "chats.sqlite3"` ($TANDEM_DATA_DIR overrides the
folder). It runs in WAL mode with `synchronous=NORMAL`: a committed
transaction survives the app being killed (only a power cut may lose the
last ones), and readers never wait for the writer. Each write is one
transaction, so a crash leaves either the old or the new state of a reply,
never half of one.

The schema version is SQLite's `PRAGMA user_version`. A store of an older
version is migrated forward at open, each step in one transaction; a store
of a newer version (written by a later Tandem) is refused and left
untouched. A file SQLite cannot read (not a database, a failed
`quick_check`) is moved aside as `chats.sqlite3.corrupt-YYYYmmdd-HHMMSS`
(with its -wal/-shm files) and a new store is started; `open_warning` says
so, for the window to show.

Schema history
--------------
v1  conversations(id, title, created_at, updated_at, system_prompt, params,
    model_id, kept_ids TEXT json), messages(conversation_id, position, role,
    text, token_ids TEXT json, state, stats, error, created_at, turn_mark),
    meta(key, value). One model per conversation, token ids as JSON text.
v2  token ids packed as little-endian int32 BLOBs (4 bytes a token instead
    of ~6 characters, no JSON parse on load); conversations gain
    context_policy and deleted_at (soft delete, undoable); messages gain
    model_id and params (each reply remembers the model and sampling that
    wrote it; v1 replies get their conversation's model, params unknown);
    the layout table (the panes that were open).

Threads: a ChatStore is one sqlite3 connection and belongs to the thread
that opened it. The GUI thread keeps one for reads; writes go through
`app.store.writer.StoreWriter`, which owns another on its own thread.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import sys
import time
from array import array
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.errors import AppError

if TYPE_CHECKING:
    # Imported lazily at run time: app.workspace.conversation pulls in engine.model.sampler
    # and with it torch, which `tandem chats list` has no need of.
    from engine.params import SamplingParams

    from app.workspace.conversation import Conversation, Message, ReplyStats

SCHEMA_VERSION = 2
STORE_FILENAME = "chats.sqlite3"
# How long a write waits for another connection's write to finish before
# reporting the store as locked. The writer thread is the only regular
# writer; this covers the CLI importing a chat while the window runs.
BUSY_TIMEOUT_S = 5.0
# Longest preview text a summary carries (the sidebar elides it further).
PREVIEW_CHARS = 160

_SESSION_KEY = "session"

_INT32 = "i"
assert array(_INT32).itemsize == 4, "token ids are stored as 32-bit integers"


# -- errors --------------------------------------------------------------------


class StoreError(AppError):
    """The chat store could not be read or written. The message can be shown as it is."""


class DiskFullError(StoreError):
    def __init__(self, path: Path) -> None:
        self.path = path
        super().__init__(
            f"The disk is full: Tandem could not save to its chat store ({path}). "
            "Your chats are still open; free some space or export them."
        )


class ReadOnlyStoreError(StoreError):
    def __init__(self, path: Path, detail: str = "") -> None:
        self.path = path
        why = f" ({detail})" if detail else ""
        super().__init__(
            f"The chat store ({path}) is read-only{why}: Tandem cannot save to it. "
            "Your chats are still open; make the file and its folder writable "
            "(or point TANDEM_DATA_DIR at a writable folder), or export them."
        )


class StoreLockedError(StoreError):
    def __init__(self, path: Path) -> None:
        self.path = path
        super().__init__(
            f"The chat store ({path}) is locked by another program (another copy of Tandem?), "
            "so the change could not be saved. Close the other program; your chats are still open."
        )


class StoreIOError(StoreError):
    def __init__(self, path: Path, detail: str) -> None:
        self.path = path
        super().__init__(
            f"Reading or writing the chat store ({path}) failed: {detail}. "
            "Check the disk; your chats are still open, export them to be safe."
        )


class StoreCorruptError(StoreError):
    def __init__(self, path: Path, detail: str) -> None:
        self.path = path
        self.detail = detail
        super().__init__(
            f"The chat store ({path}) is damaged ({detail}). Export the chats you have open; "
            "the next start of Tandem keeps the damaged file aside and starts a new store."
        )


class NewerStoreError(StoreError):
    def __init__(self, path: Path, version: int) -> None:
        self.path = path
        self.version = version
        super().__init__(
            f"The chat store ({path}) was written by a newer version of Tandem (schema version "
            f"{version}; this version reads up to {SCHEMA_VERSION}). It was left untouched: update "
            "Tandem, or move the file elsewhere to start with an empty store."
        )


class UnknownConversationError(StoreError, KeyError):
    def __init__(self, conversation_id: str) -> None:
        self.conversation_id = conversation_id
        super().__init__(f"There is no saved conversation {conversation_id}; it may have been deleted.")

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class _Unreadable(Exception):
    """The file is not a chat store SQLite can read; `reason` says why, for the warning."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def store_error(exc: BaseException, path: Path) -> StoreError:
    """The StoreError a person can act on for an sqlite3 or OS error."""
    if isinstance(exc, StoreError):
        return exc
    if isinstance(exc, OSError):
        import errno

        if exc.errno == errno.ENOSPC:
            return DiskFullError(path)
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return ReadOnlyStoreError(path, exc.strerror or "")
        return StoreIOError(path, exc.strerror or str(exc))
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    detail = str(exc)
    if primary == sqlite3.SQLITE_FULL:
        return DiskFullError(path)
    if primary in (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PERM, sqlite3.SQLITE_AUTH):
        return ReadOnlyStoreError(path)
    if primary == sqlite3.SQLITE_CANTOPEN:
        # SQLite says only "unable to open database file"; the folder's
        # permissions are the usual reason, so say that when they are.
        folder = path.parent
        if folder.exists() and not os.access(folder, os.W_OK | os.X_OK):
            return ReadOnlyStoreError(path, "its folder is not writable")
        return StoreIOError(path, "the file could not be opened")
    if primary in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return StoreLockedError(path)
    if primary in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
        return StoreCorruptError(path, detail)
    if primary == sqlite3.SQLITE_IOERR:
        return StoreIOError(path, detail)
    return StoreError(f"The chat store ({path}) could not be used: {detail}.")


# -- records -------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class PaneLayout:
    """One open pane, left to right, as the next start brings it back.

    The API key of a remote pane stays in the store file on this machine
    (like the rest of the chats); no export ever includes it.
    """

    conversation_id: str
    title: str
    remote_base_url: str | None = None
    remote_model: str | None = None
    remote_api_key: str | None = dataclasses.field(default=None, repr=False)
    width: int | None = None


@dataclass(slots=True, frozen=True)
class ConversationSummary:
    """A sidebar / `tandem chats list` row: enough to show it without loading its messages."""

    id: str
    title: str
    created_at: float
    updated_at: float
    message_count: int
    model_id: str
    preview: str  # the start of its last user or assistant message, whitespace collapsed


@dataclass(slots=True, frozen=True)
class HeaderRecord:
    """A conversation's own fields, detached from the live object.

    Taken on the thread that owns the Conversation (the GUI thread), so the
    writer thread never reads an object the GUI is changing.
    """

    id: str
    title: str
    created_at: float
    system_prompt: str
    params: str  # JSON
    model_id: str
    context_policy: str
    kept_ids: bytes


@dataclass(slots=True, frozen=True)
class MessageRecord:
    """One message as stored, detached from the live object (see HeaderRecord)."""

    position: int
    role: str
    text: str
    token_ids: bytes
    state: str
    model_id: str | None
    params: str | None  # JSON
    stats: str | None  # JSON
    error: str | None
    created_at: float
    turn_mark: int | None


def header_record(conversation: Conversation) -> HeaderRecord:
    return HeaderRecord(
        id=conversation.id,
        title=conversation.title,
        created_at=conversation.created_at,
        system_prompt=conversation.system_prompt,
        params=json.dumps(params_to_dict(conversation.params)),
        model_id=conversation.model_id,
        context_policy=conversation.context_policy,
        kept_ids=pack_ids(conversation.kept_ids),
    )


def message_record(message: Message, position: int, turn_mark: int | None = None) -> MessageRecord:
    return MessageRecord(
        position=position,
        role=message.role,
        text=message.text,
        token_ids=pack_ids(message.token_ids),
        state=message.state,
        model_id=message.model_id,
        params=None if message.params is None else json.dumps(params_to_dict(message.params)),
        stats=None if message.stats is None else json.dumps(stats_to_dict(message.stats)),
        error=message.error,
        created_at=message.created_at,
        turn_mark=turn_mark,
    )


def message_records(conversation: Conversation) -> list[MessageRecord]:
    marks = conversation.turn_marks
    return [
        message_record(message, i, marks[i] if i < len(marks) else None)
        for i, message in enumerate(conversation.messages)
    ]


# -- encodings shared with the export --------------------------------------------


def pack_ids(ids: Sequence[int]) -> bytes:
    """Token ids as little-endian int32 bytes."""
    packed = array(_INT32, ids)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def unpack_ids(blob: bytes | None) -> list[int]:
    if not blob:
        return []
    whole = len(blob) - len(blob) % 4  # a torn value can only come from a damaged row; drop it
    ids = array(_INT32)
    ids.frombytes(bytes(blob[:whole]))
    if sys.byteorder == "big":
        ids.byteswap()
    return ids.tolist()


def params_to_dict(params: SamplingParams) -> dict[str, Any]:
    fields = {f.name: getattr(params, f.name) for f in dataclasses.fields(params)}
    fields["stop"] = list(params.stop)
    return fields


def params_from_dict(data: dict[str, Any]) -> SamplingParams:
    """SamplingParams from a stored or exported dict; unknown keys are ignored.

    Raises engine.model.sampler.InvalidSamplingParams (a ValueError) or TypeError
    for values SamplingParams refuses.
    """
    from engine.params import SamplingParams

    known = {f.name for f in dataclasses.fields(SamplingParams)}
    kwargs = {k: v for k, v in data.items() if k in known}
    if "stop" in kwargs and isinstance(kwargs["stop"], list):
        kwargs["stop"] = tuple(kwargs["stop"])
    return SamplingParams(**kwargs)


def stats_to_dict(stats: ReplyStats) -> dict[str, Any]:
    return {f.name: getattr(stats, f.name) for f in dataclasses.fields(stats)}


def stats_from_dict(data: dict[str, Any]) -> ReplyStats:
    """ReplyStats from a stored or exported dict. Raises TypeError/ValueError for a wrong shape."""
    from app.workspace.conversation import ReplyStats

    names = [f.name for f in dataclasses.fields(ReplyStats)]
    missing = [n for n in names if n not in data]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}")
    return ReplyStats(**{n: data[n] for n in names})


# -- the schema ------------------------------------------------------------------

_CREATE_CONVERSATIONS = """
CREATE TABLE conversations (
    id TEXT PRIMARY KEY NOT NULL,
    title TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    system_prompt TEXT NOT NULL DEFAULT '',
    params TEXT NOT NULL DEFAULT '{}',
    model_id TEXT NOT NULL DEFAULT 'default',
    context_policy TEXT NOT NULL DEFAULT 'stop',
    kept_ids BLOB NOT NULL DEFAULT x'',
    deleted_at REAL
)"""

_CREATE_MESSAGES = """
CREATE TABLE messages (
    conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    role TEXT NOT NULL,
    text TEXT NOT NULL,
    token_ids BLOB NOT NULL DEFAULT x'',
    state TEXT NOT NULL,
    model_id TEXT,
    params TEXT,
    stats TEXT,
    error TEXT,
    created_at REAL NOT NULL,
    turn_mark INTEGER,
    PRIMARY KEY (conversation_id, position)
)"""

_CREATE_REST = (
    "CREATE INDEX conversations_by_update ON conversations (updated_at DESC)",
    """CREATE TABLE layout (
        position INTEGER PRIMARY KEY NOT NULL,
        conversation_id TEXT NOT NULL,
        title TEXT NOT NULL DEFAULT '',
        remote_base_url TEXT,
        remote_model TEXT,
        remote_api_key TEXT,
        width INTEGER
    )""",
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL)",
)


def _json_ids_to_blob(text: str | bytes | None) -> bytes:
    """v1 -> v2: token ids from JSON text to packed int32 (nothing for a value that is not a list of ints)."""
    if isinstance(text, bytes):
        return text
    try:
        ids = json.loads(text or "[]")
        if isinstance(ids, list) and all(isinstance(i, int) and -(2**31) <= i < 2**31 for i in ids):
            return pack_ids(ids)
    except (ValueError, TypeError):
        pass
    return b""


def _migrate_1_to_2(conn: sqlite3.Connection) -> None:
    """Rebuild both tables with v2's columns (SQLite cannot change a column's type in place)."""
    conn.create_function("tandem_ids_blob", 1, _json_ids_to_blob, deterministic=True)
    conn.execute(_CREATE_CONVERSATIONS.replace("CREATE TABLE conversations", "CREATE TABLE conversations_v2"))
    conn.execute(
        """INSERT INTO conversations_v2 (id, title, created_at, updated_at, system_prompt, params,
                                         model_id, context_policy, kept_ids, deleted_at)
           SELECT id, title, created_at, updated_at, system_prompt, params,
                  model_id, 'stop', tandem_ids_blob(kept_ids), NULL
           FROM conversations"""
    )
    conn.execute(_CREATE_MESSAGES.replace("CREATE TABLE messages", "CREATE TABLE messages_v2"))
    conn.execute(
        """INSERT INTO messages_v2 (conversation_id, position, role, text, token_ids, state, model_id,
                                    params, stats, error, created_at, turn_mark)
           SELECT m.conversation_id, m.position, m.role, m.text, tandem_ids_blob(m.token_ids), m.state,
                  CASE WHEN m.role = 'assistant' THEN c.model_id END,
                  NULL, m.stats, m.error, m.created_at, m.turn_mark
           FROM messages AS m JOIN conversations AS c ON c.id = m.conversation_id"""
    )
    conn.execute("DROP TABLE messages")
    conn.execute("DROP TABLE conversations")
    conn.execute("ALTER TABLE conversations_v2 RENAME TO conversations")
    conn.execute("ALTER TABLE messages_v2 RENAME TO messages")
    for statement in _CREATE_REST:
        conn.execute(statement)


# MIGRATIONS[v] takes a store of version v to version v + 1.
MIGRATIONS = {1: _migrate_1_to_2}


def _create_schema(conn: sqlite3.Connection) -> None:
    conn.execute(_CREATE_CONVERSATIONS)
    conn.execute(_CREATE_MESSAGES)
    for statement in _CREATE_REST:
        conn.execute(statement)


# -- the store ---------------------------------------------------------------------


def default_path() -> Path:
    from engine.formats.default_model import data_dir

    return data_dir() / STORE_FILENAME


def _contains_folded(haystack: str | None, needle: str) -> bool:
    # Case-insensitive for every script (SQLite's LIKE folds ASCII only), and
    # % and _ in the search are plain characters, not wildcards.
    return haystack is not None and needle in haystack.casefold()


def _collapse(text: str) -> str:
    return " ".join(text.split())[:PREVIEW_CHARS]


class ChatStore:
    """Conversations, messages and the pane layout in one SQLite file. See the module docstring."""

    def __init__(self, conn: sqlite3.Connection, path: Path, open_warning: str | None, crashed: bool) -> None:
        self._conn = conn
        self.path = path
        # Shown once by the window: e.g. the damaged file was kept aside.
        self.open_warning = open_warning
        # The previous session did not end with mark_clean_exit (it crashed or was killed).
        self.crashed_last_time = crashed

    # -- opening ---------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike[str] | None = None, *, recover: bool = True) -> ChatStore:
        """Open (creating or migrating as needed) the store at `path` (default: the data folder's).

        A file SQLite cannot read is moved aside and a new store started
        (`open_warning` says so) when `recover`; otherwise StoreCorruptError.
        A second opener (the writer thread, the CLI) passes recover=False so
        only the app's first open ever moves a file. Raises StoreError.
        """
        path = Path(path) if path is not None else default_path()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise store_error(exc, path) from exc
        warning: str | None = None
        try:
            conn = cls._connect_checked(path)
        except _Unreadable as bad:
            if not recover:
                raise StoreCorruptError(path, bad.reason) from None
            aside = _move_aside(path)
            warning = (
                f"The chat store could not be read ({bad.reason}). It was kept aside as {aside} "
                "and a new, empty store was started; your earlier chats are still in that file."
            )
            try:
                conn = cls._connect_checked(path)
            except _Unreadable as again:  # a brand-new file cannot be damaged; the disk is misbehaving
                raise StoreIOError(path, again.reason) from None
        try:
            cls._configure_and_migrate(conn, path)
            crashed = cls._read_meta(conn, _SESSION_KEY) == "running"
        except BaseException:
            conn.close()
            raise
        return cls(conn, path, warning, crashed)

    @staticmethod
    def _connect_checked(path: Path) -> sqlite3.Connection:
        """A connection to a file that is an intact store of a version we read; nothing written yet."""
        try:
            conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=True)
        except sqlite3.Error as exc:
            raise store_error(exc, path) from exc
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
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
        conn.create_function("tandem_contains", 2, _contains_folded, deterministic=True)
        return conn

    @staticmethod
    def _configure_and_migrate(conn: sqlite3.Connection, path: Path) -> None:
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
                if version == 0:
                    _create_schema(conn)
                else:
                    while version < SCHEMA_VERSION:
                        MIGRATIONS[version](conn)
                        version += 1
                broken = conn.execute("PRAGMA foreign_key_check").fetchall()
                if broken:
                    raise StoreCorruptError(path, f"{len(broken)} messages belong to no conversation")
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("PRAGMA foreign_keys = ON")
        except sqlite3.Error as exc:
            raise store_error(exc, path) from exc

    @staticmethod
    def _read_meta(conn: sqlite3.Connection, key: str) -> str | None:
        row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    @property
    def schema_version(self) -> int:
        return self._query_one("PRAGMA user_version")[0]

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> ChatStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing ----------------------------------------------------------------

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One transaction; any SQLite failure rolls it back and becomes a StoreError."""
        conn = self._conn
        try:
            # IMMEDIATE takes the write lock up front, so two connections
            # never deadlock upgrading a read to a write.
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise store_error(exc, self.path) from exc
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass  # SQLite already rolled back (it does on SQLITE_FULL and I/O errors)
            if isinstance(exc, sqlite3.Error):
                raise store_error(exc, self.path) from exc
            raise

    def _query(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        try:
            return self._conn.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise store_error(exc, self.path) from exc

    def _query_one(self, sql: str, args: Sequence[Any] = ()) -> Any:
        rows = self._query(sql, args)
        return rows[0] if rows else None

    @staticmethod
    def _put_header(conn: sqlite3.Connection, header: HeaderRecord, now: float) -> None:
        conn.execute(
            """INSERT INTO conversations (id, title, created_at, updated_at, system_prompt, params,
                                          model_id, context_policy, kept_ids)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
               ON CONFLICT (id) DO UPDATE SET
                   title = excluded.title, updated_at = excluded.updated_at,
                   system_prompt = excluded.system_prompt, params = excluded.params,
                   model_id = excluded.model_id, context_policy = excluded.context_policy,
                   kept_ids = excluded.kept_ids""",
            (header.id, header.title, header.created_at, now, header.system_prompt, header.params,
             header.model_id, header.context_policy, header.kept_ids),
        )

    @staticmethod
    def _put_message(conn: sqlite3.Connection, conversation_id: str, record: MessageRecord) -> None:
        conn.execute(
            """INSERT INTO messages (conversation_id, position, role, text, token_ids, state, model_id,
                                     params, stats, error, created_at, turn_mark)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
               ON CONFLICT (conversation_id, position) DO UPDATE SET
                   role = excluded.role, text = excluded.text, token_ids = excluded.token_ids,
                   state = excluded.state, model_id = excluded.model_id, params = excluded.params,
                   stats = excluded.stats, error = excluded.error, created_at = excluded.created_at,
                   turn_mark = excluded.turn_mark""",
            (conversation_id, record.position, record.role, record.text, record.token_ids, record.state,
             record.model_id, record.params, record.stats, record.error, record.created_at, record.turn_mark),
        )

    def _touch(self, conn: sqlite3.Connection, conversation_id: str, now: float) -> None:
        cursor = conn.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (now, conversation_id))
        if cursor.rowcount == 0:
            raise UnknownConversationError(conversation_id)

    # -- writes --------------------------------------------------------------------

    def save_conversation(self, conversation: Conversation) -> None:
        """The header and every message, in one transaction; stored messages past the end are deleted."""
        self.write_conversation(header_record(conversation), message_records(conversation))

    def write_conversation(self, header: HeaderRecord, messages: Sequence[MessageRecord]) -> None:
        with self._write() as conn:
            self._put_header(conn, header, time.time())
            for record in messages:
                self._put_message(conn, header.id, record)
            conn.execute(
                "DELETE FROM messages WHERE conversation_id = ? AND position >= ?", (header.id, len(messages))
            )

    def save_message(
        self, conversation_id: str, index: int, message: Message, *, turn_mark: int | None = None
    ) -> None:
        """Insert or replace message `index` (a streaming reply's checkpoint, a user message)."""
        self.write_message(conversation_id, message_record(message, index, turn_mark))

    def write_message(self, conversation_id: str, record: MessageRecord) -> None:
        with self._write() as conn:
            self._touch(conn, conversation_id, time.time())
            self._put_message(conn, conversation_id, record)

    def save_reply(self, conversation: Conversation, index: int) -> None:
        """A finished (complete, stopped or failed) reply with the kept ids it extends, in one transaction."""
        marks = conversation.turn_marks
        mark = marks[index] if index < len(marks) else None
        self.write_reply(header_record(conversation), message_record(conversation.messages[index], index, mark))

    def write_reply(self, header: HeaderRecord, record: MessageRecord) -> None:
        with self._write() as conn:
            self._put_header(conn, header, time.time())
            self._put_message(conn, header.id, record)

    def save_header(self, conversation: Conversation) -> None:
        """Title, system prompt, sampling, model, context policy and kept ids."""
        self.write_header(header_record(conversation))

    def write_header(self, header: HeaderRecord) -> None:
        with self._write() as conn:
            self._put_header(conn, header, time.time())

    def truncate(self, conversation_id: str, length: int, *, header: HeaderRecord | None = None) -> None:
        """Keep the first `length` messages (and, with `header`, the kept ids that cover them)."""
        with self._write() as conn:
            now = time.time()
            if header is not None:
                self._put_header(conn, header, now)
            else:
                self._touch(conn, conversation_id, now)
            conn.execute(
                "DELETE FROM messages WHERE conversation_id = ? AND position >= ?", (conversation_id, length)
            )

    def rename(self, conversation_id: str, title: str) -> None:
        with self._write() as conn:
            cursor = conn.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id))
            if cursor.rowcount == 0:
                raise UnknownConversationError(conversation_id)

    def delete(self, conversation_id: str) -> None:
        """Hide a conversation (undelete brings it back; purge_deleted removes it for good)."""
        with self._write() as conn:
            cursor = conn.execute(
                "UPDATE conversations SET deleted_at = coalesce(deleted_at, ?) WHERE id = ?",
                (time.time(), conversation_id),
            )
            if cursor.rowcount == 0:
                raise UnknownConversationError(conversation_id)

    def undelete(self, conversation_id: str) -> None:
        with self._write() as conn:
            cursor = conn.execute("UPDATE conversations SET deleted_at = NULL WHERE id = ?", (conversation_id,))
            if cursor.rowcount == 0:
                raise UnknownConversationError(conversation_id)

    def purge_deleted(self, older_than_s: float = 0.0) -> int:
        """Remove deleted conversations (deleted at least `older_than_s` ago) with their messages; returns how many."""
        with self._write() as conn:
            cutoff = time.time() - older_than_s
            ids = [r[0] for r in conn.execute(
                "SELECT id FROM conversations WHERE deleted_at IS NOT NULL AND deleted_at <= ?", (cutoff,)
            )]
            conn.executemany("DELETE FROM conversations WHERE id = ?", [(i,) for i in ids])
            conn.executemany("DELETE FROM layout WHERE conversation_id = ?", [(i,) for i in ids])
        return len(ids)

    def purge_empty(self) -> int:
        """Remove conversations without a message that no pane of the saved
        layout shows (panes that were opened and closed unused); returns how many."""
        with self._write() as conn:
            cursor = conn.execute(
                """DELETE FROM conversations
                   WHERE NOT EXISTS (SELECT 1 FROM messages AS m WHERE m.conversation_id = conversations.id)
                     AND id NOT IN (SELECT conversation_id FROM layout)"""
            )
        return cursor.rowcount

    def save_layout(self, panes: Sequence[PaneLayout]) -> None:
        """The open panes, left to right (replaces the saved layout)."""
        with self._write() as conn:
            conn.execute("DELETE FROM layout")
            conn.executemany(
                """INSERT INTO layout (position, conversation_id, title, remote_base_url, remote_model,
                                       remote_api_key, width) VALUES (?, ?, ?, ?, ?, ?, ?)""",
                [(i, p.conversation_id, p.title, p.remote_base_url, p.remote_model, p.remote_api_key, p.width)
                 for i, p in enumerate(panes)],
            )

    def mark_session_start(self) -> None:
        """The window is up: until mark_clean_exit, an end of the process counts as a crash."""
        self._set_meta(_SESSION_KEY, "running")

    def mark_clean_exit(self) -> None:
        self._set_meta(_SESSION_KEY, "clean")

    def _set_meta(self, key: str, value: str) -> None:
        with self._write() as conn:
            conn.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

    # -- reads ---------------------------------------------------------------------

    def load_conversation(self, conversation_id: str) -> Conversation:
        """The conversation as saved (a reply saved mid-stream comes back "interrupted")."""
        from app.workspace.conversation import Conversation, Message

        header = self._query_one(
            """SELECT title, created_at, system_prompt, params, model_id, context_policy, kept_ids
               FROM conversations WHERE id = ?""",
            (conversation_id,),
        )
        if header is None:
            raise UnknownConversationError(conversation_id)
        title, created_at, system_prompt, params_json, model_id, policy, kept_blob = header
        rows = self._query(
            """SELECT position, role, text, token_ids, state, model_id, params, stats, error, created_at, turn_mark
               FROM messages WHERE conversation_id = ? ORDER BY position""",
            (conversation_id,),
        )
        messages: list[Message] = []
        marks: list[int | None] = []
        for position, role, text, ids, state, msg_model, msg_params, stats, error, msg_created, mark in rows:
            if position != len(messages):
                # Positions are written densely; a gap means rows were lost.
                raise StoreCorruptError(self.path, f"conversation {conversation_id} is missing message {len(messages)}")
            messages.append(
                Message(
                    role=role,
                    text=text,
                    token_ids=unpack_ids(ids),
                    state=state,
                    stats=_stored_stats(stats),
                    error=error,
                    created_at=msg_created,
                    model_id=msg_model,
                    params=_stored_params(msg_params),
                )
            )
            marks.append(mark)
        from engine.params import SamplingParams

        return Conversation.restore(
            id=conversation_id,
            title=title,
            created_at=created_at,
            system_prompt=system_prompt,
            params=_stored_params(params_json) or SamplingParams(),
            model_id=model_id,
            context_policy=policy,
            messages=messages,
            kept_ids=unpack_ids(kept_blob),
            turn_marks=marks,
        )

    def list_conversations(self, search: str | None = None, *, deleted: bool = False) -> list[ConversationSummary]:
        """Saved conversations, most recently changed first.

        `search` keeps those whose title or any message contains it (ignoring
        case; every character literal). `deleted=True` lists the deleted ones instead.
        """
        where = "c.deleted_at IS NOT NULL" if deleted else "c.deleted_at IS NULL"
        args: list[Any] = []
        needle = (search or "").strip().casefold()
        if needle:
            where += """ AND (tandem_contains(c.title, ?) OR EXISTS (
                SELECT 1 FROM messages AS m WHERE m.conversation_id = c.id AND tandem_contains(m.text, ?)))"""
            args += [needle, needle]
        rows = self._query(
            f"""SELECT c.id, c.title, c.created_at, c.updated_at, c.model_id,
                       (SELECT count(*) FROM messages AS m WHERE m.conversation_id = c.id),
                       (SELECT substr(m.text, 1, {PREVIEW_CHARS * 2}) FROM messages AS m
                        WHERE m.conversation_id = c.id AND m.role IN ('user', 'assistant') AND m.text != ''
                        ORDER BY m.position DESC LIMIT 1)
                FROM conversations AS c WHERE {where}
                ORDER BY c.updated_at DESC, c.id""",
            args,
        )
        return [
            ConversationSummary(
                id=id_, title=title, created_at=created, updated_at=updated, message_count=count,
                model_id=model, preview=_collapse(preview or ""),
            )
            for id_, title, created, updated, model, count, preview in rows
        ]

    def find_ids(self, prefix: str) -> list[str]:
        """Ids of (not deleted) conversations starting with `prefix` (an exact id first if there is one)."""
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        rows = self._query(
            "SELECT id FROM conversations WHERE deleted_at IS NULL AND id LIKE ? ESCAPE '\\' ORDER BY id",
            (escaped + "%",),
        )
        ids = [r[0] for r in rows if r[0].startswith(prefix)]  # LIKE ignores ASCII case; ids do not
        return [prefix] if prefix in ids else ids

    def is_deleted(self, conversation_id: str) -> bool:
        row = self._query_one("SELECT deleted_at FROM conversations WHERE id = ?", (conversation_id,))
        if row is None:
            raise UnknownConversationError(conversation_id)
        return row[0] is not None

    def load_layout(self) -> list[PaneLayout]:
        """The panes that were open, left to right; [] when none was saved."""
        rows = self._query(
            """SELECT conversation_id, title, remote_base_url, remote_model, remote_api_key, width
               FROM layout ORDER BY position"""
        )
        return [PaneLayout(*row) for row in rows]


def _stored_params(text: str | None) -> SamplingParams | None:
    """Parameters as stored; None for a value this version cannot read (it was written by us, so rare)."""
    if not text:
        return None
    try:
        data = json.loads(text)
        return params_from_dict(data) if isinstance(data, dict) else None
    except (ValueError, TypeError):
        return None


def _stored_stats(text: str | None) -> ReplyStats | None:
    if not text:
        return None
    try:
        data = json.loads(text)
        return stats_from_dict(data) if isinstance(data, dict) else None
    except (ValueError, TypeError):
        return None


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


__all__ = [
    "SCHEMA_VERSION",
    "ChatStore",
    "ConversationSummary",
    "DiskFullError",
    "HeaderRecord",
    "MessageRecord",
    "NewerStoreError",
    "PaneLayout",
    "ReadOnlyStoreError",
    "StoreCorruptError",
    "StoreError",
    "StoreIOError",
    "StoreLockedError",
    "UnknownConversationError",
    "default_path",
    "header_record",
    "message_record",
    "message_records",
    "store_error",
]
