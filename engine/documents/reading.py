"""A file (from the disk or a client's bytes) to a Document: refused by size before it is
read, opened without following a link or blocking on a pipe, its kind told from its first
bytes before its name, PDF and Word read in a child process (isolated.py)."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import threading
from pathlib import PurePath

from engine.documents.document import Document, display_name, normalise_text
from engine.documents.isolated import extract_isolated
from engine.documents.text import decode_text, html_text, text_kind
from engine.errors import DocumentCancelled, DocumentError

# The largest file read: a long report with images as a PDF; a 2 GB file is refused
# from its size alone. (The API's own bound is lower: its request body limit.)
MAX_DOCUMENT_BYTES = 64 << 20
# The most text kept of one document, about 250k tokens: more than any model's context
# Tandem runs. A file holding more keeps its first part (complete=False, said on its chip).
MAX_DOCUMENT_CHARS = 1_000_000
_CHUNK_BYTES = 1 << 20
_PDF_MAGIC = b"%PDF-"
_ZIP_MAGIC = b"PK\x03\x04"
# Formats Tandem recognises but does not read, with what to do instead.
_UNREAD = {
    ".doc": "save it as .docx", ".ppt": "save it as PDF", ".pptx": "save it as PDF",
    ".xls": "save it as CSV", ".xlsx": "save it as CSV", ".odt": "save it as .docx or PDF",
    ".rtf": "save it as .docx or PDF", ".epub": "save it as PDF",
}


def read_document(path: str | os.PathLike[str], *, cancel: threading.Event | None = None) -> Document:
    """The document in the regular file at `path`. DocumentError (one line) for a link, a
    folder, a pipe or device, a file that vanished or cannot be opened, one over
    MAX_DOCUMENT_BYTES, or one that is no document Tandem reads."""
    name = display_name(os.fspath(path))
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise DocumentError(f"{name} is no longer there; it was moved or deleted.") from None
    except PermissionError:
        raise DocumentError(f"{name} cannot be read: permission denied.") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise DocumentError(f"{name} is a symbolic link; attach the file it points to.") from None
        raise DocumentError(f"{name} cannot be opened: {exc.strerror or exc}.") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise DocumentError(f"{name} is a folder; attach the files in it.")
        if not stat.S_ISREG(info.st_mode):
            raise DocumentError(f"{name} is not a regular file (a pipe, socket or device); attach a file.")
        _check_size(name, info.st_size)
        data = _read_all(fd, name, cancel)
    finally:
        os.close(fd)
    return document_from_bytes(name, data, cancel=cancel)


def document_from_bytes(filename: str, data: bytes, *, cancel: threading.Event | None = None) -> Document:
    """The document in `data`, a file named `filename` (only its base name is kept)."""
    name = display_name(filename)
    _check_size(name, len(data))
    if not data:
        raise DocumentError(f"{name} is empty.")
    suffix = PurePath(name).suffix.lower()
    pages: int | None = None
    complete = True
    if data.startswith(_PDF_MAGIC):
        kind = "pdf"
        text, pages, complete = extract_isolated("pdf", name, data, MAX_DOCUMENT_CHARS, cancel)
    elif data.startswith(_ZIP_MAGIC) and suffix not in _UNREAD:
        kind = "docx"
        text, _, complete = extract_isolated("docx", name, data, MAX_DOCUMENT_CHARS, cancel)
    elif suffix in _UNREAD:
        raise DocumentError(f"Tandem does not read {suffix} files; {_UNREAD[suffix]} and attach that.")
    elif suffix in (".pdf", ".docx"):
        raise DocumentError(f"{name} is not a {suffix[1:].upper()} file (it does not start as one); "
                            "it may be damaged or misnamed.")
    else:
        kind = text_kind(suffix)
        if cancel is not None and cancel.is_set():
            raise DocumentCancelled(f"Reading {name} was cancelled.")
        text = decode_text(name, data)
        if kind == "html":
            text = html_text(text)
        if len(text) > MAX_DOCUMENT_CHARS:
            text, complete = text[:MAX_DOCUMENT_CHARS], False
    text = normalise_text(text)
    if not text.strip():
        raise DocumentError(f"{name} holds no text.")
    return Document(name=name, text=text, kind=kind, size=len(data), sha256=hashlib.sha256(data).hexdigest(),
                    pages=pages, complete=complete)


def _check_size(name: str, size: int) -> None:
    if size > MAX_DOCUMENT_BYTES:
        raise DocumentError(f"{name} is {_size_text(size)}; Tandem reads documents of up to "
                            f"{MAX_DOCUMENT_BYTES >> 20} MiB.")


def _read_all(fd: int, name: str, cancel: threading.Event | None) -> bytes:
    # The size checked before reading may grow while we read: stop one byte past the bound.
    chunks: list[bytes] = []
    size = 0
    while True:
        if cancel is not None and cancel.is_set():
            raise DocumentCancelled(f"Reading {name} was cancelled.")
        try:
            chunk = os.read(fd, _CHUNK_BYTES)
        except OSError as exc:
            raise DocumentError(f"{name} could not be read: {exc.strerror or exc}.") from None
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        _check_size(name, size)


def _size_text(size: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:,.1f} {unit}"
    return f"{size} bytes"
