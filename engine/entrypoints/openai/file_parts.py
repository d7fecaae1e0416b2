"""A chat message's `file` content parts (`{"type": "file", "file": {"filename", "file_data"}}`,
as OpenAI's chat API takes a PDF) read into Documents by the same code the window uses.

The API is stateless: a client sends its document again with every question. A small
cache of what was read, keyed by the bytes' digest and the name, keeps the PDF reader's
child process to the first of them; the prompt (and so the prefix cache) is the same
either way.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from engine.documents import MAX_DOCUMENT_BYTES, Document, DocumentError, document_from_bytes

# Each file part may start a reader process; more files than this in one request is no
# chat turn. (The request body limit bounds their bytes.)
MAX_FILE_PARTS = 16
# Documents kept read, and the text they may hold together.
_CACHE_DOCUMENTS = 32
_CACHE_CHARS = 8_000_000
# A client that sends no filename: a name from the media type, so the kind is right.
_NAME_FOR_TYPE = {
    "application/pdf": "document.pdf",
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": "document.docx",
    "text/markdown": "document.md", "text/html": "document.html", "text/csv": "document.csv",
    "application/json": "document.json",
}


class FilePartError(ValueError):
    """A file part that cannot be read; `param` names it, str() says why in one line."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def document_from_file_part(part: Mapping[str, Any], where: str) -> Document:
    """The document in the file part `part` (at `where` in the request)."""
    file = part.get("file")
    if not isinstance(file, dict):
        raise FilePartError(f"{where}.file", f"'{where}.file' must be an object with 'filename' and 'file_data'.")
    data_url = file.get("file_data")
    if data_url is None and file.get("file_id") is not None:
        raise FilePartError(f"{where}.file.file_id", "Uploaded files ('file_id') are not supported by this server; "
                            "send the file's bytes in 'file_data' as a base64 data URL.")
    if not isinstance(data_url, str):
        raise FilePartError(f"{where}.file.file_data", f"'{where}.file.file_data' must be a string: "
                            "the file as a data URL, 'data:<media type>;base64,<bytes>'.")
    media_type, encoded = _split_data_url(data_url, f"{where}.file.file_data")
    filename = file.get("filename")
    if filename is None:
        filename = _NAME_FOR_TYPE.get(media_type, "document.txt")
    elif not isinstance(filename, str):
        raise FilePartError(f"{where}.file.filename", f"'{where}.file.filename' must be a string.")
    # base64 takes 4 characters for 3 bytes: refuse what decodes over the bound undecoded.
    if len(encoded) > (MAX_DOCUMENT_BYTES // 3 + 1) * 4:
        raise FilePartError(f"{where}.file.file_data", f"The file in '{where}' is larger than "
                            f"{MAX_DOCUMENT_BYTES >> 20} MiB.")
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise FilePartError(f"{where}.file.file_data", f"'{where}.file.file_data' is not valid base64.") from None
    try:
        return _read_cached(filename, data)
    except DocumentError as exc:
        raise FilePartError(where, f"{where}: {exc}") from None


def _split_data_url(value: str, param: str) -> tuple[str, str]:
    """(media type, base64 text) of a data URL; bare base64 is taken as it is."""
    if not value.startswith("data:"):
        return "", value
    head, comma, encoded = value.partition(",")
    if not comma or not head.endswith(";base64"):
        raise FilePartError(param, f"'{param}' must be a base64 data URL: 'data:<media type>;base64,<bytes>'.")
    return head[len("data:"):-len(";base64")].split(";")[0].strip().lower(), encoded


_cache: OrderedDict[tuple[str, str], Document] = OrderedDict()
_cache_lock = threading.Lock()


def _read_cached(filename: str, data: bytes) -> Document:
    key = (hashlib.sha256(data).hexdigest(), filename)
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    document = document_from_bytes(filename, data)
    with _cache_lock:
        _cache[key] = document
        while len(_cache) > _CACHE_DOCUMENTS or sum(len(d.text) for d in _cache.values()) > _CACHE_CHARS:
            _cache.popitem(last=False)
    return document
