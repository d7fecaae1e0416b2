"""EngineCore: the engine thread's side of an Engine. It owns the model, the
KV cache, the page pool and the scheduler, and runs the serve loop: take what
the clients queued, step the batch, hand each request its new tokens.

Requests and aborts reach the thread through a queue; results leave by push:
each request has a sink that the engine thread calls after every step (the
synchronous API's sink puts into a `queue.SimpleQueue` the caller blocks on,
the asyncio API's uses `loop.call_soon_threadsafe`). Nothing polls.

Lifetime. The thread runs on an EngineCore, never on the Engine (engine.llm)
that clients hold, so dropping the last reference to an Engine runs its
finalizer, which stops the thread and frees the model. Every put into the
queue happens under the core's lock after checking that it is open, and the
thread, once it stops, closes the core under that lock and fails whatever is
still queued: a request either runs, or ends with EngineClosedError, never
waits forever. An atexit hook stops every engine thread before interpreter
teardown, because a thread still inside a torch kernel when Python finalizes
aborts the whole process.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any

from engine.config import EngineConfig
from engine.core.detokenizer import IncrementalDetokenizer
from engine.core.page_pool import PagePool
from engine.core.scheduler import ScheduledChunk, ScheduleResult, Scheduler
from engine.core.sequence import RequestOutput, Sequence, SequenceStatus, StreamEvent
from engine.core.stats import EngineStats
from engine.errors import EngineClosedError
from engine.formats.default_model import resolve_model
from engine.formats.loader import describe_weights, load_model, quantized_formats, resolve_device, resolve_dtype
from engine.model.kv_cache import KVCache
from engine.model.config import ModelConfig
from engine.model.sampler import RequestSampler
from engine.model.tokenizer import Tokenizer
from engine.params import SamplingParams
from engine.progress import LoadReporter, ProgressCallback
from engine.config import DETERMINISTIC_DEFAULT
from engine.runner.cpu import ModelRunner
from engine.runner.cuda import make_cuda_runner
from engine.runner.memory import (
    cuda_kv_cache_bytes, default_kv_budget, default_kv_pages, kv_bytes_per_page, release_freed_heap,
)
from engine.runner.threads import thread_policy
from engine.structured.compiler import GrammarCompiler
from engine.structured.token_masks import PendingMasks, TokenMaskWorker

log = logging.getLogger(__name__)


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
_cores: weakref.WeakSet[EngineCore] = weakref.WeakSet()
_cores_lock = threading.Lock()


def _stop_engines_at_exit() -> None:
    with _cores_lock:
        cores = list(_cores)
    for core in cores:
        core.shutdown("The program is exiting")


atexit.register(_stop_engines_at_exit)



class EngineCore:
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
        self.mask_worker: TokenMaskWorker | None = None  # started by the first constrained request
        # What holds memory, until the thread stops (_release_memory).
        self.model: Any = None
        self.kv_cache: Any = None
        self.runner: Any = None
        self.kv_bytes_total = 0
        self._grammars: GrammarCompiler | None = None
        self._grammars_lock = threading.Lock()

    # -- called from any thread -------------------------------------------

    def start(self, config: EngineConfig) -> None:
        """Load `config`'s model on a new engine thread and wait until it is
        ready; raise what loading raised (the thread has ended then)."""
        # Every torch call happens on the engine thread, loading included:
        # PyTorch's OpenMP pool belongs to the thread that first uses it, and
        # a second thread running ops next to it was measured at half speed.
        self.thread = threading.Thread(
            target=self.main, args=(config,), name="tandem-engine", daemon=True
        )
        with _cores_lock:
            _cores.add(self)
        self.thread.start()
        try:
            self.ready.wait()
        except BaseException:  # Ctrl+C while loading: stop the load too
            self.shutdown("Loading was interrupted")
            raise
        if self.failure is not None:
            self.thread.join()
            failure, self.failure = self.failure, None
            raise failure

    def submit(self, seqs: list[Sequence]) -> None:
        """Queue requests for the engine thread, all or none."""
        self.put([_Submit(seq) for seq in seqs])

    def abort(self, request_id: int) -> None:
        self.inbox.put(_Abort(request_id))

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

    def grammar_compiler(self) -> GrammarCompiler:
        """Compiles constraints for this model's tokenizer (made on first use)."""
        with self._grammars_lock:
            if self._grammars is None:
                self._grammars = GrammarCompiler(
                    self.model_path / "tokenizer.json",
                    max(self.config.vocab_size, self.tokenizer.vocab_size),
                    self.stop_ids,
                )
            return self._grammars

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
            kv_bytes_total=self.kv_bytes_total,
            kv_bytes_committed=self.kv_cache.committed_bytes if self.kv_cache is not None else 0,
            weights=self.weights,
        )

    # -- the engine thread ---------------------------------------------------

    def main(self, config: EngineConfig) -> None:
        try:
            self._set_up(config)
        except BaseException as exc:
            self.failure = exc
            self._close_and_drain("The engine failed to load")
            self._release_memory()
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
            self._release_memory()

    def _set_up(self, options: EngineConfig) -> None:
        self.engine_config = options
        reporter = self.reporter
        folder = resolve_model(options.model, on_progress=reporter)
        self.model_path = folder
        # "Not a model folder" / "unsupported architecture" come before any
        # complaint about one of the folder's files, and a max_context the
        # model cannot hold before its weights are read.
        trained = ModelConfig.from_folder(folder).max_position_embeddings
        self.max_context = options.context_for(trained, folder.name)
        self.tokenizer = Tokenizer.from_folder(folder)
        reporter.check()
        dev = resolve_device(options.device)
        self.deterministic = (
            DETERMINISTIC_DEFAULT if options.deterministic is None else options.deterministic
        )
        self.thread_policy = thread_policy(dev, options.threads, self.deterministic)
        self.model = load_model(
            folder, dev, resolve_dtype(options.dtype, dev), on_progress=reporter,
            quantized=options.quantized, quantize=options.quantize,
        )
        self.weights = describe_weights(self.model, quantized_formats(folder))
        self.config = self.model.config
        self.device = self.model.device
        self.dtype = self.model.dtype
        self.kv_dtype = self.model.kv_dtype
        page_size = options.page_size
        kv_pages = options.kv_pages
        if kv_pages is None:
            # Sized for self.max_context, the capped context: a smaller
            # max_context gives a smaller pool.
            kv_pages = self._default_kv_pages(page_size, options.kv_cache_bytes)
        self.pool = PagePool(kv_pages, page_size, enable_prefix_cache=options.enable_prefix_cache)
        if self.device.type == "cuda":
            self.kv_cache = self.model.new_kv_cache(kv_pages, page_size)
        else:
            # Memory for pages only as chats first reach them: an idle or
            # lightly used engine holds a sliver of its pool.
            c = self.config
            self.kv_cache = KVCache(
                c.num_hidden_layers, kv_pages, page_size, c.num_key_value_heads, c.head_dim,
                self.model.kv_dtype, self.device, commit_on_use=True,
            )
        self.kv_bytes_total = self.kv_cache.total_bytes  # stats() answers it after the cache is released
        if self.device.type == "cuda":
            # Triton kernels and CUDA graphs where triton is installed (engine/runner/cuda.py).
            self.runner = make_cuda_runner(
                self.model, self.kv_cache, options.max_running,
                deterministic=self.deterministic, threads=self.thread_policy,
            )
        else:
            self.runner = ModelRunner(
                self.model, self.kv_cache, deterministic=self.deterministic, threads=self.thread_policy
            )
        self.scheduler = Scheduler(
            self.pool, options.max_batch_tokens_for(self.device.type), options.max_running,
            self.max_context,
        )
        self.stop_ids = frozenset(self.tokenizer.eos_token_ids) | frozenset(
            self.config.eos_token_ids
        )
        self._warm_up()
        release_freed_heap()  # the load's temporaries, freed but still resident
        device_name = "CUDA GPU" if self.device.type == "cuda" else "CPU"
        reporter.report(
            "ready", 1, 1,
            f"{folder.name} is ready on the {device_name}; weights: {self.weights}",
        )

    def _default_kv_pages(self, page_size: int, kv_cache_bytes: int | None) -> int:
        budget = default_kv_budget(self.device, kv_cache_bytes)
        if budget is None:
            # Free memory less a measured activation peak and a desktop reserve (engine/runner/memory.py).
            budget = cuda_kv_cache_bytes(self.model)
        return default_kv_pages(budget, self.kv_cache_bytes_per_page(page_size), self.max_context, page_size)

    def kv_cache_bytes_per_page(self, page_size: int) -> int:
        c = self.config
        return kv_bytes_per_page(
            c.num_hidden_layers, c.num_key_value_heads, c.head_dim, page_size, self.kv_dtype
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
        if self.mask_worker is not None:
            self.mask_worker.close()
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

    def _release_memory(self) -> None:
        """Once the thread has stopped: let go of the weights, the KV cache
        and the runner's buffers (a client may keep its Engine, which holds
        only this core), and give the freed heap back to the system. glibc
        keeps freed memory in its arenas for reuse: without the trim, a
        closed fp32 engine of the default model left ~500 MB resident, and
        unloading a model in the window freed nothing the system could see."""
        cuda = getattr(self, "device", None) is not None and self.device.type == "cuda"  # unset if loading failed
        self.runner = self.kv_cache = self.model = None
        try:
            if cuda:
                import torch

                torch.cuda.empty_cache()  # the caching allocator's blocks, for other programs
            release_freed_heap()
        except Exception:  # best effort: a client waiting for this thread's answer must still get it
            log.exception("could not give the engine's freed memory back")

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
                seq.sampler = RequestSampler(seq.params, self.device, seq.prompt_ids, seq.matcher)
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
            tokens = self._execute(step)
        except Exception as exc:
            self._isolate_failure(step, exc, started)
            return
        self._complete(step, tokens, started)

    def _execute(self, step: ScheduleResult) -> list[int]:
        """The runner's forward and sampling, with the constrained requests'
        masks computed while the forward runs."""
        return self.runner.execute(step, self._start_masks(step))

    def _start_masks(self, step: ScheduleResult) -> PendingMasks | None:
        sampling = (c.seq for c in step.chunks if c.samples)
        matchers = [
            (row, seq.sampler.matcher) for row, seq in enumerate(sampling) if seq.sampler.matcher is not None
        ]
        if not matchers:
            return None
        if self.mask_worker is None:
            self.mask_worker = TokenMaskWorker(
                self.grammar_compiler().vocab_size, self.config.vocab_size, self.device
            )
        return self.mask_worker.start(matchers)

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
                tokens = self._execute(alone)
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
            # A complete grammar allows nothing but an end token: end now, not a step later.
            if seq.detokenizer.stopped or seq.sampler.grammar_complete:
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
