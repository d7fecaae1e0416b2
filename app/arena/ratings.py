"""Bradley–Terry ratings of contenders from pairwise battles, with bootstrap
95% intervals, computed as the LMSYS Chatbot Arena computes its leaderboard.

The model: contender i beats j with probability 1 / (1 + 10^((R_j - R_i) / 400)),
Elo's scale. The ratings maximise the likelihood of the battles, a tie
counting as half a win each way (LMSYS counts a win twice and a tie once in
each direction, which is the same likelihood, doubled). LMSYS fits it with
an unpenalised logistic regression; here it is Newton's method on the same
log-likelihood, plus a weak Gaussian prior on each rating (PRIOR_SD_ELO
around the mean). The prior is what keeps the ratings finite when one
contender won every battle it was in, which a local leaderboard with a
handful of votes meets all the time; with a few dozen votes per pair it
moves a rating by well under a point. It also anchors the scale: the
ratings' mean is exactly INITIAL_RATING.

The intervals: `rounds` bootstrap samples of the votes (a vote among more
than two sides is several battles, and they are resampled together), each
fitted the same way; a contender's interval is the 2.5th and 97.5th
percentiles of its ratings over the samples it appears in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

import numpy as np

from app.arena.votes import ArenaVote, contender_key

INITIAL_RATING = 1000.0
SCALE = 400.0
BASE = 10.0
# The prior's standard deviation, in rating points: one factor of ten in the odds.
PRIOR_SD_ELO = 400.0

# Ratings in the fit are natural-log odds; a rating point is this many of them.
_NATS_PER_POINT = math.log(BASE) / SCALE
_MAX_ITERATIONS = 100
_TOLERANCE = 1e-10
# Newton steps are capped at this (in log-odds) so an early step cannot overshoot far.
_MAX_STEP = 4.0
# Matrix elements a batch of bootstrap rounds may hold at once (8 bytes each).
_BATCH_ELEMENTS = 2_000_000


class Battle(NamedTuple):
    """Two contenders and the first one's score: 1 won, 0 lost, 0.5 tied."""

    first: str
    second: str
    score: float


def vote_battles(vote: ArenaVote) -> list[Battle]:
    """The pairwise battles a vote stands for: the winner beat each other side;
    "tie" and "both_bad" are a tie between every pair. Two sides that are the
    same contender (same model and settings) do not battle each other."""
    keys = [contender_key(side) for side in vote.sides]
    if vote.outcome == "win":
        winner = contender_key(vote.side(vote.winner))  # type: ignore[arg-type]
        return [Battle(winner, key, 1.0) for key in keys if key != winner]
    return [Battle(a, b, 0.5) for i, a in enumerate(keys) for b in keys[i + 1:] if a != b]


def _prior_precision(prior_sd: float) -> float:
    if not 0 < prior_sd < math.inf:
        raise ValueError(f"the prior's standard deviation is a positive number of rating points, got {prior_sd}")
    return 1.0 / (prior_sd * _NATS_PER_POINT) ** 2


def _win_matrix(battles: Iterable[Battle], index: dict[str, int]) -> np.ndarray:
    """W[i, j]: how often i beat j, a tie counting half each way."""
    wins = np.zeros((len(index), len(index)))
    for first, second, score in battles:
        i, j = index[first], index[second]
        wins[i, j] += score
        wins[j, i] += 1.0 - score
    return wins


def _fit(wins: np.ndarray, precision: float) -> np.ndarray:
    """The log-odds ratings maximising the penalised likelihood, for a stack of win matrices.

    `wins` has shape (rounds, n, n); returns (rounds, n). Newton's method:
    the objective is strictly concave (the prior), so its maximum is unique
    and its gradient sums to zero only where the ratings' mean is zero.
    """
    rounds, n, _ = wins.shape
    games = wins + wins.transpose(0, 2, 1)
    own_wins = wins.sum(axis=2)
    ratings = np.zeros((rounds, n))
    eye = np.eye(n)
    for _ in range(_MAX_ITERATIONS):
        diff = ratings[:, :, None] - ratings[:, None, :]
        p = 0.5 + 0.5 * np.tanh(diff / 2)  # p[r, i, j]: i beats j (the logistic, never overflowing)
        gradient = own_wins - (games * p).sum(axis=2) - precision * ratings
        curvature = games * p * (1.0 - p)
        # The negative Hessian: a weighted graph Laplacian plus the prior. The
        # gradient always sums to zero, so the step does too, and adding the
        # all-ones matrix / n changes no step; it keeps the matrix invertible
        # when the prior is made vanishingly weak (LMSYS's unpenalised fit).
        hessian = (eye * curvature.sum(axis=2)[:, :, None]) - curvature + precision * eye + 1.0 / n
        step = np.linalg.solve(hessian, gradient[:, :, None])[:, :, 0]
        largest = np.abs(step).max(axis=1, keepdims=True)
        step *= np.minimum(1.0, _MAX_STEP / np.maximum(largest, 1e-300))
        ratings += step
        if largest.max() < _TOLERANCE:
            break
    return ratings


