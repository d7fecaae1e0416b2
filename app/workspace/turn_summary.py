"""The summary of a compared turn: each pane's reply to the last broadcast
message, its length, speed, time to first token and prompt tokens (and how
many of them the prefix cache served: a document sent to several panes is
computed once) from its stats, and how
many of its words it shares with each other reply (app.workspace.compare's
word diff), as a table to read, copy (Markdown) or export (CSV).

A reasoning model's reply is compared by its answer; its reasoning tokens
are counted apart from its answer's. When a reply was asked for as JSON
("Reply as JSON"), a JSON column says whether it is (app.workspace.json_reply).

The last broadcast turn is read from the conversations themselves: the
panes whose last message was the most recently sent text and which have a
reply to it. `figures_of` takes plain texts and stats, so the word diffs can
run off the GUI thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.files import csv_text
from app.workspace.compare import word_diff
from app.workspace.json_reply import check_reply, is_json_constraint

if TYPE_CHECKING:
    from engine.structured import Constraint

    from app.workspace.messages import ReplyStats
    from app.workspace.pane import Pane


@dataclass(frozen=True, slots=True)
class TurnReply:
    """One pane's reply to the turn, as the summary needs it (a copy: safe to hand to a thread)."""

    pane_id: int
    title: str
    model: str
    text: str  # the answer, reasoning left out
    stats: ReplyStats | None
    reasoning_tokens: int | None = None  # None: the reply did not reason (or it is not known)
    constraint: Constraint | None = None  # what the reply was held to (its turn's params)
    finish_reason: str | None = None  # "abort" for a reply that was stopped


@dataclass(frozen=True, slots=True)
class ReplyFigures:
    pane_id: int
    title: str
    model: str
    words: int
    tokens: int | None  # generated tokens; None when the server did not say
    tokens_per_s: float | None
    ttft_s: float | None
    # Fraction of this reply's words that match the other reply, per other pane id (in the turn's order).
    shared: dict[int, float]
    reasoning_tokens: int | None = None  # of `tokens`, those the reply reasoned with
    prompt_tokens: int | None = None  # None when the server did not say
    cached_prompt_tokens: int | None = None  # of `prompt_tokens`, those the prefix cache served
    json: str | None = None  # asked for as JSON: "valid" or "invalid: why"; None when it was not

    @property
    def answer_tokens(self) -> int | None:
        if self.tokens is None:
            return None
        return max(0, self.tokens - (self.reasoning_tokens or 0))


def last_turn(panes: Sequence[Pane], model_name: dict[str, str] | None = None) -> tuple[str, list[TurnReply]] | None:
    """(the message, each pane's finished or stopped reply to it) for the last
    broadcast turn, in the panes' order; None when no pane has a reply."""
    latest: tuple[float, str] | None = None
    answered: list[tuple[Pane, int, int]] = []
    for pane in panes:
        turn = pane.conversation.last_turn()
        if turn is None or turn[1] is None:
            continue
        user, reply = turn
        answered.append((pane, user, reply))
        sent = pane.conversation.messages[user]
        if latest is None or sent.created_at > latest[0]:
            latest = (sent.created_at, sent.text)
    if latest is None:
        return None
    text = latest[1]
    names = model_name or {}
    replies = []
    for pane, user, index in answered:
        messages = pane.conversation.messages
        reply = messages[index]
        if messages[user].text != text or reply.state in ("streaming", "error"):
            continue
        model = pane.remote.label if pane.remote is not None else names.get(reply.model_id or "", reply.model_id or "")
        reasoned = reply.reasoning_tokens if reply.parts.has_reasoning else None
        constraint = reply.params.constraint if reply.params is not None else None
        finish = "abort" if reply.state in ("stopped", "interrupted") else (
            reply.stats.finish_reason if reply.stats is not None else None)
        replies.append(TurnReply(pane.id, pane.title, model, reply.answer, reply.stats, reasoned, constraint, finish))
    return (text, replies) if replies else None


