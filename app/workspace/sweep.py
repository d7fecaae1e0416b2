"""Sweeps: one pane per value of a setting, each a fork of the same conversation.

A sweep opens, right of the pane it starts from, one fork of its
conversation per value (so every fork's next prompt starts on the pages the
source left in the prefix cache) and gives each fork that value of the
swept setting: a sampling parameter, the seed, the system prompt or the
model. Values are read from text a person typed (`parse_values`) and checked
by the one rule for each: SamplingParams (engine.params.SAMPLING_FIELDS) for
the numbers, the models on offer for a model.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.params import InvalidSamplingParams, SamplingParams, sampling_field

from app.errors import SweepError
from app.workspace.conversation import Conversation

if TYPE_CHECKING:
    from app.workspace.pane import Pane
    from app.workspace.workspace import Workspace

# Each value opens a pane: more than this is no longer a comparison on one screen.
MAX_SWEEP_VALUES = 8
# A seed range ("1-4") is written with a hyphen or an en dash.
_RANGE = re.compile(r"^(\d+)[-–](\d+)$")


@dataclass(frozen=True, slots=True)
class SweepParameter:
    name: str  # "temperature", "top_p", "min_p", "seed", "system_prompt", "model"
    label: str
    hint: str  # how to write the values, for the dialog


SWEEP_PARAMETERS: tuple[SweepParameter, ...] = (
    SweepParameter("temperature", sampling_field("temperature").label,
                   f"Numbers separated by commas, e.g. 0.2, 0.7, 1.2 ({sampling_field('temperature').range_text()})."),
    SweepParameter("top_p", sampling_field("top_p").label,
                   f"Numbers separated by commas, e.g. 0.5, 0.9, 1 ({sampling_field('top_p').range_text()})."),
    SweepParameter("min_p", sampling_field("min_p").label,
                   f"Numbers separated by commas, e.g. 0, 0.05, 0.1 ({sampling_field('min_p').range_text()})."),
    SweepParameter("seed", "Seed", "Whole numbers separated by commas, or a range: 1-4."),
    SweepParameter("system_prompt", "System prompt", "One system prompt per line."),
    SweepParameter("model", "Model", "One model per line, by its name or id."),
)
_BY_NAME = {p.name: p for p in SWEEP_PARAMETERS}


def sweep_parameter(name: str) -> SweepParameter:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise SweepError(f"{name!r} cannot be swept; choose one of: {', '.join(_BY_NAME)}.") from None


def parse_values(
    parameter: str, text: str, base: SamplingParams, models: Mapping[str, str] | None = None
) -> list[object]:
    """The values typed in `text` for `parameter`, each checked; SweepError says what is wrong.

    `base` is the pane's sampling (a value is checked together with it);
    `models` maps every model a pane may run (id -> name shown) for a model sweep.
    """
    swept = sweep_parameter(parameter)
    if parameter == "system_prompt":
        values: list[object] = [line.strip() for line in text.splitlines() if line.strip()]
    elif parameter == "model":
        values = [_model_id(line.strip(), models or {}) for line in text.splitlines() if line.strip()]
    elif parameter == "seed":
        values = _seeds(text)
    else:
        values = [_number(parameter, swept.label, item, base) for item in _items(text)]
    if not values:
        raise SweepError(f"Type at least one value to sweep {swept.label.lower()} over. {swept.hint}")
    if len(values) > MAX_SWEEP_VALUES:
        raise SweepError(f"A sweep opens one pane per value: at most {MAX_SWEEP_VALUES} values, not {len(values)}.")
    seen: set[object] = set()
    for value in values:
        if value in seen:
            shown = models.get(value, value) if parameter == "model" and models else value
            raise SweepError(f"{swept.label} {shown!s} is listed twice; each value opens its own pane.")
        seen.add(value)
    return values


def _items(text: str) -> list[str]:
    return [item for item in re.split(r"[,;\s]+", text.strip()) if item]


def _number(name: str, label: str, item: str, base: SamplingParams) -> float:
    try:
        value = float(item)
    except ValueError:
        raise SweepError(f"{label}: {item!r} is not a number.") from None
    try:
        dataclasses.replace(base, **{name: value})
    except InvalidSamplingParams:
        field = sampling_field(name)
        raise SweepError(f"{label} must be {field.range_text()}; {item} is not. {field.help}") from None
    return value


def _seeds(text: str) -> list[object]:
    seeds: list[object] = []
    for item in _items(re.sub(r"\s*([-–])\s*(?=\d)", r"\1", text)):
        span = _RANGE.match(item)
        if span is not None:
            first, last = int(span.group(1)), int(span.group(2))
            if last < first:
                raise SweepError(f"Seed range {item.strip()} runs backwards; write the smaller seed first.")
            if last - first >= MAX_SWEEP_VALUES:
                raise SweepError(f"Seed range {item.strip()} has {last - first + 1} seeds; a sweep takes at most {MAX_SWEEP_VALUES}.")
            seeds.extend(range(first, last + 1))
            continue
        try:
            seed = int(item)
        except ValueError:
            raise SweepError(f"Seed: {item.strip()!r} is not a whole number (or a range such as 1-4).") from None
        seeds.append(seed)
    for seed in seeds:
        if not 0 <= int(seed) < 2**63:  # type: ignore[call-overload]
            raise SweepError(f"Seed {seed} is out of range: use a whole number from 0 to {2**63 - 1}.")
    return seeds


def _model_id(written: str, models: Mapping[str, str]) -> str:
    if written in models:
        return written
    by_name = [model_id for model_id, name in models.items() if name.casefold() == written.casefold()]
    if len(by_name) == 1:
        return by_name[0]
    offered = ", ".join(sorted(models.values())) or "none (add one with Models → Manage models)"
    raise SweepError(f"There is no model called {written!r}. The models you can choose: {offered}.")


def value_label(parameter: str, value: object, models: Mapping[str, str] | None = None) -> str:
    """The title of the pane that runs `value`: "temperature 0.7", "seed 3", "system prompt 2", a model's name."""
    if parameter == "model":
        return (models or {}).get(str(value), str(value))
    if parameter == "system_prompt":
        text = str(value)
        return f"system: {text[:24]}…" if len(text) > 25 else f"system: {text}"
    return f"{sweep_parameter(parameter).label.lower()} {value:g}" if isinstance(value, float) else f"{parameter} {value}"


