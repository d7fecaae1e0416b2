"""Documents attached to a message: what each target pane would read, and what fits it.

A message with documents reaches the model as one user turn,
`user_message_with_documents(question, documents)` (engine.documents): the
same documents and question give the same text, so the same token ids in
every pane on the same model and in every later turn, and the prefix cache
(and, within one broadcast, the shared in-flight prefill) computes them
once. The message itself keeps the question and the documents apart
(`Message.attachments`), so the window shows the question with chips.

Before a send the composer asks `fit_documents` what each target pane would
receive against its context. `plan_send` then leaves out a pane the
documents do not fit, saying why, or, for the panes the user chose,
sends the first part of each document that fits (`first_parts_that_fit`,
marked incomplete so its chip says so). Nothing is ever cut silently.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.documents import Document, user_message_with_documents

from app.errors import ContextFullError
from app.workspace.context_policy import PromptPlan, plan_prompt

if TYPE_CHECKING:
    from engine import Engine
    from engine import Tokenizer

    from app.workspace.pane import Pane
    from app.workspace.workspace import Workspace

# A first part shorter than this is no help to anyone: the pane is refused instead.
MIN_FIRST_PART_CHARS = 200


@dataclass(slots=True, frozen=True)
class PaneFit:
    """What one target pane would receive: its whole next prompt with the documents.

    `prompt_tokens` is None where it cannot be counted here (a remote pane,
    a model not loaded yet); `context_limit` 0 where the size is unknown."""

    pane_id: int
    title: str
    prompt_tokens: int | None
    reply_tokens: int
    context_limit: int
    refusal: str | None = None  # one line: why the documents do not fit this pane
    uncounted: str = ""  # why `prompt_tokens` is None: "its model is not loaded", ...

    @property
    def fits(self) -> bool:
        return self.refusal is None


def refusal_line(title: str, documents: Sequence[Document], error: ContextFullError) -> str:
    names = _listed([d.name for d in documents])
    return (
        f"{names} {'does' if len(documents) == 1 else 'do'} not fit {title}: the message takes "
        f"{error.prompt_tokens:,} tokens and the reply up to {error.max_tokens:,}, over its context of "
        f"{error.context_limit:,}."
    )


def fit_documents(workspace: Workspace, question: str, documents: Sequence[Document], targets: Sequence[int]) -> list[PaneFit]:
    """For each target pane, its next prompt's tokens with the documents and whether they fit."""
    text = user_message_with_documents(question, documents)
    fits = []
    for pane_id in targets:
        pane = workspace.pane(pane_id)
        conversation = pane.conversation
        engine = workspace.engine_for(conversation.model_id) if pane.remote is None else None
        reserve, limit = conversation.params.max_tokens, conversation.context_limit
        if engine is None or pane.busy:
            why = ("its server counts them" if pane.remote is not None else "it is still replying" if pane.busy
                   else "its model is not loaded")
            fits.append(PaneFit(pane.id, pane.title, None, reserve, limit, uncounted=why))
            continue
        try:
            plan = plan_prompt(engine.tokenizer, conversation, pane.title, text, None)
        except ContextFullError as error:
            fits.append(PaneFit(pane.id, pane.title, error.prompt_tokens, reserve, limit,
                                refusal_line(pane.title, documents, error)))
        else:
            fits.append(PaneFit(pane.id, pane.title, len(plan.prompt), reserve, limit))
    return fits