def _to_points(log_odds: np.ndarray) -> np.ndarray:
    return INITIAL_RATING + log_odds / _NATS_PER_POINT


def bradley_terry(battles: Sequence[Battle], *, prior_sd: float = PRIOR_SD_ELO) -> dict[str, float]:
    """Each contender's rating (Elo scale, mean INITIAL_RATING) from `battles`
    (Battle or (first, second, score) tuples)."""
    battles = [Battle(*b) for b in battles]
    names = sorted({b.first for b in battles} | {b.second for b in battles})
    if not names:
        return {}
    index = {name: i for i, name in enumerate(names)}
    ratings = _to_points(_fit(_win_matrix(battles, index)[None], _prior_precision(prior_sd))[0])
    return {name: float(ratings[i]) for name, i in index.items()}


def bootstrap_draws(vote_count: int, rounds: int, seed: int) -> Iterator[np.ndarray]:
    """Which votes each bootstrap round draws, with replacement: `vote_count` indices a round.

    Part of the contract, so that a reference can redraw the same samples:
    round after round, `numpy.random.default_rng(seed).integers(0, vote_count, size=vote_count)`.
    """
    rng = np.random.default_rng(seed)
    for _ in range(rounds):
        yield rng.integers(0, vote_count, size=vote_count)


def bootstrap_intervals(
    battles_by_vote: Sequence[Sequence[Battle]],
    *,
    rounds: int = 1000,
    seed: int = 0,
    prior_sd: float = PRIOR_SD_ELO,
) -> dict[str, tuple[float, float]]:
    """Each contender's 95% interval: the 2.5th and 97.5th percentiles of its
    rating over `rounds` resamplings of the votes (each item one vote's battles).

    A round in which a contender has no battle says nothing about it and is
    left out of its percentiles (its fitted rating there is the prior's mean).
    """
    if rounds < 1:
        raise ValueError(f"the bootstrap needs at least one round, got {rounds}")
    groups = [[Battle(*b) for b in group] for group in battles_by_vote]
    names = sorted({name for group in groups for b in group for name in (b.first, b.second)})
    if not names:
        return {}
    n = len(names)
    index = {name: i for i, name in enumerate(names)}
    # Every battle as two cells of the win matrix, each with the vote it came from.
    entry_vote, entry_cell, entry_score = [], [], []
    for v, group in enumerate(groups):
        for first, second, score in group:
            i, j = index[first], index[second]
            entry_vote += [v, v]
            entry_cell += [i * n + j, j * n + i]
            entry_score += [score, 1.0 - score]
    votes = np.array(entry_vote, dtype=np.int64)
    cells = np.array(entry_cell, dtype=np.int64)
    scores = np.array(entry_score)
    precision = _prior_precision(prior_sd)
    # Rounds are fitted in batches whose matrices stay within a few tens of MB.
    batch = max(1, _BATCH_ELEMENTS // (n * n))
    ratings, present = [], []
    draws = bootstrap_draws(len(groups), rounds, seed)
    for start in range(0, rounds, batch):
        size = min(batch, rounds - start)
        wins = np.empty((size, n, n))
        for r in range(size):
            drawn = np.bincount(next(draws), minlength=len(groups))
            wins[r] = np.bincount(cells, weights=drawn[votes] * scores, minlength=n * n).reshape(n, n)
        ratings.append(_to_points(_fit(wins, precision)))
        present.append((wins + wins.transpose(0, 2, 1)).sum(axis=2) > 0)
    all_ratings = np.concatenate(ratings)
    all_present = np.concatenate(present)
    intervals: dict[str, tuple[float, float]] = {}
    for name, i in index.items():
        seen = all_ratings[all_present[:, i], i]
        if seen.size == 0:  # not for a contender with a battle (a round drawing none is rare), but never a crash
            intervals[name] = (math.nan, math.nan)
            continue
        low, high = np.percentile(seen, [2.5, 97.5])
        intervals[name] = (float(low), float(high))
    return intervals


__all__ = [
    "BASE",
    "INITIAL_RATING",
    "PRIOR_SD_ELO",
    "SCALE",
    "Battle",
    "bootstrap_intervals",
    "bootstrap_draws",
    "bradley_terry",
    "vote_battles",
]
