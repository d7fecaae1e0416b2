"""The panes of the window and the bridge between them and the engine.

A broadcast is one batched engine call: every targeted local pane's prompt
(its kept ids plus the new message, see app.workspace.conversation) goes to
`Engine.start_batch_async` with that pane's own sampling parameters, and one
task on the asyncio loop routes each `(idx, StreamEvent)` to its pane. A
remote pane (one set to an OpenAI-compatible server, app.remote.remote_pane) gets
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from engine.llm import Engine
from engine.errors import EngineError, LoadCancelled, ModelLoadError
from engine.params import SamplingParams

from app.workspace.conversation import Conversation, MessageState, ReplyStats
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
from app.remote.openai_client import RemoteError
from app.remote.remote_pane import RemoteBackend, RemoteReply
from app.settings import Settings

if TYPE_CHECKING:
    from engine.core.batch import AsyncBatch
    from engine.llm import EngineStats
    from engine.progress import LoadProgress
    from engine.core.sequence import RequestOutput

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
class ModelSlot:
    """One model the workspace has loaded, is loading, or failed to load.

    Panes on the same model share its one engine (one batch, one prefix cache).
    """

    model_id: str
    state: str = "loading"  # "loading" | "ready" | "error"
    engine: Engine | None = None
    progress: LoadProgress | None = None
    error: str | None = None
    cancel: threading.Event | None = field(default=None, repr=False)
    # The per-model Engine arguments it was loaded with ({"quantize": "int4"}):
    # a choice changed since applies at the next load.
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class _Plan:
    """A pane's next prompt; `start` is set when older turns were left out
    (messages[start:] are what the prompt holds) and `dropped` counts them."""

    prompt: list[int]
    start: int | None = None
    dropped: int = 0


@dataclass(eq=False)
class _Run:
    """One batched engine call and the panes its requests belong to (by request index)."""

    batch: AsyncBatch
    panes: list[Pane]
    engine: Engine
    task: asyncio.Task[None] | None = None

    def abort(self, pane: Pane | None = None) -> None:
        if pane is None:
            self.batch.abort()
        else:
            self.batch.abort(self.panes.index(pane))


class Turn:
    """What `send` / `regenerate` / `edit_and_resend` started: one reply per
    pane, the local ones in one engine batch per model, each remote one on its own."""

    def __init__(self, panes: list[Pane], local: list[_Run], remote: list[RemoteReply]) -> None:
        self._panes = panes
        self._local = local
        self._remote = remote

    @property
    def pane_ids(self) -> list[int]:
        return [pane.id for pane in self._panes]

    @property
    def request_ids(self) -> list[int]:
        """The engine's request ids of the local panes' replies (batch by batch)."""
        return [rid for run in self._local for rid in run.batch.request_ids]

    def _tasks(self) -> list[asyncio.Task[None]]:
        runs: list[_Run | RemoteReply] = [*self._local, *self._remote]
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
        for run in self._local:
            run.abort()
        for reply in self._remote:
            reply.abort()


class Workspace:
    """The panes, their conversations, and the engine they share."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        engine: Engine | None = None,
        resolve_model: Callable[[str], str] | None = None,
        model_options: Callable[[str], Mapping[str, Any]] | None = None,
    ) -> None:
        """`engine`: an engine that is already loaded (tests, scripts), serving
        the settings' model; otherwise call `load_engine` / `load_model`.
        `resolve_model(model_id)` turns a pane's model id into what
        `Engine(model=...)` takes (the model registry's `engine_model`); by
        default the id is that already ("default", a folder or a .gguf file).
        `model_options(model_id)`: Engine arguments of that model alone, on
        top of the settings' (the registry's `engine_options`: its "Quantize
        at load" choice); read at every load, so a changed choice applies at
        the model's next load."""
        self.settings = settings if settings is not None else Settings()
        self.panes: list[Pane] = []
        self.slots: dict[str, ModelSlot] = {}
        if engine is not None:
            self.slots[self.settings.model] = ModelSlot(self.settings.model, "ready", engine)
        self._resolve_model = resolve_model if resolve_model is not None else (lambda model_id: model_id)
        self._model_options = model_options if model_options is not None else (lambda model_id: {})
        self._closed = False
        self._listeners: list[Listener] = []
        self._pane_ids = itertools.count(1)
        self._runs: set[_Run | RemoteReply] = set()
        self._closing: set[asyncio.Task[None]] = set()  # remote clients being closed

    # -- the default model's engine (the one a new pane starts on) ---------------

    @property
    def default_model(self) -> str:
        return self.settings.model

    @property
    def engine(self) -> Engine | None:
        """The default model's engine when it is ready."""
        return self.engine_for(self.default_model)

    @property
    def engine_state(self) -> str:
        """The default model's state: "unloaded" | "loading" | "ready" | "error", or "closed" after shutdown."""
        return self.model_state(self.default_model)

    @property
    def load_progress(self) -> LoadProgress | None:
        slot = self.slots.get(self.default_model)
        return slot.progress if slot is not None else None

    @property
    def load_error(self) -> str | None:
        slot = self.slots.get(self.default_model)
        return slot.error if slot is not None else None

    def engine_for(self, model_id: str) -> Engine | None:
        """The model's engine when it is loaded and ready, else None."""
        slot = self.slots.get(model_id)
        return slot.engine if slot is not None and slot.state == "ready" else None

    def model_state(self, model_id: str) -> str:
        if self._closed:
            return "closed"
        slot = self.slots.get(model_id)
        return slot.state if slot is not None else "unloaded"

    def pane_model_state(self, pane_id: int) -> str:
        """"ready" for a remote pane; its model's state for a local one."""
        pane = self.pane(pane_id)
        if pane.remote is not None:
            return "closed" if self._closed else "ready"
        return self.model_state(pane.conversation.model_id)

    def loaded_models(self) -> dict[str, Engine]:
        """Model id -> engine, for every model that is ready."""
        return {mid: slot.engine for mid, slot in self.slots.items() if slot.state == "ready" and slot.engine}

    def model_busy(self, model_id: str) -> bool:
        """Whether a reply is streaming from the model."""
        return any(p.busy and p.remote is None and p.conversation.model_id == model_id for p in self.panes)

    def model_in_use(self, model_id: str) -> bool:
        """Whether an open local pane is set to the model."""
        return any(p.remote is None and p.conversation.model_id == model_id for p in self.panes)

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
            context_limit=self._context_limit(self.settings.model),
            context_policy=self.settings.context_policy,  # type: ignore[arg-type]
        )
        return self._insert(conversation, after)

    def open_conversation(
        self, conversation: Conversation, after: int | None = None, *, title: str | None = None,
        remote: RemoteBackend | None = None,
    ) -> Pane:
        """A new pane showing `conversation` (a saved one, or an import)."""
        if conversation.streaming:
            raise ValueError("A conversation that is still streaming cannot be opened in a second pane")
        for pane in self.panes:
            if pane.conversation is conversation:
                raise ValueError("The conversation is already open")
        if remote is None:
            conversation.context_limit = self._context_limit(conversation.model_id)
        return self._insert(conversation, after, title=title, remote=remote)

    def set_model(self, pane_id: int, model_id: str) -> None:
        """Run the pane on the local model `model_id` from its next reply on
        (a remote pane comes back to the local engine). Loading the model is a
        separate step (`load_model`), so the caller can check its memory first."""
        pane = self.pane(pane_id)
        self._refuse_busy([pane])
        if pane.remote is not None:
            old, pane.remote = pane.remote, None
            self._close_backend(old, None)
        pane.conversation.model_id = model_id
        pane.conversation.context_limit = self._context_limit(model_id)
        self._emit(PaneUpdated(pane_id))

    def set_context_policy(self, pane_id: int, policy: str) -> None:
        """"stop" (refuse a turn that does not fit) or "drop_oldest" (leave the oldest turns out)."""
        if policy not in ("stop", "drop_oldest"):
            raise ValueError(f"Unknown context policy {policy!r}")
        self.pane(pane_id).conversation.context_policy = policy  # type: ignore[assignment]
        self._emit(PaneUpdated(pane_id))

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
        pane.conversation.context_limit = self._context_limit(self.settings.model)
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
        groups = self._local_groups(panes)
        if not text.strip():
            raise EmptyMessageError()
        self._refuse_busy(panes)
        plans = {id(pane): self._plan(engine, pane, text, None) for engine, group in groups for pane in group}
        runs = self._start_batches(groups, plans)
        for pane in panes:
            self._apply_drop(pane, plans.get(id(pane)))
            index = pane.conversation.append_user(text)
            self._emit(MessageAppended(pane.id, index))
        return self._begin_turn(panes, runs, plans)

    async def regenerate(self, pane_id: int) -> Turn:
        """Replace the pane's last reply with a new one (or answer a last user message that has none)."""
        pane = self.pane(pane_id)
        groups = self._local_groups([pane])
        self._refuse_busy([pane])
        conversation = pane.conversation
        length = len(conversation.messages)
        while length and conversation.messages[length - 1].role == "assistant":
            length -= 1
        if not length or conversation.messages[length - 1].role != "user":
            raise NothingToRegenerateError(pane.title)
        plans = {id(pane): self._plan(engine, pane, None, length) for engine, _ in groups}
        runs = self._start_batches(groups, plans)
        self._truncate(pane, length)
        self._apply_drop(pane, plans.get(id(pane)))
        return self._begin_turn([pane], runs, plans)

    async def edit_and_resend(self, pane_id: int, message_index: int, text: str) -> Turn:
        """Replace user message `message_index` with `text`, drop every message after it, and reply anew."""
        pane = self.pane(pane_id)
        groups = self._local_groups([pane])
        self._refuse_busy([pane])
        if not text.strip():
            raise EmptyMessageError()
        conversation = pane.conversation
        if not 0 <= message_index < len(conversation.messages) or conversation.messages[message_index].role != "user":
            raise MessageIndexError(f"Message {message_index} of {pane.title} is not a message you wrote.")
        plans = {id(pane): self._plan(engine, pane, text, message_index) for engine, _ in groups}
        runs = self._start_batches(groups, plans)
        self._truncate(pane, message_index)
        self._apply_drop(pane, plans.get(id(pane)))
        index = conversation.append_user(text)
        self._emit(MessageAppended(pane.id, index))
        return self._begin_turn([pane], runs, plans)

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

    def _local_groups(self, panes: Sequence[Pane]) -> list[tuple[Engine, list[Pane]]]:
        """The local panes grouped by model, each with its ready engine (EngineNotReadyError otherwise)."""
        groups: dict[str, list[Pane]] = {}
        for pane in panes:
            if pane.remote is None:
                groups.setdefault(pane.conversation.model_id, []).append(pane)
        out = []
        for model_id, group in groups.items():
            engine = self.engine_for(model_id)
            if engine is None:
                slot = self.slots.get(model_id)
                raise EngineNotReadyError(
                    self.model_state(model_id), slot.error if slot is not None else None, model=model_id
                )
            out.append((engine, group))
        return out

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

    def _plan(self, engine: Engine, pane: Pane, user_text: str | None, upto: int | None) -> _Plan:
        """The pane's next prompt, leaving its oldest turns out when its
        context policy says so and the whole conversation does not fit."""
        conversation = pane.conversation
        prompt = conversation.next_prompt(engine.tokenizer, user_text=user_text, upto=upto)
        limit = conversation.context_limit
        reserve = conversation.params.max_tokens
        if not limit or len(prompt) + reserve <= limit:
            return _Plan(prompt)
        if conversation.context_policy == "drop_oldest":
            fitted = conversation.prompt_dropping_oldest(engine.tokenizer, limit - reserve, user_text, upto)
            if fitted is not None:
                prompt, start = fitted
                first = conversation.context_start(upto)
                dropped = sum(1 for m in conversation.messages[first:start] if m.to_model)
                return _Plan(prompt, start, dropped)
        raise ContextFullError(pane.title, len(prompt), reserve, limit)

    @staticmethod
    def _start_batches(groups: list[tuple[Engine, list[Pane]]], plans: dict[int, _Plan]) -> list[_Run]:
        """One batch per engine. Either every request is queued or (an error raised here) none is."""
        runs: list[_Run] = []
        try:
            for engine, group in groups:
                prompts = [plans[id(pane)].prompt for pane in group]
                batch = engine.start_batch_async(prompts, params=[p.conversation.params for p in group])
                runs.append(_Run(batch, group, engine))
        except BaseException:
            for run in runs:
                run.abort()
            raise
        return runs

    def _apply_drop(self, pane: Pane, plan: _Plan | None) -> None:
        """Insert the notice that marks where the pane's prompt now starts, when older turns were left out."""
        if plan is None or plan.start is None:
            return
        kept = sum(1 for m in pane.conversation.messages[plan.start :] if m.to_model)
        text = (
            f"{plan.dropped} earlier message{'s' if plan.dropped != 1 else ''} no longer fit the model's "
            f"context of {pane.conversation.context_limit:,} tokens and are left out of what it reads "
            f"from here on (the system prompt is kept). They stay here for you."
        )
        index = pane.conversation.insert_notice(plan.start, text)
        # The view shows messages by position: redraw from the notice on.
        self._emit(MessagesTruncated(pane.id, index))
        for i in range(index, index + 1 + kept):
            self._emit(MessageAppended(pane.id, i))

    def _truncate(self, pane: Pane, length: int) -> None:
        if length < len(pane.conversation.messages):
            pane.conversation.truncate(length)
            self._emit(MessagesTruncated(pane.id, length))

    def _begin_turn(self, panes: list[Pane], runs: list[_Run], plans: dict[int, _Plan]) -> Turn:
        """Start the replies: the local panes' (one batch per model) and the remote panes'."""
        for run in runs:
            for pane in run.panes:
                index = pane.conversation.begin_reply(plans[id(pane)].prompt)
                pane._run = run
                self._emit(MessageAppended(pane.id, index))
                self._emit(PaneUpdated(pane.id))
            self._runs.add(run)
            run.task = asyncio.get_running_loop().create_task(self._pump(run), name="tandem-replies")
        remote = [self._begin_remote(pane) for pane in panes if pane.remote is not None]
        return Turn(panes, runs, remote)

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

    # -- the engines -------------------------------------------------------------

    def stats(self, model_id: str | None = None) -> EngineStats | None:
        """A model's engine statistics (KV pages, prefix hits, speed); the
        default model's when None; None when it is not ready."""
        engine = self.engine_for(self.default_model if model_id is None else model_id)
        return engine.stats() if engine is not None else None

    async def load_engine(self, settings: Settings | None = None) -> bool:
        """Adopt `settings` (when given) and load their model: `load_model(settings.model)`."""
        if settings is not None:
            self.settings = settings
        return await self.load_model(self.settings.model)

    async def load_model(self, model_id: str) -> bool:
        """Load a model off the loop's thread, reporting progress as
        EngineStateChanged("loading", progress) events for it.

        Reloads a model that is already loaded (its replies are stopped
        first), with the current settings. Returns True when the engine is
        ready; a failure is reported as state "error" with the slot's `error`
        saying why, not raised.
        """
        if self._closed:
            raise EngineNotReadyError("closed")
        old = self.slots.get(model_id)
        if old is not None:
            if old.cancel is not None:
                old.cancel.set()  # a newer request supersedes a load in progress
            await self._retire(old)
        loop = asyncio.get_running_loop()
        cancel = threading.Event()
        slot = ModelSlot(model_id, "loading", cancel=cancel)
        self.slots[model_id] = slot
        self._slot_changed(slot)

        def on_progress(progress: LoadProgress) -> None:  # on the loading thread
            _post(loop, self._on_load_progress, slot, progress)

        kwargs = self.settings.engine_kwargs()
        try:
            kwargs["model"] = self._resolve_model(model_id)
            slot.options = dict(self._model_options(model_id))
            kwargs.update(slot.options)
            engine = await _in_thread(
                loop, lambda: Engine(**kwargs, on_progress=on_progress, cancel=cancel), "tandem-load"
            )
        except LoadCancelled:
            return False
        except (EngineError, AppError, OSError) as exc:
            self._load_failed(slot, _load_error_text(exc, slot.options))
            return False
        except Exception as exc:  # an unexpected failure is still shown, not swallowed
            log.exception("loading the model failed")
            self._load_failed(slot, f"{type(exc).__name__}: {exc}")
            return False
        if cancel.is_set() or self.slots.get(model_id) is not slot:  # superseded, unloaded or shut down meanwhile
            threading.Thread(target=engine.close, name="tandem-close", daemon=True).start()
            return False
        slot.cancel = None
        slot.engine = engine
        slot.state = "ready"
        for pane in self.panes:
            if pane.remote is None and pane.conversation.model_id == model_id:
                pane.conversation.context_limit = engine.max_context
        self._slot_changed(slot)
        for pane in self.panes:
            self._emit(PaneUpdated(pane.id))
        return True

    async def unload_model(self, model_id: str) -> None:
        """Stop the model's replies (kept as far as they got) and close its engine, freeing its memory."""
        slot = self.slots.get(model_id)
        if slot is None:
            return
        if slot.cancel is not None:
            slot.cancel.set()
        await self._retire(slot)
        self._emit(EngineStateChanged("unloaded", None, None, model_id))
        for pane in self.panes:
            if pane.remote is None and pane.conversation.model_id == model_id:
                self._emit(PaneUpdated(pane.id))

    def _load_failed(self, slot: ModelSlot, error: str) -> None:
        if slot.cancel is not None and slot.cancel.is_set():
            return
        if self.slots.get(slot.model_id) is not slot:
            return
        slot.cancel = None
        slot.state = "error"
        slot.error = error
        self._slot_changed(slot)

    def _on_load_progress(self, slot: ModelSlot, progress: LoadProgress) -> None:
        if self.slots.get(slot.model_id) is slot and slot.state == "loading" and slot.cancel is not None \
                and not slot.cancel.is_set():
            slot.progress = progress
            self._slot_changed(slot)

    def _slot_changed(self, slot: ModelSlot) -> None:
        self._emit(EngineStateChanged(slot.state, slot.progress, slot.error, slot.model_id))

    def _context_limit(self, model_id: str) -> int:
        engine = self.engine_for(model_id)
        return engine.max_context if engine is not None else 0

    async def _retire(
        self, slot: ModelSlot, timeout: float = SHUTDOWN_TIMEOUT_S, *, deadline: float | None = None
    ) -> None:
        """Stop the model's replies, close its engine (on its own thread) and forget it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if deadline is None else deadline
        if self.slots.get(slot.model_id) is slot:
            del self.slots[slot.model_id]
        engine, slot.engine = slot.engine, None
        runs = [run for run in self._runs if isinstance(run, _Run) and run.engine is engine]
        if engine is None:
            runs = []
        # The aborts reach the engine's queue before the shutdown does, so the
        # replies end as "stopped" (kept as far as they got), not as failed.
        for run in runs:
            run.abort()
        if engine is not None:
            try:
                await asyncio.wait_for(
                    _in_thread(loop, engine.close, "tandem-close"), max(0.0, deadline - loop.time())
                )
            except TimeoutError:
                log.warning("the engine did not close in time; leaving its thread behind")
        await self._end_runs(runs, deadline)

    async def _end_runs(self, runs: Sequence[_Run | RemoteReply], deadline: float) -> None:
        loop = asyncio.get_running_loop()
        tasks = [run.task for run in runs if run.task is not None and not run.task.done()]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - loop.time()))
            for task in pending:
                task.cancel()  # ends its replies as "stopped"
            if pending:
                await asyncio.wait(pending)

    async def shutdown(self) -> None:
        """Stop every reply (keeping what they wrote) and close every engine, within a second or two."""
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SHUTDOWN_TIMEOUT_S
        slots = list(self.slots.values())
        for slot in slots:
            if slot.cancel is not None:
                slot.cancel.set()
        remote = [run for run in self._runs if isinstance(run, RemoteReply)]
        for run in remote:
            run.abort()
        await asyncio.gather(*(self._retire(slot, deadline=deadline) for slot in slots))
        await self._end_runs(remote, deadline)
        for pane in self.panes:
            if pane.remote is not None:
                await pane.remote.aclose()
        if self._closing:
            await asyncio.wait(list(self._closing), timeout=SHUTDOWN_TIMEOUT_S)
        self._emit(EngineStateChanged("closed", None, None, self.default_model))


def _load_error_text(exc: BaseException, options: Mapping[str, Any]) -> str:
    """Why a load failed, for the pane; a failure while quantizing at load
    says so and how to load the model as stored instead."""
    mode = options.get("quantize")
    # OSError: writing the quantized copy (a full disk, a read-only data folder).
    if mode and isinstance(exc, (ModelLoadError, OSError)):
        reason = str(exc).rstrip(".")
        return (
            f"Loading the model quantized to {mode} failed: {reason}. To load it as stored, set "
            "“Quantize at load” to Off in Models › Manage models."
        )
    return str(exc)


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
