"""Documents (engine/documents): each format read from small files these tests write, the
hostile files the issue names each answered with one line in bounded time and memory, and
the prompt form (its ids, and a broadcast of it, are in test_server_documents.py, which
has an engine loaded)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from engine.documents import (
    MAX_DOCUMENT_BYTES,
    Document,
    DocumentCancelled,
    DocumentError,
    document_from_bytes,
    read_document,
    user_message_with_documents,
)
from tests.engine.document_files import docx_bytes, encrypted_pdf, million_page_pdf, pdf_bytes, zip_bomb_docx

REPO_ROOT = Path(__file__).resolve().parents[2]


# -- formats --------------------------------------------------------------------


@pytest.mark.parametrize("data", [
    "café\r\nnaïve\r\n".encode("utf-8"),
    "café\r\nnaïve\r\n".encode("utf-8-sig"),
    "café\r\nnaïve\r\n".encode("utf-16"),  # with a byte-order mark
    "café\r\nnaïve\r\n".encode("utf-16-le"),  # without one
    "café\r\nnaïve\r\n".encode("cp1252"),
    "cafe\u0301\rnai\u0308ve".encode("utf-8"),  # decomposed accents, old Mac line ends
], ids=["utf8", "utf8-bom", "utf16-bom", "utf16le", "cp1252", "nfd-cr"])
def test_text_is_decoded_and_normalised(data: bytes) -> None:
    document = document_from_bytes("notes.txt", data)
    assert document.text == "café\nnaïve"
    assert (document.kind, document.size, document.pages, document.complete) == ("text", len(data), None, True)


@pytest.mark.parametrize(("name", "kind"), [
    ("README.md", "markdown"), ("main.py", "code"), ("table.csv", "csv"), ("data.json", "json"), ("x.log", "text"),
])
def test_kind_follows_the_name_for_text(name: str, kind: str) -> None:
    assert document_from_bytes(name, b"a,b\n1,2\n").kind == kind


def test_html_keeps_visible_text_a_block_a_line() -> None:
    page = (b"<html><head><title>T</title><style>p{color:red}</style></head><body><h1>Report</h1>"
            b"<p>First &amp; <b>bold</b>\n   words.</p><script>alert(1)</script><ul><li>one</li><li>two</li></ul>"
            b"</body></html>")
    document = document_from_bytes("page.html", page)
    assert document.kind == "html"
    assert document.text == "Report\n\nFirst & bold words.\n\none\ntwo"


def test_pdf_text_and_pages() -> None:
    data = pdf_bytes(["Quarterly report\nRevenue rose (a lot)", "Page two says more"])
    document = document_from_bytes("/somewhere/report.pdf", data)
    assert document.name == "report.pdf"
    assert (document.kind, document.pages, document.complete) == ("pdf", 2, True)
    assert document.text == "Quarterly report\nRevenue rose (a lot)\n\nPage two says more"


def test_docx_paragraphs() -> None:
    document = document_from_bytes("memo.docx", docx_bytes(["Dear team,", "Profits & losses <attached>."]))
    assert (document.kind, document.pages) == ("docx", None)
    assert document.text == "Dear team,\n\nProfits & losses <attached>."


def test_sha256_and_size_are_of_the_original_bytes() -> None:
    import hashlib

    data = "## Title\r\n\r\nbody\r\n".encode("utf-8-sig")
    document = document_from_bytes("a.md", data)
    assert document.sha256 == hashlib.sha256(data).hexdigest() and document.size == len(data)


@pytest.mark.parametrize(("name", "data", "says"), [
    ("slides.pptx", b"PK\x03\x04", "does not read .pptx"),
    ("old.doc", b"\xd0\xcf\x11\xe0", "save it as .docx"),
    ("fake.pdf", b"hello", "not a PDF file"),
    ("empty.txt", b"", "is empty"),
    ("blank.txt", b"\n\n  \n", "holds no text"),
])
def test_unread_formats_get_one_line(name: str, data: bytes, says: str) -> None:
    with pytest.raises(DocumentError, match=says) as caught:
        document_from_bytes(name, data)
    assert "\n" not in str(caught.value)


def test_first_part_cuts_at_a_paragraph_and_says_so() -> None:
    document = Document(name="a.txt", text="one two\n\nthree four\nfive six", kind="text", size=1, sha256="0")
    assert document.first_part(100) is document
    part = document.first_part(20)
    assert (part.text, part.complete) == ("one two\n\nthree four", False)
    assert document.first_part(12).text == "one two"  # the paragraph end is past half of 12
    assert document.first_part(4).text == "one "  # no boundary in reach: cut where asked


def test_cancel_before_reading() -> None:
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(DocumentCancelled):
        document_from_bytes("a.pdf", pdf_bytes(["x"]), cancel=cancel)


def test_cancel_kills_the_reader_child(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.documents import isolated

    started: list[subprocess.Popen[bytes]] = []

    class RecordedPopen(subprocess.Popen):  # type: ignore[type-arg]
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            started.append(self)

    monkeypatch.setattr(isolated.subprocess, "Popen", RecordedPopen)
    cancel = threading.Event()
    threading.Timer(0.05, cancel.set).start()
    # Python's start and pypdf's import alone outlast the cancel; the tree takes a second more.
    with pytest.raises(DocumentCancelled, match="cancelled"):
        document_from_bytes("big.pdf", million_page_pdf(), cancel=cancel)
    assert len(started) == 1 and started[0].returncode is not None and started[0].returncode < 0  # killed, reaped


# -- the prompt form ---------------------------------------------------------------


def test_prompt_form_is_stable_and_puts_documents_first() -> None:
    a = Document(name='say "hi".md', text="alpha", kind="markdown", size=5, sha256="1")
    b = Document(name="b.txt", text="beta\ngamma", kind="text", size=10, sha256="2", complete=False)
    message = user_message_with_documents("What differs?", [a, b])
    assert message == ("<document name=\"say 'hi'.md\">\nalpha\n</document>\n\n"
                       '<document name="b.txt" part="first part only">\nbeta\ngamma\n</document>\n\n'
                       "What differs?")
    assert user_message_with_documents("What differs?", [a, b]) == message
    assert user_message_with_documents("Just text", []) == "Just text"


# -- hostile files, in a child under a memory limit ------------------------------

HOSTILE_MEMORY_BYTES = 1 << 30
HOSTILE_TIMEOUT_S = 90
_READ_EACH = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (%d, %d))
from engine.documents import DocumentError, read_document
answers = {}
for path in json.loads(sys.argv[1]):
    try:
        read_document(path)
        answers[path] = None
    except DocumentError as exc:
        answers[path] = str(exc)
print(json.dumps(answers))
""" % (HOSTILE_MEMORY_BYTES, HOSTILE_MEMORY_BYTES)

