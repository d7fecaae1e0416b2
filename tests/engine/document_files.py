"""Small documents written by the tests: a PDF and a Word file built byte by byte (a PDF
is objects and a cross-reference table; a .docx is XML in a zip), and hostile ones."""

from __future__ import annotations

import io
import zipfile
from xml.sax.saxutils import escape


def pdf_bytes(pages: list[str]) -> bytes:
    """A PDF with one Helvetica text page per string (lines split at '\\n')."""
    font = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"
    objects: list[bytes] = [b"<< /Type /Catalog /Pages 2 0 R >>", b"", font]
    kids = []
    for text in pages:
        shown = b" ".join(b"(%s) Tj 0 -14 Td" % _pdf_string(line) for line in text.split("\n"))
        stream = b"BT /F1 12 Tf 72 720 Td " + shown + b" ET"
        objects.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream))
        objects.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> "
                       b"/Contents %d 0 R >>" % len(objects))
        kids.append(len(objects))
    objects[1] = b"<< /Type /Pages /Kids [%s] /Count %d >>" % (b" ".join(b"%d 0 R" % k for k in kids), len(kids))
    return _pdf_file(objects)


def million_page_pdf() -> bytes:
    """A page tree of a million pages (a thousand nodes of a thousand, all one blank page):
    9 MB that a reader walking the tree would take minutes and gigabytes over."""
    leaf = 1003
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>",
               b"<< /Type /Pages /Kids [%s] /Count 1000000 >>" % b" ".join(b"%d 0 R" % (3 + i) for i in range(1000))]
    node = b"<< /Type /Pages /Parent 2 0 R /Kids [%s] /Count 1000 >>" % b" ".join([b"%d 0 R" % leaf] * 1000)
    objects += [node] * 1000
    objects.append(b"<< /Type /Page /Parent 3 0 R /MediaBox [0 0 612 792] >>")
    return _pdf_file(objects)


def encrypted_pdf() -> bytes:
    from pypdf import PdfWriter

    writer = PdfWriter()
    writer.add_blank_page(200, 200)
    writer.encrypt("secret", algorithm="RC4-128")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def docx_bytes(paragraphs: list[str]) -> bytes:
    body = "".join(f"<w:p><w:r><w:t>{escape(p)}</w:t></w:r></w:p>" for p in paragraphs)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("[Content_Types].xml", _CONTENT_TYPES)
        archive.writestr("_rels/.rels", _RELS)
        archive.writestr("word/document.xml", f'<?xml version="1.0"?><w:document xmlns:w="{_W}"><w:body>{body}'
                                              "</w:body></w:document>")
    return out.getvalue()


def zip_bomb_docx() -> bytes:
    """A .docx whose document inflates 64 MiB from ~300 kB (a real bomb nests or repeats this)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        archive.writestr("[Content_Types].xml", _CONTENT_TYPES)
        archive.writestr("_rels/.rels", _RELS)
        archive.writestr("word/document.xml", bytes(64 << 20))
    return out.getvalue()


def _pdf_string(line: str) -> bytes:
    return line.encode("latin-1").replace(b"\\", b"\\\\").replace(b"(", b"\\(").replace(b")", b"\\)")


def _pdf_file(objects: list[bytes]) -> bytes:
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n%s\nendobj\n" % (number, body))
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    out.write(b"".join(b"%010d 00000 n \n" % offset for offset in offsets))
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref))
    return out.getvalue()


_W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
_CONTENT_TYPES = (
    '<?xml version="1.0"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
    '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
    '<Default Extension="xml" ContentType="application/xml"/><Override PartName="/word/document.xml" '
    'ContentType="application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/></Types>')
_RELS = (
    '<?xml version="1.0"?><Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
    '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/'
    'officeDocument" Target="word/document.xml"/></Relationships>')
