"""The arena's leaderboard maths against references computed here by other means:
Bradley–Terry ratings by plain gradient ascent on the log-likelihood (Elo
units, one battle at a time), the unpenalised LMSYS fit by Zermelo's
iteration, the bootstrap by refitting the same resamplings, its width by the
Fisher information."""

from __future__ import annotations

import math
import random
import warnings

import numpy as np
import pytest

from app.arena.leaderboard import leaderboard
from app.arena.ratings import PRIOR_SD_ELO, Battle, bootstrap_intervals, bradley_terry, vote_battles
from app.arena.votes import ArenaSide, ArenaVote, contender_key

TRUE = {"alpha": 1150.0, "beta": 1050.0, "gamma": 950.0, "delta": 850.0}


def p_win(a: float, b: float) -> float:
    return 1.0 / (1.0 + 10.0 ** ((b - a) / 400.0))


def synthetic_battles(count: int, seed: int, tie_share: float = 0.15) -> list[Battle]:
    """Battles between random pairs of TRUE's contenders, won as their true ratings say, some tied."""
    rng = random.Random(seed)
    battles = []
    for _ in range(count):
        a, b = rng.sample(sorted(TRUE), 2)
        u = rng.random()
        if u < tie_share:
            battles.append(Battle(a, b, 0.5))
        else:
            battles.append(Battle(a, b, 1.0 if rng.random() < p_win(TRUE[a], TRUE[b]) else 0.0))
    return battles


def reference_ratings(battles: list[Battle], prior_sd: float = PRIOR_SD_ELO) -> dict[str, float]:
    """The maximum of sum(score * log p + (1 - score) * log(1 - p)) - sum((R - 1000)^2) / (2 prior_sd^2)
    by gradient ascent in Elo units, with a step below 1 / (the largest curvature) so it never overshoots."""
    names = sorted({n for b in battles for n in (b.first, b.second)})
    ratings = {n: 1000.0 for n in names}
    c = math.log(10) / 400
    games = {n: 0 for n in names}
    for b in battles:
        games[b.first] += 1
        games[b.second] += 1
    step = 1.0 / (c * c * max(games.values()) / 2 + 1.0 / prior_sd**2)
    for _ in range(100_000):
        gradient = {n: -(ratings[n] - 1000.0) / prior_sd**2 for n in names}
        for first, second, score in battles:
            p = p_win(ratings[first], ratings[second])
            gradient[first] += c * (score - p)
            gradient[second] -= c * (score - p)
        for n in names:
            ratings[n] += step * gradient[n]
        if max(abs(g) for g in gradient.values()) * step < 1e-9:
            return ratings
    raise AssertionError("the reference did not converge")