HOSTILE = {
    "huge.txt": "huge.txt is 2.1 GB; Tandem reads documents of up to 64 MiB.",
    "bomb.docx": "bomb.docx is a zip bomb (word/document.xml would inflate",
    "broken.pdf": "broken.pdf is not a readable PDF (",
    "locked.pdf": "locked.pdf is protected by a password; save an unprotected copy and attach that.",
    "million.pdf": "million.pdf has 1,000,000 pages; Tandem reads PDFs of up to 5,000 pages.",
    "junk.txt": "junk.txt holds binary data, not text; attach a text, PDF or Word file.",
    "link.txt": "link.txt is a symbolic link; attach the file it points to.",
    "pipe.txt": "pipe.txt is not a regular file (a pipe, socket or device); attach a file.",
    "folder.md": "folder.md is a folder; attach the files in it.",
    "gone.txt": "gone.txt is no longer there; it was moved or deleted.",
}


@pytest.fixture(scope="module")
def hostile_answers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str | None]:
    folder = tmp_path_factory.mktemp("hostile")
    with open(folder / "huge.txt", "wb") as f:  # sparse: 2 GB on paper, nothing on the disk
        f.truncate(2_100_000_000)
    (folder / "bomb.docx").write_bytes(zip_bomb_docx())
    broken = b"%PDF-1.7\n1 0 obj\n<< /Type /Catalog /Pages 9 0 R" + random.Random(0).randbytes(3000)
    (folder / "broken.pdf").write_bytes(broken)
    (folder / "locked.pdf").write_bytes(encrypted_pdf())
    (folder / "million.pdf").write_bytes(million_page_pdf())
    (folder / "junk.txt").write_bytes(random.Random(1).randbytes(8192))
    (folder / "target.txt").write_text("the real file")
    (folder / "link.txt").symlink_to(folder / "target.txt")
    os.mkfifo(folder / "pipe.txt")
    (folder / "folder.md").mkdir()
    paths = [str(folder / name) for name in HOSTILE]
    done = subprocess.run([sys.executable, "-c", _READ_EACH, json.dumps(paths)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=HOSTILE_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    return {Path(path).name: answer for path, answer in json.loads(done.stdout).items()}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_file_gets_one_clear_line(hostile_answers: dict[str, str | None], name: str) -> None:
    answer = hostile_answers[name]
    assert answer is not None and answer.startswith(HOSTILE[name])
    assert "\n" not in answer and len(answer) < 300


def test_a_file_over_the_bound_is_refused_from_its_bytes() -> None:
    with pytest.raises(DocumentError, match="64 MiB"):
        document_from_bytes("big.txt", b"a" * (MAX_DOCUMENT_BYTES + 1))


def test_reading_a_regular_file(tmp_path: Path) -> None:
    path = tmp_path / "notes.md"
    path.write_bytes(b"# Notes\n\nsome text\n")
    assert read_document(path) == document_from_bytes("notes.md", path.read_bytes())
