"""The sandbox chat templates render in: Jinja2's immutable sandbox, bounded.

A chat template comes with a downloaded model, so it is untrusted code. Jinja's
sandbox keeps it from Python's internals, not from looping 10^10 times or
keeping a thousand 4 MB strings alive. Here every render runs under limits:

- time: MAX_SECONDS, the clock read at every loop iteration, call, filter and
  test; no single step runs long (a filter that runs Python code per item or
  word gets at most MAX_FILTER_ITEMS items or MAX_FILTER_CHARS characters);
- work: MAX_STEPS loop iterations and calls; an iteration whose output goes to
  a buffer (a macro's, a `{% set %}` block's) costs a step per piece it adds;
- size: every value built, or handed to a filter, call, operator or the output,
  prints as at most `max_chars` characters, counted through nested lists,
  dicts and namespaces (`[x] * 1000` counts x a thousand times), refused
  *before* it is allocated where its size can be foreseen (repetition, joins,
  padding, tab sizes, JSON indents); integers have at most MAX_INT_BITS bits;
- memory: all a render builds, even what it drops, adds up to at most
  BUILT_BYTES_PER_CHAR bytes per character of `max_chars`;
- `range` holds at most MAX_RANGE items, `lipsum` at most MAX_FILTER_ITEMS words.

Exceeding a limit raises TemplateLimitError; engine.model.tokenizer turns it
into a TokenizerError naming the model. Loops, `~` and list, tuple and dict
literals are rewritten to go through the environment's `bounded_*` methods
(which a template cannot shadow); Jinja's buffers are joined by `concat`, and
every output goes through `finalize`.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import io
import itertools
import math
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sized
from dataclasses import dataclass, field
from typing import Any

import jinja2.nodes as nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.runtime import Context, Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace, generate_lorem_ipsum
from jinja2.visitor import NodeTransformer

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
# Bytes a render may allocate in all, per character of output allowed: 32 MB
# for a short conversation. A template copies each message a few times; this
# leaves room for dozens of copies, or for gathering messages one by one.
BUILT_BYTES_PER_CHAR = 32
# What one filter call that runs Python code per item, or per word, may be
# given: at these sizes the slowest of them (urlize, pprint, sort) take a
# fraction of a second, which bounds how far a render overruns its deadline.
MAX_FILTER_ITEMS = 100_000
MAX_FILTER_CHARS = 200_000
# How many items a measurement walks between two looks at the clock.
_CLOCK_EVERY = 4096
# A container this big is measured once (smaller ones cost less to walk again than to remember).
_MEMO_ITEMS = 64

_TEXT = (str, bytes)
_VIEWS = (type({}.keys()), type({}.values()), type({}.items()))
_CONTAINERS = (list, tuple, dict, set, frozenset, *_VIEWS)
# What prints its members: measured through them.
_MEASURED = (*_CONTAINERS, Namespace)
# What a namespace prints around its attributes: `<Namespace {...}>`.
_NAMESPACE_CHARS = 14
# A number of 7 digits or more in a format string: a padding width or precision.
_WIDTH = re.compile(r"\d{7,}")
# A replacement field inside another's format spec, `{:{}}`: a width taken from an argument.
_NESTED_FIELD = re.compile(r"\{[^{}]*\{")


class TemplateLimitError(Exception):
    """A render went past a limit; the message completes "The chat template of X ..."."""


@dataclass(slots=True)
class _Budget:
    max_chars: int
    max_built: int
    steps_left: int
    deadline: float
    built: int = 0
    # Printed size and item count of containers measured, by id, with the container (so
    # the id is not reused): one the render was given or counted in `built`.
    sizes: dict[int, tuple[Any, int, int]] = field(default_factory=dict)

    def step(self, count: int = 1) -> None:
        self.steps_left -= count
        if self.steps_left < 0:
            raise TemplateLimitError(f"loops too long (more than {MAX_STEPS:,} steps)")
        self.check_time()

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateLimitError(f"takes longer than {MAX_SECONDS:g} seconds to render")

    def charge(self, size: int, what: str) -> None:
        self.built += size
        if self.built > self.max_built:
            raise TemplateLimitError(f"allocates more than {self.max_built / 1e6:,.0f} MB in all ({what})")


_CURRENT: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("template_budget", default=None)


def _new_budget(max_chars: int) -> _Budget:
    return _Budget(max_chars, BUILT_BYTES_PER_CHAR * max_chars, MAX_STEPS, time.monotonic() + MAX_SECONDS)


def _budget() -> _Budget:
    # Outside a render (a template used without render_bounded) the default limits hold.
    return _CURRENT.get() or _new_budget(BASE_CHARS)


def render_limits(input_chars: int) -> int:
    """The most characters a render of a conversation of `input_chars` may produce."""
    return BASE_CHARS + CHARS_PER_INPUT_CHAR * input_chars


def render_bounded(template: Any, max_chars: int, variables: Mapping[str, Any]) -> str:
    """Render `template` (compiled by BoundedSandbox) under the limits; raises TemplateLimitError."""
    token = _CURRENT.set(_new_budget(max_chars))
    try:
        # A StringIO rather than a list of chunks: a million empty chunks cost nothing.
        out, total = io.StringIO(), 0
        for chunk in template.generate(**variables):
            total += len(chunk)
            if total > max_chars:
                raise TemplateLimitError(f"renders more than {max_chars:,} characters")
            out.write(chunk)
        return out.getvalue()
    finally:
        _CURRENT.reset(token)


# Measuring what a value prints as, and what it cost


def _scalar_chars(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value.bit_length() * 31 // 100 + 2  # its digits and a sign
    # Undefined prints nothing, an object's repr a few dozen characters.
    return 24 if isinstance(value, float) else 5 if value is None or isinstance(value, bool) else 8


def _measure(value: Any, budget: _Budget | None = None) -> tuple[int, int]:
    """(characters, items): what `str(value)` at least spells out, nested lists,
    dicts and namespaces included, and how many objects that walks; stops
    counting past the render's `max_chars`."""
    if isinstance(value, _TEXT):
        return len(value), 1
    if not isinstance(value, _MEASURED):
        return _scalar_chars(value), 1
    budget = budget or _budget()
    known = budget.sizes.get(id(value))
    if known is not None and known[0] is value:
        return known[1], known[2]
    limit, chars, items, volatile, stack = budget.max_chars, 0, 0, False, [value]
    while stack and chars <= limit:
        item = stack.pop()
        items += 1
        if not items % _CLOCK_EVERY:
            budget.check_time()
        kind = type(item)
        if kind is str:
            chars += len(item)
            continue
        if kind is Namespace:
            # A namespace changes after it is measured: what holds one is measured afresh each time.
            volatile = True
            chars += _NAMESPACE_CHARS
            item = object.__getattribute__(item, "_Namespace__attrs")
        elif isinstance(item, _TEXT):
            chars += len(item)
            continue
        elif not isinstance(item, _CONTAINERS):
            chars += _scalar_chars(item)
            continue
        known = budget.sizes.get(id(item))
        if known is not None and known[0] is item:
            chars, items = chars + known[1], items + known[2] - 1
            continue
        chars += len(item)
        if chars > limit:
            break
        stack.extend(itertools.chain(item.keys(), item.values()) if isinstance(item, dict) else item)
    if not volatile and chars <= limit and items >= _MEMO_ITEMS:
        budget.sizes[id(value)] = (value, chars, items)
    return chars, items


