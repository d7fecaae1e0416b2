"""The panes of the window and the bridge between them and the engine.

A broadcast is one batched engine call: every targeted local pane's prompt
(its kept ids plus the new message, see app.conversation) goes to
`Engine.start_batch_async` with that pane's own sampling parameters, and one
task on the asyncio loop routes each `(idx, StreamEvent)` to its pane. A
remote pane (one set to an OpenAI-compatible server, app.remote_pane) gets
its own streaming request instead, with the same events. The
engine thread hands events over with `loop.call_soon_threadsafe`; nothing
here ever blocks the loop: model loading and engine shutdown run on their
own threads and report back through the loop.

Every method must be called on the loop's thread (under qasync, the Qt GUI
thread), and every listener is called there too.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from engine.engine import Engine
from engine.errors import EngineError, LoadCancelled
from engine.sampling import SamplingParams

from app.conversation import Conversation, MessageState, ReplyStats
from app.errors import (
    AppError,
    ContextFullError,
    EmptyMessageError,
    EngineNotReadyError,
    LastPaneError,
    MessageIndexError,
    NoTargetError,
    NothingToRegenerateError,
    PaneBusyError,
    UnknownPaneError,
)
from app.events import (
    EngineStateChanged,
    Listener,
    MessageAppended,
    MessagesTruncated,
    PaneAdded,
    PaneClosed,
    PanesReordered,
    PaneUpdated,
    ReplyDelta,
    ReplyFinished,
    WorkspaceEvent,
)
from app.openai_client import RemoteError
from app.remote_pane import RemoteBackend, RemoteReply
from app.settings import Settings

if TYPE_CHECKING:
    from engine.batch import AsyncBatch
    from engine.engine import EngineStats
    from engine.progress import LoadProgress
    from engine.sequence import RequestOutput

log = logging.getLogger(__name__)

T = TypeVar("T")

# Seconds shutdown() gives running replies to end and the engine to close
# before it lets the (daemon) engine thread go.
SHUTDOWN_TIMEOUT_S = 1.5

_FINAL_STATES: dict[str, MessageState] = {"stop": "complete", "length": "complete", "abort": "stopped"}


@dataclass(eq=False)
class Pane:
    """One column of the window: a conversation and the backend it runs on."""

    id: int  # stable and unique for the workspace's lifetime
    title: str
    conversation: Conversation
    # None: the workspace's local engine serves the pane; otherwise a remote
    # OpenAI-compatible server does (its repr leaves the API key out).
    remote: RemoteBackend | None = None
    _run: _Run | RemoteReply | None = field(default=None, repr=False)

    @property
    def backend(self) -> str:
        """"local" or "remote"."""
        return "local" if self.remote is None else "remote"

    @property
    def busy(self) -> bool:
        """True while a reply is streaming into the pane."""
        return self.conversation.streaming


@dataclass(eq=False)
class _Run:
    """One batched engine call and the panes its requests belong to (by request index)."""

    batch: AsyncBatch
    panes: list[Pane]
    task: asyncio.Task[None] | None = None

    def abort(self, pane: Pane | None = None) -> None:
        if pane is None:
            self.batch.abort()
        else:
            self.batch.abort(self.panes.index(pane))


class Turn:
    """What `send` / `regenerate` / `edit_and_resend` started: one reply per
    pane, the local ones in one engine batch, each remote one on its own."""

    def __init__(self, panes: list[Pane], local: _Run | None, remote: list[RemoteReply]) -> None:
        self._panes = panes
        self._local = local
        self._remote = remote

    @property
    def pane_ids(self) -> list[int]:
        return [pane.id for pane in self._panes]

    @property
    def request_ids(self) -> list[int]:
        """The engine's request ids of the local panes' replies."""
        return list(self._local.batch.request_ids) if self._local is not None else []

    def _tasks(self) -> list[asyncio.Task[None]]:
        runs: list[_Run | RemoteReply] = [*([self._local] if self._local else []), *self._remote]
        return [run.task for run in runs if run.task is not None]

    @property
    def done(self) -> bool:
        return all(task.done() for task in self._tasks())

    async def wait(self) -> None:
        """Until every reply of the turn has ended (complete, stopped or failed)."""
        tasks = self._tasks()
        if tasks:
            # asyncio.wait, not await: neither cancelling the waiter cancels
            # the replies nor does a shutdown that cancels them raise here.
            await asyncio.wait(tasks)

    def stop(self) -> None:
        if self._local is not None:
            self._local.abort()
        for reply in self._remote:
            reply.abort()


class Workspace:
    """The panes, their conversations, and the engine they share."""

    def __init__(self, settings: Settings | None = None, *, engine: Engine | None = None) -> None:
        """`engine`: an engine that is already loaded (tests, scripts); otherwise call `load_engine`."""
        self.settings = settings if settings is not None else Settings()
        self.panes: list[Pane] = []
        self.engine: Engine | None = engine
        self.engine_state = "ready" if engine is not None else "unloaded"
        self.load_progress: LoadProgress | None = None
        self.load_error: str | None = None
        self._listeners: list[Listener] = []
        self._pane_ids = itertools.count(1)
        self._runs: set[_Run | RemoteReply] = set()
        self._load_cancel: threading.Event | None = None
        self._closing: set[asyncio.Task[None]] = set()  # remote clients being closed

    # -- observing -------------------------------------------------------------

    def subscribe(self, callback: Listener) -> Callable[[], None]:
        """Call `callback(event)` for every WorkspaceEvent; returns the function that unsubscribes."""
        self._listeners.append(callback)

        def unsubscribe() -> None:
            if callback in self._listeners:
                self._listeners.remove(callback)

        return unsubscribe

    def _emit(self, event: WorkspaceEvent) -> None:
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:  # a view's bug must not stop replies streaming into the others
                log.exception("workspace listener failed on %s", type(event).__name__)

    # -- panes -------------------------------------------------------------

    def pane(self, pane_id: int) -> Pane:
        for pane in self.panes:
            if pane.id == pane_id:
                return pane
        raise UnknownPaneError(pane_id)

    def index_of(self, pane_id: int) -> int:
        return self.panes.index(self.pane(pane_id))

    def add_pane(self, after: int | None = None) -> Pane:
        """A new pane with the settings' default parameters and system prompt,
        right of pane `after` (at the end when None)."""
        conversation = Conversation(
            system_prompt=self.settings.default_system_prompt,
            params=self.settings.default_params,
            model_id=self.settings.model,
            context_limit=self._context_limit(),
        )
        return self._insert(conversation, after)

    def fork_pane(self, pane_id: int, message_index: int) -> Pane:
        """A new pane, right of the source, holding its conversation up to and
        including `message_index`; its next turn reuses the source's cached pages."""
        source = self.pane(pane_id)
        remote = source.remote.copy() if source.remote is not None else None
        return self._insert(source.conversation.fork(message_index), pane_id, title=f"{source.title} fork", remote=remote)

    def _insert(
        self, conversation: Conversation, after: int | None, title: str | None = None, remote: RemoteBackend | None = None
    ) -> Pane:
        pane_id = next(self._pane_ids)
        pane = Pane(pane_id, title or f"Pane {pane_id}", conversation, remote)
        index = len(self.panes) if after is None else self.index_of(after) + 1
        self.panes.insert(index, pane)
        self._emit(PaneAdded(pane, index))
        return pane

    def close_pane(self, pane_id: int) -> None:
        """Remove a pane, stopping its reply if one is streaming. The last pane cannot be closed."""
        pane = self.pane(pane_id)
        if len(self.panes) == 1:
            raise LastPaneError()
        self._abort(pane)
        self.panes.remove(pane)
        if pane.remote is not None:
            self._close_backend(pane.remote, pane._run)
        self._emit(PaneClosed(pane_id))

    def move_pane(self, pane_id: int, new_index: int) -> None:
        pane = self.pane(pane_id)
        if not 0 <= new_index < len(self.panes):
            raise IndexError(f"Position {new_index} is outside 0..{len(self.panes) - 1}")
        self.panes.remove(pane)
        self.panes.insert(new_index, pane)
        self._emit(PanesReordered([p.id for p in self.panes]))

    def clear_pane(self, pane_id: int) -> None:
        """Start the pane's conversation over (its parameters and system prompt stay)."""
        pane = self.pane(pane_id)
        self._refuse_busy([pane])
        self._truncate(pane, 0)

    def set_params(self, pane_id: int, params: SamplingParams) -> None:
        """The pane's sampling parameters from its next reply on."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, not {type(params).__name__}")
        self.pane(pane_id).conversation.params = params
        self._emit(PaneUpdated(pane_id))

    def set_system_prompt(self, pane_id: int, text: str) -> None:
        """The pane's system prompt from its next reply on (earlier turns are re-read with it)."""
        self.pane(pane_id).conversation.system_prompt = text
        self._emit(PaneUpdated(pane_id))

    def set_title(self, pane_id: int, title: str) -> None:
        self.pane(pane_id).title = title
        self._emit(PaneUpdated(pane_id))

    async def set_remote(self, pane_id: int, base_url: str, model: str, api_key: str | None = None) -> RemoteBackend:
        """Serve the pane from an OpenAI-compatible server from its next reply on.

        The server is checked first (GET /v1/models must list `model`); any
        failure raises the client's RemoteError and leaves the pane as it was.
        """
        pane = self.pane(pane_id)
        self._refuse_busy([pane])
        try:
            backend = RemoteBackend.create(base_url, model, api_key)
        except ValueError as exc:
            raise RemoteError(str(exc)) from None
        try:
            await backend.check()
            self._refuse_busy([pane])  # a reply may have started while the server was asked
            if pane not in self.panes:
                raise UnknownPaneError(pane_id)
        except BaseException:
            await backend.aclose()
            raise
        old, pane.remote = pane.remote, backend
        if old is not None:
            self._close_backend(old, None)
        pane.conversation.model_id = backend.model
        pane.conversation.context_limit = 0  # the server does not say
        self._emit(PaneUpdated(pane_id))
        return backend

    def set_local(self, pane_id: int) -> None:
        """Serve the pane from the local engine again (from its next reply on)."""
        pane = self.pane(pane_id)
        if pane.remote is None:
            return
        self._refuse_busy([pane])
        old, pane.remote = pane.remote, None
        self._close_backend(old, None)
        pane.conversation.model_id = self.settings.model
        pane.conversation.context_limit = self._context_limit()
        self._emit(PaneUpdated(pane_id))

    def _close_backend(self, backend: RemoteBackend, run: _Run | RemoteReply | None) -> None:
        """Close a backend's client once its last reply (if any) has let go of it."""

        async def close() -> None:
            if run is not None and run.task is not None:
                await asyncio.wait([run.task])
            await backend.aclose()

        task = asyncio.get_running_loop().create_task(close(), name="tandem-remote-close")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    # -- turns -------------------------------------------------------------

    async def send(self, text: str, targets: Sequence[int] | None = None) -> Turn:
        """Send `text` to the target panes (every pane when None): the local
        panes as one batched engine call, each remote pane as its own request.

        Returns as soon as the requests are queued; the replies stream in as
        events (await `turn.wait()` for the end). Nothing is sent to any pane
        when a target is busy (PaneBusyError), the engine is not ready for a
        local target (EngineNotReadyError) or a prompt cannot run (ContextFullError, or the
        engine's PromptError).
        """
        panes = self._targets(targets)
        local = [pane for pane in panes if pane.remote is None]
        engine = self._ready_engine() if local else None
        if not text.strip():
            raise EmptyMessageError()
        self._refuse_busy(panes)
        batch, prompts = None, []
        if engine is not None:
            prompts = [pane.conversation.next_prompt(engine.tokenizer, user_text=text) for pane in local]
            batch = self._start_batch(engine, local, prompts)
        for pane in panes:
            index = pane.conversation.append_user(text)
            self._emit(MessageAppended(pane.id, index))
        return self._begin_turn(panes, batch, prompts)

    async def regenerate(self, pane_id: int) -> Turn:
        """Replace the pane's last reply with a new one (or answer a last user message that has none)."""
        pane = self.pane(pane_id)
        engine = self._ready_engine() if pane.remote is None else None
        self._refuse_busy([pane])
        conversation = pane.conversation
        length = len(conversation.messages)
        while length and conversation.messages[length - 1].role == "assistant":
            length -= 1
        if not length or conversation.messages[length - 1].role != "user":
            raise NothingToRegenerateError(pane.title)
        batch, prompts = None, []
        if engine is not None:
            prompts = [conversation.next_prompt(engine.tokenizer, upto=length)]
            batch = self._start_batch(engine, [pane], prompts)
        self._truncate(pane, length)
        return self._begin_turn([pane], batch, prompts)

    async def edit_and_resend(self, pane_id: int, message_index: int, text: str) -> Turn:
        """Replace user message `message_index` with `text`, drop every message after it, and reply anew."""
        pane = self.pane(pane_id)
        engine = self._ready_engine() if pane.remote is None else None
        self._refuse_busy([pane])
        if not text.strip():
            raise EmptyMessageError()
        conversation = pane.conversation
        if not 0 <= message_index < len(conversation.messages) or conversation.messages[message_index].role != "user":
            raise MessageIndexError(f"Message {message_index} of {pane.title} is not a message you wrote.")
        batch, prompts = None, []
        if engine is not None:
            prompts = [conversation.next_prompt(engine.tokenizer, user_text=text, upto=message_index)]
            batch = self._start_batch(engine, [pane], prompts)
        self._truncate(pane, message_index)
        index = conversation.append_user(text)
        self._emit(MessageAppended(pane.id, index))
        return self._begin_turn([pane], batch, prompts)

    def stop(self, pane_id: int | None = None) -> None:
        """Stop the pane's reply (every running reply when None). A stopped
        reply keeps what it had written, marked "stopped"; the pane becomes
        idle when the engine's last event for it arrives."""
        if pane_id is not None:
            self._abort(self.pane(pane_id))
            return
        for run in list(self._runs):
            run.abort()

    async def wait_idle(self) -> None:
        """Until no reply is streaming in any pane."""
        while self._runs:
            tasks = [run.task for run in self._runs if run.task is not None]
            if not tasks:
                return
            await asyncio.wait(tasks)

    def _ready_engine(self) -> Engine:
        if self.engine is None or self.engine_state != "ready":
            raise EngineNotReadyError(self.engine_state, self.load_error)
        return self.engine

    def _targets(self, targets: Sequence[int] | None) -> list[Pane]:
        if targets is None:
            panes = list(self.panes)
        else:
            panes = []
            for pane_id in targets:
                pane = self.pane(pane_id)
                if pane not in panes:
                    panes.append(pane)
        if not panes:
            raise NoTargetError()
        return panes

    @staticmethod
    def _refuse_busy(panes: Sequence[Pane]) -> None:
        busy = [pane for pane in panes if pane.busy]
        if busy:
            raise PaneBusyError([pane.title for pane in busy], [pane.id for pane in busy])

    def _start_batch(self, engine: Engine, panes: Sequence[Pane], prompts: Sequence[list[int]]) -> AsyncBatch:
        for pane, prompt in zip(panes, prompts):
            conversation = pane.conversation
            limit = conversation.context_limit
            if limit and len(prompt) + conversation.params.max_tokens > limit:
                raise ContextFullError(pane.title, len(prompt), conversation.params.max_tokens, limit)
        # Either every request is queued or (an error raised here) none is.
        return engine.start_batch_async(list(prompts), params=[pane.conversation.params for pane in panes])

    def _truncate(self, pane: Pane, length: int) -> None:
        if length < len(pane.conversation.messages):
            pane.conversation.truncate(length)
            self._emit(MessagesTruncated(pane.id, length))

    def _begin_turn(self, panes: list[Pane], batch: AsyncBatch | None, prompts: Sequence[list[int]]) -> Turn:
        """Start the replies: the local panes' (in `batch`, one prompt each, in order) and the remote panes'."""
        run = None
        if batch is not None:
            run = _Run(batch, [pane for pane in panes if pane.remote is None])
            for pane, prompt in zip(run.panes, prompts):
                index = pane.conversation.begin_reply(prompt)
                pane._run = run
                self._emit(MessageAppended(pane.id, index))
                self._emit(PaneUpdated(pane.id))
            self._runs.add(run)
            run.task = asyncio.get_running_loop().create_task(self._pump(run), name="tandem-replies")
        remote = [self._begin_remote(pane) for pane in panes if pane.remote is not None]
        return Turn(panes, run, remote)

    def _begin_remote(self, pane: Pane) -> RemoteReply:
        """Stream the pane's reply from its server: the conversation's text as chat messages, no token ids."""
        assert pane.remote is not None
        conversation = pane.conversation
        messages = conversation.chat_messages()

        def on_delta(text: str, stats: ReplyStats) -> None:
            index = conversation.streaming_index
            if pane._run is not reply or index is None:
                return
            conversation.add_reply_delta(text, [], stats)
            if pane in self.panes:
                self._emit(ReplyDelta(pane.id, index, text, stats))

        def on_end(state: MessageState, stats: ReplyStats | None, error: str | None) -> None:
            if pane._run is reply:
                self._end_reply_with(pane, state, stats=stats, error=error)

        index = conversation.begin_reply([])
        reply = RemoteReply(pane.remote, messages, conversation.params, on_delta, on_end)
        pane._run = reply
        self._runs.add(reply)
        reply.task.add_done_callback(lambda _task: self._runs.discard(reply))
        self._emit(MessageAppended(pane.id, index))
        self._emit(PaneUpdated(pane.id))
        return reply

    async def _pump(self, run: _Run) -> None:
        """Route the batch's events to their panes until every request has ended."""
        try:
            async for idx, event in run.batch:
                pane = run.panes[idx]
                conversation = pane.conversation
                index = conversation.streaming_index
                if index is None:
                    continue
                if event.text or event.token_ids:
                    conversation.add_reply_delta(event.text, event.token_ids, ReplyStats.from_event(event))
                    if pane in self.panes:
                        self._emit(ReplyDelta(pane.id, index, event.text, conversation.messages[index].stats))
                if event.output is not None:
                    self._end_reply(pane, event.output)
        except Exception as exc:  # a bug between engine and app: end the replies instead of leaving them "streaming"
            log.exception("routing replies failed")
            for pane in run.panes:
                if pane._run is run and pane.busy:
                    self._end_reply_with(pane, "error", error=f"The reply was lost: {exc}")
        except asyncio.CancelledError:
            for pane in run.panes:
                if pane._run is run and pane.busy:
                    self._end_reply_with(pane, "stopped")
            raise
        finally:
            self._runs.discard(run)

    def _end_reply(self, pane: Pane, output: RequestOutput) -> None:
        state = _FINAL_STATES.get(output.finish_reason, "error")
        error = None
        if state == "error":
            error = str(output.error) if output.error is not None else "The engine could not finish this reply."
        self._end_reply_with(
            pane, state, text=output.text, token_ids=output.token_ids, stats=ReplyStats.from_output(output), error=error
        )

    def _end_reply_with(self, pane: Pane, state: MessageState, **final: Any) -> None:
        conversation = pane.conversation
        index = conversation.streaming_index
        if index is None:
            return
        conversation.end_reply(state, **final)
        pane._run = None
        if pane in self.panes:
            self._emit(ReplyFinished(pane.id, index))
            self._emit(PaneUpdated(pane.id))

    def _abort(self, pane: Pane) -> None:
        run = pane._run
        if run is None or not pane.busy:
            return
        if isinstance(run, _Run):
            run.abort(pane)
        else:
            run.abort()

    # -- the engine ----------------------------------------------------------

    def stats(self) -> EngineStats | None:
        """The engine's statistics (KV pages, prefix hits, speed), or None without a ready engine."""
        if self.engine is None or self.engine_state != "ready":
            return None
        return self.engine.stats()

    async def load_engine(self, settings: Settings | None = None) -> bool:
        """Load the model the settings name, off the loop's thread, reporting
        progress as EngineStateChanged("loading", progress) events.

        Replaces an engine that is already loaded (its replies are stopped
        first). Returns True when the engine is ready; a failure is reported
        as state "error" with `load_error` saying why, not raised.
        """
        if settings is not None:
            self.settings = settings
        if self.engine_state == "closed":
            raise EngineNotReadyError("closed")
        if self._load_cancel is not None:
            self._load_cancel.set()  # a newer request supersedes a load in progress
        if self.engine is not None:
            await self._retire_engine()
        loop = asyncio.get_running_loop()
        cancel = threading.Event()
        self._load_cancel = cancel
        self._set_engine_state("loading", None, None)

        def on_progress(progress: LoadProgress) -> None:  # on the loading thread
            _post(loop, self._on_load_progress, cancel, progress)

        kwargs = self.settings.engine_kwargs()
        try:
            engine = await _in_thread(
                loop, lambda: Engine(**kwargs, on_progress=on_progress, cancel=cancel), "tandem-load"
            )
        except LoadCancelled:
            return False
        except (EngineError, AppError, OSError) as exc:
            if not cancel.is_set():
                self._load_cancel = None
                self._set_engine_state("error", None, str(exc))
            return False
        except Exception as exc:  # an unexpected failure is still shown, not swallowed
            log.exception("loading the model failed")
            if not cancel.is_set():
                self._load_cancel = None
                self._set_engine_state("error", None, f"{type(exc).__name__}: {exc}")
            return False
        if cancel.is_set():  # superseded or shut down while it loaded
            threading.Thread(target=engine.close, name="tandem-close", daemon=True).start()
            return False
        self._load_cancel = None
        self.engine = engine
        for pane in self.panes:
            if pane.remote is None:
                pane.conversation.context_limit = engine.max_context
        self._set_engine_state("ready", None, None)
        for pane in self.panes:
            self._emit(PaneUpdated(pane.id))
        return True

    def _on_load_progress(self, cancel: threading.Event, progress: LoadProgress) -> None:
        if cancel is self._load_cancel and not cancel.is_set():
            self._set_engine_state("loading", progress, None)

    def _set_engine_state(self, state: str, progress: LoadProgress | None, error: str | None) -> None:
        self.engine_state = state
        self.load_progress = progress
        self.load_error = error
        self._emit(EngineStateChanged(state, progress, error))

    def _context_limit(self) -> int:
        return self.engine.max_context if self.engine is not None and self.engine_state == "ready" else 0

    async def _retire_engine(self, timeout: float = SHUTDOWN_TIMEOUT_S, *, remote_too: bool = False) -> None:
        """Stop every local reply (and remote one, with `remote_too`), close
        the engine (on its own thread) and forget it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        engine, self.engine = self.engine, None
        runs = [run for run in self._runs if remote_too or isinstance(run, _Run)]
        # The aborts reach the engine's queue before the shutdown does, so the
        # replies end as "stopped" (kept as far as they got), not as failed.
        for run in runs:
            run.abort()
        if engine is not None:
            try:
                await asyncio.wait_for(_in_thread(loop, engine.close, "tandem-close"), timeout)
            except TimeoutError:
                log.warning("the engine did not close within %.1f s; leaving its thread behind", timeout)
        tasks = [run.task for run in runs if run.task is not None and not run.task.done()]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - loop.time()))
            for task in pending:
                task.cancel()  # ends its replies as "stopped"
            if pending:
                await asyncio.wait(pending)

    async def shutdown(self) -> None:
        """Stop every reply (keeping what they wrote) and close the engine, within a second or two."""
        if self.engine_state == "closed":
            return
        if self._load_cancel is not None:
            self._load_cancel.set()
            self._load_cancel = None
        await self._retire_engine(remote_too=True)
        for pane in self.panes:
            if pane.remote is not None:
                await pane.remote.aclose()
        if self._closing:
            await asyncio.wait(list(self._closing), timeout=SHUTDOWN_TIMEOUT_S)
        self._set_engine_state("closed", None, None)


def _post(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    """Run fn(*args) on the loop from another thread; nothing if the loop has closed."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the loop closed: the program is ending
        pass


async def _in_thread(loop: asyncio.AbstractEventLoop, fn: Callable[[], T], name: str) -> T:
    """fn() on a new daemon thread, awaited without blocking the loop.

    Not the loop's default executor: a model load that outlives the window
    must not keep the process from exiting (the executor's threads are joined
    at exit, a daemon thread is not).
    """
    future: asyncio.Future[T] = loop.create_future()

    def settle(setter: Callable[[Any], None], value: Any) -> None:
        if not future.done():
            setter(value)

    def work() -> None:
        try:
            result = fn()
        except BaseException as exc:
            _post(loop, settle, future.set_exception, exc)
        else:
            _post(loop, settle, future.set_result, result)

    threading.Thread(target=work, name=name, daemon=True).start()
    return await future
