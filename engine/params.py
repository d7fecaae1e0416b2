"""What a request asks of sampling: SamplingParams, checked when made.

Kept apart from engine.model.sampler (the tensor work) so that code which only
stores or shows parameters (the chat store, `tandem chats`) never imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.errors import EngineError

# Sampling this cold is greedy in effect, and dividing by a temperature near 0 overflows float32.
_MIN_TEMPERATURE = 1e-5


class InvalidSamplingParams(EngineError, ValueError):
    """A sampling parameter is outside its allowed range."""


@dataclass(slots=True, frozen=True)
class SamplingParams:
    max_tokens: int = 512
    temperature: float = 0.7
    """0 (or anything below 1e-5) samples greedily."""
    top_k: int = 0
    """0 turns top-k off."""
    top_p: float = 1.0
    """1 turns top-p off."""
    min_p: float = 0.0
    """0 turns min-p off; else drop tokens with probability below min_p times the top one's."""
    repetition_penalty: float = 1.0
    """1 turns it off. As in HF: for every token in prompt or output, a logit > 0 is divided
    by it, a logit < 0 multiplied by it."""
    seed: int | None = None
    """Same seed, prompt and device type give the same output; None draws a random seed."""
    stop: tuple[str, ...] = ()
    """Stop strings; the detokenizer acts on them."""
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        # Each message names the field (a program sets it) and says what it does
        # and what it accepts (a person reads it).
        _require(
            _is_int(self.max_tokens) and self.max_tokens >= 1,
            "max_tokens", "the reply length limit", "at least 1 (a whole number)", self.max_tokens,
        )
        _require(
            _is_number(self.temperature) and math.isfinite(self.temperature)
            and self.temperature >= 0,
            "temperature", "the sampling randomness",
            "at least 0 and finite (0 always picks the most likely token)",
            self.temperature,
        )
        _require(
            _is_int(self.top_k) and self.top_k >= 0,
            "top_k", "how many of the most likely tokens to sample from",
            "at least 0 (a whole number; 0 turns it off)", self.top_k,
        )
        _require(
            _is_number(self.top_p) and 0 < self.top_p <= 1,
            "top_p", "the probability mass of the most likely tokens to sample from",
            "above 0 and at most 1 (1 turns it off)", self.top_p,
        )
        _require(
            _is_number(self.min_p) and 0 <= self.min_p < 1,
            "min_p", "the least probability kept, as a fraction of the top token's",
            "at least 0 and below 1 (0 turns it off)", self.min_p,
        )
        _require(
            _is_number(self.repetition_penalty) and math.isfinite(self.repetition_penalty)
            and self.repetition_penalty > 0,
            "repetition_penalty", "how strongly repeated tokens are discouraged",
            "above 0 and finite (1 turns it off)", self.repetition_penalty,
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

    @property
    def greedy(self) -> bool:
        return self.temperature < _MIN_TEMPERATURE


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    # NaN fails every range comparison, so the range checks reject it too.
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _require(ok: bool, field: str, meaning: str, allowed: str, value: object) -> None:
    if not ok:
        raise InvalidSamplingParams(f"{field} ({meaning}) must be {allowed}, got {value!r}")
