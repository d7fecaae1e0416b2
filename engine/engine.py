"""The engine: one worker thread that owns the model, the KV cache and the
scheduler, and serves every request through continuous batching.

Requests and aborts reach the thread through a queue; results leave by push:
each request has a sink that the engine thread calls after every step (the
synchronous API's sink puts into a `queue.SimpleQueue` the caller blocks on,
the asyncio API's uses `loop.call_soon_threadsafe`). Nothing polls.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence as Seq
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Union

import torch

from engine.cache import PagePool
from engine.default_model import resolve_model
from engine.detokenizer import IncrementalDetokenizer
from engine.errors import EngineClosedError, EngineError, PromptError
from engine.loader import load_model, resolve_device, resolve_dtype
from engine.runner import ModelRunner
from engine.sampling import RequestSampler, SamplingParams
from engine.scheduler import ScheduleResult, Scheduler
from engine.sequence import EventSink, RequestOutput, Sequence, SequenceStatus, StreamEvent
from engine.tokenizer import Tokenizer

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


_SHUTDOWN = object()


class Engine:
    """A loaded model plus the thread that runs it.

    `Engine("default")` loads the embedded SmolLM2 model; any Hugging Face
    Llama-family folder or GGUF file path works too.
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
    ) -> None:
        if page_size < 1:
            raise EngineError("page_size must be at least 1")
        folder = resolve_model(model)
        self.model_path = folder
        self.tokenizer = Tokenizer.from_folder(folder)
        self._ids = itertools.count()
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._live: dict[int, Sequence] = {}
        self._closed = False
        self._prompt_computed = 0
        self._prompt_reused = 0
        self._generated = 0
        self._decode_window: deque[tuple[int, float]] = deque(maxlen=64)
        self._ttfts: deque[float] = deque(maxlen=32)
        # Every torch call happens on the engine thread, loading included:
        # PyTorch's OpenMP pool belongs to the thread that first uses it, and
        # a second thread running ops next to it was measured at half speed.
        ready = threading.Event()
        failure: list[BaseException] = []

        def start() -> None:
            try:
                self._set_up(
                    folder, device, dtype, page_size, kv_pages, kv_cache_bytes,
                    max_batch_tokens, max_running, enable_prefix_cache, threads,
                )
            except BaseException as exc:
                failure.append(exc)
                return
            finally:
                ready.set()
            self._run()

        self._thread = threading.Thread(target=start, name="tandem-engine", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._closed = True
            raise failure[0]

    def _set_up(
        self,
        folder: Path,
        device: str,
        dtype: str,
        page_size: int,
        kv_pages: int | None,
        kv_cache_bytes: int | None,
        max_batch_tokens: int | None,
        max_running: int,
        enable_prefix_cache: bool,
        threads: int | None,
    ) -> None:
        if threads is not None:
            torch.set_num_threads(max(1, threads))
        dev = resolve_device(device)
        self.model = load_model(folder, dev, resolve_dtype(dtype, dev))
        self.config = self.model.config
        self.device = self.model.device
        self.dtype = self.model.dtype
        if kv_pages is None:
            kv_pages = self._default_kv_pages(page_size, kv_cache_bytes)
        self.pool = PagePool(kv_pages, page_size, enable_prefix_cache=enable_prefix_cache)
        self.kv_cache = self.model.new_kv_cache(kv_pages, page_size)
        self.runner = ModelRunner(self.model, self.kv_cache)
        if max_batch_tokens is None:
            max_batch_tokens = 2048 if self.device.type == "cuda" else 512
        self.scheduler = Scheduler(
            self.pool, max_batch_tokens, max_running, self.config.max_position_embeddings
        )
        self.max_context = self.config.max_position_embeddings
        self._stop_ids = frozenset(self.tokenizer.eos_token_ids) | frozenset(
            self.config.eos_token_ids
        )

    def _default_kv_pages(self, page_size: int, kv_cache_bytes: int | None) -> int:
        c = self.config
        per_page = self.kv_cache_bytes_per_page(page_size)
        if kv_cache_bytes is None:
            if self.device.type == "cuda":
                free, _ = torch.cuda.mem_get_info(self.device)
                kv_cache_bytes = int(free * 0.6)
            else:
                kv_cache_bytes = 1 << 30
        # Never more than enough for every running sequence at full context.
        cap = -(-c.max_position_embeddings // page_size) * 8
        return max(1, min(kv_cache_bytes // per_page, cap))

    def kv_cache_bytes_per_page(self, page_size: int) -> int:
        c = self.config
        element = torch.empty((), dtype=self.model.act_dtype).element_size()
        return 2 * c.num_hidden_layers * page_size * c.num_key_value_heads * c.head_dim * element

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

    def submit(
        self, prompt: Prompt, params: SamplingParams | None = None, sink: EventSink | None = None
    ) -> RequestHandle:
        """Queue one request; `sink` is called on the engine thread after every
        step that produced something for it, the last time with `output` set."""
        if self._closed:
            raise EngineClosedError("The engine has been shut down")
        params = params or SamplingParams()
        ids = self.encode_prompt(prompt)
        self.scheduler.check_fits(len(ids), params.max_tokens)
        seq = Sequence(
            request_id=next(self._ids),
            prompt_ids=ids,
            params=params,
            sampler=None,  # made on the engine thread: it holds torch state
            detokenizer=IncrementalDetokenizer(self.tokenizer, ids, params.stop),
            sink=sink or (lambda event: None),
            stop_token_ids=frozenset() if params.ignore_eos else self._stop_ids,
        )
        self._inbox.put(_Submit(seq))
        return RequestHandle(seq.request_id, list(ids))

    def abort(self, request: RequestHandle | int) -> None:
        """Stop a request now; its pages are freed at the engine's next turn."""
        rid = request.request_id if isinstance(request, RequestHandle) else int(request)
        self._inbox.put(_Abort(rid))

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
        items = list(prompts) if batch else [prompts]
        plist = self._params_list(params, len(items), sampling)
        if stream:
            gen = self._stream(items, plist)
            return gen if batch else (delta for _, delta in gen)
        texts = [o.text for o in self._run_to_completion(items, plist)]
        return texts if batch else texts[0]

    def generate_outputs(
        self,
        prompts: Seq[Prompt],
        params: SamplingParams | Seq[SamplingParams] | None = None,
        **sampling: Any,
    ) -> list[RequestOutput]:
        """Run a batch to completion and return the full records, in input order."""
        return self._run_to_completion(
            list(prompts), self._params_list(params, len(prompts), sampling)
        )

    def events(
        self,
        prompts: Prompt | Seq[Prompt],
        params: SamplingParams | Seq[SamplingParams] | None = None,
        **sampling: Any,
    ) -> Iterator[tuple[int | None, StreamEvent]]:
        """Every StreamEvent of the requests as they come (the last one of each
        carries its RequestOutput); idx is None for a single prompt. Closing
        the generator early aborts what is still running."""
        batch = self._is_batch(prompts)
        items = list(prompts) if batch else [prompts]
        plist = self._params_list(params, len(items), sampling)
        for idx, event in self._batch_events(items, plist):
            yield (idx if batch else None), event

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

    def _submit_batch(
        self,
        prompts: Seq[Prompt],
        plist: Seq[SamplingParams],
        sink_for: Any,
        handles: list[RequestHandle],
    ) -> None:
        """Submit a batch, appending to `handles` as it goes (so a caller's
        cleanup can abort what was submitted). Every prompt is encoded and
        checked first: a bad one fails before any request of the batch starts."""
        encoded = [self.encode_prompt(p) for p in prompts]
        for ids, p in zip(encoded, plist):
            self.scheduler.check_fits(len(ids), p.max_tokens)
        for idx, (ids, p) in enumerate(zip(encoded, plist)):
            handles.append(self.submit(ids, p, sink_for(idx)))

    def _run_to_completion(
        self, prompts: list[Prompt], plist: list[SamplingParams]
    ) -> list[RequestOutput]:
        outputs: list[RequestOutput | None] = [None] * len(prompts)
        for idx, event in self._batch_events(prompts, plist):
            if event.output is not None:
                outputs[idx] = event.output
        return [o for o in outputs if o is not None]

    def _stream(self, prompts: list[Prompt], plist: list[SamplingParams]) -> Iterator[tuple[int, str]]:
        for idx, event in self._batch_events(prompts, plist):
            if event.text:
                yield idx, event.text

    def _batch_events(
        self, prompts: list[Prompt], plist: list[SamplingParams]
    ) -> Iterator[tuple[int, StreamEvent]]:
        inbox: queue.SimpleQueue[tuple[int, StreamEvent]] = queue.SimpleQueue()
        handles: list[RequestHandle] = []
        finished: set[int] = set()
        try:
            self._submit_batch(prompts, plist, lambda i: lambda e: inbox.put((i, e)), handles)
            while len(finished) < len(handles):
                idx, event = inbox.get()
                if event.output is not None:
                    finished.add(idx)
                    if event.output.error is not None:
                        raise event.output.error
                yield idx, event
        finally:
            # Closing the generator early (or an error) aborts what is left.
            for idx, handle in enumerate(handles):
                if idx not in finished:
                    self.abort(handle)

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
        idx is None for a single prompt."""
        batch = self._is_batch(prompts)
        items = list(prompts) if batch else [prompts]
        plist = self._params_list(params, len(items), sampling)
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[tuple[int, StreamEvent]] = asyncio.Queue()
        handles: list[RequestHandle] = []
        finished: set[int] = set()

        def sink_for(idx: int) -> EventSink:
            return lambda e: loop.call_soon_threadsafe(inbox.put_nowait, (idx, e))

        try:
            self._submit_batch(items, plist, sink_for, handles)
            while len(finished) < len(handles):
                idx, event = await inbox.get()
                if event.output is not None:
                    finished.add(idx)
                    if event.output.error is not None:
                        raise event.output.error
                yield (idx if batch else None), event
        finally:
            for idx, handle in enumerate(handles):
                if idx not in finished:
                    self.abort(handle)

    # -- introspection and lifetime ------------------------------------------

    def stats(self) -> EngineStats:
        window = list(self._decode_window)
        tokens = sum(n for n, _ in window)
        seconds = sum(t for _, t in window)
        reused, computed = self._prompt_reused, self._prompt_computed
        return EngineStats(
            pages_total=self.pool.num_pages,
            pages_used=self.pool.num_used,
            pages_cached=self.pool.num_cached,
            pages_free=self.pool.num_free,
            page_size=self.pool.page_size,
            prompt_tokens_computed=computed,
            prompt_tokens_reused=reused,
            prefix_hit_rate=reused / (reused + computed) if reused + computed else 0.0,
            generated_tokens=self._generated,
            decode_tokens_per_s=tokens / seconds if seconds else 0.0,
            preemptions=self.scheduler.total_preemptions,
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            recent_ttft_s=tuple(self._ttfts),
        )

    def run_on_engine_thread(self, fn: Any) -> Any:
        """Run fn() between two steps on the engine thread and return its result
        (for maintenance such as clearing the prefix cache)."""
        if self._closed:
            raise EngineClosedError("The engine has been shut down")
        call = _Call(fn, threading.Event())
        self._inbox.put(call)
        call.done.wait()
        if isinstance(call.result, BaseException):
            raise call.result
        return call.result

    def reset_prefix_cache(self) -> None:
        self.run_on_engine_thread(self.pool.reset_prefix_cache)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._inbox.put(_SHUTDOWN)
        self._thread.join()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the engine thread -----------------------------------------------------

    def _run(self) -> None:
        while True:
            # Block while idle; otherwise take whatever arrived since the last step.
            item = self._inbox.get() if not self.scheduler.has_work else self._next_nowait()
            while item is not None:
                if item is _SHUTDOWN:
                    self._fail_all(EngineClosedError("The engine was shut down"))
                    return
                self._handle(item)
                item = self._next_nowait()
            if self.scheduler.has_work:
                try:
                    self._step()
                except Exception as exc:  # a bug or device failure: fail the batch, keep serving
                    log.exception("engine step failed")
                    self._fail_all(exc)

    def _next_nowait(self) -> Any:
        try:
            return self._inbox.get_nowait()
        except queue.Empty:
            return None

    def _handle(self, item: Any) -> None:
        if isinstance(item, _Submit):
            seq = item.seq
            self._live[seq.request_id] = seq
            try:
                seq.sampler = RequestSampler(seq.params, self.device, seq.prompt_ids)
                self.scheduler.add(seq)
            except Exception as exc:
                self._finish(seq, exc)
        elif isinstance(item, _Abort):
            seq = self._live.get(item.request_id)
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
                self._prompt_reused += metrics.cached_prompt_tokens
        tokens = self.runner.execute(step)
        self.scheduler.commit(step)
        now = time.perf_counter()
        self._account(step, now - started)
        sampling = [c.seq for c in step.chunks if c.samples]
        for seq, token in zip(sampling, tokens):
            self._append_token(seq, token, now)
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
                self._prompt_computed += min(chunk.start + chunk.num_tokens, prompt_len) - chunk.start
        if step.decodes:
            self._decode_window.append((len(step.decodes), seconds))

    def _append_token(self, seq: Sequence, token: int, now: float) -> None:
        seq.token_ids.append(token)
        seq.pending_ids.append(token)
        seq.sampler.observe(token)
        self._generated += 1
        if seq.metrics.first_token_time is None:
            seq.metrics.first_token_time = now
            self._ttfts.append(now - seq.metrics.arrival_time)
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
        event = StreamEvent(seq.request_id, seq.pending_text, seq.pending_ids, output)
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
        self._live.pop(seq.request_id, None)
        if error is None and seq.finish_reason != "abort":
            seq.pending_text += seq.detokenizer.finish()
        if error is not None:
            seq.finish_reason = "error"
        seq.metrics.finish_time = time.perf_counter()
        self._emit(seq, seq.to_output(error))

    def _fail_all(self, error: Exception) -> None:
        for seq in list(self._live.values()):
            self._finish(seq, error)
