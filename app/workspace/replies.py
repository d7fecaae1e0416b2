"""The replies streaming into panes: one engine batch per model, one request per remote pane.

A turn (`Workspace.send`, `regenerate`, `edit_and_resend`) submits the local
panes' prompts as one `Engine.start_batch_async` call per model
(`start_batches`: all of them or none), then `Replies.begin` opens each
pane's reply and starts one task per batch on the asyncio loop that routes
each `(idx, StreamEvent)` to its pane's conversation and reports it as
events. A remote pane (app.remote.remote_pane) streams its own request with
the same events. Every method runs on the loop's thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine import reasoning

from app.events import MessageAppended, PaneUpdated, ReplyDelta, ReplyFinished, WorkspaceEvent
from app.remote.remote_pane import RemoteReply
from app.workspace.messages import MessageState, ReplyStats

if TYPE_CHECKING:
    from engine import AsyncBatch
    from engine import RequestOutput
    from engine import Engine

    from app.workspace.context_policy import PromptPlan
    from app.workspace.pane import Pane

log = logging.getLogger(__name__)

_FINAL_STATES: dict[str, MessageState] = {"stop": "complete", "length": "complete", "abort": "stopped"}


@dataclass(eq=False)
class ReplyBatch:
    """One batched engine call and the panes its requests belong to (by request index)."""

    batch: AsyncBatch
    panes: list[Pane]
    engine: Engine
    task: asyncio.Task[None] | None = None

    def abort(self, pane: Pane | None = None) -> None:
        """Stop one pane's request, or every request of the batch when None."""
        if pane is None:
            self.batch.abort()
        else:
            self.batch.abort(self.panes.index(pane))


class Turn:
    """What `send` / `regenerate` / `edit_and_resend` started: one reply per
    pane, the local ones in one engine batch per model, each remote one on its own.

    `skipped` are the targets a broadcast left out because they were still
    replying; `refused` those its documents did not fit, each with the line
    that says so (app.workspace.attachments)."""

    def __init__(
        self, panes: list[Pane], local: list[ReplyBatch], remote: list[RemoteReply], skipped: Sequence[Pane] = (),
        refused: Sequence[tuple[Pane, str]] = (),
    ) -> None:
        self._panes = panes
        self._local = local
        self._remote = remote
        self.skipped: list[Pane] = list(skipped)
        self.refused: list[tuple[Pane, str]] = list(refused)

    @property
    def pane_ids(self) -> list[int]:
        return [pane.id for pane in self._panes]

    @property
    def request_ids(self) -> list[int]:
        """The engine's request ids of the local panes' replies (batch by batch)."""
        return [rid for run in self._local for rid in run.batch.request_ids]

    def _tasks(self) -> list[asyncio.Task[None]]:
        runs: list[ReplyBatch | RemoteReply] = [*self._local, *self._remote]
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


def start_batches(groups: Sequence[tuple[Engine, list[Pane]]], plans: Mapping[int, PromptPlan]) -> list[ReplyBatch]:
    """One batch per engine, each pane with its own sampling parameters (plans by `id(pane)`).

    Either every request is queued or (an error raised here) none is.
    """
    runs: list[ReplyBatch] = []
    try:
        for engine, group in groups:
            prompts = [plans[id(pane)].prompt for pane in group]
            batch = engine.start_batch_async(prompts, params=[p.conversation.params for p in group])
            runs.append(ReplyBatch(batch, group, engine))
    except BaseException:
        for run in runs:
            run.abort()
        raise
    return runs


