"""What a request asks of sampling: SamplingParams, checked when made, and
SAMPLING_FIELDS, the one table of the numeric fields' ranges and meanings that
SamplingParams' checks, the command line's flags and the window's form all read;
and the one place the defaults live: SamplingParams' own, replaced field by
field by what a model's generation_config.json recommends (`defaults_for`).

Kept apart from engine.model.sampler (the tensor work) so that code which only
stores or shows parameters (the chat store, `tandem chats`) never imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from engine.errors import EngineError
from engine.structured.constraint import Constraint

# Sampling this cold is greedy in effect, and dividing by a temperature near 0 overflows float32.
_MIN_TEMPERATURE = 1e-5


class InvalidSamplingParams(EngineError, ValueError):
    """A sampling parameter is outside its allowed range."""


_LARGEST_WHOLE = 2**63 - 1


@dataclass(slots=True, frozen=True)
class SamplingField:
    """One numeric SamplingParams field: its range, how a form shows it, what it does.

    `minimum`/`maximum` are the bounds SamplingParams accepts. A bound is
    included unless `exclusive_minimum`/`exclusive_maximum` says otherwise
    (top_p may not be 0, min_p may not be 1); `form_minimum`/`form_maximum`
    are the nearest values a spin box with `decimals` decimals may show.
    """

    name: str
    """The SamplingParams field, e.g. "min_p"."""
    label: str
    """For a form: "Min-p"."""
    kind: type
    """int or float."""
    minimum: float
    maximum: float | None
    """None: no upper bound."""
    step: float
    """A spin box's step."""
    decimals: int
    """0 for ints."""
    help: str
    """One sentence: what it does, and which value turns it off."""
    exclusive_minimum: bool = False
    exclusive_maximum: bool = False

    def allows(self, value: object) -> bool:
        """Whether `value` is of this field's kind, finite, and in its range."""
        if isinstance(value, bool) or not isinstance(value, (int, float) if self.kind is float else int):
            return False
        # NaN fails every comparison below, and infinity is no setting.
        if isinstance(value, float) and not math.isfinite(value):
            return False
        # A whole number past what the sampler's float32 and int64 tensors
        # hold (10**4000 from a JSON body or settings.json) is no setting either.
        if isinstance(value, int) and abs(value) > _LARGEST_WHOLE:
            return False
        if value < self.minimum or (self.exclusive_minimum and value == self.minimum):
            return False
        if self.maximum is not None and (
            value > self.maximum or (self.exclusive_maximum and value == self.maximum)
        ):
            return False
        return True

    def range_text(self) -> str:
        """The range in words, e.g. "above 0 and at most 1" (used by every message about it)."""
        low = f"above {self.minimum:g}" if self.exclusive_minimum else f"at least {self.minimum:g}"
        if self.maximum is None:
            return low
        high = f"below {self.maximum:g}" if self.exclusive_maximum else f"at most {self.maximum:g}"
        return f"{low} and {high}"

    @property
    def form_minimum(self) -> float:
        """The least value a spin box with `decimals` decimals may offer."""
        return self.minimum + 10.0**-self.decimals if self.exclusive_minimum else self.minimum

    @property
    def form_maximum(self) -> float | None:
        """The greatest value a spin box may offer; None: no upper bound."""
        if self.maximum is None or not self.exclusive_maximum:
            return self.maximum
        return self.maximum - 10.0**-self.decimals


SAMPLING_FIELDS: tuple[SamplingField, ...] = (
    SamplingField(
        "temperature", "Temperature", float, 0.0, None, 0.05, 2,
        "Randomness of the reply; 0 always picks the most likely token (greedy).",
    ),
    SamplingField(
        "top_p", "Top-p", float, 0.0, 1.0, 0.05, 2,
        "Sample only from the most likely tokens whose probabilities add up to this; 1 turns it off.",
        exclusive_minimum=True,
    ),
    SamplingField(
        "top_k", "Top-k", int, 0, None, 1, 0,
        "Sample only from this many of the most likely tokens; 0 turns it off.",
    ),
    SamplingField(
        "min_p", "Min-p", float, 0.0, 1.0, 0.01, 2,
        "Drop tokens less likely than this fraction of the most likely one; 0 turns it off.",
        exclusive_maximum=True,
    ),
    SamplingField(
        "repetition_penalty", "Repetition penalty", float, 0.0, None, 0.05, 2,
        "Above 1 discourages tokens already in the prompt or reply; 1 turns it off.",
        exclusive_minimum=True,
    ),
    SamplingField(
        "max_tokens", "Max tokens", int, 1, None, 1, 0,
        "Most tokens a reply may have.",
    ),
)

_BY_NAME = {f.name: f for f in SAMPLING_FIELDS}