def first_parts_that_fit(
    tokenizer: Tokenizer, pane: Pane, question: str, documents: Sequence[Document]
) -> tuple[tuple[Document, ...], PromptPlan] | None:
    """The documents, each cut to at most the same number of characters (so the
    short ones stay whole and the longest give way first), as long as that
    length can be while the pane's next prompt still fits; with that prompt's
    plan. None when not even MIN_FIRST_PART_CHARS of each would fit.

    The length is found by bisection, each step one encode of the prompt, to
    within 1% of the longest document: a first part ends at a paragraph
    anyway, and each step costs the GUI thread an encode."""

    def attempt(cap: int) -> tuple[tuple[Document, ...], PromptPlan] | None:
        parts = tuple(d.first_part(cap) for d in documents)
        try:
            return parts, plan_prompt(tokenizer, pane.conversation, pane.title, user_message_with_documents(question, parts), None)
        except ContextFullError:
            return None

    longest = max((len(d.text) for d in documents), default=0)
    lo, hi = MIN_FIRST_PART_CHARS, longest - 1
    best = attempt(lo) if lo <= hi else None
    if best is None:
        return None
    close_enough = max(32, longest // 100)
    while hi - lo > close_enough:
        mid = (lo + hi + 1) // 2
        found = attempt(mid)
        if found is not None:
            best, lo = found, mid
        else:
            hi = mid - 1
    return best


@dataclass(slots=True)
class SendPlan:
    """A send's prompts by `id(pane)`, the documents each pane gets, and the panes left out (with why)."""

    groups: list[tuple[Engine, list[Pane]]]
    plans: dict[int, PromptPlan] = field(default_factory=dict)
    documents: dict[int, tuple[Document, ...]] = field(default_factory=dict)
    refused: list[tuple[Pane, str]] = field(default_factory=list)

    @property
    def refused_panes(self) -> list[Pane]:
        return [pane for pane, _ in self.refused]


def plan_send(
    groups: Sequence[tuple[Engine, list[Pane]]], question: str, documents: Sequence[Document],
    first_part: Collection[int] = (),
) -> SendPlan:
    """Every local pane's prompt for `question` with `documents`.

    Without documents a prompt that does not fit raises ContextFullError, as
    any message's. With documents such a pane is left out (`refused`, with
    the line that says why) unless its id is in `first_part`: then it gets the
    first parts that fit, and is refused only when not even those do.
    """
    documents = tuple(documents)
    text = user_message_with_documents(question, documents)
    send = SendPlan([])
    for engine, group in groups:
        kept = []
        for pane in group:
            try:
                send.plans[id(pane)] = plan_prompt(engine.tokenizer, pane.conversation, pane.title, text, None)
                send.documents[id(pane)] = documents
            except ContextFullError as error:
                if not documents:
                    raise
                cut = first_parts_that_fit(engine.tokenizer, pane, question, documents) if pane.id in first_part else None
                if cut is None:
                    send.refused.append((pane, refusal_line(pane.title, documents, error)))
                    continue
                send.documents[id(pane)], send.plans[id(pane)] = cut
            kept.append(pane)
        if kept:
            send.groups.append((engine, kept))
    return send


async def plan_send_beside(
    groups: Callable[[], Sequence[tuple[Engine, list[Pane]]]], question: str, documents: Sequence[Document],
    first_part: Collection[int], refuse_busy: Callable[[], None],
) -> SendPlan:
    """plan_send for the panes `groups()` gives, on a thread when documents go with the message:
    it encodes each pane's whole prompt (and a bisection of encodes for first parts), up to
    seconds for long documents in several panes, while the loop's thread (the window) runs
    beside it; the tokenizer lets go of the GIL. `refuse_busy` raises if a pane began a reply
    meanwhile; a pane whose chat or model changed is planned again on the loop's thread."""
    if not documents:
        return plan_send(groups(), question, documents, first_part)

    def state() -> list[tuple[int, int, int]]:
        return [(id(engine), pane.id, len(pane.conversation.messages)) for engine, group in groups() for pane in group]

    before = state()
    planned = await asyncio.to_thread(plan_send, groups(), question, documents, first_part)
    refuse_busy()
    if state() != before:
        planned = plan_send(groups(), question, documents, first_part)
    return planned


def document_tokens(tokenizer: Tokenizer, document: Document) -> int:
    """The document's text in the model's tokens (its chip's figure; the block around it adds a few)."""
    return len(tokenizer.encode(document.text))


def _listed(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" and {names[-1]}"