class Replies:
    """Every reply streaming into a pane, and the routing of its text into the pane's conversation.

    `emit` reports what changed; `is_open(pane)` says whether the pane is
    still in the workspace (a closed pane's reply ends without events).
    """

    def __init__(self, emit: Callable[[WorkspaceEvent], None], is_open: Callable[[Pane], bool]) -> None:
        self._emit = emit
        self._is_open = is_open
        self._running: set[ReplyBatch | RemoteReply] = set()

    def begin(
        self, panes: list[Pane], runs: list[ReplyBatch], plans: Mapping[int, PromptPlan], skipped: Sequence[Pane] = (),
        refused: Sequence[tuple[Pane, str]] = (),
    ) -> Turn:
        """Start the replies: the local panes' (their batches, already queued) and the remote panes'."""
        for run in runs:
            for pane in run.panes:
                prompt = plans[id(pane)].prompt
                opens = bool(reasoning.reply_start(run.engine.tokenizer, prompt))
                index = pane.conversation.begin_reply(prompt, opens_reasoning=opens)
                pane.running = run
                self._emit(MessageAppended(pane.id, index))
                self._emit(PaneUpdated(pane.id))
            self._running.add(run)
            run.task = asyncio.get_running_loop().create_task(self._pump(run), name="tandem-replies")
        remote = [self._begin_remote(pane) for pane in panes if pane.remote is not None]
        return Turn(panes, runs, remote, skipped, refused)

    def abort(self, pane: Pane) -> None:
        """Stop the pane's reply, if one is streaming (it ends "stopped", keeping its text)."""
        run = pane.running
        if run is None or not pane.busy:
            return
        if isinstance(run, ReplyBatch):
            run.abort(pane)
        else:
            run.abort()

    def abort_all(self) -> None:
        for run in list(self._running):
            run.abort()

    def batches_of(self, engine: Engine) -> list[ReplyBatch]:
        """The running batches the engine serves."""
        return [run for run in self._running if isinstance(run, ReplyBatch) and run.engine is engine]

    def remote(self) -> list[RemoteReply]:
        """The running remote replies."""
        return [run for run in self._running if isinstance(run, RemoteReply)]

    async def wait_idle(self) -> None:
        """Until no reply is streaming."""
        while self._running:
            tasks = [run.task for run in self._running if run.task is not None]
            if not tasks:
                return
            await asyncio.wait(tasks)

    @staticmethod
    async def wait_ended(runs: Sequence[ReplyBatch | RemoteReply], deadline: float) -> None:
        """Until the runs have ended; those still running at `deadline` (loop time) are cancelled."""
        loop = asyncio.get_running_loop()
        tasks = [run.task for run in runs if run.task is not None and not run.task.done()]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - loop.time()))
            for task in pending:
                task.cancel()  # ends its replies as "stopped"
            if pending:
                await asyncio.wait(pending)

    def _begin_remote(self, pane: Pane) -> RemoteReply:
        """Stream the pane's reply from its server: the conversation's text as chat messages, no token ids."""
        assert pane.remote is not None
        conversation = pane.conversation
        messages = conversation.chat_messages()

        def on_delta(text: str, stats: ReplyStats) -> None:
            index = conversation.streaming_index
            if pane.running is not reply or index is None:
                return
            conversation.add_reply_delta(text, [], stats)
            if self._is_open(pane):
                self._emit(ReplyDelta(pane.id, index, text, stats))

        def on_end(state: MessageState, stats: ReplyStats | None, error: str | None) -> None:
            if pane.running is reply:
                self._end(pane, state, stats=stats, error=error)

        index = conversation.begin_reply([])
        reply = RemoteReply(pane.remote, messages, conversation.params, on_delta, on_end)
        pane.running = reply
        self._running.add(reply)
        reply.task.add_done_callback(lambda _task: self._running.discard(reply))
        self._emit(MessageAppended(pane.id, index))
        self._emit(PaneUpdated(pane.id))
        return reply

    async def _pump(self, run: ReplyBatch) -> None:
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
                    if self._is_open(pane):
                        self._emit(ReplyDelta(pane.id, index, event.text, conversation.messages[index].stats))
                if event.output is not None:
                    self._end_with_output(pane, event.output)
        except Exception as exc:  # a bug between engine and app: end the replies instead of leaving them "streaming"
            log.exception("routing replies failed")
            for pane in run.panes:
                if pane.running is run and pane.busy:
                    self._end(pane, "error", error=f"The reply was lost: {exc}")
        except asyncio.CancelledError:
            for pane in run.panes:
                if pane.running is run and pane.busy:
                    self._end(pane, "stopped")
            raise
        finally:
            self._running.discard(run)

    def _end_with_output(self, pane: Pane, output: RequestOutput) -> None:
        state = _FINAL_STATES.get(output.finish_reason, "error")
        error = None
        if state == "error":
            error = str(output.error) if output.error is not None else "The engine could not finish this reply."
        self._end(
            pane, state, text=output.text, token_ids=output.token_ids, stats=ReplyStats.from_output(output), error=error
        )

    def _end(self, pane: Pane, state: MessageState, **final: Any) -> None:
        conversation = pane.conversation
        index = conversation.streaming_index
        if index is None:
            return
        conversation.end_reply(state, **final)
        pane.running = None
        if self._is_open(pane):
            self._emit(ReplyFinished(pane.id, index))
            self._emit(PaneUpdated(pane.id))
