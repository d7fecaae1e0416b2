"""The leaderboard as CSV or JSON, and the votes themselves as JSON.

The same text goes to the window's Export and to `tandem arena export`;
writing it to a file is app.files.write_text_atomically's job (regular files
only, atomic, 0600), and the CSV's cells are app.files.csv_text's (quoted, a
model's name that would start a formula shown as text).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from app.arena.leaderboard import LeaderboardRow
from app.arena.votes import ArenaVote, vote_to_dict
from app.files import csv_text

VOTES_FORMAT = "tandem-arena-votes"
VOTES_FORMAT_VERSION = 1

CSV_COLUMNS = ("rank", "name", "rating", "low", "high", "votes", "wins", "losses", "ties", "both_bad",
               "win_rate", "contender")


def row_to_dict(row: LeaderboardRow, rank: int) -> dict[str, Any]:
    return {
        "rank": rank,
        "name": row.name,
        "rating": row.rating,
        "low": row.low,
        "high": row.high,
        "votes": row.votes,
        "wins": row.wins,
        "losses": row.losses,
        "ties": row.ties,
        "both_bad": row.both_bad,
        "win_rate": row.win_rate,
        "contender": row.contender,
    }


def leaderboard_csv(rows: Sequence[LeaderboardRow]) -> str:
    """One line per contender, best first, under a header line (CSV_COLUMNS);
    ratings to two decimals, win rates to four."""
    return csv_text([
        CSV_COLUMNS,
        *(
            [rank, row.name, f"{row.rating:.2f}", f"{row.low:.2f}", f"{row.high:.2f}", row.votes, row.wins,
             row.losses, row.ties, row.both_bad, f"{row.win_rate:.4f}", row.contender]
            for rank, row in enumerate(rows, 1)
        ),
    ])


def leaderboard_json(rows: Sequence[LeaderboardRow]) -> str:
    """A list of objects, best first, with the CSV's fields at full precision."""
    return json.dumps([row_to_dict(row, rank) for rank, row in enumerate(rows, 1)],
                      ensure_ascii=False, indent=2) + "\n"


def votes_json(votes: Sequence[ArenaVote]) -> str:
    """Every vote, oldest first: prompt, outcome, winner label, and each side's
    label, model, settings, reply, contender key and readable name."""
    document = {
        "format": VOTES_FORMAT,
        "version": VOTES_FORMAT_VERSION,
        "votes": [vote_to_dict(vote) for vote in votes],
    }
    return json.dumps(document, ensure_ascii=False, indent=2) + "\n"


__all__ = ["CSV_COLUMNS", "VOTES_FORMAT", "leaderboard_csv", "leaderboard_json", "row_to_dict", "votes_json"]
