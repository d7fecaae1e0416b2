"""Constraints compiled into grammars for one model's tokenizer, bounded and cached.

llguidance (Microsoft's grammar engine, a backend of vLLM, SGLang and
llama.cpp) does the work: it reads the model's tokenizer.json with its own copy of
`tokenizers`, turns a JSON schema, a regular expression or a Lark grammar
into an Earley parser over a lazily built lexer, and computes each step's
set of allowed tokens without holding the GIL.

A hostile constraint must not cost the engine anything. Compiling runs on a
daemon thread of its own, never on the engine thread, at most
`_PARALLEL_COMPILES` at once and waited for at most `COMPILE_SECONDS`; the
grammar library's limits (`grammar_limits()`) bound its work and its lexer's
memory, at compile time and at every step. Results, failures included, are
cached per constraint, so a schema sent again costs a dictionary look-up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from engine.structured.constraint import Constraint, InvalidConstraint, one_line

log = logging.getLogger(__name__)

# The longest a caller waits for one compile. Real schemas compile in
# milliseconds (an object of 3,000 required properties in under 2 s on a busy
# 2-core machine); this bounds a pathological one whose work stays within
# the limits below.
COMPILE_SECONDS = 5.0
_PARALLEL_COMPILES = 2
_CACHED_GRAMMARS = 128

# Between JSON tokens: nothing, one space, or a newline and up to 20 spaces or
# tabs (llama.cpp's rule): JSON as models write it in-line or pretty-printed,
# where unbounded whitespace lets a weak model (or a random one) pad a reply
# with newlines until max_tokens.
_JSON_OPTIONS = {
    "whitespace_flexible": True,
    "whitespace_pattern": r"\x20|\x0A[\x20\x09]{0,20}",
}


def grammar_limits() -> Any:
    """llguidance's resource limits for every grammar the engine runs.

    The library's defaults, except for the lexer: at most 50,000 states
    (1-2 kB each, so ~100 MB at worst, where the default allows ~500 MB),
    and no parser state or grammar text quoted in an error message (a
    message may reach an HTTP client)."""
    import llguidance

    return llguidance.LLParserLimits(max_lexer_states=50_000, verbose_errors=False)


def grammar_text(constraint: Constraint) -> str:
    """The constraint in llguidance's grammar format (raises InvalidConstraint for
    a JSON schema that is not JSON)."""
    from llguidance import LLMatcher

    if constraint.kind == "regex":
        return LLMatcher.grammar_from_regex(constraint.spec)
    if constraint.kind == "lark":
        return LLMatcher.grammar_from_lark(constraint.spec)
    schema = constraint.spec if constraint.kind == "json_schema" else '{"type": "object"}'
    try:
        return LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_OPTIONS)
    except ValueError as exc:
        raise InvalidConstraint(f"The JSON schema is not a JSON object: {one_line(str(exc))}") from None


def check_constraint(constraint: Constraint) -> None:
    """Raise InvalidConstraint unless `constraint` compiles (no tokenizer needed:
    what a form or a request check can ask before any model is loaded)."""
    from llguidance import LLMatcher

    def validate() -> None:
        error = LLMatcher.validate_grammar(grammar_text(constraint), None, limits=grammar_limits())
        if error and not error.startswith("WARNING"):
            raise _invalid(constraint, error)

    _bounded(validate, constraint)


class CompiledGrammar:
    """A constraint compiled for one tokenizer: new matchers are copies of a fresh one."""

    __slots__ = ("constraint", "_template")

    def __init__(self, constraint: Constraint, template: Any) -> None:
        self.constraint = constraint
        self._template = template

    def new_matcher(self) -> Any:
        """An llguidance LLMatcher at the grammar's start, for one request."""
        return self._template.deep_copy()