def open_sweep(
    workspace: Workspace, pane_id: int, parameter: str, values: Sequence[object],
    models: Mapping[str, str] | None = None, *, keep_constraint: bool = True,
) -> list[Pane]:
    """One new pane per value, right of the pane (in the values' order), each
    a fork of its whole conversation with that value set. A model value is
    only set: loading it is the caller's choice (memory). `keep_constraint`:
    the forks reply as the source does ("Reply as JSON"), or as free text.
    Returns the panes."""
    sweep_parameter(parameter)
    if not values:
        raise SweepError("A sweep needs at least one value.")
    source = workspace.pane(pane_id)
    if source.busy:
        raise SweepError(f"{source.title} is still replying; sweep once its reply has finished (or stop it).")
    opened: list[Pane] = []
    # Each fork opens right of the source: the last value first keeps them in the values' order.
    for value in reversed(values):
        pane = _fork_whole(workspace, source)
        opened.insert(0, pane)
        _apply(workspace, pane, parameter, value)
        if not keep_constraint and pane.conversation.params.constraint is not None:
            workspace.set_params(pane.id, dataclasses.replace(pane.conversation.params, constraint=None))
        workspace.set_title(pane.id, value_label(parameter, value, models))
    return opened


def _fork_whole(workspace: Workspace, source: Pane) -> Pane:
    conversation = source.conversation
    if conversation.messages:
        return workspace.fork_pane(source.id, len(conversation.messages) - 1)
    empty = Conversation(
        system_prompt=conversation.system_prompt,
        params=conversation.params,
        model_id=conversation.model_id,
        context_policy=conversation.context_policy,
    )
    remote = source.remote.copy() if source.remote is not None else None
    return workspace.open_conversation(empty, after=source.id, remote=remote)


def _apply(workspace: Workspace, pane: Pane, parameter: str, value: object) -> None:
    if parameter == "system_prompt":
        workspace.set_system_prompt(pane.id, str(value))
    elif parameter == "model":
        workspace.set_model(pane.id, str(value))
    else:
        workspace.set_params(pane.id, dataclasses.replace(pane.conversation.params, **{parameter: value}))