def figures_of(replies: Sequence[TurnReply]) -> list[ReplyFigures]:
    """Each reply's figures; the word overlaps take a word diff per pair (run it off the GUI thread)."""
    shared: dict[int, dict[int, float]] = {r.pane_id: {} for r in replies}
    for i, a in enumerate(replies):
        for b in replies[i + 1 :]:
            left, right = word_diff(a.text, b.text)
            shared[a.pane_id][b.pane_id] = _matched_fraction(left)
            shared[b.pane_id][a.pane_id] = _matched_fraction(right)
    out = []
    for reply in replies:
        stats = reply.stats
        out.append(ReplyFigures(
            pane_id=reply.pane_id,
            title=reply.title,
            model=reply.model,
            words=len(reply.text.split()),
            tokens=stats.generated_tokens if stats is not None else None,
            tokens_per_s=stats.tokens_per_s if stats is not None and stats.tokens_per_s else None,
            ttft_s=stats.ttft_s if stats is not None else None,
            shared={pid: shared[reply.pane_id][pid] for pid in (r.pane_id for r in replies) if pid != reply.pane_id},
            reasoning_tokens=reply.reasoning_tokens,
            prompt_tokens=stats.prompt_tokens if stats is not None and stats.prompt_tokens else None,
            cached_prompt_tokens=stats.cached_prompt_tokens if stats is not None and stats.prompt_tokens else None,
            json=(check_reply(reply.text, reply.constraint, reply.finish_reason).cell
                  if reply.constraint is not None and is_json_constraint(reply.constraint) else None),
        ))
    return out


def _matched_fraction(segments: Sequence[object]) -> float:
    total = changed = 0
    for segment in segments:
        words = len(segment.text.split())  # type: ignore[attr-defined]
        total += words
        if segment.changed:  # type: ignore[attr-defined]
            changed += words
    return (total - changed) / total if total else 0.0


def _reasoned(figures: Sequence[ReplyFigures]) -> bool:
    return any(f.reasoning_tokens is not None for f in figures)


# Columns of words, not figures (left-aligned).
TEXT_COLUMNS = ("JSON",)


def _asked_json(figures: Sequence[ReplyFigures]) -> bool:
    return any(f.json is not None for f in figures)


def json_valid_count(figures: Sequence[ReplyFigures]) -> tuple[int, int] | None:
    """(replies that are the JSON asked for, replies asked for JSON); None when none was."""
    asked = [f for f in figures if f.json is not None]
    return (sum(f.json == "valid" for f in asked), len(asked)) if asked else None


def header(figures: Sequence[ReplyFigures]) -> list[str]:
    tokens = ["Reasoning tokens", "Answer tokens"] if _reasoned(figures) else ["Tokens"]
    json_column = ["JSON"] if _asked_json(figures) else []
    return ["Pane", "Model", "Words", *tokens, "Tok/s", "TTFT (s)", *json_column, "Prompt tokens", "From cache",
            *(f"Shared with {f.title}" for f in figures)]


def rows(figures: Sequence[ReplyFigures]) -> list[list[str]]:
    """The table's cells as text, one row per reply, the columns of `header`."""
    out = []
    reasoned = _reasoned(figures)
    asked_json = _asked_json(figures)
    for f in figures:
        if reasoned:
            tokens = ["" if f.reasoning_tokens is None else str(f.reasoning_tokens), _count(f.answer_tokens)]
        else:
            tokens = [_count(f.tokens)]
        cells = [
            f.title,
            f.model,
            str(f.words),
            *tokens,
            "" if f.tokens_per_s is None else f"{f.tokens_per_s:.1f}",
            "" if f.ttft_s is None else f"{f.ttft_s:.2f}",
            *([f.json or "—"] if asked_json else []),
            _count(f.prompt_tokens),
            _count(f.cached_prompt_tokens),
        ]
        cells += ["—" if other.pane_id == f.pane_id else f"{f.shared[other.pane_id]:.0%}" for other in figures]
        out.append(cells)
    return out


def to_markdown(message: str, figures: Sequence[ReplyFigures]) -> str:
    """The summary as a Markdown table under the message it answers."""
    first_line = message.strip().splitlines()[0] if message.strip() else ""
    quoted = first_line if len(first_line) <= 80 else first_line[:79] + "…"
    lines = [f"**Turn summary** for “{_cell(quoted)}”", ""]
    head = header(figures)
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "|".join("---" if i < 2 or name in TEXT_COLUMNS else "---:" for i, name in enumerate(head)) + "|")
    for cells in rows(figures):
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    counted = json_valid_count(figures)
    if counted is not None:
        lines += ["", f"JSON valid in {counted[0]} of {counted[1]}."]
    return "\n".join(lines) + "\n"


def to_csv(figures: Sequence[ReplyFigures]) -> str:
    # A pane's title is the user's text, a model's name its publisher's: app.files.csv_text
    # quotes every cell and shows one a spreadsheet would run as a formula as text.
    return csv_text([header(figures), *rows(figures)])


def _count(n: int | None) -> str:
    return "" if n is None else str(n)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
