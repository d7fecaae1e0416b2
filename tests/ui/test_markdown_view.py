"""Message bodies: Markdown blocks, code blocks with a copy button, cheap streaming."""

from __future__ import annotations

from typing import Any

from PySide6.QtGui import QGuiApplication

from ui.panes.markdown_view import AutoHeightText, Block, CodeBlockView, MarkdownView, appends_as_plain_text, split_blocks


def test_split_blocks_separates_code_and_standalone_paragraphs() -> None:
    text = "Intro **bold**\n\nSecond paragraph\n\n- a\n\n- b\n\n```python\nx = 1\n\ny = 2\n```\nafter\n\n```\nopen"
    assert split_blocks(text) == [
        Block("text", "Intro **bold**"),
        # A list after a blank line continues the block it follows: split, it would render differently.
        Block("text", "Second paragraph\n\n- a\n\n- b"),
        Block("code", "x = 1\n\ny = 2", "python", True),
        Block("text", "after"),
        Block("code", "open", "", False),  # still streaming: no closing fence yet
    ]
    assert split_blocks("") == []
    assert split_blocks("~~~\ncode ``` inside\n~~~") == [Block("code", "code ``` inside", "", True)]


def test_streaming_re_renders_only_the_last_block(qtbot: Any) -> None:
    view = MarkdownView()
    qtbot.addWidget(view)
    view.resize(400, 300)
    view.set_markdown("First paragraph.\n\nSecond")
    first, second = view.block_widgets()
    rendered = first.toHtml()
    view.set_markdown("First paragraph.\n\nSecond paragraph grows")
    assert view.block_widgets()[0] is first and first.toHtml() == rendered
    assert view.block_widgets()[1] is second
    assert "grows" in second.toPlainText()
    view.set_markdown("First paragraph.\n\nSecond paragraph grows\n\n```sh\necho hi")
    widgets = view.block_widgets()
    assert widgets[:2] == [first, second] and isinstance(widgets[2], CodeBlockView)
    assert widgets[2].code.toPlainText() == "echo hi"
    # The same text again changes nothing; a shorter text drops blocks.
    view.set_markdown("Only one")
    assert len(view.block_widgets()) == 1 and view.block_widgets()[0].toPlainText() == "Only one"


def test_markdown_renders_and_code_has_a_copy_button(qtbot: Any) -> None:
    view = MarkdownView()
    qtbot.addWidget(view)
    view.set_markdown("Some **bold** text\n\n```python\nprint('hi')\n```")
    text = view.block_widgets()[0]
    assert isinstance(text, AutoHeightText)
    assert text.toPlainText() == "Some bold text"  # Markdown, not the raw asterisks
    (code,) = view.code_blocks()
    assert code.lang_label.text() == "python"
    assert code.code.font().fixedPitch() or "mono" in code.code.font().family().lower()
    code.copy_button.click()
    assert QGuiApplication.clipboard().text() == "print('hi')"


def test_user_text_is_shown_as_typed(qtbot: Any) -> None:
    view = MarkdownView(plain=True)
    qtbot.addWidget(view)
    view.set_markdown("2 * 3 * 4 and `x`")
    assert view.block_widgets()[0].toPlainText() == "2 * 3 * 4 and `x`"


def test_highlight_marks_changed_words_and_clears(qtbot: Any) -> None:
    from app.workspace.compare import word_diff

    view = MarkdownView()
    qtbot.addWidget(view)
    view.set_markdown("The cat sat")
    left, _ = word_diff("The cat sat", "The dog sat")
    view.set_highlight(left)
    html = view.highlighted_html()
    assert "background-color" in html and "cat" in html
    assert all(not w.isVisible() for w in view.block_widgets())
    view.set_highlight(None)
    assert view.highlighted_html() == ""
    assert view.block_widgets()[0].toPlainText() == "The cat sat"


def _coloured_runs(block: Any) -> list[Any]:
    """The highlighter's coloured runs over every line of a code block."""
    runs = []
    line = block.code.document().firstBlock()
    while line.isValid():
        runs += [r for r in line.layout().formats() if r.format.foreground().style() != 0]
        line = line.next()
    return runs


def test_a_python_block_is_coloured_and_an_unknown_language_stays_plain(qtbot: Any) -> None:
    view = MarkdownView()
    qtbot.addWidget(view)
    view.resize(400, 300)
    view.set_markdown("```python\ndef f(x):\n    return x  # twice\n```\n\n```nosuchlanguage\ndef f(x):\n```")
    python, unknown = view.code_blocks()
    assert python.is_highlighted() and not unknown.is_highlighted()
    assert python.code.toPlainText() == "def f(x):\n    return x  # twice"
    assert unknown.code.toPlainText() == "def f(x):"
    runs = _coloured_runs(python)
    assert len({r.format.foreground().color().name() for r in runs}) >= 2  # keywords, names, comments differ
    first_line = python.code.document().firstBlock()
    assert any(r.start == 0 and r.length == 3 for r in first_line.layout().formats())  # "def"
    assert _coloured_runs(unknown) == []


