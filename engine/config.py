"""EngineConfig: every engine option, declared once.

Each field carries its own declaration (`EngineOption` in the field's
metadata): what it does, how it is checked (choices, a minimum), its
command-line flag and metavar, and the help group the flag goes in. From that
one declaration come `Engine(...)`'s keyword arguments, the command line's
engine flags (engine.entrypoints.cli.options), `serve`'s flags (the same
parent parser), and the app's `Settings.engine_kwargs()`. Adding an option
means adding a field here (and a widget where the window offers it).

Nothing here imports torch: the command line builds its parser, and answers
argument errors, before the model's libraries load.
"""

from __future__ import annotations

import os
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields, replace
from functools import cache
from pathlib import Path
from typing import Any

from engine.errors import InvalidEngineConfig, MaxContextTooLargeError

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")
QUANTIZE_MODES = ("int8", "int4")
QUANTIZED_COMPUTE = ("auto", "kernel", "dequantize")
# What Engine(deterministic=None) means. Off: on the float paths batch
# invariance costs more than the 10% the project allows for a default
# (docs/benchmarks.md). Quantized models on the CPU are batch invariant
# either way (engine/kernels/native/quant_matmul.c).
DETERMINISTIC_DEFAULT = False
# Tokens one step may compute when max_batch_tokens is not set: a GPU is
# still far from saturated at 2048, a CPU's step time grows with every token.
DEFAULT_MAX_BATCH_TOKENS = {"cuda": 2048, "cpu": 512}

GROUP_MODEL = "model and device"
GROUP_KV = "KV cache"
GROUP_BATCH = "batching"


@dataclass(slots=True, frozen=True)
class EngineOption:
    """How one EngineConfig field is described, checked and offered as a flag."""

    help: str
    """What it does, as the command line's help says it (lower case, no final period)."""
    group: str
    """The command line's help group."""
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    minimum: int | None = None
    flag: str | None = None
    """The command-line flag; default: "--" + the name with dashes. A bool that
    defaults to on has a "--no-..." flag that turns it off."""
    default_text: str | Callable[[], str] | None = None
    """How help states the default when the value alone does not say it
    (None: "the engine's policy"); a callable is asked only when help is built."""

    def cli_flag(self, name: str) -> str:
        return self.flag or "--" + name.replace("_", "-")

    def describe_default(self, default: Any) -> str:
        text = self.default_text
        if callable(text):
            return text()
        if text is not None:
            return text
        if isinstance(default, bool):
            return "on" if default else "off"
        return str(default)


def _option(default: Any, **declaration: Any) -> Any:
    return field(default=default, metadata={"option": EngineOption(**declaration)})


def _deterministic_default() -> str:
    return "on" if DETERMINISTIC_DEFAULT else "off"


