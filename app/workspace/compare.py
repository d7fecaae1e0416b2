"""Word-level differences between two replies, for the compare view.

Texts are split into words and punctuation marks, each carrying the
whitespace that follows it; tokens are compared without that whitespace, so
a reflowed line is not a difference. The segments of each side concatenate
back to exactly its text, and the whitespace at the end of a changed run is
reported as unchanged, so a highlight covers words, not the gap after them.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.workspace.pane import Pane

# A word (letters, digits, underscore) or one other visible character, then the whitespace after it.
_TOKEN = re.compile(r"(\w+|[^\w\s])(\s*)")


@dataclass(slots=True, frozen=True)
class Segment:
    text: str
    changed: bool


def _tokens(text: str) -> tuple[str, list[tuple[str, str]]]:
    """Leading whitespace, then (token, trailing whitespace) pairs."""
    lead = len(text) - len(text.lstrip())
    return text[:lead], [(m.group(1), m.group(2)) for m in _TOKEN.finditer(text, lead)]


def _segments(lead: str, tokens: list[tuple[str, str]], changed: list[bool]) -> list[Segment]:
    out: list[Segment] = []

    def add(text: str, is_changed: bool) -> None:
        if not text:
            return
        if out and out[-1].changed == is_changed:
            out[-1] = Segment(out[-1].text + text, is_changed)
        else:
            out.append(Segment(text, is_changed))

    add(lead, False)
    for i, ((word, space), is_changed) in enumerate(zip(tokens, changed)):
        add(word, is_changed)
        # Whitespace inside a changed run is part of it; after its last token it is not.
        inside_run = is_changed and i + 1 < len(changed) and changed[i + 1]
        add(space, inside_run)
    return out


def word_diff(a: str, b: str) -> tuple[list[Segment], list[Segment]]:
    """Segments of `a` and of `b`, `changed` where the word is not in the other text's matching run."""
    lead_a, tokens_a = _tokens(a)
    lead_b, tokens_b = _tokens(b)
    words_a = [word for word, _ in tokens_a]
    words_b = [word for word, _ in tokens_b]
    changed_a = [True] * len(words_a)
    changed_b = [True] * len(words_b)
    # autojunk would treat frequent words ("the") as noise in long replies.
    matcher = difflib.SequenceMatcher(None, words_a, words_b, autojunk=False)
    for block in matcher.get_matching_blocks():
        changed_a[block.a : block.a + block.size] = [False] * block.size
        changed_b[block.b : block.b + block.size] = [False] * block.size
    return _segments(lead_a, tokens_a, changed_a), _segments(lead_b, tokens_b, changed_b)


def default_pair(panes: Sequence[Pane]) -> tuple[int, int] | None:
    """The two panes (ids, in `panes`' order) to compare first: the leftmost
    pair that answered the same last question, else the leftmost two with a
    reply, else the leftmost two; None with fewer than two panes.

    Replies to different questions differ everywhere, so such a diff says nothing.
    """
    if len(panes) < 2:
        return None
    asked: list[tuple[int, str | None]] = []
    for pane in panes:
        conversation = pane.conversation
        turn = conversation.last_turn()
        question = conversation.messages[turn[0]].text if turn is not None and turn[1] is not None else None
        asked.append((pane.id, question))
    for i, (first, question) in enumerate(asked):
        for second, other in asked[i + 1:]:
            if question is not None and question == other:
                return first, second
    answered = [pid for pid, question in asked if question is not None]
    if len(answered) >= 2:
        return answered[0], answered[1]
    return panes[0].id, panes[1].id