def test_a_growing_block_is_appended_and_only_new_lines_are_lexed(qtbot: Any) -> None:
    from ui.panes.code_highlight import line_spans

    view = MarkdownView()
    qtbot.addWidget(view)
    view.resize(400, 300)
    lines = [f"value_{i} = compute({i})  # step {i}" for i in range(40)]
    view.set_markdown("```python\n" + "\n".join(lines[:20]))
    block = view.code_blocks()[0]
    document = block.code.document()
    line_spans.cache_clear()
    for n in range(21, 41):
        view.set_markdown("```python\n" + "\n".join(lines[:n]))
    assert view.code_blocks()[0] is block and block.code.document() is document
    assert block.code.toPlainText() == "\n".join(lines)
    # Each new line is lexed as it grows, never the lines before it again: no more
    # distinct lines than were added (the partial last line counts once per frame).
    assert line_spans.cache_info().misses <= 2 * 20
    # A line already seen is not lexed again (cached by language and text).
    assert line_spans("python", lines[0], False) is line_spans("python", lines[0], False)


def test_dark_palette_recolours_a_block(qtbot: Any, qapp: Any) -> None:
    from ui.theme import apply_theme

    view = MarkdownView()
    qtbot.addWidget(view)
    view.set_markdown("```python\ndef f(x):\n    return 'text'\n```")
    block = view.code_blocks()[0]
    light = sorted(r.format.foreground().color().name() for r in _coloured_runs(block))
    try:
        apply_theme(qapp, "dark")
        qapp.processEvents()
        dark = sorted(r.format.foreground().color().name() for r in _coloured_runs(block))
    finally:
        apply_theme(qapp, "light")
    assert dark and dark != light


def test_a_long_code_line_scrolls_inside_its_block_instead_of_widening_it(qtbot: Any) -> None:
    view = MarkdownView()
    qtbot.addWidget(view)
    view.resize(300, 400)
    view.show()
    line = "value = compute(" + ", ".join(f"argument_{i}" for i in range(30)) + ")"
    view.set_markdown(f"```python\n{line}\nshort = 1\n```")
    qtbot.waitUntil(lambda: view.code_blocks()[0].code.horizontalScrollBar().maximum() > 0)
    block = view.code_blocks()[0]
    assert block.width() <= view.width()
    assert block.code.document().blockCount() == 2  # not wrapped: two lines stay two
    bar = block.code.horizontalScrollBar()
    qtbot.waitUntil(bar.isVisible)
    # Both lines and the scroll bar fit the block's height.
    assert block.code.height() >= block.code.document().size().height() + bar.height()


def test_a_growing_paragraph_of_plain_words_is_appended_as_markdown_would_render_it(qtbot: Any) -> None:
    # Streamed token by token: each step shows exactly what parsing the whole paragraph shows.
    streams = [
        ["Once", " upon", " a", " time,", " the", " keeper", " (old", " Tom)", " said:", " “Storm’s", " coming!”"],
        ["The", " 3", " ships", " sailed", " at", " 5.30;", " 100%", " sure", " — ", "no", " doubt", "…"],
        ["Go", " to", " **", "bold", "**", " then", " plain", " again"],  # emphasis: parsed again
        ["Visit", " www", ".example", ".com", " now"],  # an autolink: parsed again
        ["Two", "  ", "spaces", " and", " a", " trailing", " ", "space"],
        ["1", ".", " not", " a", " list", " yet"],
        ["Line", "\n", "break", " here"],
    ]
    for tokens in streams:
        growing = AutoHeightText()
        qtbot.addWidget(growing)
        growing.resize(300, 100)
        text = ""
        for token in tokens:
            text += token
            growing.show_markdown(text)
            fresh = AutoHeightText()
            fresh.setMarkdown(text)
            assert growing.toPlainText() == fresh.toPlainText(), text
            assert growing.document().toMarkdown() == fresh.document().toMarkdown(), text
            assert growing.document().blockCount() == fresh.document().blockCount(), text
            fresh.deleteLater()


def test_only_plain_prose_appends_without_parsing() -> None:
    assert appends_as_plain_text("The keeper", " said, “yes!”")
    assert not appends_as_plain_text("The keeper", " *said*")  # emphasis
    assert not appends_as_plain_text("The keeper", " `code`")
    assert not appends_as_plain_text("The keeper", " [a](b)")
    assert not appends_as_plain_text("The keeper ", "said")  # Markdown dropped the trailing space
    assert not appends_as_plain_text("The keeper", " said\nthen")  # a line break
    assert not appends_as_plain_text("- item", " more")  # a list
    assert not appends_as_plain_text("1. item", " more")
    assert not appends_as_plain_text("# Title", " more")
    assert not appends_as_plain_text("See www", ".example.com")  # an autolink
    assert not appends_as_plain_text("Mail me", " at a@b.org")
    assert not appends_as_plain_text("", "Hello")


def test_warm_up_loads_the_common_lexer_ahead(qtbot: Any) -> None:
    from ui.panes import code_highlight

    code_highlight.line_spans.cache_clear()
    code_highlight.warm_up(dark=False)
    assert code_highlight.line_spans.cache_info().currsize == 1
    assert code_highlight._lexer(code_highlight.COMMON_LANGUAGE) is not None
