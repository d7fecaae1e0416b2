"""What can go wrong with the chat store, each as a StoreError whose message a person can act on.

`store_error` turns an sqlite3 or OS error into the right one: a full disk,
a read-only file or folder, a file another program holds locked, an I/O
failure, a damaged file. Every message says what happened to the user's
chats (they are still open) and what to do.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path

from app.errors import AppError
from app.store.schema import SCHEMA_VERSION


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


class KeySaveError(StoreError):
    """A remote pane's API key could not be kept in the secret store; the layout was saved without it."""

    def __init__(self, detail: str) -> None:
        super().__init__(
            f"A remote pane's API key could not be saved: {detail} The pane keeps working; "
            "after a restart, enter its key again in the pane's settings."
        )


def store_error(exc: BaseException, path: Path) -> StoreError:
    """The StoreError a person can act on for an sqlite3 or OS error."""
    if isinstance(exc, StoreError):
        return exc
    if isinstance(exc, OSError):
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
