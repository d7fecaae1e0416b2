"""An arena vote: the prompt, every side's hidden model, settings and reply,
and what the user chose, and the name of each model-and-settings it rates.

A *contender* is a model with its settings (sampling parameters, system
prompt): the leaderboard rates contenders, not panes, so two panes on the
same model at temperatures 0.2 and 1.0 are two contenders, and a pane that
keeps its model and settings across turns is one contender across votes.

Votes are stored by app.store.chat_store (schema v5) and exported by
app.arena.export; the dict form below is the one both use.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.errors import AppError

if TYPE_CHECKING:
    from engine.params import SamplingParams

# What a vote says: one label won ("win", with `winner`), the replies were as
# good as each other ("tie"), or all of them were bad ("both_bad"; kept apart
# from "tie" in the votes and the counts, rated as a tie as LMSYS does).
OUTCOMES = ("win", "tie", "both_bad")

# The settings key of a pane's system prompt, beside SamplingParams' fields.
SYSTEM_PROMPT = "system_prompt"

# Longest system prompt a contender's readable name quotes.
_NAME_PROMPT_CHARS = 32


class ArenaVoteError(AppError, ValueError):
    """A vote that cannot be right (a winner that is not one of its sides, one side only, ...)."""


@dataclass(frozen=True, slots=True)
class ArenaSide:
    """One side of a vote: the label it was shown under and what the label hid."""

    label: str
    model: str
    # The pane's sampling parameters and system prompt as a JSON-able dict
    # (contender_settings makes it): what makes two contenders differ.
    settings: dict[str, Any]
    reply: str
    pane_id: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.label, str) or not self.label:
            raise ArenaVoteError(f"an arena side needs a label, got {self.label!r}")
        if not isinstance(self.model, str):
            raise ArenaVoteError(f"side {self.label}: the model must be a name, got {type(self.model).__name__}")
        if not isinstance(self.settings, dict):
            raise ArenaVoteError(f"side {self.label}: the settings must be a dict, got {type(self.settings).__name__}")
        if not isinstance(self.reply, str):
            raise ArenaVoteError(f"side {self.label}: the reply must be text, got {type(self.reply).__name__}")
        if self.pane_id is not None and (isinstance(self.pane_id, bool) or not isinstance(self.pane_id, int)):
            raise ArenaVoteError(f"side {self.label}: the pane id must be a whole number, got {self.pane_id!r}")
        try:
            json.dumps(self.settings)
        except (TypeError, ValueError) as exc:
            raise ArenaVoteError(f"side {self.label}: the settings must be JSON-able ({exc})") from None


@dataclass(frozen=True, slots=True)
class ArenaVote:
    """One vote on one broadcast turn. `id` is the store's, once stored."""

    prompt: str
    sides: tuple[ArenaSide, ...]
    outcome: str
    winner: str | None
    created_at: float
    arena_id: str | None = None
    id: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "sides", tuple(self.sides))
        if not isinstance(self.prompt, str):
            raise ArenaVoteError(f"a vote's prompt must be text, got {type(self.prompt).__name__}")
        if len(self.sides) < 2 or not all(isinstance(s, ArenaSide) for s in self.sides):
            raise ArenaVoteError(f"a vote compares at least two sides, got {len(self.sides)}")
        labels = [s.label for s in self.sides]
        if len(set(labels)) != len(labels):
            raise ArenaVoteError(f"a vote's sides need different labels, got {labels}")
        if self.outcome not in OUTCOMES:
            raise ArenaVoteError(f"a vote's outcome is one of {', '.join(OUTCOMES)}, got {self.outcome!r}")
        if self.outcome == "win" and self.winner not in labels:
            raise ArenaVoteError(
                f"the winner of a vote is one of its labels ({', '.join(labels)}), got {self.winner!r}")
        if self.outcome != "win" and self.winner is not None:
            raise ArenaVoteError(f"a {self.outcome!r} vote has no winner, got {self.winner!r}")
        if isinstance(self.created_at, bool) or not isinstance(self.created_at, (int, float)) \
                or not math.isfinite(self.created_at):
            raise ArenaVoteError(f"a vote's time is a number of seconds, got {self.created_at!r}")
        if self.arena_id is not None and not isinstance(self.arena_id, str):
            raise ArenaVoteError(f"an arena id is text, got {type(self.arena_id).__name__}")

    def side(self, label: str) -> ArenaSide:
        for side in self.sides:
            if side.label == label:
                return side
        raise KeyError(label)


# -- contenders ------------------------------------------------------------------------


def contender_settings(params: SamplingParams, system_prompt: str = "") -> dict[str, Any]:
    """A pane's settings as an ArenaSide holds them: every sampling parameter and the system prompt."""
    from app.store.records import params_to_dict

    return {**params_to_dict(params), SYSTEM_PROMPT: system_prompt}


def _defaults() -> dict[str, Any]:
    from engine.params import SamplingParams

    defaults = {f.name: getattr(SamplingParams(), f.name) for f in dataclasses.fields(SamplingParams)}
    defaults["stop"] = list(defaults["stop"])
    defaults[SYSTEM_PROMPT] = ""
    return defaults


