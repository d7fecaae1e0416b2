"""The engine: one worker thread that owns the model, the KV cache and the
scheduler, and serves every request through continuous batching.

Requests and aborts reach the thread through a queue; results leave by push:
each request has a sink that the engine thread calls after every step (the
synchronous API's sink puts into a `queue.SimpleQueue` the caller blocks on,
the asyncio API's uses `loop.call_soon_threadsafe`). Nothing polls.

Lifetime. The thread runs on an `_EngineCore` (the model, cache, scheduler
and queue), never on the `Engine` itself, so dropping the last reference to
an Engine runs its finalizer, which stops the thread and frees the model.
Every put into the queue happens under the core's lock after checking that it
is open, and the thread, once it stops, closes the core under that lock and
fails whatever is still queued: a request either runs, or ends with
EngineClosedError, never waits forever. An atexit hook stops every engine
thread before interpreter teardown, because a thread still inside a torch
kernel when Python finalizes aborts the whole process.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import logging
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence as Seq
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Union

import torch

from engine.model.attention import KVCache
from engine.core.batch import AsyncBatch, Batch
from engine.core.page_pool import PagePool
from engine.model.config import ModelConfig
from engine.runner.threads import thread_policy
from engine.formats.default_model import resolve_model
from engine.core.detokenizer import IncrementalDetokenizer
from engine.errors import EngineClosedError, EngineError, PromptError
from engine.formats.loader import describe_weights, load_model, quantized_formats, resolve_device, resolve_dtype
from engine.progress import LoadReporter, ProgressCallback
from engine.runner.cuda import make_cuda_runner
from engine.runner.memory import CPU_DEFAULT_KV_BYTES, cuda_kv_cache_bytes, default_kv_pages, kv_bytes_per_page
from engine.runner.cpu import DETERMINISTIC_DEFAULT, ModelRunner
from engine.model.sampler import RequestSampler
from engine.params import SamplingParams
from engine.core.scheduler import ScheduledChunk, ScheduleResult, Scheduler
from engine.core.sequence import EventSink, RequestOutput, Sequence, SequenceStatus, StreamEvent
from engine.model.tokenizer import Tokenizer

log = logging.getLogger(__name__)

Message = Mapping[str, str]
Prompt = Union[str, Seq[int], Seq[Message]]

_SAMPLING_FIELDS = frozenset(f.name for f in fields(SamplingParams))


@dataclass(slots=True, frozen=True)
class EngineStats:
    pages_total: int
    pages_used: int
    pages_cached: int  # evictable pages still holding reusable prefixes
    pages_free: int
    page_size: int
    prompt_tokens_computed: int
    prompt_tokens_reused: int  # served from the prefix cache
    prefix_hit_rate: float  # reused / (reused + computed)
    generated_tokens: int
    decode_tokens_per_s: float  # over the recent steps that decoded
    preemptions: int
    running: int
    waiting: int
    recent_ttft_s: tuple[float, ...]  # time to first token of recent requests
    device: str  # "cpu", "cuda:0"
    dtype: str  # the products' input dtype: "bfloat16", "float16", "float32"
    max_context: int  # tokens the model's context holds
    # The KV pool's size, and how much of it holds memory: on the CPU pages
    # are committed as they are first used, on CUDA all at start.
    kv_bytes_total: int
    kv_bytes_committed: int
    # How the weights are held: "q4_1+q8_0 (kernel)" (run quantized),
    # "float32 (dequantized from q4_1+q8_0)", "bfloat16".
    weights: str


@dataclass(slots=True)
class RequestHandle:
    request_id: int
    prompt_token_ids: list[int]


@dataclass(slots=True)
class _Submit:
    seq: Sequence


@dataclass(slots=True)
class _Abort:
    request_id: int


@dataclass(slots=True)
class _Call:
    fn: Any
    done: threading.Event
    result: Any = None


@dataclass(slots=True)
class _Shutdown:
    reason: str


# Every core whose thread may still run; atexit stops them.
_cores: weakref.WeakSet[_EngineCore] = weakref.WeakSet()
_cores_lock = threading.Lock()


def _stop_engines_at_exit() -> None:
    with _cores_lock:
        cores = list(_cores)
    for core in cores:
        core.shutdown("The program is exiting")


atexit.register(_stop_engines_at_exit)


class Engine:
    """A loaded model plus the thread that runs it.

    `Engine("default")` loads the embedded SmolLM2 model; any Hugging Face
    Llama-family folder or GGUF file path works too.

    `on_progress(LoadProgress)` is called from the engine thread while the
    constructor runs ("import", "weights", "warmup", "ready", in that order);
    setting `cancel` makes the constructor raise LoadCancelled (an import in
    progress leaves nothing behind).

    `quantize` ("int8", "int4") keeps a float checkpoint's weights quantized
    and `quantized` ("auto", "kernel", "dequantize") says how quantized
    weights run: see engine.formats.loader.
    """

    def __init__(
        self,
        model: str | Path = "default",
        device: str = "auto",
        dtype: str = "auto",
        *,
        page_size: int = 16,
        kv_pages: int | None = None,
        kv_cache_bytes: int | None = None,
        max_batch_tokens: int | None = None,
        max_running: int = 64,
        enable_prefix_cache: bool = True,
        threads: int | None = None,
        deterministic: bool | None = None,
        quantize: str | None = None,
        quantized: str = "auto",
        on_progress: ProgressCallback | None = None,
        cancel: threading.Event | None = None,
    ) -> None:
        if page_size < 1:
            raise EngineError("page_size must be at least 1")
        self._ids = itertools.count()
        core = _EngineCore(on_progress, cancel)
        self._core = core
        # Every torch call happens on the engine thread, loading included:
        # PyTorch's OpenMP pool belongs to the thread that first uses it, and
        # a second thread running ops next to it was measured at half speed.
        core.thread = threading.Thread(
            target=core.main,
            args=(
                model, device, dtype, page_size, kv_pages, kv_cache_bytes,
                max_batch_tokens, max_running, enable_prefix_cache, threads,
                deterministic, quantize, quantized,
            ),
            name="tandem-engine",
            daemon=True,
        )
        with _cores_lock:
            _cores.add(core)
        core.thread.start()
        try:
            core.ready.wait()
        except BaseException:  # Ctrl+C while loading: stop the load too
            core.shutdown("Loading was interrupted")
            raise
        if core.failure is not None:
            core.thread.join()
            failure, core.failure = core.failure, None
            raise failure
        # The finalizer holds the core, never the Engine: dropping the last
        # reference to the Engine stops the thread and frees the model.
        self._finalizer = weakref.finalize(self, core.shutdown, "The engine was dropped")
        self._finalizer.atexit = False  # the module's atexit hook does it, loading cores too

    # -- what the engine thread set up -------------------------------------

    @property
    def model_path(self) -> Path:
        return self._core.model_path

    @property
    def tokenizer(self) -> Tokenizer:
        return self._core.tokenizer

    @property
    def model(self) -> Any:
        return self._core.model

    @property
    def config(self) -> Any:
        return self._core.config

    @property
    def device(self) -> torch.device:
        return self._core.device

    @property
    def dtype(self) -> torch.dtype:
        return self._core.dtype

    @property
    def max_context(self) -> int:
        return self._core.max_context

    @property
    def pool(self) -> PagePool:
        return self._core.pool

    @property
    def kv_cache(self) -> Any:
        return self._core.kv_cache

    @property
    def deterministic(self) -> bool:
        """Whether outputs are batch-invariant (see engine.runner.cpu)."""
        return self._core.deterministic

    @property
    def runner(self) -> ModelRunner:
        return self._core.runner

    @property
    def scheduler(self) -> Scheduler:
        return self._core.scheduler

    @property
    def closed(self) -> bool:
        return self._core.closed

    def kv_cache_bytes_per_page(self, page_size: int) -> int:
        return self._core.kv_cache_bytes_per_page(page_size)

    # -- prompts -----------------------------------------------------------

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        """Text (raw, no template), token ids, or chat messages -> token ids."""
        if isinstance(prompt, str):
            if not prompt:
                raise PromptError("The prompt is empty")
            ids = self.tokenizer.encode(prompt, add_special_tokens=True)
        elif isinstance(prompt, Seq) and prompt and all(isinstance(m, Mapping) for m in prompt):
            ids = self.tokenizer.encode_chat(list(prompt), add_generation_prompt=True)
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

    # -- submitting ----------------------------------------------------------

    def _new_sequence(self, ids: list[int], params: SamplingParams, sink: EventSink | None) -> Sequence:
        core = self._core
        return Sequence(
            request_id=next(self._ids),
            prompt_ids=ids,
            params=params,
            sampler=None,  # made on the engine thread: it holds torch state
            detokenizer=IncrementalDetokenizer(self.tokenizer, ids, params.stop),
            sink=sink or (lambda event: None),
            stop_token_ids=frozenset() if params.ignore_eos else core.stop_ids,
        )

    def submit(
        self, prompt: Prompt, params: SamplingParams | None = None, sink: EventSink | None = None
    ) -> RequestHandle:
        """Queue one request; `sink` is called on the engine thread after every
        step that produced something for it, the last time with `output` set
        (EngineClosedError as `output.error` if the engine stops first)."""
        self._core.check_open()
        params = params or SamplingParams()
        ids = self.encode_prompt(prompt)
        self.scheduler.check_fits(len(ids), params.max_tokens)
        seq = self._new_sequence(ids, params, sink)
        self._core.put([_Submit(seq)])
        return RequestHandle(seq.request_id, list(ids))

    def abort(self, request: RequestHandle | int) -> None:
        """Stop a request now; its pages are freed at the engine's next turn and
        its sink gets a last event with finish_reason "abort"."""
        rid = request.request_id if isinstance(request, RequestHandle) else int(request)
        self._core.inbox.put(_Abort(rid))

    @staticmethod
    def sampling_params(params: SamplingParams | None = None, **overrides: Any) -> SamplingParams:
        unknown = set(overrides) - _SAMPLING_FIELDS
        if unknown:
            raise TypeError(f"Unknown sampling option(s): {', '.join(sorted(unknown))}")
        if "stop" in overrides:
            stop = overrides["stop"]
            overrides["stop"] = (stop,) if isinstance(stop, str) else tuple(stop or ())
        if params is None:
            return SamplingParams(**overrides)
        values = {f: getattr(params, f) for f in _SAMPLING_FIELDS}
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
        self._core.put([_Submit(seq) for seq in seqs])
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
        a list of prompts -> list[str] (or a generator of (idx, delta))."""
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