def zermelo(battles: list[Battle]) -> dict[str, float]:
    """The unpenalised maximum-likelihood ratings (LMSYS's logistic regression) by
    Zermelo's / Hunter's MM iteration, a tie half a win each way, on Elo's scale with mean 1000."""
    names = sorted({n for b in battles for n in (b.first, b.second)})
    wins = {n: 0.0 for n in names}
    games: dict[tuple[str, str], float] = {}
    for first, second, score in battles:
        wins[first] += score
        wins[second] += 1.0 - score
        games[(first, second)] = games.get((first, second), 0.0) + 1.0
        games[(second, first)] = games.get((second, first), 0.0) + 1.0
    strength = {n: 1.0 for n in names}
    for _ in range(20_000):
        new = {
            i: wins[i] / sum(n_ij / (strength[i] + strength[j]) for (a, j), n_ij in games.items() if a == i)
            for i in names
        }
        scale = math.exp(sum(math.log(v) for v in new.values()) / len(new))
        new = {i: v / scale for i, v in new.items()}
        done = max(abs(math.log(new[i] / strength[i])) for i in names) < 1e-13
        strength = new
        if done:
            break
    return {i: 1000.0 + 400.0 * math.log10(s) for i, s in strength.items()}


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks."""
    ordered = sorted(values)
    position = q / 100 * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def test_ratings_match_a_reference_fit() -> None:
    battles = synthetic_battles(400, seed=5)
    ours = bradley_terry(battles)
    reference = reference_ratings(battles)
    assert set(ours) == set(TRUE)
    for name in TRUE:
        assert ours[name] == pytest.approx(reference[name], abs=1e-6)
    assert sum(ours.values()) / len(ours) == pytest.approx(1000.0, abs=1e-9)  # anchored at mean 1000
    assert sorted(ours, key=ours.get) == ["delta", "gamma", "beta", "alpha"]  # the true order
    # Tuples are battles too.
    assert bradley_terry([tuple(b) for b in battles]) == pytest.approx(ours)


def test_without_the_prior_the_ratings_are_lmsys_maximum_likelihood() -> None:
    battles = synthetic_battles(600, seed=9)
    ours = bradley_terry(battles, prior_sd=1e9)
    reference = zermelo(battles)
    for name in TRUE:
        assert ours[name] == pytest.approx(reference[name], abs=1e-4)
    # With a few hundred votes the default prior moves a rating by well under a point.
    assert bradley_terry(battles) == pytest.approx(ours, abs=1.0)


def test_a_clean_sweep_keeps_finite_ratings() -> None:
    ours = bradley_terry([Battle("a", "b", 1.0)] * 3)
    assert all(math.isfinite(r) for r in ours.values()) and ours["a"] > 1100 > 900 > ours["b"]
    assert ours == pytest.approx(reference_ratings([Battle("a", "b", 1.0)] * 3), abs=1e-6)
    assert bradley_terry([]) == {}
    with warnings.catch_warnings():  # without the prior a sweep runs off towards infinity, without overflowing
        warnings.simplefilter("error")
        unbounded = bradley_terry([Battle("a", "b", 1.0)] * 3, prior_sd=1e9)
    assert unbounded["a"] - unbounded["b"] > 2000 and math.isfinite(unbounded["a"])


def test_bootstrap_intervals_match_refitting_the_same_resamplings() -> None:
    groups = [[b] for b in synthetic_battles(120, seed=3)]
    rounds, seed = 60, 17
    ours = bootstrap_intervals(groups, rounds=rounds, seed=seed)
    rng = np.random.default_rng(seed)  # the draws the bootstrap documents
    samples: dict[str, list[float]] = {name: [] for name in TRUE}
    for _ in range(rounds):
        drawn = rng.integers(0, len(groups), size=len(groups))
        fitted = reference_ratings([b for i in drawn for b in groups[i]])
        for name, rating in fitted.items():
            samples[name].append(rating)
    for name in TRUE:
        assert ours[name] == pytest.approx((percentile(samples[name], 2.5), percentile(samples[name], 97.5)), abs=1e-5)
    assert bootstrap_intervals(groups, rounds=rounds, seed=seed) == ours  # seeded: the same again
    assert bootstrap_intervals(groups, rounds=rounds, seed=seed + 1) != ours


def test_bootstrap_intervals_are_as_wide_as_the_fisher_information_says() -> None:
    battles = synthetic_battles(2000, seed=11, tie_share=0.0)
    ratings = bradley_terry(battles, prior_sd=1e9)
    intervals = bootstrap_intervals([[b] for b in battles], rounds=1000, seed=0, prior_sd=1e9)
    # Observed information of the log-odds ratings, with the mean fixed: the standard error of each.
    names = sorted(TRUE)
    c = math.log(10) / 400
    info = np.zeros((4, 4))
    for first, second, _ in battles:
        i, j = names.index(first), names.index(second)
        w = p_win(ratings[first], ratings[second]) * (1 - p_win(ratings[first], ratings[second]))
        info[[i, j], [i, j]] += w
        info[i, j] -= w
        info[j, i] -= w
    # The ratings' mean is fixed: their covariance is the inverse on the space of mean-zero vectors.
    covariance = np.linalg.inv(info + 1 / 4) - 1 / 4
    for k, name in enumerate(names):
        se = math.sqrt(covariance[k, k]) / c
        low, high = intervals[name]
        assert low < ratings[name] < high
        assert high - low == pytest.approx(2 * 1.96 * se, rel=0.1)
        assert low < TRUE[name] < high  # both have mean 1000


def arena_side(label: str, model: str, reply: str = "") -> ArenaSide:
    return ArenaSide(label, model, {"temperature": 1.1}, reply)


def test_a_vote_of_several_sides_is_battles_between_pairs() -> None:
    x, y, z = arena_side("A", "x"), arena_side("B", "y"), arena_side("C", "z")
    kx, ky, kz = (contender_key(s) for s in (x, y, z))
    assert vote_battles(ArenaVote("p", (x, y, z), "win", "B", 1.0)) == [Battle(ky, kx, 1.0), Battle(ky, kz, 1.0)]
    tie = [Battle(kx, ky, 0.5), Battle(kx, kz, 0.5), Battle(ky, kz, 0.5)]
    assert vote_battles(ArenaVote("p", (x, y, z), "tie", None, 1.0)) == tie
    assert vote_battles(ArenaVote("p", (x, y, z), "both_bad", None, 1.0)) == tie
    twin = arena_side("D", "x")  # the same model and settings on two sides do not battle each other
    assert vote_battles(ArenaVote("p", (x, twin, y), "win", "A", 1.0)) == [Battle(kx, ky, 1.0)]


def test_the_leaderboard_counts_and_rates_every_contender() -> None:
    rng = random.Random(4)
    models = {"strong": 1200.0, "middle": 1000.0, "weak": 800.0}
    votes = []
    for t in range(150):
        picked = rng.sample(sorted(models), 3 if t % 5 == 0 else 2)
        sides = tuple(arena_side(label, m) for label, m in zip("ABC", picked))
        u = rng.random()
        if u < 0.1:
            votes.append(ArenaVote("p", sides, "tie", None, float(t)))
        elif u < 0.15:
            votes.append(ArenaVote("p", sides, "both_bad", None, float(t)))
        else:
            # The winner drawn in proportion to 10^(rating / 400), as Bradley–Terry has it.
            weights = [10 ** (models[s.model] / 400) for s in sides]
            winner = rng.choices(sides, weights)[0]
            votes.append(ArenaVote("p", sides, "win", winner.label, float(t)))
    rows = leaderboard(votes, rounds=200, seed=1)
    assert [r.name for r in rows] == [f"{m} · temperature 1.1" for m in ("strong", "middle", "weak")]
    battles = [b for v in votes for b in vote_battles(v)]
    reference = reference_ratings(battles)
    by_model = {r.name.split(" ")[0]: r for r in rows}
    for model, row in by_model.items():
        mine = [v for v in votes if any(s.model == model for s in v.sides)]
        won = [v for v in mine if v.outcome == "win" and v.side(v.winner).model == model]  # type: ignore[arg-type]
        assert row.votes == len(mine) and row.wins == len(won)
        assert row.losses == sum(v.outcome == "win" for v in mine) - len(won)
        assert row.ties == sum(v.outcome == "tie" for v in mine)
        assert row.both_bad == sum(v.outcome == "both_bad" for v in mine) > 0
        assert row.wins + row.losses + row.ties + row.both_bad == row.votes
        assert row.win_rate == row.wins / row.votes
        assert row.rating == pytest.approx(reference[row.contender], abs=1e-6)
        assert row.low < row.rating < row.high
    assert leaderboard([]) == []