class GrammarCompiler:
    """Compiles constraints for one model's tokenizer; thread-safe; cached by constraint.

    `tokenizer_file` is the model's tokenizer.json; `vocab_size` the larger of
    the tokenizer's ids and the model's logits (an embedding padded past the
    tokenizer's ids gets masks that cover it, its extra ids never allowed);
    `end_ids` the ids that end a reply, allowed exactly where the grammar may end.
    """

    def __init__(self, tokenizer_file: Path, vocab_size: int, end_ids: Iterable[int]) -> None:
        self._tokenizer_file = tokenizer_file
        self.vocab_size = vocab_size
        self._end_ids = sorted(set(end_ids))
        self._tokenizer: Any = None  # an LLTokenizer, or the InvalidConstraint that building it gave
        self._tokenizer_lock = threading.Lock()
        self._lock = threading.Lock()  # the cache
        self._compiled: OrderedDict[Constraint, CompiledGrammar | InvalidConstraint] = OrderedDict()
        self._compiling: dict[Constraint, Future[CompiledGrammar]] = {}

    def tokenizer(self) -> Any:
        """The llguidance tokenizer (built on first use: ~0.4 s for a 49k vocabulary,
        2 s for 152k); InvalidConstraint, every time, when the library cannot read it."""
        with self._tokenizer_lock:
            if self._tokenizer is None:
                import llguidance

                # llguidance reads special tokens, byte fallback and merges from the JSON itself.
                try:
                    self._tokenizer = llguidance.LLTokenizer(
                        str(self._tokenizer_file), n_vocab=self.vocab_size, eos_token=self._end_ids or None
                    )
                except Exception:
                    # The library's message names the file; a client of the server is told less.
                    log.exception("llguidance cannot read %s", self._tokenizer_file)
                    self._tokenizer = InvalidConstraint(
                        "Constrained replies are not available for this model: "
                        "the grammar library cannot read its tokenizer.json"
                    )
            if isinstance(self._tokenizer, InvalidConstraint):
                raise InvalidConstraint(str(self._tokenizer))
            return self._tokenizer

    def compile(self, constraint: Constraint) -> CompiledGrammar:
        """The compiled grammar, from the cache or compiled now (waiting at most
        COMPILE_SECONDS); raises InvalidConstraint, also for a constraint that
        failed before."""
        with self._lock:
            cached = self._compiled.get(constraint)
            if cached is not None:
                self._compiled.move_to_end(constraint)
                if isinstance(cached, InvalidConstraint):
                    raise InvalidConstraint(str(cached))
                return cached
            running = self._compiling.get(constraint)
            if running is None:
                running = self._compiling[constraint] = Future()
                owner = True
            else:
                owner = False
        if not owner:  # the same constraint is being compiled for another request
            try:
                return running.result(timeout=COMPILE_SECONDS)
            except TimeoutError:
                raise _too_slow(constraint) from None
            except InvalidConstraint as exc:  # a fresh one: the owner raises the same object
                raise InvalidConstraint(str(exc)) from None
        try:
            result: CompiledGrammar | InvalidConstraint = _bounded(lambda: self._build(constraint), constraint)
        except InvalidConstraint as exc:
            result = exc
        with self._lock:
            self._compiling.pop(constraint, None)
            if not isinstance(result, _CompilerBusy):  # the one answer that may change
                self._compiled[constraint] = result
            while len(self._compiled) > _CACHED_GRAMMARS:
                self._compiled.popitem(last=False)
        if isinstance(result, InvalidConstraint):
            running.set_exception(result)
            raise InvalidConstraint(str(result))
        running.set_result(result)
        return result

    def _build(self, constraint: Constraint) -> CompiledGrammar:
        from llguidance import LLMatcher

        tokenizer = self.tokenizer()
        matcher = LLMatcher(tokenizer, grammar_text(constraint), log_level=0, limits=grammar_limits())
        if matcher.is_error():
            raise _invalid(constraint, matcher.get_error())
        # The first step's mask, on a copy: a grammar that allows no text at all
        # (a $ref cycle with nothing in it) is only found out by trying.
        probe = matcher.deep_copy()
        probe.compute_bitmask()
        if probe.is_error():
            raise _invalid(constraint, "it allows no reply at all (a $ref cycle with nothing in it?)")
        return CompiledGrammar(constraint, matcher)


_compile_slots = threading.BoundedSemaphore(_PARALLEL_COMPILES)


class _CompilerBusy(InvalidConstraint):
    """Every compile slot stayed taken: says nothing about the constraint, so it is not cached."""


def _bounded(work: Callable[[], Any], constraint: Constraint) -> Any:
    """`work()` on a daemon thread, at most _PARALLEL_COMPILES at once, waited for
    at most COMPILE_SECONDS in all. A compile past its time keeps its slot until
    it ends (native code cannot be interrupted), so runaway compiles cannot pile up."""
    deadline = time.monotonic() + COMPILE_SECONDS
    if not _compile_slots.acquire(timeout=COMPILE_SECONDS):
        raise _CompilerBusy(
            f"{_sentence_start(constraint.described)} could not be compiled: the grammar compiler is busy "
            f"with other constraints; try again"
        )
    outcome: Future[Any] = Future()

    def run() -> None:
        try:
            outcome.set_result(work())
        except BaseException as exc:  # handed to the waiting caller
            outcome.set_exception(exc)
        finally:
            _compile_slots.release()

    threading.Thread(target=run, name="tandem-grammar-compile", daemon=True).start()
    try:
        return outcome.result(timeout=max(0.0, deadline - time.monotonic()))
    except TimeoutError:
        raise _too_slow(constraint) from None
    except InvalidConstraint:
        raise
    except Exception as exc:  # the library refused it in a way of its own
        raise _invalid(constraint, str(exc)) from None


def _invalid(constraint: Constraint, error: str) -> InvalidConstraint:
    return InvalidConstraint(f"{_sentence_start(constraint.described)} cannot be used: {one_line(error)}")


def _too_slow(constraint: Constraint) -> InvalidConstraint:
    return InvalidConstraint(
        f"{_sentence_start(constraint.described)} took more than {COMPILE_SECONDS:g} s to compile; "
        "simplify it (fewer alternatives, shorter patterns, smaller repetition counts)"
    )


def _sentence_start(text: str) -> str:
    return text[:1].upper() + text[1:]
