"""The panes of the window and the bridge between them and the engines.

A `Workspace` holds the panes (app.workspace.pane: each a conversation and
the backend it runs on), the models they run (app.workspace.model_slots:
one engine per model, loaded and closed off the loop's thread) and the
replies streaming into them (app.workspace.replies). A broadcast is one
batched engine call per model: every targeted local pane's prompt (its kept
ids plus the new message, see app.workspace.conversation; cut to fit by
app.workspace.context_policy) goes to `Engine.start_batch_async` with that
pane's own sampling parameters. A remote pane (one set to an
OpenAI-compatible server, app.remote.remote_pane) gets its own streaming
request instead, with the same events. The engine thread hands events over
with `loop.call_soon_threadsafe`; nothing here ever blocks the loop.

Every method must be called on the loop's thread (under qasync, the Qt GUI
thread), and every listener is called there too.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from engine import reasoning
from engine.documents import Document, user_message_with_documents
from engine.params import SamplingParams

from app.errors import (
    DocumentsTooLargeError,
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
    ReplyVersionShown,
    WorkspaceEvent,
)
from app.remote.openai_client import RemoteError
from app.remote.remote_pane import RemoteBackend, RemoteReply
from app.settings import Settings
from app.workspace.attachments import plan_send_beside
from app.workspace.carry_forward import CarryResult, carried_reply, prompt_for_carried_ids, why_not_carried
from app.workspace.context_policy import PromptPlan, drop_notice, plan_prompt
from app.workspace.conversation import CONTEXT_POLICIES, Conversation
from app.workspace.model_slots import SHUTDOWN_TIMEOUT_S, ModelSlot, ModelSlots
from app.workspace.pane import Pane, is_automatic_title
from app.workspace.pane_defaults import new_pane_params
from app.workspace.replies import Replies, ReplyBatch, Turn, start_batches

if TYPE_CHECKING:
    from engine import Engine, EngineStats
    from engine.progress import LoadProgress

log = logging.getLogger(__name__)


class Workspace:
    """The panes, their conversations, and the engines they share."""

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
        self._models = ModelSlots(
            resolve_model=resolve_model if resolve_model is not None else (lambda model_id: model_id),
            model_options=model_options if model_options is not None else (lambda model_id: {}),
            on_change=self._slot_changed,
        )
        if engine is not None:
            self._models.adopt(self.settings.model, engine)
        self._closed = False
        self._listeners: list[Listener] = []
        self._pane_ids = itertools.count(1)
        self._replies = Replies(self._emit, lambda pane: pane in self.panes)
        self._closing: set[asyncio.Task[None]] = set()  # remote clients being closed

    @property
    def closed(self) -> bool:
        """True once `shutdown` has begun: every model's state reads "closed" and none can be loaded."""
        return self._closed

    # -- the models -------------------------------------------------------------

    @property
    def default_model(self) -> str:
        """The model a new pane starts on (the settings' model)."""
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
        slot = self._models.get(self.default_model)
        return slot.progress if slot is not None else None

    @property
    def load_error(self) -> str | None:
        slot = self._models.get(self.default_model)
        return slot.error if slot is not None else None

    def slot_model_ids(self) -> list[str]:
        """Every model that is loading, ready or failed to load, in the order they were asked for."""
        return self._models.model_ids()

    def model_slot(self, model_id: str) -> ModelSlot | None:
        """The model's slot (its state, load progress, error), or None when it was never loaded or is unloaded."""
        return self._models.get(model_id)

    def engine_for(self, model_id: str) -> Engine | None:
        """The model's engine when it is loaded and ready, else None."""
        return self._models.engine_for(model_id)

    def model_state(self, model_id: str) -> str:
        """"unloaded" | "loading" | "ready" | "error", or "closed" after shutdown."""
        if self._closed:
            return "closed"
        return self._models.state(model_id)

    def pane_model_state(self, pane_id: int) -> str:
        """"ready" for a remote pane; its model's state for a local one."""
        pane = self.pane(pane_id)
        if pane.remote is not None:
            return "closed" if self._closed else "ready"
        return self.model_state(pane.conversation.model_id)

    def loaded_models(self) -> dict[str, Engine]:
        """Model id -> engine, for every model that is ready."""
        return self._models.ready_engines()

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
        params, source = self._default_params(self.settings.model)
        conversation = Conversation(
            system_prompt=self.settings.default_system_prompt,
            params=params,
            model_id=self.settings.model,
            context_limit=self._context_limit(self.settings.model),
            context_policy=self.settings.context_policy,  # type: ignore[arg-type]
        )
        return self._insert(conversation, after, params_source=source)

    def _default_params(self, model_id: str) -> tuple[SamplingParams, str]:
        engine = self._models.engine_for(model_id)
        return new_pane_params(self.settings.default_params, engine.recommended_sampling if engine else {})

    def _renew_default_params(self, pane: Pane) -> None:
        """A pane whose settings the user has not changed takes its model's
        (a model loaded after the pane opened, or another model chosen)."""
        if pane.params_source and pane.remote is None:
            pane.conversation.params, pane.params_source = self._default_params(pane.conversation.model_id)

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
        self._renew_default_params(pane)
        self._emit(PaneUpdated(pane_id))

    def set_context_policy(self, pane_id: int, policy: str) -> None:
        """"stop" (refuse a turn that does not fit) or "drop_oldest" (leave the oldest turns out)."""
        if policy not in CONTEXT_POLICIES:
            raise ValueError(f"Unknown context policy {policy!r}")
        self.pane(pane_id).conversation.context_policy = policy  # type: ignore[assignment]
        self._emit(PaneUpdated(pane_id))

    def has_thinking_switch(self, pane_id: int) -> bool:
        """Whether the pane's model can be told not to think (its template reads `enable_thinking`)."""
        pane = self.pane(pane_id)
        engine = self.engine_for(pane.conversation.model_id) if pane.remote is None else None
        return engine is not None and reasoning.template_has_thinking_switch(engine.tokenizer.chat_template_source)

    def set_thinking(self, pane_id: int, on: bool) -> None:
        """"Think before answering" (the model's thinking switch), from the pane's next reply."""
        self.pane(pane_id).conversation.thinking = on
        self._emit(PaneUpdated(pane_id))

    def fork_pane(self, pane_id: int, message_index: int) -> Pane:
        """A new pane, right of the source, holding its conversation up to and
        including `message_index`; its next turn reuses the source's cached pages."""
        source = self.pane(pane_id)
        remote = source.remote.copy() if source.remote is not None else None
        # A pane the user named gives its name to the fork; a numbered one's fork takes the next number.
        title = f"{source.name} fork" if source.name else None
        return self._insert(source.conversation.fork(message_index), pane_id, title=title, remote=remote)

    def _insert(
        self, conversation: Conversation, after: int | None, title: str | None = None,
        remote: RemoteBackend | None = None, params_source: str = "",
    ) -> Pane:
        pane_id = next(self._pane_ids)
        name = title if title and not is_automatic_title(title) else ""
        pane = Pane(pane_id, name, conversation, remote, params_source=params_source)
        conversation.set_label(name)
        index = len(self.panes) if after is None else self.index_of(after) + 1
        self.panes.insert(index, pane)
        renumbered = self._renumber()
        self._emit(PaneAdded(pane, index))
        self._announce_renumbered(renumbered, pane)
        return pane

    def _renumber(self) -> list[Pane]:
        """Number the panes 1..N left to right; returns those whose number changed."""
        changed = []
        for number, pane in enumerate(self.panes, 1):
            if pane.number != number:
                pane.number = number
                changed.append(pane)
        return changed

    def _announce_renumbered(self, panes: list[Pane], added: Pane | None = None) -> None:
        for pane in panes:
            if pane is not added and pane in self.panes:
                self._emit(PaneUpdated(pane.id))

    def close_pane(self, pane_id: int) -> None:
        """Remove a pane, stopping its reply if one is streaming. The last pane cannot be closed."""
        pane = self.pane(pane_id)
        if len(self.panes) == 1:
            raise LastPaneError()
        self._replies.abort(pane)
        self.panes.remove(pane)
        if pane.remote is not None:
            self._close_backend(pane.remote, pane.running)
        renumbered = self._renumber()
        self._emit(PaneClosed(pane_id))
        self._announce_renumbered(renumbered)

    def move_pane(self, pane_id: int, new_index: int) -> None:
        pane = self.pane(pane_id)
        if not 0 <= new_index < len(self.panes):
            raise IndexError(f"Position {new_index} is outside 0..{len(self.panes) - 1}")
        self.panes.remove(pane)
        self.panes.insert(new_index, pane)
        renumbered = self._renumber()
        self._emit(PanesReordered([p.id for p in self.panes]))
        self._announce_renumbered(renumbered)

    def clear_pane(self, pane_id: int) -> None:
        """Start the pane's conversation over (its parameters and system prompt stay)."""
        pane = self.pane(pane_id)
        self._refuse_busy([pane])
        self._truncate(pane, 0)

    def set_params(self, pane_id: int, params: SamplingParams) -> None:
        """The pane's sampling parameters from its next reply on."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, not {type(params).__name__}")
        pane = self.pane(pane_id)
        if params != pane.conversation.params:  # applying the popover unchanged is no choice
            pane.conversation.params, pane.params_source = params, ""
        self._emit(PaneUpdated(pane_id))

    def set_system_prompt(self, pane_id: int, text: str) -> None:
        """The pane's system prompt from its next reply on (earlier turns are re-read with it)."""
        self.pane(pane_id).conversation.system_prompt = text
        self._emit(PaneUpdated(pane_id))

    def set_title(self, pane_id: int, title: str) -> None:
        """The pane's own name; "" gives it back its number ("Pane 2")."""
        name = title.strip()
        pane = self.pane(pane_id)
        pane.name = "" if is_automatic_title(name) else name
        # The sidebar tells chats apart by their titles: a pane's name leads its chat's.
        pane.conversation.set_label(pane.name)
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

    def _close_backend(self, backend: RemoteBackend, run: ReplyBatch | RemoteReply | None) -> None:
        """Close a backend's client once its last reply (if any) has let go of it."""

        async def close() -> None:
            if run is not None and run.task is not None:
                await asyncio.wait([run.task])
            await backend.aclose()

        task = asyncio.get_running_loop().create_task(close(), name="tandem-remote-close")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    # -- turns -------------------------------------------------------------

    async def send(
        self, text: str, targets: Sequence[int] | None = None, *, skip_busy: bool = False,
        documents: Sequence[Document] = (), first_part: Collection[int] = (),
    ) -> Turn:
        """Send `text` with `documents` to the target panes (every pane when None): the local panes
        as one batched engine call per model, each remote pane as its own request. Returns once the
        requests are queued; the replies stream in as events (await `turn.wait()`). Nothing is sent
        when a target is busy (PaneBusyError), a local target's engine is not ready
        (EngineNotReadyError) or a prompt cannot run (ContextFullError, the engine's PromptError).
        With `skip_busy` a busy target is left out and named in `turn.skipped` (PaneBusyError only
        when all are). A pane the documents do not fit is left out and named in `turn.refused`, or,
        if its id is in `first_part`, gets their first parts that fit (app.workspace.attachments;
        planned on a thread); DocumentsTooLargeError when none is left."""
        targeted = self._targets(targets)
        if not text.strip() and not documents:
            raise EmptyMessageError()
        skipped = [pane for pane in targeted if pane.busy] if skip_busy else []
        if len(skipped) == len(targeted) or not skip_busy:
            self._refuse_busy(targeted)
        panes = [pane for pane in targeted if pane not in skipped]
        planned = await plan_send_beside(lambda: self._local_groups(panes), text, documents, first_part,
                                         lambda: self._refuse_busy(panes))
        if not (panes := [pane for pane in panes if pane not in planned.refused_panes]):
            raise DocumentsTooLargeError(planned.refused[0][1])
        runs = start_batches(planned.groups, planned.plans)
        for pane in panes:
            self._apply_drop(pane, planned.plans.get(id(pane)))
            index = pane.conversation.append_user(text, planned.documents.get(id(pane), tuple(documents)))
            self._emit(MessageAppended(pane.id, index))
        return self._replies.begin(panes, runs, planned.plans, skipped, planned.refused)

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
        runs = start_batches(groups, plans)
        # The reply it replaces stays as an earlier version of the turn.
        if length < len(conversation.messages):
            conversation.set_version_aside(length)
            self._emit(MessagesTruncated(pane.id, length))
        self._apply_drop(pane, plans.get(id(pane)))
        return self._replies.begin([pane], runs, plans)

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
        sent = user_message_with_documents(text, conversation.messages[message_index].attachments)
        plans = {id(pane): self._plan(engine, pane, sent, message_index) for engine, _ in groups}
        runs = start_batches(groups, plans)
        # The reply to the old text (and what followed it) stays as an earlier version of the turn.
        conversation.edit_user(message_index, text)
        self._emit(MessagesTruncated(pane.id, message_index))
        self._emit(MessageAppended(pane.id, message_index))
        self._apply_drop(pane, plans.get(id(pane)))
        return self._replies.begin([pane], runs, plans)

    def show_version(self, pane_id: int, message_index: int, version: int) -> None:
        """Show version `version` (0-based) of the reply at `message_index`; the
        pane's next turn continues from it, with its own kept token ids."""
        pane = self.pane(pane_id)
        self._refuse_busy([pane])
        conversation = pane.conversation
        conversation.show_version(message_index, version)
        self._emit(ReplyVersionShown(pane.id, message_index, conversation.user_message_of(message_index)))

    def use_in_all_panes(self, pane_id: int, message_index: int) -> CarryResult:
        """Make the pane's last reply the answer to the same message in every
        other pane, as the newest version of their answer (theirs stays a
        version), so the next broadcast continues from the same history
        everywhere (app.workspace.carry_forward). A pane whose last message
        differs is left as it was and named in the result; nothing happens
        while any pane is replying (PaneBusyError)."""
        source = self.pane(pane_id)
        reply, user_text = carried_reply(source, message_index)
        self._refuse_busy(self.panes)
        engine = self.engine_for(source.conversation.model_id) if source.remote is None else None
        tokenizer = engine.tokenizer if engine is not None else None
        result = CarryResult()
        for pane in list(self.panes):
            if pane is source:
                continue
            why = why_not_carried(pane, user_text)
            if why is not None:
                result.skipped.append((pane.id, why))
                continue
            index = pane.conversation.adopt_reply(reply, prompt_for_carried_ids(source, pane, tokenizer))
            result.carried.append(pane.id)
            self._emit(ReplyVersionShown(pane.id, index, pane.conversation.user_message_of(index)))
        return result

    def stop(self, pane_id: int | None = None) -> None:
        """Stop the pane's reply (every running reply when None). A stopped
        reply keeps what it had written, marked "stopped"; the pane becomes
        idle when the engine's last event for it arrives."""
        if pane_id is not None:
            self._replies.abort(self.pane(pane_id))
            return
        self._replies.abort_all()

    async def wait_idle(self) -> None:
        """Until no reply is streaming in any pane."""
        await self._replies.wait_idle()

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
                slot = self._models.get(model_id)
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

    @staticmethod
    def _plan(engine: Engine, pane: Pane, user_text: str | None, upto: int | None) -> PromptPlan:
        return plan_prompt(engine.tokenizer, pane.conversation, pane.title, user_text, upto)

    def _apply_drop(self, pane: Pane, plan: PromptPlan | None) -> None:
        """Insert the notice that marks where the pane's prompt now starts, when older turns were left out."""
        if plan is None or plan.start is None:
            return
        kept = sum(1 for m in pane.conversation.messages[plan.start :] if m.to_model)
        index = pane.conversation.insert_notice(plan.start, drop_notice(plan.dropped, pane.conversation.context_limit))
        # The view shows messages by position: redraw from the notice on.
        self._emit(MessagesTruncated(pane.id, index))
        for i in range(index, index + 1 + kept):
            self._emit(MessageAppended(pane.id, i))

    def _truncate(self, pane: Pane, length: int) -> None:
        if length < len(pane.conversation.messages):
            pane.conversation.truncate(length)
            self._emit(MessagesTruncated(pane.id, length))

    # -- loading, unloading, shutting down -------------------------------------------

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
        old = self._models.get(model_id)
        if old is not None:
            old.cancel_load()  # a newer request supersedes a load in progress
            await self._retire(old)
        slot = await self._models.load(model_id, self.settings.engine_kwargs())
        if slot is None or slot.engine is None:
            return False
        for pane in self.panes:
            if pane.remote is None and pane.conversation.model_id == model_id:
                pane.conversation.context_limit = slot.engine.max_context
                self._renew_default_params(pane)
        self._models.announce(slot)
        for pane in self.panes:
            self._emit(PaneUpdated(pane.id))
        return True

    async def unload_model(self, model_id: str) -> None:
        """Stop the model's replies (kept as far as they got) and close its engine, freeing its memory."""
        slot = self._models.get(model_id)
        if slot is None:
            return
        slot.cancel_load()
        await self._retire(slot)
        self._emit(EngineStateChanged("unloaded", None, None, model_id))
        for pane in self.panes:
            if pane.remote is None and pane.conversation.model_id == model_id:
                self._emit(PaneUpdated(pane.id))

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
        engine = self._models.forget(slot)
        if engine is None:
            return
        runs = self._replies.batches_of(engine)
        # The aborts reach the engine's queue before the shutdown does, so the
        # replies end as "stopped" (kept as far as they got), not as failed.
        for run in runs:
            run.abort()
        await self._models.close_engine(engine, deadline)
        await self._replies.wait_ended(runs, deadline)

    async def shutdown(self) -> None:
        """Stop every reply (keeping what they wrote) and close every engine, within a second or two."""
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SHUTDOWN_TIMEOUT_S
        slots = self._models.all()
        self._models.cancel_loads()
        remote = self._replies.remote()
        for run in remote:
            run.abort()
        await asyncio.gather(*(self._retire(slot, deadline=deadline) for slot in slots))
        await self._replies.wait_ended(remote, deadline)
        for pane in self.panes:
            if pane.remote is not None:
                await pane.remote.aclose()
        if self._closing:
            await asyncio.wait(list(self._closing), timeout=SHUTDOWN_TIMEOUT_S)
        self._emit(EngineStateChanged("closed", None, None, self.default_model))


__all__ = [
    "SHUTDOWN_TIMEOUT_S",
    "CarryResult",
    "ModelSlot",
    "Pane",
    "Turn",
    "Workspace",
]
