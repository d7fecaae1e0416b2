"""The command line's shared options, each from the one place it is declared:
the engine flags from EngineConfig's field declarations (engine.config), the
sampling flags from SAMPLING_FIELDS (engine.params), plus what turns them
back into an EngineConfig and SamplingParams, and the engine's "too large"
messages in the words of these flags.

Every flag checks its value here, in the words of the command line (argparse
prefixes "argument --flag:"), before a model is loaded or torch imported.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from engine.config import EngineConfig, EngineOption
from engine.errors import EngineError, KVCacheTooSmallError, MaxContextTooLargeError, RequestTooLargeError
from engine.params import (
    RECOMMENDABLE_FIELDS,
    SAMPLING_FIELDS,
    SamplingField,
    SamplingParams,
    defaults_for,
)

_SAMPLING_DEFAULTS = SamplingParams()
# The letter each sampling flag's help refers to its value by.
_SAMPLING_METAVARS = {
    "temperature": "T", "top_p": "P", "top_k": "K", "min_p": "P",
    "repetition_penalty": "X", "max_tokens": "N",
}


def paragraphs(*texts: str) -> str:
    # The raw formatter keeps the examples' layout, so prose is wrapped here.
    return "\n\n".join(textwrap.fill(t, 79) for t in texts)


# -- option types: each says what is wrong in the words of its flag ---------------


def integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None


def number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def int_at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = integer(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    return parse


def in_range(spec: SamplingField) -> Callable[[str], int | float]:
    """A value of `spec`'s kind in `spec`'s range, or the range in words."""

    def parse(text: str) -> int | float:
        value = integer(text) if spec.kind is int else number(text)
        if not spec.allows(value):
            raise argparse.ArgumentTypeError(f"must be {spec.range_text()}, got {text}")
        return value

    return parse


def text_value(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def _as_flag_help(sentence: str) -> str:
    # A form's sentence ("Most tokens a reply may have.") as a flag's help,
    # which argparse %-formats.
    sentence = sentence.rstrip(".")
    return (sentence[:1].lower() + sentence[1:]).replace("%", "%%")


# -- engine options: one flag per EngineConfig field ---------------------------------


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    """Every EngineConfig field as a flag, in its declared help group. A flag
    left out is absent from `engine_kwargs(args)`: the engine's default."""
    groups: dict[str, Any] = {}
    for name, option, default in EngineConfig.options():
        group = groups.get(option.group)
        if group is None:
            group = groups[option.group] = parser.add_argument_group(option.group)
        _add_engine_flag(group, name, option, default)


def _add_engine_flag(group: Any, name: str, option: EngineOption, default: Any) -> None:
    flag = option.cli_flag(name)
    help_text = option.help.replace("%", "%%")  # written as a flag's help already
    kind = EngineConfig.option_kind(name)
    if kind is bool:
        if default is True:  # a "--no-..." flag turns it off; on needs no flag
            group.add_argument(flag, dest=name, action="store_const", const=False, default=None,
                               help=help_text)
        else:
            group.add_argument(
                flag, dest=name, action=argparse.BooleanOptionalAction, default=None,
                help=f"{help_text} (default: {option.describe_default(default)})",
            )
        return
    kwargs: dict[str, Any] = {"dest": name, "default": default}
    if default is None:
        kwargs["help"] = f"{help_text} (default: {option.describe_default(default)})"
    else:
        kwargs["help"] = f"{help_text} (default: %(default)s)"
    if option.choices is not None:
        kwargs["choices"] = list(option.choices)
    else:
        kwargs["metavar"] = option.metavar
    if kind is int:
        kwargs["type"] = int_at_least(option.minimum) if option.minimum is not None else integer
    group.add_argument(flag, **kwargs)


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The engine options the command line gave (checked by EngineConfig);
    those left out are absent, so the engine's own defaults apply."""
    given: dict[str, Any] = {}
    for name, _option, default in EngineConfig.options():
        value = getattr(args, name, None)
        if value is not None and value != default:
            given[name] = value
    EngineConfig(**given)  # InvalidEngineConfig before anything loads
    return given