class _EngineCore:
    """Everything the engine thread owns. It never references the Engine, so
    the Engine can be collected while the thread runs."""

    def __init__(self, on_progress: ProgressCallback | None, cancel: threading.Event | None) -> None:
        self.inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # Orders every put against closing. Reentrant: a finalizer run by the
        # garbage collector inside put() may call shutdown() on this thread.
        self.lock = threading.RLock()
        self.closed = False
        self.stopping = threading.Event()  # set on shutdown; also cancels a load
        self.reporter = LoadReporter(on_progress, cancel, self.stopping)
        self.ready = threading.Event()
        self.failure: BaseException | None = None
        self.thread: threading.Thread | None = None
        self.live: dict[int, Sequence] = {}
        self.prompt_computed = 0
        self.prompt_reused = 0
        self.generated = 0
        self.decode_window: deque[tuple[int, float]] = deque(maxlen=64)
        self.ttfts: deque[float] = deque(maxlen=32)

    # -- called from any thread -------------------------------------------

    def check_open(self) -> None:
        if self.closed:
            raise EngineClosedError("The engine has been shut down")

    def put(self, items: list[Any]) -> None:
        """Queue items for the engine thread, all or none."""
        with self.lock:
            self.check_open()
            for item in items:
                self.inbox.put(item)

    def call(self, fn: Any) -> Any:
        if threading.current_thread() is self.thread:
            return fn()  # waiting on our own queue would never return
        call = _Call(fn, threading.Event())
        self.put([call])
        call.done.wait()
        if isinstance(call.result, BaseException):
            raise call.result
        return call.result

    def shutdown(self, reason: str) -> None:
        with self.lock:
            if not self.closed:
                self.closed = True
                self.stopping.set()
                self.inbox.put(_Shutdown(reason))
        thread = self.thread
        if thread is not None and thread is not threading.current_thread() and thread.ident is not None:
            thread.join()

    def stats(self) -> EngineStats:
        window = list(self.decode_window)
        tokens = sum(n for n, _ in window)
        seconds = sum(t for _, t in window)
        reused, computed = self.prompt_reused, self.prompt_computed
        return EngineStats(
            pages_total=self.pool.num_pages,
            pages_used=self.pool.num_used,
            pages_cached=self.pool.num_cached,
            pages_free=self.pool.num_free,
            page_size=self.pool.page_size,
            prompt_tokens_computed=computed,
            prompt_tokens_reused=reused,
            prefix_hit_rate=reused / (reused + computed) if reused + computed else 0.0,
            generated_tokens=self.generated,
            decode_tokens_per_s=tokens / seconds if seconds else 0.0,
            preemptions=self.scheduler.total_preemptions,
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            recent_ttft_s=tuple(self.ttfts),
            device=str(self.device),
            dtype=str(self.dtype).removeprefix("torch."),
            max_context=self.max_context,
            kv_bytes_total=self.kv_cache.total_bytes,
            kv_bytes_committed=self.kv_cache.committed_bytes,
            weights=self.weights,
        )

    # -- the engine thread ---------------------------------------------------

    def main(self, model: str | Path, device: str, dtype: str, *setup: Any) -> None:
        try:
            self._set_up(model, device, dtype, *setup)
        except BaseException as exc:
            self.failure = exc
            self._close_and_drain("The engine failed to load")
            self.ready.set()
            return
        self.ready.set()
        reason = "The engine stopped after an internal error"
        try:
            reason = self._serve()
        except BaseException:
            log.exception("the engine thread failed")
        finally:
            self._close_and_drain(reason)

    def _set_up(
        self,
        model: str | Path,
        device: str,
        dtype: str,
        page_size: int,
        kv_pages: int | None,
        kv_cache_bytes: int | None,
        max_batch_tokens: int | None,
        max_running: int,
        enable_prefix_cache: bool,
        threads: int | None,
        deterministic: bool | None,
        quantize: str | None,
        quantized: str,
    ) -> None:
        reporter = self.reporter
        folder = resolve_model(model, on_progress=reporter)
        self.model_path = folder
        # "Not a model folder" / "unsupported architecture" come before any
        # complaint about one of the folder's files.
        ModelConfig.from_folder(folder)
        self.tokenizer = Tokenizer.from_folder(folder)
        reporter.check()
        dev = resolve_device(device)
        self.deterministic = DETERMINISTIC_DEFAULT if deterministic is None else bool(deterministic)
        self.thread_policy = thread_policy(dev, threads, self.deterministic)
        self.model = load_model(
            folder, dev, resolve_dtype(dtype, dev), on_progress=reporter,
            quantized=quantized, quantize=quantize,
        )
        self.weights = describe_weights(self.model, quantized_formats(folder))
        self.config = self.model.config
        self.device = self.model.device
        self.dtype = self.model.dtype
        self.max_context = self.config.max_position_embeddings
        if kv_pages is None:
            kv_pages = self._default_kv_pages(page_size, kv_cache_bytes)
        self.pool = PagePool(kv_pages, page_size, enable_prefix_cache=enable_prefix_cache)
        if self.device.type == "cuda":
            self.kv_cache = self.model.new_kv_cache(kv_pages, page_size)
        else:
            # Memory for pages only as chats first reach them: an idle or
            # lightly used engine holds a sliver of its pool.
            c = self.config
            self.kv_cache = KVCache(
                c.num_hidden_layers, kv_pages, page_size, c.num_key_value_heads, c.head_dim,
                self.model.act_dtype, self.device, commit_on_use=True,
            )
        if self.device.type == "cuda":
            # Triton kernels and CUDA graphs where triton is installed (engine/runner/cuda.py).
            self.runner = make_cuda_runner(
                self.model, self.kv_cache, max_running,
                deterministic=self.deterministic, threads=self.thread_policy,
            )
        else:
            self.runner = ModelRunner(
                self.model, self.kv_cache, deterministic=self.deterministic, threads=self.thread_policy
            )
        if max_batch_tokens is None:
            max_batch_tokens = 2048 if self.device.type == "cuda" else 512
        self.scheduler = Scheduler(
            self.pool, max_batch_tokens, max_running, self.config.max_position_embeddings
        )
        self.stop_ids = frozenset(self.tokenizer.eos_token_ids) | frozenset(
            self.config.eos_token_ids
        )
        self._warm_up()
        device_name = "CUDA GPU" if self.device.type == "cuda" else "CPU"
        reporter.report(
            "ready", 1, 1,
            f"{folder.name} is ready on the {device_name}; weights: {self.weights}",
        )

    def _default_kv_pages(self, page_size: int, kv_cache_bytes: int | None) -> int:
        per_page = self.kv_cache_bytes_per_page(page_size)
        if kv_cache_bytes is None:
            if self.device.type == "cuda":
                # Free memory less a measured activation peak and a desktop reserve (engine/runner/memory.py).
                kv_cache_bytes = cuda_kv_cache_bytes(self.model)
            else:
                kv_cache_bytes = CPU_DEFAULT_KV_BYTES
        return default_kv_pages(kv_cache_bytes, per_page, self.max_context, page_size)

    def kv_cache_bytes_per_page(self, page_size: int) -> int:
        c = self.config
        return kv_bytes_per_page(
            c.num_hidden_layers, c.num_key_value_heads, c.head_dim, page_size, self.model.act_dtype
        )

    def _warm_up(self) -> None:
        """One short prefill and one decode, so the first request does not pay
        for kernel selection and first-touch allocations. The pages it writes
        are freed unregistered: nothing of it can be served as a prefix."""
        pool = self.pool
        capacity = pool.num_pages * pool.page_size
        prompt_len = min(4, capacity - 1)
        detail = "Warming up"
        self.reporter.report("warmup", 0, 2, detail)
        if prompt_len < 1:
            self.reporter.report("warmup", 2, 2, detail)
            return
        ids = [self.tokenizer.bos_token_id or 0] * prompt_len
        params = SamplingParams(temperature=0.0, max_tokens=1)
        seq = Sequence(
            request_id=-1,
            prompt_ids=ids,
            params=params,
            sampler=RequestSampler(params, self.device, ids),
            detokenizer=IncrementalDetokenizer(self.tokenizer, ids, ()),
            sink=lambda event: None,
            stop_token_ids=frozenset(),
        )
        seq.pages = pool.allocate(-(-(prompt_len + 1) // pool.page_size))
        try:
            token = self.runner.execute(
                ScheduleResult(prefills=[ScheduledChunk(seq, 0, prompt_len)])
            )[0]
            self.reporter.report("warmup", 1, 2, detail)
            seq.token_ids.append(token)
            self.runner.execute(ScheduleResult(decodes=[ScheduledChunk(seq, prompt_len, 1)]))
        finally:
            pool.release(seq.pages)
            seq.pages = []
        self.reporter.report("warmup", 2, 2, detail)

    def _serve(self) -> str:
        """Serve until a _Shutdown arrives; return its reason."""
        while True:
            # Block while idle; otherwise take whatever arrived since the last step.
            item = self.inbox.get() if not self.scheduler.has_work else self._next_nowait()
            while item is not None:
                if isinstance(item, _Shutdown):
                    return item.reason
                self._handle(item)
                item = self._next_nowait()
            if self.scheduler.has_work:
                try:
                    self._step()
                except Exception as exc:  # a bug outside the model: the state is suspect
                    log.exception("engine step failed")
                    self._fail_all(exc)

    def _close_and_drain(self, reason: str) -> None:
        """Once the thread stops serving: refuse new work, end every live
        request and everything still queued with EngineClosedError."""
        with self.lock:
            self.closed = True
            self.stopping.set()
        error = EngineClosedError(reason)
        if hasattr(self, "scheduler"):
            self._fail_all(error)
        while (item := self._next_nowait()) is not None:
            if isinstance(item, _Submit):
                seq = item.seq
                seq.status = SequenceStatus.FINISHED
                seq.finish_reason = "error"
                seq.metrics.finish_time = time.perf_counter()
                self._emit(seq, seq.to_output(error))
            elif isinstance(item, _Call):
                item.result = error
                item.done.set()

    def _next_nowait(self) -> Any:
        try:
            return self.inbox.get_nowait()
        except queue.Empty:
            return None

    def _handle(self, item: Any) -> None:
        if isinstance(item, _Submit):
            seq = item.seq
            self.live[seq.request_id] = seq
            try:
                seq.sampler = RequestSampler(seq.params, self.device, seq.prompt_ids)
                self.scheduler.add(seq)
            except Exception as exc:
                self._finish(seq, exc)
        elif isinstance(item, _Abort):
            seq = self.live.get(item.request_id)
            if seq is not None:
                seq.finish_reason = "abort"
                self._finish(seq)
        elif isinstance(item, _Call):
            try:
                item.result = item.fn()
            except Exception as exc:
                item.result = exc
            item.done.set()

    def _step(self) -> None:
        step = self.scheduler.schedule()
        if not step.chunks:
            return
        started = time.perf_counter()
        for chunk in step.chunks:
            metrics = chunk.seq.metrics
            if metrics.first_scheduled_time is None:
                metrics.first_scheduled_time = started
                self.prompt_reused += metrics.cached_prompt_tokens
        try:
            tokens = self.runner.execute(step)
        except Exception as exc:
            self._isolate_failure(step, exc, started)
            return
        self._complete(step, tokens, started)

    def _isolate_failure(self, step: ScheduleResult, error: Exception, started: float) -> None:
        """A forward failed. Rerun its chunks one at a time: only the request(s)
        that fail alone are failed, the others go on as if nothing happened
        (their chunk's K/V is simply written again)."""
        chunks = step.chunks
        if len(chunks) == 1:
            log.error("request %d failed in the model", chunks[0].seq.request_id, exc_info=error)
            self._finish(chunks[0].seq, error)
            return
        log.warning(
            "a step of %d requests failed (%s: %s); running them one at a time",
            len(chunks), type(error).__name__, error,
        )
        for chunk in chunks:
            seq = chunk.seq
            if seq.status is not SequenceStatus.RUNNING:
                continue
            alone = (
                ScheduleResult(decodes=[chunk]) if chunk.num_tokens == 1
                else ScheduleResult(prefills=[chunk])
            )
            try:
                tokens = self.runner.execute(alone)
            except Exception as exc:
                log.error("request %d failed in the model", seq.request_id, exc_info=exc)
                self._finish(seq, exc)
                continue
            self._complete(alone, tokens, started)

    def _complete(self, step: ScheduleResult, tokens: list[int], started: float) -> None:
        self.scheduler.commit(step)
        now = time.perf_counter()
        self._account(step, now - started)
        sampling = [c.seq for c in step.chunks if c.samples]
        for seq, token in zip(sampling, tokens):
            try:
                self._append_token(seq, token, now)
            except Exception as exc:  # e.g. detokenizing: this request's problem only
                log.exception("request %d failed after sampling", seq.request_id)
                self._finish(seq, exc)
        for seq in sampling:
            if seq.status is SequenceStatus.FINISHED:
                continue
            if seq.pending_ids or seq.pending_text:
                self._emit(seq)

    def _account(self, step: ScheduleResult, seconds: float) -> None:
        for chunk in step.chunks:
            seq = chunk.seq
            prompt_len = len(seq.prompt_ids)
            if chunk.start < prompt_len and seq.metrics.preemptions == 0:
                self.prompt_computed += min(chunk.start + chunk.num_tokens, prompt_len) - chunk.start
        if step.decodes:
            self.decode_window.append((len(step.decodes), seconds))

    def _append_token(self, seq: Sequence, token: int, now: float) -> None:
        seq.token_ids.append(token)
        seq.pending_ids.append(token)
        seq.sampler.observe(token)
        self.generated += 1
        if seq.metrics.first_token_time is None:
            seq.metrics.first_token_time = now
            self.ttfts.append(now - seq.metrics.arrival_time)
        if token in seq.stop_token_ids:
            seq.finish_reason = "stop"
        else:
            seq.pending_text += seq.detokenizer.add(token)
            if seq.detokenizer.stopped:
                seq.finish_reason = "stop"
        if seq.finish_reason is None and (
            seq.num_generated >= seq.params.max_tokens or len(seq.token_ids) >= self.max_context
        ):
            seq.finish_reason = "length"
        if seq.finish_reason is not None:
            self._finish(seq)

    def _emit(self, seq: Sequence, output: RequestOutput | None = None) -> None:
        metrics = seq.metrics
        end = metrics.finish_time if metrics.finish_time is not None else time.perf_counter()
        event = StreamEvent(
            seq.request_id,
            seq.pending_text,
            seq.pending_ids,
            output,
            num_generated=seq.num_generated,
            elapsed_s=end - metrics.arrival_time,
            ttft_s=metrics.time_to_first_token,
            prompt_tokens=metrics.prompt_tokens,
            cached_prompt_tokens=metrics.cached_prompt_tokens,
        )
        seq.pending_text = ""
        seq.pending_ids = []
        try:
            seq.sink(event)
        except Exception:  # a consumer's bug must not take the engine down
            log.exception("request sink failed")

    def _finish(self, seq: Sequence, error: Exception | None = None) -> None:
        if seq.status is SequenceStatus.FINISHED:
            return
        self.scheduler.finish(seq)
        self.live.pop(seq.request_id, None)
        if error is None and seq.finish_reason != "abort":
            seq.pending_text += seq.detokenizer.finish()
        if error is not None:
            seq.finish_reason = "error"
        seq.metrics.finish_time = time.perf_counter()
        self._emit(seq, seq.to_output(error))

    def _fail_all(self, error: Exception) -> None:
        for seq in list(self.live.values()):
            self._finish(seq, error)
