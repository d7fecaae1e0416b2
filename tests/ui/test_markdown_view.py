"""Message bodies: Markdown blocks, code blocks with a copy button, cheap streaming."""

from __future__ import annotations

from typing import Any

from PySide6.QtGui import QGuiApplication

from ui.panes.markdown_view import AutoHeightText, Block, CodeBlockView, MarkdownView, split_blocks


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
