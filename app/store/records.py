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
import datetime as dt
import json
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.documents import Document
    from engine.params import SamplingParams

    from app.workspace.conversation import Conversation

    from app.workspace.messages import Message, ReplyStats, ReplyVersions

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
    updated_at: float  # its newest message's time, or created_at if later (app.store.chat_store LAST_UPDATE_SQL)
    message_count: int
    model_id: str
    preview: str  # the start of its last user or assistant message, whitespace collapsed
    # A search's match only in an attached document: that document's name (the preview says so).
    found_in_attachment: str | None = None


# The times a conversation or message may hold (Unix seconds): from 1970 to the
# start of 9999-12-31 UTC, so that the date is one a datetime can hold in every
# timezone (14 hours ahead of UTC at most). An import refuses any other
# (app.store.export), and a reader shows one an older version let in as
# UNKNOWN_TIME_TEXT, with a warning, instead of failing.
EARLIEST_TIME = 0.0
LATEST_TIME = 253_402_214_400.0  # 9999-12-31 00:00 UTC
UNKNOWN_TIME_TEXT = "unknown date"


def is_showable_time(value: object) -> bool:
    """Whether `value` is a time Tandem can show as a date (see LATEST_TIME); False for NaN, text, None."""
    return (
        isinstance(value, (int, float)) and not isinstance(value, bool) and EARLIEST_TIME <= value <= LATEST_TIME
    )


def local_datetime(timestamp: object) -> dt.datetime | None:
    """A stored time as a datetime in this machine's timezone; None for one that is no date."""
    if not is_showable_time(timestamp):
        return None
    try:
        # From UTC: a naive local datetime's astimezone() steps past the year 9999 near the end.
        return dt.datetime.fromtimestamp(timestamp, dt.timezone.utc).astimezone()  # type: ignore[arg-type]
    except (ValueError, OverflowError, OSError):  # a platform whose clock functions stop sooner
        return None


def local_time_text(timestamp: float) -> str:
    """'2026-11-30 15:42': a stored time in this machine's timezone, to the
    minute (cut, not rounded, as a clock shows it); UNKNOWN_TIME_TEXT for one
    that is no date. `tandem chats list` and the Chats sidebar write a
    summary's times with it, so both say the same."""
    when = local_datetime(timestamp)
    return UNKNOWN_TIME_TEXT if when is None else when.strftime("%Y-%m-%d %H:%M")


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
    thinking: bool = True  # "Think before answering"


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
    versions: str | None = None  # JSON (versions_to_dict); None: the reply has one version
    system_prompt: str | None = None  # a reply's; None: not a reply, or not known (stored before schema v6)
    attachments: tuple[Document, ...] = ()  # a user message's documents (frozen records, safe to hand over)


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
        thinking=conversation.thinking,
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
        versions=None if message.versions is None else json.dumps(versions_to_dict(message.versions)),
        system_prompt=message.system_prompt,
        attachments=message.attachments,
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
    # A reply's grammar (engine.structured) as {"kind", "spec"}; left out when there is none,
    # so parameters stored before it existed and those without one read alike.
    constraint = fields.pop("constraint", None)
    if constraint is not None:
        fields["constraint"] = {"kind": constraint.kind, "spec": constraint.spec}
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
    if isinstance(kwargs.get("constraint"), dict):
        from engine.structured import Constraint

        # InvalidConstraint (a ValueError) for a kind or spec it refuses; TypeError for other keys.
        kwargs["constraint"] = Constraint(**kwargs["constraint"])
    return SamplingParams(**kwargs)


def stats_to_dict(stats: ReplyStats) -> dict[str, Any]:
    return {f.name: getattr(stats, f.name) for f in dataclasses.fields(stats)}


def stats_from_dict(data: dict[str, Any]) -> ReplyStats:
    """ReplyStats from a stored or exported dict. Raises TypeError/ValueError for a wrong shape."""
    from app.workspace.messages import ReplyStats

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


def stored_system_prompt(role: object, value: object) -> str | None:
    """A reply's system prompt as stored; None for any other message, and for
    a value that is not text (a reply stored before schema v6 has NULL)."""
    return value if role == "assistant" and isinstance(value, str) else None


def stored_stats(text: str | None) -> ReplyStats | None:
    """Statistics as stored; None for a value this version cannot read."""
    if not text:
        return None
    try:
        data = json.loads(text)
        return stats_from_dict(data) if isinstance(data, dict) else None
    except (ValueError, TypeError):
        return None


# -- attached documents ----------------------------------------------------------------

ATTACHMENT_FIELDS = ("name", "kind", "size", "sha256", "pages", "complete", "text")


def attachment_to_dict(document: Document) -> dict[str, Any]:
    """A document as the versions JSON and the JSON export hold it: every field, the text included."""
    return {name: getattr(document, name) for name in ATTACHMENT_FIELDS}