def sampling_field(name: str) -> SamplingField:
    """The table's entry for SamplingParams field `name` (KeyError for seed, stop, or a typo)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name!r} is not a numeric sampling field; they are {', '.join(_BY_NAME)}") from None


@dataclass(slots=True, frozen=True)
class SamplingParams:
    # The defaults are the ecosystem's (llama.cpp's; LM Studio and Ollama are
    # alike): at temperature 0.7 with nothing cut off, small models reach into
    # their long tail and write gibberish. A model's own recommendation, where
    # it has one, replaces them (`recommended_sampling`, `defaults_for`).
    max_tokens: int = 512
    temperature: float = 0.8
    """0 (or anything below 1e-5) samples greedily."""
    top_k: int = 40
    """0 turns top-k off."""
    top_p: float = 0.95
    """1 turns top-p off."""
    min_p: float = 0.05
    """0 turns min-p off; else drop tokens with probability below min_p times the top one's."""
    repetition_penalty: float = 1.0
    """1 turns it off. As in HF: for every token in prompt or output, a logit > 0 is divided
    by it, a logit < 0 multiplied by it."""
    seed: int | None = None
    """Same seed, prompt and device type give the same output; None draws a random seed."""
    stop: tuple[str, ...] = ()
    """Stop strings; the detokenizer acts on them."""
    ignore_eos: bool = False
    constraint: Constraint | None = None
    """The grammar the reply must follow (engine.structured); None: free text.
    Set by a program (the server's response_format and tools), not by a form."""

    def __post_init__(self) -> None:
        # Each message names the field (a program sets it) and says what it does
        # and what it accepts (a person reads it).
        for field in SAMPLING_FIELDS:
            value = getattr(self, field.name)
            if not field.allows(value):
                kind = " (a whole number)" if field.kind is int else (
                    " (a finite number)" if field.maximum is None else ""
                )
                raise InvalidSamplingParams(
                    f"{field.name} ({field.label}) must be {field.range_text()}{kind}, "
                    f"got {_shown(value)}. {field.help}"
                )
        _require(
            self.seed is None or _is_int(self.seed),
            "seed", "the random seed", "a whole number, or None for a random one",
            self.seed,
        )
        _require(
            isinstance(self.stop, tuple) and all(isinstance(s, str) for s in self.stop),
            "stop", "texts that end the reply", "a tuple of strings, e.g. (\"\\n\\n\",)",
            self.stop,
        )
        _require(
            all(self.stop),
            "stop", "texts that end the reply",
            "free of empty strings (an empty one would end every reply at once)", self.stop,
        )
        _require(
            self.constraint is None or isinstance(self.constraint, Constraint),
            "constraint", "the grammar the reply follows", "an engine.structured.Constraint, or None",
            self.constraint,
        )

    @property
    def greedy(self) -> bool:
        return self.temperature < _MIN_TEMPERATURE


# The fields a model may recommend, by their generation_config.json names
# (Hugging Face's, which are SamplingParams' own). vLLM reads the same keys;
# max_new_tokens is left out: it is a model's limit, not advice for a chat.
RECOMMENDABLE_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
# How the window and the command line name where a pane's or a run's settings came from.
MODEL_RECOMMENDED = "the model's recommended settings"
TANDEM_DEFAULTS = "Tandem's defaults"
GENERATION_CONFIG = "generation_config.json"


def recommended_sampling(generation_config: Mapping[str, Any]) -> dict[str, int | float]:
    """The sampling settings a model's generation_config.json recommends:
    each RECOMMENDABLE_FIELDS key it holds with a value SamplingParams accepts
    (a value out of range is no advice and is left out, never an error)."""
    found: dict[str, int | float] = {}
    for name in RECOMMENDABLE_FIELDS:
        value = generation_config.get(name)
        field = _BY_NAME[name]
        # 1.0 for top_k from a float-only writer is still a whole number.
        if field.kind is int and isinstance(value, float) and value.is_integer():
            value = int(value)
        if field.kind is float and _is_int(value):
            value = float(value)
        if field.allows(value):
            found[name] = value
    return found


def read_recommended_sampling(folder: str | Path) -> dict[str, int | float]:
    """`recommended_sampling` of the model folder's generation_config.json;
    empty when the folder has none or it cannot be read (the defaults apply)."""
    # Imported here: engine.params stays free of the model-file readers for
    # code that only stores parameters.
    from engine.formats.model_json import ModelJSONError, read_json_object

    path = Path(folder) / GENERATION_CONFIG
    try:
        return recommended_sampling(read_json_object(path))
    except (OSError, ModelJSONError):
        return {}


def defaults_for(
    recommended: Mapping[str, int | float], base: SamplingParams | None = None
) -> tuple[SamplingParams, str]:
    """`base` (SamplingParams() when None) with the model's recommendation laid
    over it, and which of MODEL_RECOMMENDED / TANDEM_DEFAULTS that is."""
    base = base if base is not None else SamplingParams()
    chosen = {k: v for k, v in recommended.items() if k in RECOMMENDABLE_FIELDS}
    if not chosen:
        return base, TANDEM_DEFAULTS
    return replace(base, **chosen), MODEL_RECOMMENDED


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require(ok: bool, field: str, meaning: str, allowed: str, value: object) -> None:
    if not ok:
        raise InvalidSamplingParams(f"{field} ({meaning}) must be {allowed}, got {_shown(value)}")


def _shown(value: object) -> str:
    """A value as a message quotes it: a huge whole number by its size (its
    repr may not even exist past 4,300 digits), anything else cut short."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**40:
        return f"a number of {len(str(abs(value))) if value.bit_length() < 14000 else 'over 4,000'} digits"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
