"""The sandbox chat templates render in: Jinja2's immutable sandbox, bounded.

A chat template comes with a downloaded model, so it is untrusted code. Jinja's
sandbox stops it from reaching Python's internals, but not from looping
10^10 times or building a 3 GB string. Here every render runs under limits:

- work: every loop iteration and every call (macros included) is a step,
  and a render may take MAX_STEPS of them and MAX_SECONDS of wall time;
- size: the rendered text, and every value built on the way (`*`, `+`, `~`,
  `%`, filters, methods), is at most `max_chars` characters or items, and a
  step that would exceed it is refused *before* it allocates (repetition,
  concatenation, padding widths); an integer at most MAX_INT_BITS bits;
- `range` holds at most MAX_RANGE items.

Exceeding a limit raises TemplateLimitError; engine.model.tokenizer turns it
into a TokenizerError naming the model. Loops and `~` are bounded by
rewriting the parsed template: each `for` iterates through
`environment.bounded_iter`, each `~` goes through `environment.bounded_concat`
(environment attributes, which a template cannot shadow).
"""

from __future__ import annotations

import contextvars
import functools
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import jinja2.nodes as nodes
from jinja2.visitor import NodeTransformer
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Loop iterations and calls one render may make: a template walks its
# messages a few times (a long conversation: thousands of steps).
MAX_STEPS = 2_000_000
# A call (a macro above all) costs this many steps: it is several times the
# work of a loop iteration.
CALL_STEPS = 8
MAX_SECONDS = 10.0
MAX_RANGE = 100_000
MAX_INT_BITS = 1 << 16
# Output allowed whatever the conversation, and per character of it.
BASE_CHARS = 1_000_000
CHARS_PER_INPUT_CHAR = 4

_SIZED = (str, list, tuple, dict, bytes)
# A number of 7 digits or more in a format string: a padding width or precision.
_WIDTH = re.compile(r"\d{7,}")


class TemplateLimitError(Exception):
    """A render went past a limit; the message completes "The chat template of X ..."."""


@dataclass(slots=True)
class _Budget:
    max_chars: int
    steps_left: int
    deadline: float

    def step(self, count: int = 1) -> None:
        self.steps_left -= count
        if self.steps_left < 0:
            raise TemplateLimitError(f"loops too long (more than {MAX_STEPS:,} steps)")
        if self.steps_left % 4096 < count and time.monotonic() > self.deadline:
            raise TemplateLimitError(f"takes longer than {MAX_SECONDS:g} seconds to render")


_CURRENT: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("template_budget", default=None)


def _budget() -> _Budget:
    # Outside a render (Jinja folds constant expressions while compiling) the default limits hold.
    return _CURRENT.get() or _Budget(BASE_CHARS, MAX_STEPS, time.monotonic() + MAX_SECONDS)


def render_limits(input_chars: int) -> int:
    """The most characters a render of a conversation of `input_chars` may produce."""
    return BASE_CHARS + CHARS_PER_INPUT_CHAR * input_chars


def render_bounded(template: Any, max_chars: int, variables: Mapping[str, Any]) -> str:
    """Render `template` (compiled by BoundedSandbox) under the limits; raises TemplateLimitError."""
    budget = _Budget(max_chars, MAX_STEPS, time.monotonic() + MAX_SECONDS)
    token = _CURRENT.set(budget)
    try:
        parts: list[str] = []
        total = 0
        for chunk in template.generate(**variables):
            total += len(chunk)
            if total > max_chars:
                raise TemplateLimitError(f"renders more than {max_chars:,} characters")
            parts.append(chunk)
        return "".join(parts)
    finally:
        _CURRENT.reset(token)


def _deep_len(value: Any, limit: int) -> int:
    """Characters and items in `value`, nested lists and dicts included (what
    `str(value)` at least spells out); stops counting past `limit`."""
    total, stack = 0, [value]
    while stack and total <= limit:
        item = stack.pop()
        if isinstance(item, (str, bytes)):
            total += len(item)
        elif isinstance(item, (list, tuple)):
            total += len(item)
            stack.extend(item)
        elif isinstance(item, dict):
            total += len(item)
            stack.extend(item.keys())
            stack.extend(item.values())
        else:
            total += 1
    return total


def _check_size(value: Any, what: str) -> Any:
    if isinstance(value, _SIZED) and len(value) > _budget().max_chars:
        raise TemplateLimitError(f"builds a value of more than {_budget().max_chars:,} characters or items ({what})")
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_INT_BITS:
        raise TemplateLimitError(f"builds a number of more than {MAX_INT_BITS:,} bits ({what})")
    return value


def _refuse_growth(size: int, what: str) -> None:
    if size > _budget().max_chars:
        raise TemplateLimitError(f"builds a value of more than {_budget().max_chars:,} characters or items ({what})")


def _check_widths(text: Any, what: str) -> None:
    if isinstance(text, str):
        for digits in _WIDTH.findall(text):
            _refuse_growth(int(digits), what)


# Filters and str methods whose whole-number arguments are sizes of what they build.
_SIZE_FILTERS = frozenset({"center", "indent", "slice", "wordwrap"})
_SIZE_METHODS = frozenset({"center", "ljust", "rjust", "zfill", "expandtabs"})