def _depth(value: Any) -> int:
    """How deeply `value`'s containers nest (it has at most MAX_FILTER_ITEMS items)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Namespace):
            item = object.__getattribute__(item, "_Namespace__attrs")
        if isinstance(item, _CONTAINERS):
            deepest = max(deepest, depth + 1)
            members = item.values() if isinstance(item, dict) else item
            stack.extend((member, depth + 1) for member in members if isinstance(member, _MEASURED))
    return deepest


def _total_chars(values: Iterable[Any]) -> int:
    budget, total, count = _budget(), 0, 0
    for value in values:
        total += len(value) if type(value) is str else _measure(value, budget)[0]
        count += 1
        if not count % _CLOCK_EVERY:
            budget.check_time()
    return total


def _refuse_growth(size: int, what: str, budget: _Budget | None = None) -> None:
    limit = (budget or _budget()).max_chars
    if size > limit:
        raise TemplateLimitError(f"builds a value of more than {limit:,} characters or items ({what})")


def _check_value(value: Any, what: str, budget: _Budget | None = None) -> Any:
    """Refuse a value that prints as more than the render's limit, or a number too long."""
    if isinstance(value, _TEXT):
        _refuse_growth(len(value), what, budget)
    elif isinstance(value, _MEASURED):
        _refuse_growth(_measure(value, budget)[0], what, budget)
    elif isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_INT_BITS:
        raise TemplateLimitError(f"builds a number of more than {MAX_INT_BITS:,} bits ({what})")
    return value


