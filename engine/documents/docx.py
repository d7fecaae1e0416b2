"""A Word document's text through mammoth, after checking the zip it is: a zip bomb is
refused from its directory, before anything is inflated. Runs in the extraction child."""

from __future__ import annotations

import io
import zipfile

from engine.errors import DocumentError

# A Word file's XML is rarely over a few megabytes; a book with images stays far below
# this (images are not inflated). Deflate expands at most ~1,030:1, so declared sizes,
# which zipfile holds every member to, bound what inflating can cost.
MAX_UNZIPPED_BYTES = 256 << 20
MAX_ZIP_MEMBERS = 10_000
# A member larger than this with a higher ratio is a bomb, not a document.
MAX_RATIO = 200
_RATIO_FROM_BYTES = 1 << 20


def check_zip(name: str, data: bytes) -> zipfile.ZipFile:
    """The zip in `data`, opened; DocumentError when it is no zip, or inflating it would
    take more than MAX_UNZIPPED_BYTES, MAX_ZIP_MEMBERS members or a bomb's ratio."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        members = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        raise DocumentError(f"{name} is not a readable Word document (its zip is damaged).") from None
    if len(members) > MAX_ZIP_MEMBERS:
        raise DocumentError(f"{name} holds {len(members):,} files; a Word document holds a few dozen.")
    total = 0
    for member in members:
        total += member.file_size
        if member.file_size > _RATIO_FROM_BYTES and member.file_size > MAX_RATIO * max(member.compress_size, 1):
            raise DocumentError(f"{name} is a zip bomb ({member.filename} would inflate "
                                f"{member.file_size / max(member.compress_size, 1):,.0f} times); not read.")
    if total > MAX_UNZIPPED_BYTES:
        raise DocumentError(f"{name} would inflate to {total / 1e6:,.0f} MB; Tandem reads Word documents "
                            f"of up to {MAX_UNZIPPED_BYTES >> 20} MiB unpacked.")
    return archive


def docx_text(name: str, data: bytes, max_chars: int) -> tuple[str, bool]:
    """(text, complete): the document's paragraphs, a blank line apart, at most `max_chars`."""
    archive = check_zip(name, data)
    if "word/document.xml" not in archive.namelist():
        raise DocumentError(f"{name} is not a Word document (no word/document.xml); "
                            "Tandem reads .docx files, not .doc.")
    import mammoth

    try:
        text = mammoth.extract_raw_text(io.BytesIO(data)).value
    except MemoryError:
        raise
    except Exception as exc:  # mammoth raises every kind there is over bad XML
        reason = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise DocumentError(f"{name} is not a readable Word document ({reason}).") from None
    if not text.strip():
        raise DocumentError(f"{name} holds no text.")
    if len(text) > max_chars:
        return text[:max_chars], False
    return text, True
