"""Text-like files (plain text, Markdown, code, CSV, JSON, HTML): which kind a file is, its
bytes decoded, binary data refused, HTML reduced to its text. Cheap and linear in the size,
so these run in the caller's process."""

from __future__ import annotations

import codecs
import re
from html.parser import HTMLParser

from engine.errors import DocumentError

MARKDOWN_SUFFIXES = frozenset({".md", ".markdown", ".mdx", ".rst"})
HTML_SUFFIXES = frozenset({".html", ".htm", ".xhtml"})
CODE_SUFFIXES = frozenset({
    ".py", ".pyi", ".ipynb", ".c", ".h", ".cc", ".cpp", ".cxx", ".hpp", ".cs", ".java", ".kt", ".scala",
    ".go", ".rs", ".swift", ".m", ".js", ".mjs", ".cjs", ".jsx", ".ts", ".tsx", ".rb", ".php", ".pl",
    ".lua", ".r", ".jl", ".sh", ".bash", ".zsh", ".fish", ".ps1", ".bat", ".sql", ".css", ".scss",
    ".vue", ".svelte", ".dart", ".hs", ".ml", ".ex", ".exs", ".erl", ".clj", ".lisp", ".el", ".vim",
    ".zig", ".nim", ".toml", ".yaml", ".yml", ".ini", ".cfg", ".conf", ".xml", ".gradle", ".cmake",
    ".mk", ".tex", ".proto", ".graphql", ".diff", ".patch",
})
TEXT_KINDS = {".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json"}

# Characters that are no text: more than this share of them (after decoding) means
# the file is binary data whatever its name says.
_MAX_CONTROL_SHARE = 0.01
_ALLOWED_CONTROLS = frozenset("\t\n\r\f")
# How many bytes the sniff for UTF-16 without a byte-order mark looks at.
_SNIFF_BYTES = 4096


def text_kind(suffix: str) -> str:
    """The kind a text-like file of this (lower-case) suffix is shown as."""
    if suffix in MARKDOWN_SUFFIXES:
        return "markdown"
    if suffix in HTML_SUFFIXES:
        return "html"
    if suffix in CODE_SUFFIXES:
        return "code"
    return TEXT_KINDS.get(suffix, "text")


def decode_text(name: str, data: bytes) -> str:
    """`data` as text: UTF-8 (with or without a byte-order mark), UTF-16/32 with a mark,
    UTF-16 without one, else Windows-1252. DocumentError when the result is not text."""
    text = _decode(data)
    if text is None or _is_binary(text):
        raise DocumentError(f"{name} holds binary data, not text; attach a text, PDF or Word file.")
    return text


def _decode(data: bytes) -> str | None:
    for bom, encoding in ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
                          (codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"),
                          (codecs.BOM_UTF16_BE, "utf-16")):
        if data.startswith(bom):
            return _strict(data, encoding)
    head = data[:_SNIFF_BYTES]
    # ASCII text in UTF-16 has a NUL in every other byte, on the side of its byte order.
    if len(head) >= 4 and head.count(0) * 3 > len(head):
        if head[1::2].count(0) * 4 > len(head[1::2]) * 3:
            return _strict(data, "utf-16-le")
        if head[0::2].count(0) * 4 > len(head[0::2]) * 3:
            return _strict(data, "utf-16-be")
        return None
    text = _strict(data, "utf-8")
    if text is None:
        text = data.decode("cp1252", errors="replace")
    return text


def _strict(data: bytes, encoding: str) -> str | None:
    try:
        return data.decode(encoding)
    except UnicodeDecodeError:
        return None


def _is_binary(text: str) -> bool:
    if "\x00" in text or "\ufffd" * 4 in text:
        return True
    sample = text[:1 << 20]
    controls = sum(1 for ch in sample if ch < " " and ch not in _ALLOWED_CONTROLS)
    replaced = sample.count("\ufffd")
    return (controls + replaced) > _MAX_CONTROL_SHARE * max(len(sample), 1)


class _HTMLText(HTMLParser):
    """The visible text of an HTML page: the head, scripts and styles left out, a blank line
    around each block, a line for each list item, row or break, white space collapsed
    outside <pre> as a browser does."""

    _HIDDEN = frozenset({"script", "style", "template", "noscript", "head", "svg"})
    _BLOCKS = frozenset({
        "p", "div", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "blockquote", "section", "article",
        "header", "footer", "main", "nav", "aside", "table", "ul", "ol", "dl", "hr", "figure",
    })
    _LINES = frozenset({"br", "li", "tr", "dt", "dd"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._hidden_depth = 0
        self._pre_depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self._HIDDEN:
            self._hidden_depth += 1
        elif tag in self._BLOCKS:
            self.parts.append("\n\n")
        elif tag in self._LINES:
            self.parts.append("\n")
        elif tag in ("td", "th"):
            self.parts.append("\t")
        self._pre_depth += tag == "pre"

    def handle_endtag(self, tag: str) -> None:
        if tag in self._HIDDEN:
            self._hidden_depth = max(0, self._hidden_depth - 1)
        elif tag in self._BLOCKS:
            self.parts.append("\n\n")
        if tag == "pre":
            self._pre_depth = max(0, self._pre_depth - 1)

    def handle_data(self, data: str) -> None:
        if not self._hidden_depth:
            self.parts.append(data if self._pre_depth else re.sub(r"\s+", " ", data))


def html_text(page: str) -> str:
    """The visible text of an HTML page, a paragraph a line."""
    parser = _HTMLText()
    parser.feed(page)
    parser.close()
    lines = (line.strip(" ") for line in "".join(parser.parts).split("\n"))
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines))
