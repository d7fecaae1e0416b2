"""What tells one chat's title from another's: a pane's name and a fork's mark, put first.

The Chats sidebar cuts a long title at its end, so whatever distinguishes a
fork or a sweep's pane from the chat it came from must lead the title:
"Fork: What is…", "seed 1 · What is…". A pane the user names lends that name
to its chat's title; renaming it again replaces the name, not stacks it.
"""

from __future__ import annotations

import re

LABEL_SEPARATOR = " · "
_FORK = re.compile(r"Fork(?: (\d+))?: ")


def fork_title(title: str) -> str:
    """"Fork: <title>"; a fork of a fork counts up ("Fork 2: <title>") rather than stacking marks."""
    if not title:
        return ""
    match = _FORK.match(title)
    if match is None:
        return f"Fork: {title}"
    depth = int(match.group(1) or 1) + 1
    return f"Fork {depth}: {title[match.end():]}"


def without_label(title: str, *labels: str) -> str:
    """`title` without a leading "<label> · " for any of `labels`."""
    for label in labels:
        prefix = f"{label}{LABEL_SEPARATOR}"
        if label and title.startswith(prefix):
            return title[len(prefix):]
    return title


def labelled_title(title: str, old_label: str, new_label: str) -> str:
    """The title under the pane name `new_label` ("" for none) instead of `old_label`.

    A named pane's own name tells it apart, so a fork's mark gives way to it.
    """
    base = without_label(title, old_label, new_label)
    if not new_label:
        return base
    base = base[m.end():] if (m := _FORK.match(base)) is not None else base
    return f"{new_label}{LABEL_SEPARATOR}{base}" if base else ""
