"""The labels an arena shows instead of models (A, B, ...), and which pane
each label stands for on one turn.

The order is drawn afresh every turn so that a pane's position (left, right)
never tells which model it is, and a habit of preferring the left reply
cannot favour one model.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from string import ascii_uppercase


def arena_labels(count: int) -> list[str]:
    """["A", "B", ...] for `count` sides; after "Z" come "AA", "AB", ... as spreadsheet columns."""
    if count < 0:
        raise ValueError(f"an arena has a number of sides, not {count}")
    labels = []
    for n in range(1, count + 1):
        label = ""
        while n:
            n, rest = divmod(n - 1, len(ascii_uppercase))
            label = ascii_uppercase[rest] + label
        labels.append(label)
    return labels


def draw_order(pane_ids: Sequence[int], rng: random.Random) -> dict[str, int]:
    """Label -> pane id for one turn: the panes in an order drawn from `rng`.

    "A" is the first label shown (the leftmost side), so shuffling which pane
    gets it is what hides position. Raises ValueError for a pane listed twice.
    """
    ids = list(pane_ids)
    if len(set(ids)) != len(ids):
        raise ValueError(f"every pane takes part in an arena once; got {ids}")
    shuffled = rng.sample(ids, len(ids))
    return dict(zip(arena_labels(len(shuffled)), shuffled))


__all__ = ["arena_labels", "draw_order"]