def attachment_from_dict(data: object) -> Document:
    """A document from `attachment_to_dict`'s shape; ValueError (saying which field) for any other."""
    from engine.documents import Document

    if not isinstance(data, dict):
        raise ValueError("an attachment must be an object")
    for name in ("name", "kind", "sha256", "text"):
        if not isinstance(data.get(name), str):
            raise ValueError(f"an attachment's {name!r} must be text")
    size, pages, complete = data.get("size"), data.get("pages"), data.get("complete", True)
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ValueError("an attachment's 'size' must be a whole number of bytes")
    if pages is not None and (not isinstance(pages, int) or isinstance(pages, bool) or pages < 0):
        raise ValueError("an attachment's 'pages' must be a whole number or null")
    if not isinstance(complete, bool):
        raise ValueError("an attachment's 'complete' must be true or false")
    return Document(name=data["name"], text=data["text"], kind=data["kind"], size=size, sha256=data["sha256"],
                    pages=pages, complete=complete)


def attachments_from_list(value: object) -> tuple[Document, ...]:
    """Documents from a list of `attachment_to_dict` objects (none when absent); ValueError for a wrong shape."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ValueError("'attachments' must be a list")
    return tuple(attachment_from_dict(item) for item in value)


# -- reply versions -------------------------------------------------------------------


def message_to_dict(message: Message) -> dict[str, Any]:
    """A message of a version set aside, as stored (its own versions nested)."""
    return {
        "role": message.role,
        "text": message.text,
        "token_ids": list(message.token_ids),
        "state": message.state,
        "model_id": message.model_id,
        "params": None if message.params is None else params_to_dict(message.params),
        "stats": None if message.stats is None else stats_to_dict(message.stats),
        "error": message.error,
        "created_at": message.created_at,
        "versions": None if message.versions is None else versions_to_dict(message.versions),
        "system_prompt": message.system_prompt,
        "attachments": [attachment_to_dict(d) for d in message.attachments],
    }


def versions_to_dict(versions: ReplyVersions) -> dict[str, Any]:
    """Every version of a turn: the one shown is null (it is the conversation's own messages)."""
    return {
        "current": versions.current,
        "versions": [
            None if v is None else {
                "user_text": v.user_text,
                "messages": [message_to_dict(m) for m in v.messages],
                "turn_marks": list(v.turn_marks),
                "kept_ids": list(v.kept_ids),
            }
            for v in versions.versions
        ],
    }


def _ints(value: object) -> list[int]:
    if isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        return list(value)
    return []


def message_from_dict(data: dict[str, Any]) -> Message:
    """A stored message of a version; raises ValueError/TypeError/KeyError for a wrong shape."""
    from app.workspace.messages import Message

    state = data["state"]
    return Message(
        role=data["role"],
        text=str(data["text"]),
        token_ids=_ints(data.get("token_ids")),
        state="interrupted" if state == "streaming" else state,
        stats=stats_from_dict(data["stats"]) if isinstance(data.get("stats"), dict) else None,
        error=data.get("error"),
        created_at=float(data["created_at"]),
        model_id=data.get("model_id"),
        params=params_from_dict(data["params"]) if isinstance(data.get("params"), dict) else None,
        versions=versions_from_dict(data["versions"]) if isinstance(data.get("versions"), dict) else None,
        system_prompt=stored_system_prompt(data.get("role"), data.get("system_prompt")),
        attachments=attachments_from_list(data.get("attachments")),
    )


def versions_from_dict(data: dict[str, Any]) -> ReplyVersions | None:
    """The versions as `versions_to_dict` wrote them; None for a value that does not
    hold exactly one version shown (the reply then shows alone, as in v3)."""
    from app.workspace.messages import ReplyVersion, ReplyVersions

    try:
        raw = data["versions"]
        current = data["current"]
        if not isinstance(raw, list) or not isinstance(current, int) or not 0 <= current < len(raw):
            return None
        versions: list[ReplyVersion | None] = []
        for i, item in enumerate(raw):
            if i == current:
                if item is not None:
                    return None
                versions.append(None)
                continue
            if not isinstance(item, dict) or not isinstance(item.get("messages"), list) or not item["messages"]:
                return None
            messages = [message_from_dict(m) for m in item["messages"]]
            marks = item.get("turn_marks")
            marks = marks if isinstance(marks, list) else []
            marks = [m if isinstance(m, int) and not isinstance(m, bool) else None for m in marks][: len(messages)]
            marks += [None] * (len(messages) - len(marks))
            versions.append(ReplyVersion(str(item["user_text"]), messages, marks, _ints(item.get("kept_ids"))))
        return ReplyVersions(versions, current) if len(versions) > 1 else None
    except (KeyError, ValueError, TypeError):
        return None


def stored_versions(text: str | None) -> ReplyVersions | None:
    """Versions as stored; None for none or a value this version cannot read."""
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return versions_from_dict(data) if isinstance(data, dict) else None
