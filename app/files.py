"""A user's files in and out, so that a crash, a full disk, a kill, a planted link or a
hostile file never does harm.

The rules, in one place for every file Tandem writes (exports, settings,
models.json, the secrets file):

- A file is written through a temporary file beside it and renamed over the
  old one: it is the old file or the new one, never a part.
- Only a regular file (or nothing) is ever replaced. A symbolic link, a FIFO,
  a device or a folder at the path is refused with `UnsafeOutputError`: a
  rename over a link would silently break it, and one over `/dev/full` (as
  root) replaces the device node.
- What Tandem writes is private to the user (0600): chats, keys and settings
  are nobody else's business. Tandem's own folders are 0700
  (`make_private_folder`, which the engine's data folder uses too).
- The temporary file has a short name of its own (`.tandem-XXXXXXXX.tmp`),
  so any name the folder takes (up to NAME_MAX bytes) can be written.

and for every file Tandem reads that a user may have edited or been handed
(settings.json, models.json, a chat export):

- Only a regular file is read (a link to one is followed): a FIFO or a
  device (`/dev/zero`) is refused before it is opened, because reading one
  can wait forever or never end. A regular file that says it is empty (as
  /proc's files do, /proc/kmsg among them) is taken as empty, not read; the
  read itself does not block.
- At most a stated number of bytes is read (`read_regular_file`).
- JSON is parsed by `parse_json`: malformed JSON, nesting too deep, an
  integer beyond Python's digit limit and a lone surrogate are each one
  sentence (`BadJSONError.reason`), never another exception.

and for text Tandem writes that other programs interpret:

- CSV (`csv_text`): every cell quoted, and a text cell a spreadsheet would
  run as a formula (starting with = + - @ TAB CR) starts with ' instead.
- A terminal (`terminal_text`, `terminal_json`): control characters (ESC,
  CSI, OSC, BEL, every C0 and C1 one), bidirectional overrides and line
  separators are spelled out, so a title cannot steer the terminal.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from app.errors import AppError
from engine.model_files import PRIVATE_FOLDER_MODE, make_private_folder

# Files only their owner may read or write.
PRIVATE_FILE_MODE = 0o600
# settings.json and models.json are a few KiB; a few MiB leaves room for any real
# one and keeps a planted giant from filling memory.
MAX_CONFIG_FILE_BYTES = 4 * 2**20

__all__ = [
    "MAX_CONFIG_FILE_BYTES",
    "PRIVATE_FILE_MODE",
    "PRIVATE_FOLDER_MODE",
    "BadJSONError",
    "UnreadableFileError",
    "UnsafeOutputError",
    "check_unicode",
    "check_writable_target",
    "create_private_file",
    "csv_cell",
    "csv_text",
    "make_private_file",
    "make_private_folder",
    "parse_json",
    "read_json_file",
    "read_regular_file",
    "terminal_json",
    "terminal_text",
    "write_text_atomically",
]


class UnsafeOutputError(AppError):
    """The path to write names something that is not a regular file; nothing was written."""

    def __init__(self, path: Path, what: str) -> None:
        self.path = path
        self.what = what
        super().__init__(
            f"{path} is {what}, not a regular file; Tandem writes only regular files and left it untouched. "
            "Choose another file name."
        )


def _kind(mode: int) -> str | None:
    """What a non-regular file is, in words; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a special file"


def check_writable_target(path: str | os.PathLike[str]) -> Path:
    """`path` when nothing or a regular file is there; UnsafeOutputError otherwise.

    Looks at the path itself, not where a link points (lstat)."""
    path = Path(path)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return path
    what = _kind(info.st_mode)
    if what is not None:
        raise UnsafeOutputError(path, what)
    return path


TEMPORARY_PREFIX = ".tandem-"


