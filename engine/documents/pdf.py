"""A PDF's text through pypdf, page by page. Runs in the extraction child (isolated.py):
pypdf can take very long, or very much memory, over a hostile file."""

from __future__ import annotations

import io
import logging

from engine.errors import DocumentError

# More pages than any document a model's context could hold the text of; a file claiming
# more (a million empty pages) is refused before its page tree is read.
MAX_PDF_PAGES = 5000


def pdf_text(name: str, data: bytes, max_chars: int) -> tuple[str, int, bool]:
    """(text, pages, complete): the text of each page, pages apart by a blank line, at most
    `max_chars` characters (complete False when it stopped there)."""
    import pypdf
    from pypdf.errors import DependencyError

    logging.getLogger("pypdf").setLevel(logging.CRITICAL)  # damaged files warn on every object
    try:
        reader = pypdf.PdfReader(io.BytesIO(data), strict=False)
        if reader.is_encrypted:
            _decrypt(name, reader)
        declared = _declared_pages(reader)
        if declared > MAX_PDF_PAGES:
            raise DocumentError(f"{name} has {declared:,} pages; Tandem reads PDFs of up to {MAX_PDF_PAGES:,} pages.")
        pages = len(reader.pages)
        if pages > MAX_PDF_PAGES:
            raise DocumentError(f"{name} has {pages:,} pages; Tandem reads PDFs of up to {MAX_PDF_PAGES:,} pages.")
        texts: list[str] = []
        total = 0
        for page in reader.pages:
            text = (page.extract_text() or "").strip()
            texts.append(text)
            total += len(text) + 2
            if total > max_chars:
                return "\n\n".join(texts)[:max_chars], pages, False
    except (DocumentError, MemoryError):
        raise
    except DependencyError:
        raise DocumentError(f"{name} is encrypted in a way Tandem cannot open; save an unencrypted copy.") from None
    except Exception as exc:  # pypdf raises PyPdfError and every built-in kind over damaged files
        reason = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise DocumentError(f"{name} is not a readable PDF ({reason}); it may be damaged.") from None
    if not any(texts):
        raise DocumentError(f"{name} has no text layer (a scanned PDF?); Tandem reads text, not images.")
    return "\n\n".join(t for t in texts if t), pages, True


def _decrypt(name: str, reader: object) -> None:
    # Many PDFs are encrypted only against editing, with an empty password to open them.
    from pypdf import PasswordType

    try:
        opened = reader.decrypt("")  # type: ignore[attr-defined]
    except NotImplementedError:
        opened = PasswordType.NOT_DECRYPTED
    if opened == PasswordType.NOT_DECRYPTED:
        raise DocumentError(f"{name} is protected by a password; save an unprotected copy and attach that.")


def _declared_pages(reader: object) -> int:
    try:
        count = reader.trailer["/Root"]["/Pages"]["/Count"]  # type: ignore[attr-defined]
        return int(count)
    except Exception:  # a damaged tree: len(reader.pages) will say
        return 0