@dataclass(slots=True, frozen=True)
class EngineConfig:
    """What an Engine loads and how it runs it. Checked when made
    (InvalidEngineConfig); what only the model can tell (a max_context above
    its trained context) is checked when the engine loads it."""

    model: str | Path = _option(
        "default", group=GROUP_MODEL, metavar="PATH",
        help="a Hugging Face model folder (config.json, *.safetensors, tokenizer.json) of a family Tandem runs, "
        "a .gguf file (imported once), or 'default' for the bundled SmolLM2-135M-Instruct",
    )
    device: str = _option(
        "auto", group=GROUP_MODEL, choices=DEVICES,
        help="where the model runs; auto picks CUDA when PyTorch sees a GPU, else the CPU",
    )
    dtype: str = _option(
        "auto", group=GROUP_MODEL, choices=DTYPES,
        help="weight and activation type; auto is bfloat16 on CUDA and on CPUs with native "
        "bf16 (AVX512-BF16 or AMX), float32 elsewhere",
    )
    quantize: str | None = _option(
        None, group=GROUP_MODEL, choices=QUANTIZE_MODES, default_text="none, run as stored",
        help="keep a float checkpoint's weights quantized (8-bit or 4-bit groups, run by "
        "weight-only quantized kernels): less memory and faster one-sequence decoding; quantized "
        "once and cached; GGUF files keep their own quantization",
    )
    quantized: str = _option(
        "auto", group=GROUP_MODEL, choices=QUANTIZED_COMPUTE,
        help="how block-quantized weights (GGUF imports, --quantize) run: kernel keeps them "
        "quantized in memory, dequantize expands them to --dtype at load (what the GGUF file "
        "means exactly, at float memory and speed); auto runs the kernels where this machine "
        "has them",
    )
    max_context: int | None = _option(
        None, group=GROUP_MODEL, metavar="N", minimum=1,
        default_text="the model's trained context, max_position_embeddings",
        help="the most tokens a conversation (prompt and reply) may hold, at most the model's "
        "trained context; a smaller one sizes a smaller KV cache",
    )
    threads: int | None = _option(
        None, group=GROUP_MODEL, metavar="N", minimum=1,
        default_text="the engine's CPU thread policy, which measures as it runs whether all "
        "cores or one fewer is faster, so that a busy machine does not stall it",
        help="a fixed number of CPU threads for the model's math",
    )
    deterministic: bool | None = _option(
        None, group=GROUP_MODEL, default_text=_deterministic_default,
        help="reproducible replies on every path: a request's output does not depend on what "
        "else runs beside it in the batch, on chunking or on prefix-cache hits (batch-invariant "
        "kernels for float weights and the GPU, somewhat slower; quantized models on the CPU "
        "are batch invariant without it)",
    )
    kv_pages: int | None = _option(
        None, group=GROUP_KV, metavar="N", minimum=1,
        default_text="sized from the device's memory",
        help="KV-cache size in pages of --page-size tokens",
    )
    kv_cache_bytes: int | None = _option(
        None, group=GROUP_KV, metavar="N", minimum=1,
        default_text="the free GPU memory less a reserve on CUDA, 1 GiB on the CPU",
        help="KV-cache size in bytes, when --kv-pages is not given",
    )
    page_size: int = _option(
        16, group=GROUP_KV, metavar="N", minimum=1,
        help="tokens per KV-cache page; the prefix cache reuses whole pages",
    )
    enable_prefix_cache: bool = _option(
        True, group=GROUP_KV, flag="--no-prefix-cache",
        help="recompute every prompt in full instead of reusing cached prefixes",
    )
    max_batch_tokens: int | None = _option(
        None, group=GROUP_BATCH, metavar="N", minimum=1,
        default_text=", ".join(f"{n} on {d.upper() if d == 'cuda' else 'the ' + d.upper()}"
                               for d, n in DEFAULT_MAX_BATCH_TOKENS.items()),
        help="the most prompt and reply tokens one step computes across all requests",
    )
    max_running: int = _option(
        64, group=GROUP_BATCH, metavar="N", minimum=1,
        help="the most requests decoded together; more wait their turn",
    )

    def __post_init__(self) -> None:
        for name, option, _default in self.options():
            value = getattr(self, name)
            problem = _check(name, option, _kind(name), value)
            if problem is not None:
                raise InvalidEngineConfig(f"{name} must be {problem}, got {value!r}")

    @classmethod
    def options(cls) -> Iterator[tuple[str, EngineOption, Any]]:
        """(field name, declaration, default) for every option, in declaration order."""
        for f in fields(cls):
            yield f.name, f.metadata["option"], f.default

    @classmethod
    def option_kind(cls, name: str) -> type:
        """The option's value type without None: bool, int, or str (a model path is a str)."""
        return _kind(name)

    def replace(self, **changes: Any) -> EngineConfig:
        """A copy with `changes` (checked like a new config)."""
        return replace(self, **changes)

    def max_batch_tokens_for(self, device_type: str) -> int:
        if self.max_batch_tokens is not None:
            return self.max_batch_tokens
        return DEFAULT_MAX_BATCH_TOKENS.get(device_type, DEFAULT_MAX_BATCH_TOKENS["cpu"])

    def context_for(self, trained: int, model: str = "the model") -> int:
        """The context the engine uses for a model trained on `trained` tokens.
        Raises MaxContextTooLargeError when max_context asks for more."""
        if self.max_context is None:
            return trained
        if self.max_context > trained:
            raise MaxContextTooLargeError(self.max_context, trained, model)
        return self.max_context


@cache
def _kinds() -> dict[str, tuple[type, bool]]:
    """Each field's value type (bool, int or str) and whether None is allowed."""
    kinds: dict[str, tuple[type, bool]] = {}
    for name, hint in typing.get_type_hints(EngineConfig).items():
        args = typing.get_args(hint) or (hint,)
        kind = bool if bool in args else int if int in args else str
        kinds[name] = (kind, type(None) in args)
    return kinds


def _kind(name: str) -> type:
    return _kinds()[name][0]


def _check(name: str, option: EngineOption, kind: type, value: Any) -> str | None:
    """What `value` must be, in words, when it is not valid; None when it is."""
    optional = _kinds()[name][1]
    if kind is bool:
        ok, allowed = isinstance(value, bool), "True or False"
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool) and (
            option.minimum is None or value >= option.minimum
        )
        allowed = "a whole number" + (f" of at least {option.minimum}" if option.minimum is not None else "")
    elif option.choices is not None:
        ok, allowed = value in option.choices, "one of " + ", ".join(repr(c) for c in option.choices)
    else:  # the model: a name, folder or file
        ok = isinstance(value, (str, os.PathLike)) and str(value) != ""
        allowed = "a model name, folder or file"
    if optional:
        ok, allowed = ok or value is None, f"{allowed}, or None for the default"
    return None if ok else allowed