def write_text_atomically(path: str | os.PathLike[str], text: str) -> Path:
    """Write `text` to `path` through a temporary file beside it, flushed to
    disk before it replaces the old file: the file is the old one or the new
    one, never a part. The file is private (0600).

    Raises UnsafeOutputError, writing nothing, when `path` is a symbolic
    link, a FIFO, a device or anything else that is not a regular file;
    OSError when writing fails (nothing is left behind then).
    """
    path = check_writable_target(path)
    folder = path.parent if str(path.parent) else Path(".")
    # mkstemp opens with O_EXCL (never through a planted link) and mode 0600.
    # A name of its own, not the target's plus a suffix: a 250-byte target name would
    # make a temporary name past NAME_MAX (255 bytes) and the write would fail.
    fd, temporary = tempfile.mkstemp(prefix=TEMPORARY_PREFIX, suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        # Looked at again just before the rename: the check above and the
        # rename are not one step, so keep the window between them small.
        check_writable_target(path)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    return path


def set_aside(path: str | os.PathLike[str]) -> Path | None:
    """Move a file of Tandem's that could not be fully used to `<name>.bad`, so the user can
    look at it and a fresh one is written in its place; where it went, None when it could not be moved."""
    path = Path(path)
    bad = path.with_name(path.name + ".bad")
    try:
        os.replace(path, bad)
    except OSError:
        return None
    return bad


def make_private_file(path: str | os.PathLike[str]) -> bool:
    """Tighten one of Tandem's own files to 0600 when it is looser; whether it is private now.

    Opened with O_NOFOLLOW (and without blocking, for a FIFO) so a link or a
    special file planted at the path is never followed or changed; a file
    that is missing, not ours or not regular is left as it is (False).
    """
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):  # not even opened: a device may act on open
            return False
    except OSError:
        return False
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return False
    try:
        info = os.fstat(fd)
        getuid = getattr(os, "getuid", None)
        if not stat.S_ISREG(info.st_mode) or getuid is None or info.st_uid != getuid():
            return False
        if stat.S_IMODE(info.st_mode) != PRIVATE_FILE_MODE:
            os.fchmod(fd, PRIVATE_FILE_MODE)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def create_private_file(path: str | os.PathLike[str]) -> None:
    """Create an empty file at `path` with mode 0600 unless something is there already.

    For files another library fills (SQLite creates its store with 0644
    otherwise). O_EXCL and O_NOFOLLOW: never through a planted link.
    Raises OSError (other than for an existing path)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, PRIVATE_FILE_MODE)
    except FileExistsError:
        return
    os.close(fd)


# -- reading a file someone else may have written ------------------------------------------


class UnreadableFileError(AppError):
    """A file Tandem reads could not be used; `reason` completes "... because <reason>"."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path} could not be used because {reason}.")


class BadJSONError(AppError):
    """Text that is not JSON Tandem can use; `reason` is a clause such as "it is not valid JSON (...)"."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


def _size_text(size: int) -> str:
    return f"{size / 2**20:.1f} MiB" if size >= 2**20 else f"{size:,} bytes"


def read_regular_file(path: str | os.PathLike[str], max_bytes: int) -> bytes:
    """The bytes of the regular file at `path` (a link to one is followed), at most `max_bytes`.

    Raises FileNotFoundError when nothing is there (callers take it as
    "absent"), UnreadableFileError when it is a FIFO, a device or a folder,
    holds more than `max_bytes`, or cannot be read. Never blocks on a FIFO
    or a device and never reads one: they are refused before they are opened.
    """
    path = Path(path)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise UnreadableFileError(path, f"it cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
    what = _kind(info.st_mode)
    if what is not None:
        raise UnreadableFileError(path, f"it is {what}, not a regular file")
    if info.st_size > max_bytes:
        raise UnreadableFileError(path, f"it holds {_size_text(info.st_size)}, more than the {_size_text(max_bytes)} "
                                        "such a file can be")
    if info.st_size == 0:
        # An empty file, or a kernel's file (/proc/kmsg says 0 bytes and waits
        # forever for more): either way there is nothing to read.
        return b""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise UnreadableFileError(path, f"it cannot be read ({exc.strerror or exc})") from None
    try:
        what = _kind(os.fstat(fd).st_mode)  # what was opened, not what was looked at a moment before
        if what is not None:
            raise UnreadableFileError(path, f"it is {what}, not a regular file")
        chunks: list[bytes] = []
        total = 0
        while total <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as exc:
        raise UnreadableFileError(path, f"it cannot be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if total > max_bytes:  # it grew while it was read
        raise UnreadableFileError(path, f"it holds more than the {_size_text(max_bytes)} such a file can be")
    return b"".join(chunks)


def parse_json(text: str) -> object:
    """JSON text as Python values, every string (keys too) valid Unicode.

    Raises BadJSONError, for any text: malformed, nested too deep, an
    integer longer than Python converts, a lone surrogate (JSON's \\ud800
    escapes make them, and no file or database can hold one).
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadJSONError(f"it is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except RecursionError:
        raise BadJSONError("its JSON is nested too deeply to read") from None
    except ValueError:  # the one other ValueError json raises: an integer longer than Python converts
        raise BadJSONError(f"it holds a number of more than {sys.get_int_max_str_digits()} digits") from None
    check_unicode(data)
    return data


def check_unicode(data: object) -> None:
    """BadJSONError unless every string in `data` (keys too) is valid Unicode.
    Iterative: the depth is the file's."""
    pending = [data]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            strings: list[str] = [item]
        elif isinstance(item, dict):
            strings = [k for k in item if isinstance(k, str)]
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
            continue
        else:
            continue
        for string in strings:
            try:
                string.encode("utf-8")
            except UnicodeEncodeError as exc:
                bad = string[exc.start]
                raise BadJSONError(
                    f"it holds text that is not valid Unicode (a lone surrogate, \\u{ord(bad):04x})"
                ) from None


def read_json_file(path: str | os.PathLike[str], max_bytes: int | None = None) -> object:
    """The JSON value in the regular file at `path`, read through `read_regular_file`
    (at most `max_bytes`, default MAX_CONFIG_FILE_BYTES) and `parse_json`.

    Raises FileNotFoundError when nothing is there, UnreadableFileError (its
    `reason` says why) for anything else that keeps the file from being used.
    """
    path = Path(path)
    raw = read_regular_file(path, MAX_CONFIG_FILE_BYTES if max_bytes is None else max_bytes)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UnreadableFileError(path, "it is not a text file (expected JSON in UTF-8)") from None
    try:
        return parse_json(text)
    except BadJSONError as exc:
        raise UnreadableFileError(path, exc.reason) from None


# -- writing text other programs interpret ----------------------------------------------

# A spreadsheet runs a cell that starts with one of these as a formula (OWASP's
# CSV injection list); names and titles come from whoever published a model or
# wrote a chat.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
# A number as Tandem writes one ("-3.25", "1e-05") is data, not a formula.
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def csv_cell(value: object) -> object:
    """A cell as it is safe to hand a spreadsheet: text that would start a
    formula gets a leading ' (shown as text); numbers pass as they are."""
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS) and not _PLAIN_NUMBER.fullmatch(value):
        return "'" + value
    return value


