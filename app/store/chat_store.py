"""The chat store: every conversation, message and the pane layout, in one SQLite file.

`ChatStore` is the queries: saving a conversation, a message, a finished
reply or the layout, each in one transaction (so a crash leaves either the
old or the new state of a reply, never half of one), and reading them back.
The rest of the store lives beside it, one concept a module:

    app.store.connection   where the file is, opening, checking, keeping a damaged file aside
    app.store.schema       the current schema (version and tables)
    app.store.migrations   one function per schema version step
    app.store.records      the row records and the encodings of their values
    app.store.errors       StoreError and its subclasses

The blind arena's votes (app.arena.votes) are kept here too, in a table of
their own: `add_arena_vote`, `arena_votes`, `delete_arena_vote`.

The names other modules use from those are re-exported here.

Threads: a ChatStore is one sqlite3 connection and belongs to the thread
that opened it. The GUI thread keeps one for reads; writes go through
`app.store.writer.StoreWriter`, which owns another on its own thread.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.arena.votes import ArenaVote, ArenaVoteError, sides_from_json, sides_to_json
from app.secrets import SecretStoreError, default_secrets, new_remote_key_id
from app.store.connection import BUSY_TIMEOUT_S, STORE_FILENAME, default_path, open_store_file
from app.store.errors import (
    DiskFullError,
    KeySaveError,
    NewerStoreError,
    ReadOnlyStoreError,
    StoreCorruptError,
    StoreError,
    StoreIOError,
    StoreLockedError,
    UnknownConversationError,
    store_error,
)
from app.store.records import (
    ConversationSummary,
    HeaderRecord,
    MessageRecord,
    PaneLayout,
    header_record,
    is_showable_time,
    message_record,
    message_records,
    pack_ids,
    params_from_dict,
    params_to_dict,
    stats_from_dict,
    stats_to_dict,
    stored_params,
    stored_stats,
    stored_system_prompt,
    stored_versions,
    unpack_ids,
)
from app.store.schema import SCHEMA_VERSION
from engine import reasoning

if TYPE_CHECKING:
    from app.secrets import Secrets

    # Imported lazily at run time: app.workspace.conversation pulls in engine.model.sampler
    # and with it torch, which `tandem chats list` has no need of.
    from engine.documents import Document

    from app.workspace.conversation import Conversation

    from app.workspace.messages import Message

log = logging.getLogger(__name__)

# Longest preview text a summary carries (the sidebar elides it further).
PREVIEW_CHARS = 160

# When a conversation was last updated, as the Chats sidebar and `tandem chats
# list` both show it (and order by): its newest message's time, or its own
# creation when that is later (a fork starts with copies of older messages)
# or it has no message. Not the row's updated_at column, which every write
# sets, the bookkeeping ones included: a model that loads re-saves the
# header of every open conversation, a chat opened into a pane is saved
# whole again, so that column says "touched", not "updated".
LAST_UPDATE_SQL = """max(c.created_at, coalesce(
    (SELECT max(m.created_at) FROM messages AS m WHERE m.conversation_id = c.id), c.created_at))"""

_SESSION_KEY = "session"


def _collapse(text: str) -> str:
    """A message's start for the sidebar: a reply's answer, or where the
    stored start is all reasoning, that reasoning without its tags."""
    parts = reasoning.split_reply(text)
    return " ".join((parts.answer or parts.reasoning).split())[:PREVIEW_CHARS]


class ChatStore:
    """Conversations, messages and the pane layout in one SQLite file. See the module docstring."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        path: Path,
        open_warning: str | None,
        crashed: bool,
        secrets: Secrets | None = None,
    ) -> None:
        self._conn = conn
        self.path = path
        # Where remote panes' API keys are kept (never in this file); chosen on first use.
        self._secrets = secrets
        # The keys this store saved or read, by id: a layout saved again
        # with the same keys does not write the keyring again.
        self._known_keys: dict[str, str] = {}
        # Conversations whose times are no date, already in the log (warned once each).
        self._reported_times: set[str] = set()
        # Shown once by the window: e.g. the damaged file was kept aside.
        self.open_warning = open_warning
        # The previous session did not end with mark_clean_exit (it crashed or was killed).
        self.crashed_last_time = crashed

    # -- opening ---------------------------------------------------------------

    @classmethod
    def open(
        cls, path: str | os.PathLike[str] | None = None, *, recover: bool = True, secrets: Secrets | None = None
    ) -> ChatStore:
        """Open (creating or migrating as needed) the store at `path` (default: the data folder's).

        A file SQLite cannot read is moved aside and a new store started
        (`open_warning` says so) when `recover`; otherwise StoreCorruptError.
        A second opener (the writer thread, the CLI) passes recover=False so
        only the app's first open ever moves a file. `secrets`: where remote
        panes' API keys are kept (default: app.secrets.default_secrets()).
        Raises StoreError.
        """
        path = Path(path) if path is not None else default_path()
        opened = open_store_file(path, recover=recover, secrets=secrets)
        try:
            crashed = cls._read_meta(opened.conn, _SESSION_KEY) == "running"
        except BaseException:
            opened.conn.close()
            raise
        return cls(opened.conn, path, opened.warning, crashed, secrets)

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

    def _query(self, sql: str, args: Sequence[Any] | Mapping[str, Any] = ()) -> list[Any]:
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
                                          model_id, context_policy, kept_ids, thinking)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
               ON CONFLICT (id) DO UPDATE SET
                   title = excluded.title, updated_at = excluded.updated_at,
                   system_prompt = excluded.system_prompt, params = excluded.params,
                   model_id = excluded.model_id, context_policy = excluded.context_policy,
                   kept_ids = excluded.kept_ids, thinking = excluded.thinking""",
            (header.id, header.title, header.created_at, now, header.system_prompt, header.params,
             header.model_id, header.context_policy, header.kept_ids, int(header.thinking)),
        )

    @staticmethod
    def _put_message(conn: sqlite3.Connection, conversation_id: str, record: MessageRecord) -> None:
        conn.execute(
            """INSERT INTO messages (conversation_id, position, role, text, token_ids, state, model_id,
                                     params, stats, error, created_at, turn_mark, versions, system_prompt)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
               ON CONFLICT (conversation_id, position) DO UPDATE SET
                   role = excluded.role, text = excluded.text, token_ids = excluded.token_ids,
                   state = excluded.state, model_id = excluded.model_id, params = excluded.params,
                   stats = excluded.stats, error = excluded.error, created_at = excluded.created_at,
                   turn_mark = excluded.turn_mark, versions = excluded.versions,
                   system_prompt = excluded.system_prompt""",
            (conversation_id, record.position, record.role, record.text, record.token_ids, record.state,
             record.model_id, record.params, record.stats, record.error, record.created_at, record.turn_mark,
             record.versions, record.system_prompt),
        )
        # A message's documents are written with it, in full: at most a few per message, sent once.
        conn.execute(
            "DELETE FROM attachments WHERE conversation_id = ? AND message_position = ?",
            (conversation_id, record.position),
        )
        conn.executemany(
            """INSERT INTO attachments (conversation_id, message_position, position, name, kind, size, sha256,
                                        pages, complete, text) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
            [(conversation_id, record.position, i, d.name, d.kind, d.size, d.sha256, d.pages, int(d.complete), d.text)
             for i, d in enumerate(record.attachments)],
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
            keys: set[str | None] = set()
            for i in ids:
                keys.update(r[0] for r in conn.execute(
                    "SELECT remote_key_id FROM layout WHERE conversation_id = ?", (i,)
                ))
            conn.executemany("DELETE FROM layout WHERE conversation_id = ?", [(i,) for i in ids])
            kept = {r[0] for r in conn.execute("SELECT remote_key_id FROM layout")}
        self._forget_keys(keys - kept)
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
        """The open panes, left to right (replaces the saved layout).

        A remote pane's API key goes to the secret store under the pane's
        `remote_key_id` (a new id when it has none); the file keeps only the
        id. Keys no pane uses any more are deleted from the secret store.
        A key the secret store refuses: the layout is saved without it, then
        KeySaveError says so.
        """
        key_ids: list[str | None] = []
        failure: str | None = None
        for pane in panes:
            key_id = None
            if pane.remote_api_key:
                key_id = pane.remote_key_id or new_remote_key_id()
                try:
                    self._keep_key(key_id, pane.remote_api_key)
                except SecretStoreError as exc:
                    key_id, failure = None, str(exc)
            key_ids.append(key_id)
        with self._write() as conn:
            before = {r[0] for r in conn.execute("SELECT remote_key_id FROM layout WHERE remote_key_id IS NOT NULL")}
            conn.execute("DELETE FROM layout")
            conn.executemany(
                """INSERT INTO layout (position, conversation_id, title, remote_base_url, remote_model,
                                       remote_key_id, width) VALUES (?, ?, ?, ?, ?, ?, ?)""",
                [(i, p.conversation_id, p.title, p.remote_base_url, p.remote_model, key_id, p.width)
                 for i, (p, key_id) in enumerate(zip(panes, key_ids))],
            )
        self._forget_keys(before - set(key_ids))
        if failure is not None:
            raise KeySaveError(failure)

    # -- remote panes' keys (in app.secrets, never in this file) -------------------------

    def _secret_store(self) -> Secrets:
        if self._secrets is None:
            self._secrets = default_secrets()
        return self._secrets

    def _keep_key(self, key_id: str, key: str) -> None:
        if self._known_keys.get(key_id) != key:
            self._secret_store().set(key_id, key)
            self._known_keys[key_id] = key

    def _read_key(self, key_id: str) -> str | None:
        key = self._known_keys.get(key_id)
        if key is None:
            try:
                key = self._secret_store().get(key_id)
            except SecretStoreError as exc:
                log.warning("a remote pane's API key could not be read: %s", exc)
                return None
            if key is not None:
                self._known_keys[key_id] = key
        return key

    def _forget_keys(self, key_ids: set[str | None]) -> None:
        """Delete keys the saved layout no longer refers to (after the layout's commit)."""
        for key_id in key_ids:
            if key_id is None:
                continue
            self._known_keys.pop(key_id, None)
            try:
                self._secret_store().delete(key_id)
            except SecretStoreError as exc:  # a stray key is untidy, not a failed save
                log.warning("an unused API key could not be deleted: %s", exc)

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

    def _report_times(self, conversation_id: str, times: Sequence[object], problems: list[str] | None) -> None:
        """Warn about a conversation holding a time that is no date (imported
        by a version that let one in): its readers show it as an unknown date.
        The warning goes to `problems` when given (a caller that prints it), else to the log."""
        bad = [t for t in times if not is_showable_time(t)]
        if not bad:
            return
        problem = (
            f"Conversation {conversation_id[:8]} in {self.path} holds a time that is not a date ({bad[0]!r}); "
            "it is shown as an unknown date."
        )
        if problems is not None:
            problems.append(problem)
        elif conversation_id not in self._reported_times:  # the sidebar lists at every keystroke of a search
            self._reported_times.add(conversation_id)
            log.warning("%s", problem)

    def load_conversation(self, conversation_id: str, *, problems: list[str] | None = None) -> Conversation:
        """The conversation as saved (a reply saved mid-stream comes back "interrupted").

        A time in it that is no date is kept as it is and reported (see `_report_times`)."""
        from app.workspace.conversation import Conversation
        from app.workspace.messages import Message

        header = self._query_one(
            """SELECT title, created_at, system_prompt, params, model_id, context_policy, kept_ids, thinking
               FROM conversations WHERE id = ?""",
            (conversation_id,),
        )
        if header is None:
            raise UnknownConversationError(conversation_id)
        title, created_at, system_prompt, params_json, model_id, policy, kept_blob, thinking = header
        rows = self._query(
            """SELECT position, role, text, token_ids, state, model_id, params, stats, error, created_at, turn_mark,
                      versions, system_prompt
               FROM messages WHERE conversation_id = ? ORDER BY position""",
            (conversation_id,),
        )
        attached = self._attachments(conversation_id)
        messages: list[Message] = []
        marks: list[int | None] = []
        for (position, role, text, ids, state, msg_model, msg_params, stats, error, msg_created, mark, versions,
             msg_system_prompt) in rows:
            if position != len(messages):
                # Positions are written densely; a gap means rows were lost.
                raise StoreCorruptError(self.path, f"conversation {conversation_id} is missing message {len(messages)}")
            messages.append(
                Message(
                    role=role,
                    text=text,
                    token_ids=unpack_ids(ids),
                    state=state,
                    stats=stored_stats(stats),
                    error=error,
                    created_at=msg_created,
                    model_id=msg_model,
                    params=stored_params(msg_params),
                    versions=stored_versions(versions) if role == "assistant" else None,
                    system_prompt=stored_system_prompt(role, msg_system_prompt),
                    attachments=tuple(attached.get(position, ())),
                )
            )
            marks.append(mark)
        self._report_times(conversation_id, [created_at, *(m.created_at for m in messages)], problems)
        from engine.params import SamplingParams

        return Conversation.restore(
            id=conversation_id,
            title=title,
            created_at=created_at,
            system_prompt=system_prompt,
            params=stored_params(params_json) or SamplingParams(),
            model_id=model_id,
            context_policy=policy,
            messages=messages,
            kept_ids=unpack_ids(kept_blob),
            turn_marks=marks,
            thinking=thinking != 0,
        )

    def _attachments(self, conversation_id: str) -> dict[int, list[Document]]:
        """The conversation's documents by message position, each message's in the order attached."""
        from engine.documents import Document

        attached: dict[int, list[Document]] = {}
        for position, name, kind, size, sha256, pages, complete, text in self._query(
            """SELECT message_position, name, kind, size, sha256, pages, complete, text FROM attachments
               WHERE conversation_id = ? ORDER BY message_position, position""",
            (conversation_id,),
        ):
            attached.setdefault(position, []).append(
                Document(name=name, text=text, kind=kind, size=size, sha256=sha256, pages=pages, complete=bool(complete))
            )
        return attached

    def list_conversations(
        self, search: str | None = None, *, deleted: bool = False, problems: list[str] | None = None
    ) -> list[ConversationSummary]:
        """Saved conversations, most recently updated first (LAST_UPDATE_SQL:
        its newest message's time; each summary's `updated_at`).

        `search` keeps those whose title, any message or any attached
        document's name or text contains it (ignoring case; every character
        literal); a match only in a document names it (`found_in_attachment`). `deleted=True` lists the deleted ones instead.
        A conversation whose times are no date (an older version imported
        1e12) is still listed, so it can be opened, exported or deleted; its
        readers show an unknown date (app.store.records.local_time_text), and
        a warning for it goes to `problems` when given, else to the log.
        """
        where = "c.deleted_at IS NOT NULL" if deleted else "c.deleted_at IS NULL"
        needle = (search or "").strip().casefold()
        document = "NULL"
        if needle:
            text_hit = """(tandem_contains(c.title, :needle) OR EXISTS (SELECT 1 FROM messages AS m
                           WHERE m.conversation_id = c.id AND tandem_contains(m.text, :needle)))"""
            document_hit = """(SELECT a.name FROM attachments AS a WHERE a.conversation_id = c.id
                               AND (tandem_contains(a.name, :needle) OR tandem_contains(a.text, :needle))
                               ORDER BY a.message_position, a.position LIMIT 1)"""
            where += f" AND ({text_hit} OR {document_hit} IS NOT NULL)"
            # A match only in an attached document: the row names the document.
            document = f"CASE WHEN {text_hit} THEN NULL ELSE {document_hit} END"
        rows = self._query(
            f"""SELECT c.id, c.title, c.created_at, {LAST_UPDATE_SQL} AS last_update, c.model_id,
                       (SELECT count(*) FROM messages AS m WHERE m.conversation_id = c.id),
                       (SELECT substr(m.text, 1, {PREVIEW_CHARS * 2}) FROM messages AS m
                        WHERE m.conversation_id = c.id AND m.role IN ('user', 'assistant') AND m.text != ''
                        ORDER BY m.position DESC LIMIT 1),
                       {document}
                FROM conversations AS c WHERE {where}
                ORDER BY last_update DESC, c.id""",
            {"needle": needle},
        )
        summaries = []
        for id_, title, created, updated, model, count, preview, document in rows:
            self._report_times(id_, (created, updated), problems)
            summaries.append(ConversationSummary(
                id=id_, title=title, created_at=created, updated_at=updated, message_count=count,
                model_id=model, preview=f"Found in the attached {document}" if document else _collapse(preview or ""),
                found_in_attachment=document,
            ))
        return summaries

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
            """SELECT conversation_id, title, remote_base_url, remote_model, remote_key_id, width
               FROM layout ORDER BY position"""
        )
        return [
            PaneLayout(
                conversation_id, title, base_url, model,
                remote_api_key=self._read_key(key_id) if key_id else None,
                width=width,
                remote_key_id=key_id,
            )
            for conversation_id, title, base_url, model, key_id, width in rows
        ]

    # -- the blind arena's votes -----------------------------------------------------

    def add_arena_vote(self, vote: ArenaVote) -> int:
        """Store a vote (its prompt, outcome and every side's label, model,
        settings and reply) in one transaction; returns its id (vote.id is ignored)."""
        with self._write() as conn:
            cursor = conn.execute(
                """INSERT INTO arena_votes (arena_id, created_at, prompt, outcome, winner, sides)
                   VALUES (?, ?, ?, ?, ?, ?)""",
                (vote.arena_id, vote.created_at, vote.prompt, vote.outcome, vote.winner, sides_to_json(vote.sides)),
            )
        return int(cursor.lastrowid)  # type: ignore[arg-type]

    def delete_arena_vote(self, vote_id: int) -> None:
        """Take a vote back (a mistaken key press); unknown ids are a StoreError."""
        with self._write() as conn:
            cursor = conn.execute("DELETE FROM arena_votes WHERE id = ?", (vote_id,))
            if cursor.rowcount == 0:
                raise StoreError(f"There is no arena vote {vote_id}; it may have been taken back already.")

    def arena_votes(self, *, problems: list[str] | None = None) -> list[ArenaVote]:
        """Every vote, oldest first.

        A row that cannot be a vote (damaged JSON, a winner that is none of
        its sides, ...) is left out with a logged warning, so one bad row
        never keeps the leaderboard from showing; `problems`, when given,
        also receives one sentence per row left out.
        """
        rows = self._query(
            "SELECT id, arena_id, created_at, prompt, outcome, winner, sides FROM arena_votes ORDER BY id"
        )
        votes: list[ArenaVote] = []
        for vote_id, arena_id, created_at, prompt, outcome, winner, sides in rows:
            try:
                votes.append(ArenaVote(prompt=prompt, sides=sides_from_json(sides), outcome=outcome, winner=winner,
                                       created_at=created_at, arena_id=arena_id, id=vote_id))
            except ArenaVoteError as exc:
                problem = f"Arena vote {vote_id} in {self.path} could not be read ({exc}); it is left out."
                log.warning("%s", problem)
                if problems is not None:
                    problems.append(problem)
        return votes


__all__ = [
    "BUSY_TIMEOUT_S",
    "PREVIEW_CHARS",
    "SCHEMA_VERSION",
    "STORE_FILENAME",
    "ChatStore",
    "ConversationSummary",
    "DiskFullError",
    "HeaderRecord",
    "KeySaveError",
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
    "pack_ids",
    "params_from_dict",
    "params_to_dict",
    "stats_from_dict",
    "stats_to_dict",
    "store_error",
    "unpack_ids",
]
