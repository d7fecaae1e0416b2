"""The engine's client side: `Engine`, a loaded model plus the thread that
runs it, with synchronous, event and asyncio APIs over the same requests.

The thread itself (the model, the KV cache, the scheduler and the serve loop)
is an EngineCore (engine/core/engine_core.py): the Engine only encodes and
checks prompts, queues requests on its core and reads what the core pushes
back. The core never references the Engine, so dropping the last reference
to an Engine stops its thread (see engine.core.engine_core on lifetime).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import weakref
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence as Seq
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Union

import torch

from engine.config import EngineConfig
from engine.core.batch import AsyncBatch, Batch
from engine.core.detokenizer import IncrementalDetokenizer
from engine.core.engine_core import EngineCore
from engine.core.page_pool import PagePool
from engine.core.scheduler import Scheduler
from engine.core.sequence import EventSink, RequestOutput, Sequence, StreamEvent
from engine.core.stats import EngineStats
from engine.errors import EngineClosedError, PromptError
from engine.model.tokenizer import Tokenizer
from engine.params import SamplingParams, defaults_for, read_recommended_sampling
from engine.progress import ProgressCallback
from engine.runner.cpu import ModelRunner
from engine.structured.constraint import Constraint

__all__ = ["Engine", "EngineStats", "RequestHandle", "Prompt", "Message"]

Message = Mapping[str, str]
Prompt = Union[str, Seq[int], Seq[Message]]

_SAMPLING_PARAM_NAMES = frozenset(f.name for f in fields(SamplingParams))


@dataclass(slots=True)
class RequestHandle:
    request_id: int
    prompt_token_ids: list[int]


class Engine:
    """A loaded model plus the thread that runs it.

    `Engine("default")` loads the embedded SmolLM2 model; any Hugging Face
    Llama-family folder or GGUF file path works too.

    `on_progress(LoadProgress)` is called from the engine thread while the
    constructor runs ("import", "weights", "warmup", "ready", in that order);
    setting `cancel` makes the constructor raise LoadCancelled (an import in
    progress leaves nothing behind).

    The options are EngineConfig's fields, given as keyword arguments
    (`Engine(path, "cpu", page_size=32, max_context=4096)`) or as one
    `Engine(config=EngineConfig(...))`; keywords given beside a config
    override its fields. A value outside an option's range raises
    InvalidEngineConfig before anything loads; a `max_context` above the
    model's trained context raises MaxContextTooLargeError.

    A request given no SamplingParams samples with `default_sampling`: the
    model's own recommendation (its generation_config.json) where it has
    one, else Tandem's defaults (engine.params.SamplingParams': temperature
    0.8, top-k 40, top-p 0.95, min-p 0.05, as llama.cpp). Keyword options
    (`generate(prompt, max_tokens=64)`) change single fields of either;
    SamplingParams given are used as they are.
    """

    def __init__(
        self,
        model: str | Path | None = None,
        device: str | None = None,
        dtype: str | None = None,
        *,
        config: EngineConfig | None = None,
        on_progress: ProgressCallback | None = None,
        cancel: threading.Event | None = None,
        **options: Any,
    ) -> None:
        config = _engine_config(config, model=model, device=device, dtype=dtype, **options)
        self._ids = itertools.count()
        self._recommended: dict[str, int | float] | None = None
        core = EngineCore(on_progress, cancel)
        self._core = core
        core.start(config)
        # The finalizer holds the core, never the Engine: dropping the last
        # reference to the Engine stops the thread and frees the model.
        self._finalizer = weakref.finalize(self, core.shutdown, "The engine was dropped")
        self._finalizer.atexit = False  # the core module's atexit hook does it, loading cores too

    # -- what the engine thread set up -------------------------------------

    @property
    def model_path(self) -> Path:
        return self._core.model_path

    @property
    def recommended_sampling(self) -> dict[str, int | float]:
        """The sampling settings the model's generation_config.json recommends;
        empty when it recommends none (engine.params.defaults_for lays them over the defaults)."""
        # Read once: the server asks on every request, and the folder does not change under a loaded model.
        if self._recommended is None:
            self._recommended = read_recommended_sampling(self.model_path)
        return dict(self._recommended)

    @property
    def default_sampling(self) -> SamplingParams:
        """What a request given no SamplingParams samples with: `recommended_sampling`
        over Tandem's defaults (engine.params.defaults_for), as the CLI, the
        server and a new pane in the window choose too."""
        return defaults_for(self.recommended_sampling)[0]

    @property
    def tokenizer(self) -> Tokenizer:
        return self._core.tokenizer

    def _in_memory(self, what: Any) -> Any:
        if what is None:  # released when the engine stopped
            raise EngineClosedError("The engine has been shut down: its model is no longer in memory")
        return what

    @property
    def model(self) -> Any:
        return self._in_memory(self._core.model)

    @property
    def config(self) -> Any:
        return self._core.config

    @property
    def engine_config(self) -> EngineConfig:
        """The options this engine was loaded with (max_context as asked; the
        context it uses is `max_context`)."""
        return self._core.engine_config

    @property
    def device(self) -> torch.device:
        return self._core.device

    @property
    def dtype(self) -> torch.dtype:
        return self._core.dtype

    @property
    def max_context(self) -> int:
        """Tokens a conversation may hold: the model's trained context, or
        EngineConfig.max_context where that is smaller."""
        return self._core.max_context

    @property
    def pool(self) -> PagePool:
        return self._core.pool

    @property
    def kv_cache(self) -> Any:
        return self._in_memory(self._core.kv_cache)

    @property
    def deterministic(self) -> bool:
        """Whether outputs are batch-invariant (see engine.runner.cpu)."""
        return self._core.deterministic

    @property
    def runner(self) -> ModelRunner:
        return self._in_memory(self._core.runner)

    @property
    def scheduler(self) -> Scheduler:
        return self._core.scheduler

    @property
    def closed(self) -> bool:
        return self._core.closed

    def kv_cache_bytes_per_page(self, page_size: int) -> int:
        return self._core.kv_cache_bytes_per_page(page_size)

    # -- prompts -----------------------------------------------------------

    def encode_prompt(self, prompt: Prompt, *, parse_special_in_content: bool = False) -> list[int]:
        """Text (raw, no template), token ids, or chat messages -> token ids.

        Special-token text inside chat messages stays text unless
        `parse_special_in_content` (see Tokenizer.encode_chat); raw text is
        the caller's whole prompt and is read with its control tokens."""
        if isinstance(prompt, str):
            if not prompt:
                raise PromptError("The prompt is empty")
            ids = self.tokenizer.encode(prompt, add_special_tokens=True)
        elif isinstance(prompt, Seq) and prompt and all(isinstance(m, Mapping) for m in prompt):
            ids = self.tokenizer.encode_chat(
                list(prompt), add_generation_prompt=True, parse_special_in_content=parse_special_in_content
            )
        elif isinstance(prompt, Seq) and all(isinstance(t, int) for t in prompt):
            ids = [int(t) for t in prompt]
            bad = [t for t in ids if not 0 <= t < self.config.vocab_size]
            if bad:
                raise PromptError(
                    f"Token id {bad[0]} is outside the model's vocabulary "
                    f"(0..{self.config.vocab_size - 1})"
                )
        else:
            raise PromptError("A prompt is text, a list of token ids, or a list of chat messages")
        if not ids:
            raise PromptError("The prompt is empty")
        return ids

    @staticmethod
    def _is_batch(prompts: Any) -> bool:
        if isinstance(prompts, str) or not isinstance(prompts, Seq) or not prompts:
            return False
        first = prompts[0]
        return isinstance(first, str) or (
            isinstance(first, Seq) and not isinstance(first, Mapping)
        )

    # -- constraints -----------------------------------------------------------

    def check_constraint(self, constraint: Constraint) -> None:
        """Compile `constraint` for this model's tokenizer (cached) or raise
        InvalidConstraint, a one-line message naming the unsupported feature or
        the limit. Submitting a constrained request does this too; a server
        calls it first off its event loop (`await asyncio.to_thread(...)`), as
        a first compile may take up to engine.structured.compiler.COMPILE_SECONDS."""
        self._core.grammar_compiler().compile(constraint)

    # -- submitting ----------------------------------------------------------

    def _new_sequence(self, ids: list[int], params: SamplingParams, sink: EventSink | None) -> Sequence:
        core = self._core
        # Compiled before the request exists: a constraint that cannot run
        # fails the call, and nothing is queued.
        grammar = core.grammar_compiler().compile(params.constraint) if params.constraint else None
        return Sequence(
            request_id=next(self._ids),
            prompt_ids=ids,
            params=params,
            sampler=None,  # made on the engine thread: it holds torch state
            detokenizer=IncrementalDetokenizer(self.tokenizer, ids, params.stop),
            sink=sink or (lambda event: None),
            stop_token_ids=frozenset() if params.ignore_eos else core.stop_ids,
            matcher=grammar.new_matcher() if grammar is not None else None,
        )

    def submit(
        self, prompt: Prompt, params: SamplingParams | None = None, sink: EventSink | None = None
    ) -> RequestHandle:
        """Queue one request; `sink` is called on the engine thread after every
        step that produced something for it, the last time with `output` set
        (EngineClosedError as `output.error` if the engine stops first)."""
        self._core.check_open()
        params = params if params is not None else self.default_sampling
        ids = self.encode_prompt(prompt)
        self.scheduler.check_fits(len(ids), params.max_tokens)
        seq = self._new_sequence(ids, params, sink)
        self._core.submit([seq])
        return RequestHandle(seq.request_id, list(ids))

    def abort(self, request: RequestHandle | int) -> None:
        """Stop a request now; its pages are freed at the engine's next turn and
        its sink gets a last event with finish_reason "abort"."""
        rid = request.request_id if isinstance(request, RequestHandle) else int(request)
        self._core.abort(rid)

    def sampling_params(self, params: SamplingParams | None = None, **overrides: Any) -> SamplingParams:
        """`params` (`default_sampling` when None) with the fields in `overrides` replaced."""
        unknown = set(overrides) - _SAMPLING_PARAM_NAMES
        if unknown:
            raise TypeError(f"Unknown sampling option(s): {', '.join(sorted(unknown))}")
        if "stop" in overrides:
            stop = overrides["stop"]
            overrides["stop"] = (stop,) if isinstance(stop, str) else tuple(stop or ())
        if params is None:
            params = self.default_sampling
        values = {f: getattr(params, f) for f in _SAMPLING_PARAM_NAMES}
        values.update(overrides)
        return SamplingParams(**values)

    def _params_list(
        self,
        params: SamplingParams | Seq[SamplingParams] | None,
        count: int,
        overrides: dict[str, Any],
    ) -> list[SamplingParams]:
        if isinstance(params, SamplingParams) or params is None:
            base = self.sampling_params(params, **overrides)
            return [base] * count
        plist = [self.sampling_params(p, **overrides) for p in params]
        if len(plist) != count:
            raise ValueError(f"{len(plist)} sampling params for {count} prompts")
        return plist

    def _start(
        self,
        batch: Batch | AsyncBatch,
        prompts: Prompt | Seq[Prompt],
        params: SamplingParams | Seq[SamplingParams] | None,
        sampling: dict[str, Any],
        as_batch: bool | None = None,
    ) -> None:
        """Submit a batch as one unit. Every prompt is encoded and checked
        first, and all are queued under one lock: a bad prompt, or a closed
        engine, fails the call before any request of the batch starts."""
        self._core.check_open()
        if as_batch is None:
            as_batch = self._is_batch(prompts)
        items = list(prompts) if as_batch else [prompts]
        plist = self._params_list(params, len(items), sampling)
        encoded = [self.encode_prompt(p) for p in items]
        for ids, p in zip(encoded, plist):
            self.scheduler.check_fits(len(ids), p.max_tokens)
        seqs = [
            self._new_sequence(ids, p, batch._sink_for(idx))
            for idx, (ids, p) in enumerate(zip(encoded, plist))
        ]
        self._core.submit(seqs)
        for seq in seqs:
            batch._add(seq.request_id, list(seq.prompt_ids))

    def start_batch_async(
        self,
        prompts: Prompt | Seq[Prompt],
        params: SamplingParams | Seq[SamplingParams] | None = None,
        **sampling: Any,
    ) -> AsyncBatch:
        """Queue prompts (one prompt is a batch of one) and return at once with
        a handle that knows their ids, can stop any of them and yields
        (idx, StreamEvent) under `async for`. Call with the reading loop running."""
        batch = AsyncBatch(asyncio.get_running_loop(), self.abort)
        self._start(batch, prompts, params, sampling)
        return batch

    def start_batch(
        self,
        prompts: Prompt | Seq[Prompt],
        params: SamplingParams | Seq[SamplingParams] | None = None,
        **sampling: Any,
    ) -> Batch:
        """The blocking twin of start_batch_async: iterate the Batch with `for`."""
        batch = Batch(self.abort)
        self._start(batch, prompts, params, sampling)
        return batch

    # -- synchronous API -----------------------------------------------------

    def generate(
        self,
        prompts: Prompt | Seq[Prompt],
        stream: bool = False,
        params: SamplingParams | Seq[SamplingParams] | None = None,
        **sampling: Any,
    ) -> Any:
        """One prompt -> str (or a generator of text deltas with stream=True);
        a list of prompts -> list[str] (or a generator of (idx, delta)).

        Without `params`, each prompt samples with `default_sampling` (the
        model's recommendation, else Tandem's defaults), with any keyword
        options (`max_tokens=64`, `seed=1`) over it; `params` given (one, or
        one per prompt) win, keyword options still replacing their fields."""
        batch = self._is_batch(prompts)
        if stream:
            gen = self._stream(prompts, params, sampling)
            return gen if batch else (delta for _, delta in gen)
        texts = [o.text for o in self._run_to_completion(prompts, params, sampling)]
        return texts if batch else texts[0]

    def generate_outputs(
        self,
        prompts: Seq[Prompt],
        params: SamplingParams | Seq[SamplingParams] | None = None,
        **sampling: Any,
    ) -> list[RequestOutput]:
        """Run a batch to completion and return the full records, in input order."""
        return self._run_to_completion(list(prompts), params, sampling, as_batch=True)

    def events(
        self,
        prompts: Prompt | Seq[Prompt],
        params: SamplingParams | Seq[SamplingParams] | None = None,
        **sampling: Any,
    ) -> Iterator[tuple[int | None, StreamEvent]]:
        """Every StreamEvent of the requests as they come (the last one of each
        carries its RequestOutput); idx is None for a single prompt. A failed
        request raises its error; closing the generator early aborts what is
        still running."""
        batch = self._is_batch(prompts)
        for idx, event in self._raising_events(prompts, params, sampling):
            yield (idx if batch else None), event

    def _raising_events(
        self, prompts: Any, params: Any, sampling: dict[str, Any], as_batch: bool | None = None
    ) -> Iterator[tuple[int, StreamEvent]]:
        batch = Batch(self.abort)
        self._start(batch, prompts, params, sampling, as_batch)
        try:
            for idx, event in batch:
                if event.output is not None and event.output.error is not None:
                    raise event.output.error
                yield idx, event
        finally:
            # Closing the generator early (or an error) aborts what is left.
            batch.abort()

    def _run_to_completion(
        self, prompts: Any, params: Any, sampling: dict[str, Any], as_batch: bool | None = None
    ) -> list[RequestOutput]:
        outputs: list[RequestOutput | None] = []
        for idx, event in self._raising_events(prompts, params, sampling, as_batch):
            if event.output is not None:
                outputs.extend([None] * (idx + 1 - len(outputs)))
                outputs[idx] = event.output
        return [o for o in outputs if o is not None]

    def _stream(self, prompts: Any, params: Any, sampling: dict[str, Any]) -> Iterator[tuple[int, str]]:
        for idx, event in self._raising_events(prompts, params, sampling):
            if event.text:
                yield idx, event.text

    # -- asyncio API -------------------------------------------------------

    async def stream_async(
        self,
        prompts: Prompt | Seq[Prompt],
        params: SamplingParams | Seq[SamplingParams] | None = None,
        **sampling: Any,
    ) -> AsyncIterator[Any]:
        """Async twin of generate(stream=True): text deltas for one prompt,
        (idx, delta) pairs for a list."""
        async for idx, event in self.events_async(prompts, params, **sampling):
            if event.text:
                yield event.text if idx is None else (idx, event.text)

    async def events_async(
        self,
        prompts: Prompt | Seq[Prompt],
        params: SamplingParams | Seq[SamplingParams] | None = None,
        **sampling: Any,
    ) -> AsyncIterator[tuple[int | None, StreamEvent]]:
        """Every StreamEvent of the requests (the last one carries the output);
        idx is None for a single prompt. A failed request raises its error;
        leaving early aborts what is still running. For per-request control
        (ids up front, stopping one request) use start_batch_async."""
        is_batch = self._is_batch(prompts)
        batch = self.start_batch_async(prompts, params, **sampling)
        try:
            async for idx, event in batch:
                if event.output is not None and event.output.error is not None:
                    raise event.output.error
                yield (idx if is_batch else None), event
        finally:
            batch.abort()

    # -- introspection and lifetime ------------------------------------------

    def stats(self) -> EngineStats:
        return self._core.stats()

    def run_on_engine_thread(self, fn: Any) -> Any:
        """Run fn() between two steps on the engine thread and return its result
        (for maintenance such as clearing the prefix cache). Raises
        EngineClosedError if the engine stops before running it."""
        return self._core.call(fn)

    def reset_prefix_cache(self) -> None:
        self.run_on_engine_thread(self.pool.reset_prefix_cache)

    def close(self) -> None:
        """Stop the engine: every live or queued request ends with
        EngineClosedError as its output.error. Idempotent, callable from any
        thread (on the engine thread itself it stops without waiting)."""
        self._core.shutdown("The engine was shut down")
        self._finalizer.detach()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _engine_config(config: EngineConfig | None, **given: Any) -> EngineConfig:
    """`config` (or the defaults) with the options given beside it; None means "not given"."""
    base = config if config is not None else EngineConfig()
    names = {name for name, _, _ in EngineConfig.options()}
    unknown = sorted(set(given) - names)
    if unknown:
        raise TypeError(
            f"Engine() got unknown option(s) {', '.join(unknown)}; "
            f"the options are EngineConfig's fields: {', '.join(sorted(names))}"
        )
    changes = {k: v for k, v in given.items() if v is not None or k not in ("model", "device", "dtype")}
    return base.replace(**changes) if changes else base