def _check_given(values: Iterable[Any], what: str, budget: _Budget | None = None) -> None:
    """Refuse an argument that prints as more than the limit: an input, or a
    container holding a namespace that grew (whatever else was checked when built)."""
    for value in values:
        if isinstance(value, _MEASURED):
            _refuse_growth(_measure(value, budget)[0], what, budget)


def _charge(value: Any, inputs: Iterable[Any], what: str, members: bool = False, budget: _Budget | None = None) -> None:
    """Count the memory of a value an operation returned, unless it is one of its inputs;
    `members`: and what a returned container alone holds (what `split` or `batch` made)."""
    for given in inputs:
        if value is given:
            return
    budget, size = budget or _budget(), sys.getsizeof(value, 64)
    if members and isinstance(value, (list, tuple, set, frozenset, dict)):
        contents = itertools.chain(value.keys(), value.values()) if isinstance(value, dict) else value
        count = 0
        for member in contents:
            # Held only by the container, `member` and getrefcount's argument: made by
            # this operation, not a value it sorted or picked out (CPython's counts).
            if sys.getrefcount(member) <= 3:
                size += sys.getsizeof(member, 64)
            count += 1
            if not count % _CLOCK_EVERY:
                budget.check_time()
    budget.charge(size, what)


# Checks before an operation allocates


# Filters and str methods whose whole-number arguments are sizes of what they build.
_SIZE_FILTERS = frozenset({"batch", "center", "indent", "wordwrap"})
_SIZE_METHODS = frozenset({"center", "ljust", "rjust", "zfill"})
_CHECKED_METHODS = _SIZE_METHODS | {"expandtabs", "format", "format_map", "join", "replace", "to_bytes", "translate"}
# Keyword arguments Jinja adds to calls inside loops and blocks.
_JINJA_KWARGS = frozenset({"_loop_vars", "_block_vars"})
# Filters that run Python code for each item of what they are given, or each word.
_ITEM_FILTERS = frozenset({
    "batch", "dictsort", "groupby", "items", "map", "max", "min", "reject", "rejectattr", "select",
    "selectattr", "slice", "sort", "sum", "unique", "xmlattr",
})
_TREE_FILTERS = frozenset({"pprint", "tojson"})
_WORD_FILTERS = frozenset({"title", "urlencode", "urlize", "wordwrap"})
_CHECKED_FILTERS = _SIZE_FILTERS | _ITEM_FILTERS | _TREE_FILTERS | _WORD_FILTERS | {"format", "join", "replace"}