def engine_config(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(**engine_kwargs(args))


def max_context_in_flags(exc: MaxContextTooLargeError) -> str:
    return (
        f"--max-context {exc.requested} is more than {exc.model}'s trained context of "
        f"{exc.trained} tokens; give at most {exc.trained}, or leave --max-context out "
        "for the whole trained context"
    )


# -- sampling options: one flag per SAMPLING_FIELDS entry, plus seed and stop ----------


def add_sampling_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("sampling")
    for spec in sorted(SAMPLING_FIELDS, key=lambda s: s.name != "max_tokens"):
        default = getattr(_SAMPLING_DEFAULTS, spec.name)
        # Left out, a field a model may recommend takes the model's value
        # (its generation_config.json), else Tandem's default: None marks it left out.
        recommendable = spec.name in RECOMMENDABLE_FIELDS
        shown = f"the model's recommendation, else {default:g}" if recommendable else "%(default)s"
        g.add_argument(
            "--" + spec.name.replace("_", "-"), type=in_range(spec),
            default=None if recommendable else default, metavar=_SAMPLING_METAVARS[spec.name],
            help=f"{_as_flag_help(spec.help)} (default: {shown})",
        )
    g.add_argument(
        "--seed", type=integer, default=None, metavar="N",
        help="the same seed, prompt and settings give the same reply (default: a random seed)",
    )
    g.add_argument(
        "--stop", action="append", type=text_value, default=[], metavar="TEXT",
        help="end the reply where TEXT appears, TEXT left out (repeatable; "
        "the model's own end-of-turn token always stops it)",
    )


def sampling_params(
    args: argparse.Namespace, recommended: Mapping[str, int | float] | None = None
) -> SamplingParams:
    """The flags given, over the model's `recommended` settings (Engine.recommended_sampling),
    over Tandem's defaults."""
    return _sampling(args, recommended)[0]


def sampling_source(args: argparse.Namespace, recommended: Mapping[str, int | float] | None) -> str:
    """Where the settings the flags left out came from, for a line on stderr:
    MODEL_RECOMMENDED or TANDEM_DEFAULTS, "" when every such flag was given."""
    return _sampling(args, recommended)[1]


def _sampling(
    args: argparse.Namespace, recommended: Mapping[str, int | float] | None
) -> tuple[SamplingParams, str]:
    given = {spec.name: getattr(args, spec.name) for spec in SAMPLING_FIELDS}
    given = {name: value for name, value in given.items() if value is not None}
    left = {k: v for k, v in (recommended or {}).items() if k not in given}
    base, source = defaults_for(left)
    if all(name in given for name in RECOMMENDABLE_FIELDS):
        source = ""
    return replace(base, **given, seed=args.seed, stop=tuple(args.stop)), source


# -- statistics, and errors in the words of the flags -----------------------------------


def add_stats_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--stats", action="store_true",
        help="at the end, print decode tokens/s, time to first token and KV-cache use "
        "to stderr as one JSON object",
    )


def print_stats(engine: Any) -> None:
    stats = engine.stats()
    summary = {
        "device": engine.device.type,
        "dtype": str(engine.dtype).removeprefix("torch."),
        "decode_tok_s": round(stats.decode_tokens_per_s, 1),
        "ttft_s": [round(t, 4) for t in stats.recent_ttft_s],
        "prompt_tokens_computed": stats.prompt_tokens_computed,
        "prompt_tokens_reused": stats.prompt_tokens_reused,
        "pages_used": stats.pages_used,
        "pages_cached": stats.pages_cached,
        "pages_free": stats.pages_free,
        "preemptions": stats.preemptions,
    }
    print(json.dumps(summary), file=sys.stderr)


def too_large_in_flags(exc: RequestTooLargeError, args: argparse.Namespace) -> str:
    """The engine's "too large" message, with the flags that move the limit it hit."""
    config = engine_config(args)
    if isinstance(exc, KVCacheTooSmallError):
        if config.kv_pages is None:
            return str(exc)
        return (
            f"{exc} (--kv-pages {config.kv_pages} holds {config.kv_pages * config.page_size} "
            "tokens: raise --kv-pages, lower --max-tokens, or leave --kv-pages out to size "
            "the cache from memory)"
        )
    if config.max_context is not None:
        return (
            f"{exc} (--max-context {config.max_context} caps the context: raise it, up to the "
            f"model's trained context, or lower --max-tokens, which is {args.max_tokens})"
        )
    return f"{exc} (--max-tokens is {args.max_tokens})"


def request_error(exc: EngineError, args: argparse.Namespace) -> str:
    """An engine error from running a request, in the words of the flags where they can help."""
    if isinstance(exc, RequestTooLargeError):
        return too_large_in_flags(exc, args)
    return str(exc)
