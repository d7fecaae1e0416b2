"""The arena's leaderboard: one row per contender (model-and-settings), its
vote counts, win rate, Bradley–Terry rating and bootstrap 95% interval."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from app.arena.ratings import bootstrap_intervals, bradley_terry, vote_battles
from app.arena.votes import ArenaVote, contender_key, contender_name


@dataclass(frozen=True, slots=True)
class LeaderboardRow:
    """One contender's standing.

    `votes` counts the votes it took part in: `wins` (its side won), `losses`
    (another side won), `ties` ("tie") and `both_bad` ("both_bad"), which add
    up to `votes`. `win_rate` is wins / votes, ties and both-bad included in
    the total as LMSYS counts them. `rating` is the Bradley–Terry rating on
    all votes, `low`/`high` its bootstrap 95% interval.
    """

    contender: str
    name: str
    votes: int
    wins: int
    losses: int
    ties: int
    win_rate: float
    rating: float
    low: float
    high: float
    both_bad: int = 0


@dataclass(slots=True)
class _Tally:
    name: str
    votes: int = 0
    wins: int = 0
    losses: int = 0
    ties: int = 0
    both_bad: int = 0


def _tallies(votes: Sequence[ArenaVote]) -> dict[str, _Tally]:
    tallies: dict[str, _Tally] = {}
    for vote in votes:
        winner = contender_key(vote.side(vote.winner)) if vote.winner is not None else None
        seen: set[str] = set()
        for side in vote.sides:
            key = contender_key(side)
            if key in seen:  # a contender on two sides of one vote took part in it once
                continue
            seen.add(key)
            tally = tallies.setdefault(key, _Tally(contender_name(side)))
            tally.votes += 1
            if vote.outcome == "win":
                if key == winner:
                    tally.wins += 1
                else:
                    tally.losses += 1
            elif vote.outcome == "tie":
                tally.ties += 1
            else:
                tally.both_bad += 1
    return tallies


def leaderboard(votes: Sequence[ArenaVote], *, rounds: int = 1000, seed: int = 0) -> list[LeaderboardRow]:
    """Every contender that battled another, best rating first (then by name).

    `rounds` bootstrap resamplings of the votes (seeded by `seed`, so the
    same votes give the same intervals) make the intervals; takes about half
    a second for 1000 rounds of a few contenders, so a window computes it
    off its GUI thread.
    """
    battles = [vote_battles(vote) for vote in votes]
    ratings = bradley_terry([b for group in battles for b in group])
    intervals = bootstrap_intervals(battles, rounds=rounds, seed=seed) if ratings else {}
    rows = []
    for key, tally in _tallies(votes).items():
        if key not in ratings:  # only ever on a side with a copy of itself: nothing to rate
            continue
        rating = ratings[key]
        low, high = intervals.get(key, (math.nan, math.nan))
        if math.isnan(low) or math.isnan(high):
            low = high = rating
        rows.append(LeaderboardRow(
            contender=key, name=tally.name, votes=tally.votes, wins=tally.wins, losses=tally.losses,
            ties=tally.ties, win_rate=tally.wins / tally.votes, rating=rating, low=low, high=high,
            both_bad=tally.both_bad,
        ))
    rows.sort(key=lambda row: (-row.rating, row.name, row.contender))
    return rows


def interval_text(row: LeaderboardRow, between: str = " – ") -> str:
    """The 95% interval as a person reads it, or that there is none yet.

    Resampling one vote (or votes that all say the same) gives the same
    votes every round, so the interval shrinks to the rating itself: a
    certainty the votes do not have.
    """
    if round(row.high) <= round(row.low):
        return "needs more votes"
    return f"{row.low:.0f}{between}{row.high:.0f}"


def count_text(count: int, noun: str) -> str:
    """"1 vote", "2 votes"."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


__all__ = ["LeaderboardRow", "count_text", "interval_text", "leaderboard"]