def _check_arguments(args: Iterable[Any], kwargs: Mapping[str, Any], what: str) -> None:
    """Refuse a size argument (a width, a count of slices) beyond the limit before the call."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool):
            _refuse_growth(abs(value), what)


def _check_binop(operator: str, left: Any, right: Any) -> None:
    what = f"'{operator}'"
    if operator == "*":
        for sequence, times in ((left, right), (right, left)):
            if isinstance(sequence, (str, bytes, list, tuple)) and isinstance(times, int) and times > 0:
                # [big] * 1000 is a thousand references, but prints as a thousand copies.
                _refuse_growth(_measure(sequence)[0] * times, what)
        if isinstance(left, int) and isinstance(right, int) and left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise TemplateLimitError(f"builds a number of more than {MAX_INT_BITS:,} bits ({what})")
    elif operator == "**":
        if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
            if right * left.bit_length() > MAX_INT_BITS:
                raise TemplateLimitError(f"builds a number of more than {MAX_INT_BITS:,} bits ({what})")
    elif operator == "+":
        if isinstance(left, (*_CONTAINERS, str, bytes)) and isinstance(right, (*_CONTAINERS, str, bytes)):
            _refuse_growth(_measure(left)[0] + _measure(right)[0], what)
    elif operator == "%":
        _check_format(left, right if isinstance(right, (tuple, dict)) else (right,), what)


def _check_format(template: Any, args: Iterable[Any], what: str) -> None:
    """printf- and str.format-style formatting: each field may insert the
    biggest argument once, and a width pads to its number."""
    if isinstance(template, bytes):
        template = template.decode("latin-1")
    if not isinstance(template, str):
        return
    for digits in _WIDTH.findall(template):
        _refuse_growth(int(digits), what)
    values = list(args.values()) if isinstance(args, dict) else list(args)
    if "*" in template or _NESTED_FIELD.search(template):  # `%*s`, `{:{}}`: widths from the arguments
        _check_arguments(values, {}, what)
    biggest = max((_measure(value)[0] for value in values), default=0)
    fields = template.count("%") + template.count("{")
    _refuse_growth(len(template) + fields * biggest, what)


def _check_replace(text: Any, args: tuple[Any, ...], what: str) -> None:
    if isinstance(text, (str, bytes)) and len(args) >= 2 and all(type(arg) is type(text) for arg in args[:2]):
        old, new = args[0], args[1]
        hits = len(text) + 1 if not old else text.count(old)
        _refuse_growth(len(text) + hits * max(len(new) - len(old), 0), what)


def _check_join(separator: Any, values: Any, what: str) -> list[Any]:
    """The items of a join, refused when they and the separators between them are too long."""
    items = list(values)
    _refuse_growth(_total_chars(items) + _measure(separator)[0] * max(len(items) - 1, 0), what)
    return items


def _check_text_method(
    text: str | bytes, name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any], what: str
) -> tuple[Any, ...]:
    """Refuse a str or bytes method call whose result would exceed the limit; returns
    the arguments to call it with (a join's items, gathered once)."""
    if name in _SIZE_METHODS:
        _check_arguments(args, kwargs, what)
    elif name == "format" and isinstance(text, str):
        _check_format(text, (*args, *kwargs.values()), what)
    elif name == "format_map" and isinstance(text, str) and args and isinstance(args[0], Mapping):
        _check_format(text, tuple(args[0].values()), what)
    elif name == "replace":
        _check_replace(text, args, what)
    elif name == "join" and args:
        args = (_check_join(text, args[0], what), *args[1:])
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(size, int):
            tabs = text.count("\t" if isinstance(text, str) else b"\t")
            _refuse_growth(len(text) + tabs * max(size, 0), what)
    elif name == "translate" and isinstance(text, str) and args:
        table = args[0]
        replacements = table.values() if isinstance(table, dict) else table if isinstance(table, (list, tuple)) else ()
        longest = max((len(value) for value in replacements if isinstance(value, str)), default=1)
        _refuse_growth(len(text) * longest, what)
    return args


def _bounded_range(*args: int) -> range:
    numbers = range(*args)
    if len(numbers) > MAX_RANGE:
        raise TemplateLimitError(f"asks for a range of {len(numbers):,} numbers (at most {MAX_RANGE:,})")
    return numbers


def _bounded_lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # noqa: A002
    if isinstance(n, int) and isinstance(max, int) and n * max > MAX_FILTER_ITEMS:
        raise TemplateLimitError(f"asks lipsum for more than {MAX_FILTER_ITEMS:,} words")
    return generate_lorem_ipsum(n, html, min, max)


# Filters and tests


def _parameters(function: Callable[..., Any]) -> list[str]:
    """The names of a filter's parameters after the value it filters."""
    names = list(inspect.signature(function).parameters)
    # An async-variant filter takes its context argument only in its outer wrapper.
    passes = getattr(inspect.unwrap(function), "jinja_pass_arg", None) is not None
    return names[2 if passes else 1 :]


def _check_filter(
    name: str, value: Any, named: Mapping[str, Any], rest: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> None:
    """Refuse a filter call that would run long or build too much, before it runs."""
    what = f"the filter {name}"
    if name in _SIZE_FILTERS:
        _check_arguments(rest, kwargs, what)
    if name in _ITEM_FILTERS and isinstance(value, Sized) and len(value) > MAX_FILTER_ITEMS:
        raise TemplateLimitError(f"gives {what} more than {MAX_FILTER_ITEMS:,} items")
    if name in _WORD_FILTERS and _measure(value)[0] > MAX_FILTER_CHARS:
        raise TemplateLimitError(f"gives {what} more than {MAX_FILTER_CHARS:,} characters")
    if name in _TREE_FILTERS:
        chars, items = _measure(value)
        if items > MAX_FILTER_ITEMS:
            raise TemplateLimitError(f"gives {what} more than {MAX_FILTER_ITEMS:,} items")
        # Each item may start a line indented once per level, and be followed by a separator.
        indent = named.get("indent") or (1 if name == "pprint" else 0)
        indent_chars = _measure(indent)[0] if isinstance(indent, str) else indent if isinstance(indent, int) else 0
        separators = named.get("separators")
        separator_chars = _total_chars(separators) if isinstance(separators, (list, tuple)) else 2
        depth = _depth(value) if indent_chars else 0
        _refuse_growth(chars + items * (abs(indent_chars) * depth + separator_chars + 1), what)
    if name == "indent" and isinstance(value, str):
        width = named.get("width", 4)
        width_chars = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
        _refuse_growth(len(value) + width_chars * (value.count("\n") + 1), what)
    elif name == "slice" and isinstance(named.get("slices"), int) and named["slices"] > MAX_FILTER_ITEMS:
        raise TemplateLimitError(f"asks {what} for more than {MAX_FILTER_ITEMS:,} slices")
    elif name == "format":
        _check_format(value, (*rest, *kwargs.values()), what)
    elif name == "replace":
        _check_replace(value, rest, what)
    elif name == "wordwrap" and isinstance(value, str):
        width, wrap = named.get("width", 79), named.get("wrapstring")
        lines = len(value) // width + value.count("\n") + 1 if isinstance(width, int) and width > 0 else 1
        _refuse_growth(len(value) + lines * (_measure(wrap)[0] if isinstance(wrap, str) else 1), what)
    elif name == "urlize":
        # Every link (at least 3 characters) repeats the target and rel attributes.
        attributes = sum(_measure(named.get(key) or "")[0] for key in ("target", "rel"))
        _refuse_growth(_measure(value)[0] * 10 + (_measure(value)[0] // 3 + 1) * attributes, what)
    elif name == "sum" and not isinstance(named.get("start", 0), (int, float)):
        raise TemplateLimitError(f"adds up values that are not numbers ({what})")


def _bounded_filter(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    # functools.wraps keeps `jinja_pass_arg`, so context-passing filters still get their context.
    # The filtered value's position: after the context or environment a filter asks for.
    first = 1 if hasattr(function, "jinja_pass_arg") else 0
    parameters = _parameters(function)
    what = f"the filter {name}"
    checked = name in _CHECKED_FILTERS

    @functools.wraps(function)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        budget = _budget()
        budget.check_time()
        value, rest = (args[first], args[first + 1 :]) if len(args) > first else (None, ())
        _check_given((value, *rest, *kwargs.values()), what, budget)
        if checked:
            named = {**dict(zip(parameters, rest)), **kwargs}
            _check_filter(name, value, named, rest, kwargs)
            if name == "join" and isinstance(value, Iterable):
                args = (*args[:first], _check_join(named.get("d", ""), value, what), *rest)
        result = function(*args, **kwargs)
        if result is not value:
            _check_value(result, what, budget)
            _charge(result, (*args, *kwargs.values()), what, True, budget)
        return result

    return bounded


def _bounded_test(function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        _budget().check_time()
        return function(*args, **kwargs)

    return bounded


def _bounded_output(value: Any) -> Any:
    """Jinja's `finalize`: every `{{ ... }}` goes through it before it is printed."""
    if isinstance(value, str):
        return value
    _check_value(value, "an output")
    text = str(value)
    # Inside a macro or `{% set %}` block the text is kept until the block is joined.
    _budget().charge(sys.getsizeof(text, 64), "an output")
    return text


# The rewritten template and the environment

# Nodes whose body is rendered into a buffer that is joined at its end.
_BUFFERED = (nodes.Macro, nodes.CallBlock, nodes.FilterBlock, nodes.AssignBlock)


class _Bound(NodeTransformer):
    """Routes every loop's items, every `~` and every list, tuple and dict literal
    through the environment's bounded helpers."""

    def __init__(self) -> None:
        self.buffered = 0
        self.recursive_costs: list[int] = []

    def generic_visit(self, node: nodes.Node, *args: Any, **kwargs: Any) -> nodes.Node:
        buffered = isinstance(node, _BUFFERED) or (isinstance(node, nodes.For) and node.recursive)
        self.buffered += buffered
        try:
            return super().generic_visit(node, *args, **kwargs)
        finally:
            self.buffered -= buffered

    def visit_For(self, node: nodes.For) -> nodes.Node:
        # A buffered iteration costs a step per piece it appends to the buffer.
        buffered = self.buffered or node.recursive
        pieces = sum(len(output.nodes) for output in nodes.Scope(node.body).find_all(nodes.Output))
        cost = max(1, pieces) if buffered else 1
        self.recursive_costs.append(cost if node.recursive else 0)
        try:
            self.generic_visit(node)
        finally:
            self.recursive_costs.pop()
        node.iter = _helper_call("bounded_iter", [node.iter, nodes.Const(cost, lineno=node.lineno)], node.lineno)
        return node

    def visit_Call(self, node: nodes.Call) -> nodes.Node:
        self.generic_visit(node)
        # `loop(children)` in a recursive loop iterates `children` without the For's own iter.
        if isinstance(node.node, nodes.Name) and node.node.name == "loop" and node.args:
            cost = next((cost for cost in reversed(self.recursive_costs) if cost), 1)
            iterated = [node.args[0], nodes.Const(cost, lineno=node.lineno)]
            node.args[0] = _helper_call("bounded_iter", iterated, node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return _helper_call("bounded_concat", [nodes.List(node.nodes, lineno=node.lineno)], node.lineno)

    def visit_List(self, node: nodes.List | nodes.Dict) -> nodes.Node:
        self.generic_visit(node)
        return _helper_call("bounded_literal", [node], node.lineno)

    visit_Dict = visit_List

    def visit_Tuple(self, node: nodes.Tuple) -> nodes.Node:
        return self.visit_List(node) if node.ctx == "load" else self.generic_visit(node)


def _helper_call(name: str, args: list[nodes.Expr], lineno: int) -> nodes.Call:
    return nodes.Call(nodes.EnvironmentAttribute(name, lineno=lineno), args, [], None, None, lineno=lineno)


_HELPERS = frozenset({"bounded_concat", "bounded_iter", "bounded_literal"})


class _CodeGenerator(CodeGenerator):
    """Calls the bounded helpers directly: they are not the template's own calls."""

    def visit_Call(self, node: nodes.Call, frame: Frame, forward_caller: bool = False) -> None:
        if isinstance(node.node, nodes.EnvironmentAttribute) and node.node.name in _HELPERS:
            self.write(f"environment.{node.node.name}(")
            for index, arg in enumerate(node.args):
                self.write(", " if index else "")
                self.visit(arg, frame)
            self.write(")")
        else:
            super().visit_Call(node, frame, forward_caller=forward_caller)


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox with the limits of this module."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})
    code_generator_class = _CodeGenerator

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.finalize = _bounded_output
        self.globals["range"] = _bounded_range
        self.globals["lipsum"] = _bounded_lipsum

    def bound_filters(self) -> None:
        """Wrap every filter and test (call after adding the caller's own)."""
        self.filters = {name: _bounded_filter(name, function) for name, function in self.filters.items()}
        self.tests = {name: _bounded_test(function) for name, function in self.tests.items()}

    def compile(  # noqa: A003
        self, source: Any, name: str | None = None, filename: str | None = None, raw: bool = False, defer_init: bool = False
    ) -> Any:
        # Jinja runs filters and tests on constants while compiling, outside any
        # deadline: a budget already out of time leaves all of them to the render.
        expired = _Budget(BASE_CHARS, BUILT_BYTES_PER_CHAR * BASE_CHARS, MAX_STEPS, -math.inf)
        token = _CURRENT.set(expired)
        try:
            return super().compile(source, name, filename, raw, defer_init)
        finally:
            _CURRENT.reset(token)

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        return _Bound().visit(super()._parse(source, name, filename))

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        budget, what = _budget(), f"'{operator}'"
        if operator == "+" and type(left) is str and type(right) is str:
            _refuse_growth(len(left) + len(right), what, budget)  # the common case, quickly
        else:
            _check_binop(operator, left, right)
        result = _check_value(super().call_binop(context, operator, left, right), what, budget)
        _charge(result, (left, right), what, False, budget)
        return result

    def getitem(self, obj: Any, argument: Any) -> Any:
        result = super().getitem(obj, argument)
        if isinstance(argument, slice):
            _check_value(result, "a slice")
            _charge(result, (obj,), "a slice")
        return result

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        budget = _budget()
        budget.step(CALL_STEPS)
        if isinstance(__obj, Macro):
            # What a macro is given is checked where the macro uses it, and its text when its buffer is joined.
            return super().call(__context, __obj, *args, **kwargs)
        name = getattr(__obj, "__name__", type(__obj).__name__)
        what = f"a call of {name}"
        # Jinja passes a loop's and a block's variables along; they are not arguments.
        given = {key: value for key, value in kwargs.items() if key not in _JINJA_KWARGS} if kwargs else kwargs
        _check_given((*args, *given.values()), what, budget)
        owner = getattr(getattr(__obj, "__wrapped__", __obj), "__self__", None)  # the sandbox wraps str.format
        if name in _CHECKED_METHODS:
            if isinstance(owner, _TEXT):
                args = _check_text_method(owner, name, args, given, what)
            elif isinstance(owner, int) and name == "to_bytes":
                _check_arguments(args, given, what)
        result = super().call(__context, __obj, *args, **kwargs)
        if result is not None and result is not True and result is not False:
            _check_value(result, what, budget)
            _charge(result, (owner, *args, *given.values()), what, True, budget)
        return result

    @staticmethod
    def concat(parts: Iterable[str]) -> str:
        """Join a buffer (a macro's, a block's): Jinja's generated code calls it."""
        what = "a macro or block"
        if isinstance(parts, list):
            _refuse_growth(sum(map(len, parts)), what)
            text = "".join(parts)
        else:
            out, total = io.StringIO(), 0
            for part in parts:
                total += len(part)
                _refuse_growth(total, what)
                out.write(part)
            text = out.getvalue()
        _budget().charge(sys.getsizeof(text, 64), what)
        return text

    @staticmethod
    def bounded_iter(items: Any, cost: int = 1) -> Iterator[Any]:
        budget = _budget()
        for item in items:
            budget.steps_left -= cost
            if budget.steps_left < 0 or time.monotonic() > budget.deadline:
                budget.step(0)  # raises the limit's error
            yield item

    @staticmethod
    def bounded_concat(parts: list[Any]) -> str:
        _budget().check_time()
        _refuse_growth(_total_chars(parts), "'~'")
        text = "".join(str(part) for part in parts)
        _budget().charge(sys.getsizeof(text, 64), "'~'")
        return text

    @staticmethod
    def bounded_literal(value: Any) -> Any:
        _budget().check_time()
        _check_value(value, "a list or dict")
        _budget().charge(sys.getsizeof(value, 64), "a list or dict")
        return value

