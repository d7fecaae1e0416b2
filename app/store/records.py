"""The chat store's rows as plain records, and the encodings of their values.

Records are snapshots: `header_record` / `message_records` copy what a
conversation holds on the thread that owns it (the GUI thread), so the
writer thread never reads an object the GUI is changing. The encodings
(token ids as packed int32, sampling parameters and reply statistics as
JSON-ready dicts) are shared with the JSON export (app.store.export).

No torch here: `tandem chats list` reads summaries without loading the
engine, so SamplingParams and the conversation classes are imported when a
value is decoded, not when the module is.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.params import SamplingParams

    from app.workspace.conversation import Conversation, Message, ReplyStats

_INT32 = "i"
assert array(_INT32).itemsize == 4, "token ids are stored as 32-bit integers"


@dataclass(slots=True, frozen=True)
class PaneLayout:
    """One open pane, left to right, as the next start brings it back.

    The API key of a remote pane never goes into the store file: the store
    keeps `remote_key_id`, the key's id in app.secrets (the OS keyring or a
    0600 file), and `ChatStore.load_layout` fills `remote_api_key` from
    there. No export ever includes the key.
    """

    conversation_id: str
    title: str
    remote_base_url: str | None = None
    remote_model: str | None = None
    remote_api_key: str | None = dataclasses.field(default=None, repr=False)
    width: int | None = None
    # Where the key is kept (None: the store picks a new id when it saves a
    # key). Bookkeeping, so two layouts with the same panes and keys are equal.
    remote_key_id: str | None = dataclasses.field(default=None, compare=False)


@dataclass(slots=True, frozen=True)
class ConversationSummary:
    """A sidebar / `tandem chats list` row: enough to show it without loading its messages."""

    id: str
    title: str
    created_at: float
    updated_at: float
    message_count: int
    model_id: str
    preview: str  # the start of its last user or assistant message, whitespace collapsed


@dataclass(slots=True, frozen=True)
class HeaderRecord:
    """A conversation's own fields, detached from the live object.

    Taken on the thread that owns the Conversation (the GUI thread), so the
    writer thread never reads an object the GUI is changing.
    """

    id: str
    title: str
    created_at: float
    system_prompt: str
    params: str  # JSON
    model_id: str
    context_policy: str
    kept_ids: bytes


@dataclass(slots=True, frozen=True)
class MessageRecord:
    """One message as stored, detached from the live object (see HeaderRecord)."""

    position: int
    role: str
    text: str
    token_ids: bytes
    state: str
    model_id: str | None
    params: str | None  # JSON
    stats: str | None  # JSON
    error: str | None
    created_at: float
    turn_mark: int | None


def header_record(conversation: Conversation) -> HeaderRecord:
    return HeaderRecord(
        id=conversation.id,
        title=conversation.title,
        created_at=conversation.created_at,
        system_prompt=conversation.system_prompt,
        params=json.dumps(params_to_dict(conversation.params)),
        model_id=conversation.model_id,
        context_policy=conversation.context_policy,
        kept_ids=pack_ids(conversation.kept_ids),
    )


def message_record(message: Message, position: int, turn_mark: int | None = None) -> MessageRecord:
    return MessageRecord(
        position=position,
        role=message.role,
        text=message.text,
        token_ids=pack_ids(message.token_ids),
        state=message.state,
        model_id=message.model_id,
        params=None if message.params is None else json.dumps(params_to_dict(message.params)),
        stats=None if message.stats is None else json.dumps(stats_to_dict(message.stats)),
        error=message.error,
        created_at=message.created_at,
        turn_mark=turn_mark,
    )


def message_records(conversation: Conversation) -> list[MessageRecord]:
    marks = conversation.turn_marks
    return [
        message_record(message, i, marks[i] if i < len(marks) else None)
        for i, message in enumerate(conversation.messages)
    ]


# -- encodings shared with the export --------------------------------------------


def pack_ids(ids: Sequence[int]) -> bytes:
    """Token ids as little-endian int32 bytes."""
    packed = array(_INT32, ids)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def unpack_ids(blob: bytes | None) -> list[int]:
    if not blob:
        return []
    whole = len(blob) - len(blob) % 4  # a torn value can only come from a damaged row; drop it
    ids = array(_INT32)
    ids.frombytes(bytes(blob[:whole]))
    if sys.byteorder == "big":
        ids.byteswap()
    return ids.tolist()


def params_to_dict(params: SamplingParams) -> dict[str, Any]:
    fields = {f.name: getattr(params, f.name) for f in dataclasses.fields(params)}
    fields["stop"] = list(params.stop)
    return fields


def params_from_dict(data: dict[str, Any]) -> SamplingParams:
    """SamplingParams from a stored or exported dict; unknown keys are ignored.

    Raises engine.params.InvalidSamplingParams (a ValueError) or TypeError
    for values SamplingParams refuses.
    """
    from engine.params import SamplingParams

    known = {f.name for f in dataclasses.fields(SamplingParams)}
    kwargs = {k: v for k, v in data.items() if k in known}
    if "stop" in kwargs and isinstance(kwargs["stop"], list):
        kwargs["stop"] = tuple(kwargs["stop"])
    return SamplingParams(**kwargs)


def stats_to_dict(stats: ReplyStats) -> dict[str, Any]:
    return {f.name: getattr(stats, f.name) for f in dataclasses.fields(stats)}


def stats_from_dict(data: dict[str, Any]) -> ReplyStats:
    """ReplyStats from a stored or exported dict. Raises TypeError/ValueError for a wrong shape."""
    from app.workspace.conversation import ReplyStats

    names = [f.name for f in dataclasses.fields(ReplyStats)]
    missing = [n for n in names if n not in data]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}")
    return ReplyStats(**{n: data[n] for n in names})


def stored_params(text: str | None) -> SamplingParams | None:
    """Parameters as stored; None for a value this version cannot read (it was written by us, so rare)."""
    if not text:
        return None
    try:
        data = json.loads(text)
        return params_from_dict(data) if isinstance(data, dict) else None
    except (ValueError, TypeError):
        return None


def stored_stats(text: str | None) -> ReplyStats | None:
    """Statistics as stored; None for a value this version cannot read."""
    if not text:
        return None
    try:
        data = json.loads(text)
        return stats_from_dict(data) if isinstance(data, dict) else None
    except (ValueError, TypeError):
        return None