def _check_arguments(args: Iterable[Any], kwargs: Mapping[str, Any], what: str) -> None:
    """Refuse a size argument (a width, a count of slices) beyond the limit before the call."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool):
            _refuse_growth(abs(value), what)


def _check_binop(operator: str, left: Any, right: Any) -> None:
    what = f"'{operator}'"
    limit = _budget().max_chars
    if operator == "*":
        for sequence, times in ((left, right), (right, left)):
            if isinstance(sequence, _SIZED) and isinstance(times, int) and times > 0:
                # [big] * 1000 is a thousand references, but prints as a thousand copies.
                _refuse_growth(_deep_len(sequence, limit) * times, what)
        if isinstance(left, int) and isinstance(right, int) and left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise TemplateLimitError(f"builds a number of more than {MAX_INT_BITS:,} bits ({what})")
    elif operator == "**":
        if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
            if right * left.bit_length() > MAX_INT_BITS:
                raise TemplateLimitError(f"builds a number of more than {MAX_INT_BITS:,} bits ({what})")
    elif operator == "+":
        if isinstance(left, _SIZED) and isinstance(right, _SIZED):
            _refuse_growth(_deep_len(left, limit) + _deep_len(right, limit), what)
    elif operator == "%":
        _check_format(left, right if isinstance(right, (tuple, dict)) else (right,), what)


def _check_format(template: Any, args: Iterable[Any], what: str) -> None:
    """printf- and str.format-style formatting: each field may insert the
    biggest argument once, and a width pads to its number."""
    if not isinstance(template, str):
        return
    _check_widths(template, what)
    values = list(args.values()) if isinstance(args, dict) else list(args)
    limit = _budget().max_chars
    biggest = max((_deep_len(value, limit) for value in values), default=0)
    fields = template.count("%") + template.count("{")
    _refuse_growth(len(template) + fields * biggest, what)


def _check_replace(text: Any, args: tuple[Any, ...], what: str) -> None:
    if isinstance(text, str) and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        old, new = args[0], args[1]
        hits = len(text) + 1 if not old else text.count(old)
        _refuse_growth(len(text) + hits * max(len(new) - len(old), 0), what)


def _bounded_range(*args: int) -> range:
    numbers = range(*args)
    if len(numbers) > MAX_RANGE:
        raise TemplateLimitError(f"asks for a range of {len(numbers):,} numbers (at most {MAX_RANGE:,})")
    return numbers


def _bounded_filter(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    # functools.wraps keeps `jinja_pass_arg`, so context-passing filters still get their context.
    # The filtered value's position: after the context or environment a filter asks for.
    first = 1 if hasattr(function, "jinja_pass_arg") else 0

    @functools.wraps(function)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        what = f"the filter {name}"
        value, rest = (args[first], args[first + 1 :]) if len(args) > first else (None, ())
        if name in _SIZE_FILTERS:
            _check_arguments(rest, kwargs, what)
        if name == "indent" and isinstance(value, str):
            width = rest[0] if rest else kwargs.get("width", 4)
            width_chars = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
            _refuse_growth(len(value) + width_chars * (value.count("\n") + 1), what)
        elif name == "format":
            _check_format(value, (*rest, *kwargs.values()), what)
        elif name == "replace":
            _check_replace(value, rest, what)
        elif name == "join" and isinstance(value, Iterable) and not isinstance(value, str):
            items = list(value)
            _refuse_growth(sum(_deep_len(item, _budget().max_chars) for item in items), what)
            args = (*args[:first], items, *rest)
        return _check_size(function(*args, **kwargs), what)

    return bounded


class _BoundLoops(NodeTransformer):
    """Routes every loop's items and every `~` through the environment's bounded helpers."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = _helper_call("bounded_iter", [node.iter], node.lineno)
        return node

    def visit_Call(self, node: nodes.Call) -> nodes.Node:
        self.generic_visit(node)
        # `loop(children)` in a recursive loop iterates `children` without the For's own iter.
        if isinstance(node.node, nodes.Name) and node.node.name == "loop" and node.args:
            node.args[0] = _helper_call("bounded_iter", [node.args[0]], node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return _helper_call("bounded_concat", [nodes.List(node.nodes, lineno=node.lineno)], node.lineno)


def _helper_call(name: str, args: list[nodes.Expr], lineno: int) -> nodes.Call:
    return nodes.Call(nodes.EnvironmentAttribute(name, lineno=lineno), args, [], None, None, lineno=lineno)


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox with the limits of this module."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.globals["range"] = _bounded_range

    def bound_filters(self) -> None:
        """Wrap every filter (call after adding the caller's own)."""
        self.filters = {name: _bounded_filter(name, function) for name, function in self.filters.items()}

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        return _BoundLoops().visit(super()._parse(source, name, filename))

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        _check_binop(operator, left, right)
        return _check_size(super().call_binop(context, operator, left, right), f"'{operator}'")

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        _budget().step(CALL_STEPS)
        name = getattr(__obj, "__name__", type(__obj).__name__)
        what = f"a call of {name}"
        method = getattr(__obj, "__wrapped__", __obj)  # the sandbox wraps str.format
        text = getattr(method, "__self__", None)
        if isinstance(text, str):
            if name in _SIZE_METHODS:
                _check_arguments(args, kwargs, what)
            elif name in ("format", "format_map"):
                _check_format(text, (*args, *kwargs.values()), what)
            elif name == "replace":
                _check_replace(text, args, what)
            elif name == "join" and args and not isinstance(args[0], str):
                items = list(args[0])
                _refuse_growth(sum(_deep_len(item, _budget().max_chars) for item in items), what)
                args = (items, *args[1:])
        return _check_size(super().call(__context, __obj, *args, **kwargs), what)

    @staticmethod
    def bounded_iter(items: Any) -> Iterator[Any]:
        budget = _budget()
        for item in items:
            budget.step()
            yield item

    @staticmethod
    def bounded_concat(parts: list[Any]) -> str:
        _refuse_growth(sum(_deep_len(part, _budget().max_chars) for part in parts), "'~'")
        return "".join(str(part) for part in parts)
