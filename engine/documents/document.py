"""A document as Tandem keeps it: a file's extracted text, its name and what identifies the
original (size, SHA-256), never the original bytes."""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from dataclasses import dataclass

# A name is shown on a chip and written into the prompt; a file system allows 255 bytes.
MAX_NAME_CHARS = 255
# C0 and C1 controls other than tab and line feed: a document's text is read by a
# tokenizer and shown in a window, where they are noise at best.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


@dataclass(frozen=True, slots=True)
class Document:
    """Text extracted from one file.

    `text` is normalised (`\\n` line ends, NFC, no NULs or other control characters);
    `complete` is False when only a first part of the text is kept (`first_part`, or a
    file holding more than MAX_DOCUMENT_CHARS of text)."""

    name: str
    text: str
    kind: str
    size: int
    sha256: str
    pages: int | None = None
    complete: bool = True

    def first_part(self, max_chars: int) -> Document:
        """This document cut to at most `max_chars` characters, at the last paragraph (else
        line) end before the cut when that keeps at least half; `complete` False when cut."""
        if max_chars < 0:
            raise ValueError("max_chars must not be negative")
        if len(self.text) <= max_chars:
            return self
        head = self.text[:max_chars]
        for boundary in ("\n\n", "\n"):
            end = head.rfind(boundary)
            if end >= max_chars // 2:
                head = head[:end]
                break
        return dataclasses.replace(self, text=head.rstrip("\n"), complete=False)


def normalise_text(text: str) -> str:
    """`\\n` line ends, NFC, no NULs or control characters other than tab and line feed,
    no trailing blank lines: the same file always gives the same string."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _CONTROLS.sub("", text)
    return unicodedata.normalize("NFC", text).strip("\n")


def display_name(filename: str) -> str:
    """The base name of `filename` (a path from any platform, a client's string), without
    control characters, at most MAX_NAME_CHARS; "document" when nothing is left."""
    base = re.split(r"[/\\]", filename)[-1]
    base = unicodedata.normalize("NFC", _CONTROLS.sub("", base)).strip()
    return base[:MAX_NAME_CHARS] or "document"