# A cell holding one of these is quoted: any separator a spreadsheet may split on
# (",", ";", a tab), the quote itself and line breaks.
_CSV_NEEDS_QUOTES = re.compile('[",;\t\r\n]')


def _csv_field(value: object) -> str:
    text = "" if value is None else str(csv_cell(value))
    if _CSV_NEEDS_QUOTES.search(text) or text != text.strip():
        return '"' + text.replace('"', '""') + '"'
    return text


def csv_text(rows: Iterable[Sequence[object]]) -> str:
    """Rows as CSV text (RFC 4180, one "\n" a row), each cell passed through `csv_cell`.

    A cell is quoted when it holds any separator a spreadsheet may split on
    (",", ";", a tab), a quote, a line break or space at either end, so
    `x;=cmd|' /C calc'!A0` stays one quoted cell in a spreadsheet that
    splits on ";", never a second cell that starts with "=".
    """
    return "".join(",".join(_csv_field(cell) for cell in row) + "\n" for row in rows)


# What a terminal may act on: C0 controls (ESC, BEL, BS, CR, LF, ...), DEL, C1 controls
# (CSI U+009B and OSC U+009D among them), the Arabic letter mark, left/right marks and
# bidirectional embeddings, overrides and isolates (they reorder what a line shows),
# line and paragraph separators, and surrogates (no terminal can show one).
_TERMINAL_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")
# The same less C0: json.dumps escapes C0 inside strings itself, and the newlines
# between its lines are JSON's own whitespace.
_JSON_TERMINAL_UNSAFE = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")


def terminal_text(text: str) -> str:
    """`text` safe to print on a terminal: every character `_TERMINAL_UNSAFE`
    names is spelled out as Python writes it (\\x1b, \\x9b, \\u202e), so a
    title or a model's name can neither steer the terminal nor hide text."""
    return _TERMINAL_UNSAFE.sub(lambda m: ascii(m.group())[1:-1], text)


def terminal_json(text: str) -> str:
    """JSON text (json.dumps with ensure_ascii=False) safe to print on a
    terminal and still the same JSON: the characters `terminal_text` spells
    out become \\u escapes (json.dumps escapes C0 itself, but not DEL, C1 or
    the bidirectional controls). They can only occur inside JSON strings."""
    return _JSON_TERMINAL_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