def _float_fields() -> set[str]:
    from engine.params import SAMPLING_FIELDS

    return {f.name for f in SAMPLING_FIELDS if f.kind is float}


def _same(value: Any, default: Any) -> bool:
    # 1 and 1.0 are one setting; True and 1 are not.
    if isinstance(value, bool) or isinstance(default, bool):
        return type(value) is type(default) and value == default
    return value == default


def canonical_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The settings that tell a contender apart: those at their default left out
    (so votes stored before a new setting existed rate the same contender),
    a float parameter given as a whole number made a float, stop strings a list."""
    defaults = _defaults()
    floats = _float_fields()
    kept: dict[str, Any] = {}
    for name, value in settings.items():
        if isinstance(value, tuple):
            value = list(value)
        if name in floats and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if name in defaults and _same(value, defaults[name]):
            continue
        kept[name] = value
    return kept


def contender_key(side: ArenaSide) -> str:
    """The stable name of a side's model-and-settings: `["model",{settings}]` as compact
    JSON with sorted keys (canonical_settings), equal for equal contenders."""
    return json.dumps([side.model, canonical_settings(side.settings)],
                      sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _value_text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return " ".join(_value_text(v) for v in value)
    return json.dumps(value, ensure_ascii=False, sort_keys=True) if isinstance(value, dict) else str(value)


def _setting_text(name: str, value: Any) -> str:
    from engine.params import SAMPLING_FIELDS

    labels = {f.name: f.label.lower() for f in SAMPLING_FIELDS}
    if name == SYSTEM_PROMPT:
        prompt = " ".join(str(value).split())
        if len(prompt) > _NAME_PROMPT_CHARS:
            prompt = prompt[: _NAME_PROMPT_CHARS - 1] + "…"
        return f"system prompt {json.dumps(prompt, ensure_ascii=False)}"
    if name == "ignore_eos":
        return "ignore EOS" if value is True else f"ignore EOS {_value_text(value)}"
    return f"{labels.get(name, name.replace('_', ' '))} {_value_text(value)}"


def contender_name(side: ArenaSide) -> str:
    """A contender for people: the model, then each setting that is not at its
    default, e.g. "SmolLM2-135M-Instruct · temperature 0.8 · seed 3"."""
    from engine.params import SAMPLING_FIELDS

    kept = canonical_settings(side.settings)
    order = [f.name for f in SAMPLING_FIELDS] + ["seed", "stop", "ignore_eos", SYSTEM_PROMPT]
    names = [n for n in order if n in kept] + sorted(n for n in kept if n not in order)
    return " · ".join([side.model or "(unnamed model)", *(_setting_text(n, kept[n]) for n in names)])


# -- the dict form (the store's sides column, the votes export) -----------------------


def side_to_dict(side: ArenaSide) -> dict[str, Any]:
    return {"label": side.label, "model": side.model, "settings": side.settings, "reply": side.reply,
            "pane_id": side.pane_id}


def side_from_dict(data: object) -> ArenaSide:
    """A side as side_to_dict wrote it; ArenaVoteError for anything else."""
    if not isinstance(data, dict):
        raise ArenaVoteError(f"an arena side is an object, got {type(data).__name__}")
    try:
        return ArenaSide(label=data["label"], model=data["model"], settings=data["settings"],
                         reply=data["reply"], pane_id=data.get("pane_id"))
    except KeyError as exc:
        raise ArenaVoteError(f"an arena side has no {exc.args[0]!r}") from None


def sides_to_json(sides: tuple[ArenaSide, ...]) -> str:
    return json.dumps([side_to_dict(s) for s in sides], ensure_ascii=False)


def sides_from_json(text: object) -> tuple[ArenaSide, ...]:
    """The sides as sides_to_json wrote them; ArenaVoteError for text that is not."""
    if not isinstance(text, str):
        raise ArenaVoteError(f"the sides are JSON text, got {type(text).__name__}")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ArenaVoteError(f"the sides are not valid JSON ({exc})") from None
    if not isinstance(data, list):
        raise ArenaVoteError(f"the sides are a list, got {type(data).__name__}")
    return tuple(side_from_dict(item) for item in data)


def vote_to_dict(vote: ArenaVote) -> dict[str, Any]:
    """A vote for the JSON export: its fields, and each side's contender key and readable name."""
    return {
        "id": vote.id,
        "arena_id": vote.arena_id,
        "created_at": vote.created_at,
        "prompt": vote.prompt,
        "outcome": vote.outcome,
        "winner": vote.winner,
        "sides": [
            {**side_to_dict(side), "contender": contender_key(side), "name": contender_name(side)}
            for side in vote.sides
        ],
    }


__all__ = [
    "OUTCOMES",
    "SYSTEM_PROMPT",
    "ArenaSide",
    "ArenaVote",
    "ArenaVoteError",
    "canonical_settings",
    "contender_key",
    "contender_name",
    "contender_settings",
    "side_from_dict",
    "side_to_dict",
    "sides_from_json",
    "sides_to_json",
    "vote_to_dict",
]
