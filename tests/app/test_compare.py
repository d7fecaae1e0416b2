"""Word-level differences between two replies."""

from __future__ import annotations

from app.workspace.compare import Segment, word_diff


def changed_words(segments: list[Segment]) -> list[str]:
    return [s.text for s in segments if s.changed]


def test_segments_rebuild_each_text_exactly() -> None:
    a = "  The quick brown fox,\njumps over\tthe lazy dog.  "
    b = "The slow brown fox jumps over the lazy cat!\n"
    left, right = word_diff(a, b)
    assert "".join(s.text for s in left) == a
    assert "".join(s.text for s in right) == b
    # Adjacent segments always alternate: runs are merged.
    for segments in (left, right):
        assert all(x.changed != y.changed for x, y in zip(segments, segments[1:]))


def test_identical_texts_have_no_changes() -> None:
    left, right = word_diff("Same words here.", "Same words here.")
    assert left == [Segment("Same words here.", False)]
    assert right == [Segment("Same words here.", False)]


def test_changed_words_and_punctuation_are_flagged() -> None:
    left, right = word_diff("the quick brown fox.", "the slow brown fox!")
    assert changed_words(left) == ["quick", "."]
    assert changed_words(right) == ["slow", "!"]


def test_whitespace_alone_is_not_a_difference() -> None:
    left, right = word_diff("one two\nthree", "one  two three")
    assert not changed_words(left) and not changed_words(right)


def test_insertions_and_deletions() -> None:
    left, right = word_diff("keep this and that", "keep this, plus more, and that")
    assert changed_words(left) == []
    assert changed_words(right) == [", plus more,"]
    left, right = word_diff("a b c d", "a d")
    assert changed_words(left) == ["b c"]
    assert changed_words(right) == []


def test_run_highlight_stops_before_the_following_space() -> None:
    left, _ = word_diff("alpha beta gamma delta", "alpha delta")
    assert left == [Segment("alpha ", False), Segment("beta gamma", True), Segment(" delta", False)]


def test_empty_sides() -> None:
    left, right = word_diff("", "new words")
    assert left == []
    assert right == [Segment("new words", True)]


def test_the_default_pair_is_two_panes_that_answered_the_same_question() -> None:
    from app.settings import Settings
    from app.workspace.compare import default_pair
    from app.workspace.workspace import Workspace

    workspace = Workspace(Settings())
    panes = [workspace.add_pane() for _ in range(4)]
    assert default_pair(panes[:1]) is None
    assert default_pair(panes) == (panes[0].id, panes[1].id)  # nothing asked yet: the leftmost two

    def ask(index: int, text: str, reply: bool = True) -> None:
        conversation = panes[index].conversation
        conversation.append_user(text)
        if reply:
            conversation.begin_reply([1, 2])

    ask(0, "What is the capital of France?")
    ask(1, "Tell me a joke", reply=False)
    ask(2, "Name a colour")
    assert default_pair(panes) == (panes[0].id, panes[2].id)  # the two with a reply
    ask(3, "Name a colour")
    assert default_pair(panes) == (panes[2].id, panes[3].id)  # asked the same thing
