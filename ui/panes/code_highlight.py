"""Fenced code in colour: Pygments, by the fence's language, a line at a time.

A streaming reply grows its last code block at every frame. The block's
text is appended to its document (not set again), and a QSyntaxHighlighter
colours only the lines that changed: the last line or two, whatever the
length of the block. What a line looks like is cached by (language, line,
dark), so a line is lexed once. Languages Pygments does not know stay plain.

Lines are lexed on their own: a string or comment that spans lines (a Python
docstring) is coloured line by line as the lexer reads each one, the price
of never lexing the whole block again while it grows.
"""

from __future__ import annotations

from functools import lru_cache

from PySide6.QtGui import QColor, QFont, QFontDatabase, QSyntaxHighlighter, QTextCharFormat, QTextDocument
from pygments.lexer import Lexer
from pygments.lexers import get_lexer_by_name
from pygments.styles import get_style_by_name
from pygments.token import _TokenType
from pygments.util import ClassNotFound

# Styles that keep to the block's own background (the palette's AlternateBase).
LIGHT_STYLE = "default"
DARK_STYLE = "monokai"

# (colour "#rrggbb" or "", bold, italic): how one token looks.
Look = tuple[str, bool, bool]
# (start, length, look) for each coloured run of a line.
Spans = tuple[tuple[int, int, Look], ...]


@lru_cache(maxsize=64)
def _lexer(lang: str) -> Lexer | None:
    if not lang:
        return None
    try:
        return get_lexer_by_name(lang, stripnl=False, ensurenl=False)
    except ClassNotFound:
        return None


def knows_language(lang: str) -> bool:
    """Whether code fenced as `lang` is shown in colour."""
    return _lexer(lang.strip().lower()) is not None


@lru_cache(maxsize=4096)
def _look(token: _TokenType, dark: bool) -> Look:
    style = get_style_by_name(DARK_STYLE if dark else LIGHT_STYLE).style_for_token(token)
    return (f"#{style['color']}" if style["color"] else "", bool(style["bold"]), bool(style["italic"]))


@lru_cache(maxsize=8192)
def line_spans(lang: str, line: str, dark: bool) -> Spans:
    """The coloured runs of one line of `lang` code (empty for an unknown language)."""
    lexer = _lexer(lang.strip().lower())
    if lexer is None or not line:
        return ()
    spans: list[tuple[int, int, Look]] = []
    for start, token, text in lexer.get_tokens_unprocessed(line):
        look = _look(token, dark)
        if look != ("", False, False) and text:
            spans.append((start, len(text), look))
    return tuple(spans)


# The fence most replies open: its lexer is loaded ahead (warm_up).
COMMON_LANGUAGE = "python"


def warm_up(dark: bool) -> None:
    """Load what the first coloured block needs (the commonest lexer, the
    style, the monospace font), ~60 ms on a small machine, so it is spent
    while the window is idle and not in the frame where a reply's first
    code block appears (a stall seen in bench/ui_latency.py --code)."""
    line_spans(COMMON_LANGUAGE, "def f(x): return 'x'  # warm", dark)
    QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)


class CodeHighlighter(QSyntaxHighlighter):
    """Colours a code document by language; `set_language` re-colours it (a new fence or theme)."""

    def __init__(self, document: QTextDocument, lang: str = "", dark: bool = False) -> None:
        super().__init__(document)
        self._lang = lang
        self._dark = dark
        self._formats: dict[Look, QTextCharFormat] = {}

    def set_language(self, lang: str, dark: bool) -> None:
        if (lang, dark) == (self._lang, self._dark):
            return
        self._lang, self._dark = lang, dark
        self._formats.clear()
        self.rehighlight()

    def _format(self, look: Look) -> QTextCharFormat:
        fmt = self._formats.get(look)
        if fmt is None:
            fmt = QTextCharFormat()
            color, bold, italic = look
            if color:
                fmt.setForeground(QColor(color))
            if bold:
                fmt.setFontWeight(QFont.Weight.Bold)
            if italic:
                fmt.setFontItalic(True)
            self._formats[look] = fmt
        return fmt

    def highlightBlock(self, text: str) -> None:  # noqa: N802 (Qt naming)
        for start, length, look in line_spans(self._lang, text, self._dark):
            self.setFormat(start, length, self._format(look))
