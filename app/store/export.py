"""Conversations out of Tandem and back in: Markdown, JSON, and a side-by-side comparison.

JSON ("tandem-chat", version 1) carries every message with the model and
sampling parameters that wrote it and its statistics, so a script can
analyse a chat and Tandem can import it again. It leaves out two things on
purpose: API keys of remote servers (never exported), and token ids (they
belong to one model's tokenizer; an imported conversation is re-tokenized
from its text on the next turn, so a file cannot feed a model ids that are
not its own).

    {"format": "tandem-chat", "version": 1, "exported_at": 1767225600.0,
     "conversation": {"title", "created_at", "system_prompt", "model_id",
                      "context_policy", "params": {...},
                      "messages": [{"role", "text", "state", "created_at",
                                    "model_id", "params", "stats", "error", "system_prompt",
                                    "attachments" (a message with documents: [{"name", "kind",
                                     "size", "sha256", "pages", "complete", "text"}]),
                                    "versions" (a reply made again: {"shown", "count",
                                     "others": [{"version", "user_text", "messages"}]})}]}}

Times are Unix seconds (UTC). A reply's "system_prompt" is the one it was
written under ("" for none; null when not known: a reply saved before Tandem
kept it, and every message that is not a reply); the conversation's is the
one its next reply gets. A file without the field (an older Tandem's) imports
with the replies' prompts unknown.

An import file comes from anyone: `read_chat_file` (the CLI's and the
window's import) turns any content into a conversation or a ChatImportError
with one sentence, never another exception: not a regular file, too big, not
UTF-8, not JSON, nested too deep, a number too long, text that is not valid
Unicode (a lone surrogate), a value of the wrong type anywhere, a time that
is no date (app.store.records.is_showable_time), more messages or versions
of a reply than any real chat has. Reading is bounded before parsing (a
regular file only, at most MAX_IMPORT_BYTES, app.files.read_regular_file)
and the counts are checked before any message is built, so a hostile file
costs little time or memory. A file holds one conversation.
"""

from __future__ import annotations

import math
import os
import re
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.store.records import (
    UNKNOWN_TIME_TEXT,
    attachment_to_dict,
    attachments_from_list,
    is_showable_time,
    params_from_dict,
    params_to_dict,
    stats_from_dict,
    stats_to_dict,
)
from app.errors import AppError
from app.files import BadJSONError, UnreadableFileError, check_unicode, parse_json, read_regular_file
from engine.model_files import DEFAULT_MODEL_NAME

if TYPE_CHECKING:
    from engine.documents import Document
    from engine.params import SamplingParams

    from app.workspace.conversation import Conversation

    from app.workspace.messages import Message, ReplyVersions

FORMAT = "tandem-chat"
FORMAT_VERSION = 1

_ROLES = ("system", "user", "assistant", "notice")
_STATES = ("complete", "streaming", "stopped", "interrupted", "error")


# A chat export is text: 32 MiB is some 8 million tokens, more than any model reads
# in a conversation. A file of tiny messages parses to about 4x its size in memory.
MAX_IMPORT_BYTES = 32 * 2**20
# Messages in one conversation, every version of every reply counted: a chat of
# 10,000 turns, each answered twice, fits. Building each costs ~70 us, so the
# cap bounds an import's time to seconds.
MAX_IMPORT_MESSAGES = 50_000
# Versions of one reply (regenerations and edits).
MAX_REPLY_VERSIONS = 1_000
# A seed is a 64-bit number everywhere it is used.
_SEED_LIMIT = 2**64


class ChatImportError(AppError):
    """A file that is not a chat Tandem can import; the message says what is wrong with it."""


# -- reading an import file ------------------------------------------------------------


def read_chat_file(path: str | os.PathLike[str]) -> Conversation:
    """A new conversation from a Tandem JSON export file. Raises ChatImportError, for any content."""
    path = Path(path)
    try:
        raw = read_regular_file(path, MAX_IMPORT_BYTES)
    except FileNotFoundError:
        raise ChatImportError(f"{path} could not be read: there is no such file.") from None
    except UnreadableFileError as exc:
        raise ChatImportError(f"{path} is not a Tandem chat export: {exc.reason}.") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ChatImportError(f"{path} is not a Tandem chat: it is not a text file (expected JSON).") from None
    try:
        conversation = from_json(parse_chat_json(text))
    except ChatImportError as exc:
        raise ChatImportError(f"{path}: {exc}") from None
    return conversation


def parse_chat_json(text: str) -> object:
    """JSON text as Python values, every string valid Unicode. Raises ChatImportError, for any text."""
    try:
        return parse_json(text)
    except BadJSONError as exc:
        raise ChatImportError(f"This is not a Tandem chat: {exc.reason}.") from None


def _check_text(data: object) -> None:
    try:
        check_unicode(data)
    except BadJSONError as exc:
        raise ChatImportError(f"This is not a Tandem chat: {exc.reason}.") from None


def _check_counts(messages: list[Any]) -> None:
    """ChatImportError when the conversation holds more messages (every
    version's counted) or versions of a reply than the caps: checked on the
    parsed JSON before anything is built, so a file of a million messages
    is refused at once. Shapes are not checked here; building does that."""
    total = 0
    pending = [messages]
    while pending:
        items = pending.pop()
        total += len(items)
        if total > MAX_IMPORT_MESSAGES:
            raise ChatImportError(
                f"The conversation holds more than {MAX_IMPORT_MESSAGES:,} messages (every version of a reply "
                "counted); Tandem imports at most that many. Split it into smaller chats."
            )
        for item in items:
            versions = item.get("versions") if isinstance(item, dict) else None
            others = versions.get("others") if isinstance(versions, dict) else None
            if not isinstance(others, list):
                continue
            if len(others) >= MAX_REPLY_VERSIONS:
                raise ChatImportError(
                    f"A reply in the conversation has {len(others) + 1:,} versions; Tandem keeps at most "
                    f"{MAX_REPLY_VERSIONS:,} versions of a reply."
                )
            for other in others:
                if isinstance(other, dict) and isinstance(other.get("messages"), list):
                    pending.append(other["messages"])


# -- JSON --------------------------------------------------------------------------


def to_json(conversation: Conversation) -> dict[str, Any]:
    """The conversation as a JSON-ready dict (see the module docstring)."""
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "exported_at": time.time(),
        "conversation": {
            "id": conversation.id,
            "title": conversation.title,
            "created_at": conversation.created_at,
            "system_prompt": conversation.system_prompt,
            "model_id": conversation.model_id,
            "context_policy": conversation.context_policy,
            "thinking": conversation.thinking,
            "params": params_to_dict(conversation.params),
            "messages": [_message_json(m) for m in conversation.messages],
        },
    }


def _message_json(message: Message) -> dict[str, Any]:
    data = {
        "role": message.role,
        "text": message.text,
        "state": message.state,
        "created_at": message.created_at,
        "model_id": message.model_id,
        "params": None if message.params is None else params_to_dict(message.params),
        "stats": None if message.stats is None else stats_to_dict(message.stats),
        "error": message.error,
        "system_prompt": message.system_prompt,
    }
    if message.attachments:
        data["attachments"] = [attachment_to_dict(d) for d in message.attachments]
    if message.versions is not None:
        data["versions"] = _versions_json(message.versions)
    return data


def _versions_json(versions: ReplyVersions) -> dict[str, Any]:
    """A reply's versions: which one the conversation shows (1-based, the
    message itself), and every other one with the user text it answers and
    the messages that followed it in that version."""
    return {
        "shown": versions.current + 1,
        "count": versions.count,
        "others": [
            {"version": n + 1, "user_text": v.user_text, "messages": [_message_json(m) for m in v.messages]}
            for n, v in enumerate(versions.versions)
            if v is not None
        ],
    }


def from_json(data: object) -> Conversation:
    """A new conversation (with a new id) from `to_json`'s output. Raises ChatImportError, for any value."""
    try:
        return _from_json(data)
    except ChatImportError:
        raise
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        # Every value is checked below; this is the net under those checks,
        # so that no file can end an import in a traceback.
        raise ChatImportError(f"The chat export holds a value Tandem cannot use ({type(exc).__name__}: {exc}).") from None


def _from_json(data: object) -> Conversation:
    from app.workspace.conversation import CONTEXT_POLICIES, Conversation

    _check_text(data)
    top = _object(data, "The file")
    if top.get("format") != FORMAT:
        raise ChatImportError("This is not a Tandem chat export (its \"format\" is not \"tandem-chat\").")
    version = top.get("version")
    if not _is_int(version) or version < 1:
        raise ChatImportError("The chat export has no valid \"version\" number.")
    if version > FORMAT_VERSION:
        raise ChatImportError(
            f"The chat was exported by a newer version of Tandem (format version {version}; this version "
            f"reads up to {FORMAT_VERSION}). Update Tandem to import it."
        )
    conv = _object(top.get("conversation"), "\"conversation\"")
    where = "the conversation"
    title = _string(conv, "title", where)
    created_at = _time(conv, "created_at", where)
    system_prompt = _string(conv, "system_prompt", where)
    model_id = _string(conv, "model_id", where)
    if not model_id:
        raise ChatImportError("The conversation's \"model_id\" is empty.")
    policy = _string(conv, "context_policy", where)
    if policy not in CONTEXT_POLICIES:
        raise ChatImportError(
            f"The conversation's \"context_policy\" must be one of {', '.join(CONTEXT_POLICIES)}, not {policy!r}."
        )
    thinking = conv.get("thinking", True)  # files exported before it was saved: on
    if not isinstance(thinking, bool):
        raise ChatImportError(f"{where.capitalize()}: \"thinking\" must be true or false.")
    params = _params(conv.get("params"), where)
    if params is None:
        raise ChatImportError("The conversation has no sampling \"params\".")
    raw_messages = conv.get("messages")
    if not isinstance(raw_messages, list):
        raise ChatImportError("The conversation's \"messages\" must be a list.")
    _check_counts(raw_messages)
    messages = [_message_from_json(raw, f"message {i + 1}") for i, raw in enumerate(raw_messages)]
    return Conversation.restore(
        id=uuid.uuid4().hex,
        title=title,
        created_at=created_at,
        system_prompt=system_prompt,
        params=params,
        model_id=model_id,
        context_policy=policy,
        messages=messages,
        kept_ids=[],
        turn_marks=[None] * len(messages),
        thinking=thinking,
    )


def _message_from_json(raw: object, where: str) -> Message:
    from app.workspace.messages import Message

    item = _object(raw, where.capitalize())
    role = _string(item, "role", where)
    if role not in _ROLES:
        raise ChatImportError(f"{where.capitalize()}: \"role\" must be one of {', '.join(_ROLES)}, not {role!r}.")
    state = _string(item, "state", where)
    if state not in _STATES:
        raise ChatImportError(
            f"{where.capitalize()}: \"state\" must be one of {', '.join(_STATES)}, not {state!r}."
        )
    versions = item.get("versions")
    try:
        attachments = attachments_from_list(item.get("attachments"))
    except ValueError as exc:
        raise ChatImportError(f"{where.capitalize()}: {exc}.") from None
    return Message(
        role=role,  # type: ignore[arg-type]
        text=_string(item, "text", where),
        state=state,  # type: ignore[arg-type]
        created_at=_time(item, "created_at", where),
        model_id=_optional_string(item, "model_id", where),
        params=_params(item.get("params"), where),
        stats=_stats(item.get("stats"), where),
        error=_optional_string(item, "error", where),
        system_prompt=_optional_string(item, "system_prompt", where) if role == "assistant" else None,
        # One version is no choice to offer: the reply shows alone.
        versions=_versions_from_json(versions, where) if versions is not None and role == "assistant" else None,
        attachments=attachments if role == "user" else (),
    )


def _versions_from_json(value: object, where: str) -> ReplyVersions | None:
    """A reply's versions from `_versions_json`. Token ids are not exported, so
    a version shown after an import is re-tokenized from its text on the next turn."""
    from app.workspace.messages import ReplyVersion, ReplyVersions

    data = _object(value, f"{where.capitalize()}: \"versions\"")
    shown, count, others = data.get("shown"), data.get("count"), data.get("others")
    if not _is_int(count) or not _is_int(shown) or not isinstance(others, list):
        raise ChatImportError(
            f"{where.capitalize()}: \"versions\" needs whole numbers \"shown\", \"count\" and a list \"others\"."
        )
    if not 1 <= shown <= count or len(others) != count - 1:
        raise ChatImportError(
            f"{where.capitalize()}: \"versions\" says version {shown} of {count} is shown but lists "
            f"{len(others)} others; it must list {max(count - 1, 0)}."
        )
    versions: list[ReplyVersion | None] = [None] * count
    for raw in others:
        other = _object(raw, f"{where.capitalize()}: a version")
        number = other.get("version")
        if not _is_int(number) or not 1 <= number <= count or number == shown or versions[number - 1] is not None:
            raise ChatImportError(
                f"{where.capitalize()}: each other version needs its own \"version\" number, "
                f"1 to {count}, not the one shown."
            )
        label = f"{where}, version {number}"
        raw_messages = other.get("messages")
        if not isinstance(raw_messages, list) or not raw_messages:
            raise ChatImportError(f"{label.capitalize()}: \"messages\" must be a list of at least one message.")
        messages = [_message_from_json(m, f"{label}, message {i + 1}") for i, m in enumerate(raw_messages)]
        if messages[0].role != "assistant":
            raise ChatImportError(f"{label.capitalize()}: its first message must be the assistant's reply.")
        for message in messages:
            if message.state == "streaming":
                message.state = "interrupted"
        versions[number - 1] = ReplyVersion(_string(other, "user_text", label), messages, [None] * len(messages), [])
    return ReplyVersions(versions, shown - 1) if count > 1 else None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _object(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ChatImportError(f"{what} must be a JSON object.")
    return value


def _string(data: dict[str, Any], key: str, where: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise ChatImportError(f"{where.capitalize()}: \"{key}\" must be text.")
    return value


def _optional_string(data: dict[str, Any], key: str, where: str) -> str | None:
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise ChatImportError(f"{where.capitalize()}: \"{key}\" must be text or null.")
    return value


def _finite(value: object) -> float | None:
    """`value` as a finite float when it is a JSON number that is one; None otherwise (bools, huge ints, NaN)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int beyond a float's range
        return None
    return number if math.isfinite(number) else None


def _time(data: dict[str, Any], key: str, where: str) -> float:
    value = _finite(data.get(key))
    if value is None or not is_showable_time(value):
        # 1e12 is a finite number, but no date: every list and export of the store would fail on it.
        raise ChatImportError(
            f"{where.capitalize()}: \"{key}\" must be a time in seconds since 1970, a date from 1970 "
            "to the year 9999 (a time in milliseconds is 1,000 times too large)."
        )
    return value


def _params(value: object, where: str) -> Any:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ChatImportError(f"{where.capitalize()}: \"params\" must be an object.")
    seed = value.get("seed")
    if _is_int(seed) and not -_SEED_LIMIT < seed < _SEED_LIMIT:
        raise ChatImportError(f"{where.capitalize()}: the sampling \"seed\" must fit in 64 bits.")
    try:
        return params_from_dict(value)
    except (ValueError, TypeError, OverflowError) as exc:
        raise ChatImportError(f"{where.capitalize()}: the sampling parameters are not valid: {exc}") from None


def _stats(value: object, where: str) -> Any:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ChatImportError(f"{where.capitalize()}: \"stats\" must be an object.")
    numbers = ("generated_tokens", "prompt_tokens", "cached_prompt_tokens")
    for key in numbers:
        if not _is_int(value.get(key)) or not 0 <= value[key] < 2**63:
            raise ChatImportError(f"{where.capitalize()}: stats \"{key}\" must be a whole number, at least 0.")
    for key, optional in (("tokens_per_s", False), ("elapsed_s", False), ("ttft_s", True)):
        v = value.get(key)
        if optional and v is None:
            continue
        number = _finite(v)
        if number is None or number < 0:
            raise ChatImportError(f"{where.capitalize()}: stats \"{key}\" must be a number, at least 0.")
    reason = value.get("finish_reason")
    if reason is not None and not isinstance(reason, str):
        raise ChatImportError(f"{where.capitalize()}: stats \"finish_reason\" must be text or null.")
    try:
        return stats_from_dict(value)
    except (ValueError, TypeError) as exc:
        raise ChatImportError(f"{where.capitalize()}: the statistics are not valid ({exc}).") from None


# -- Markdown ----------------------------------------------------------------------


def _when(timestamp: float) -> str:
    if not is_showable_time(timestamp):  # stored by an older version that let such a time in
        return UNKNOWN_TIME_TEXT
    return datetime.fromtimestamp(timestamp, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _display_title(conversation: Conversation) -> str:
    if conversation.title:
        return conversation.title
    from app.workspace.conversation import Conversation

    first = next((m.text for m in conversation.messages if m.role == "user"), "")
    return Conversation.auto_title(first) or "Untitled conversation"


def _quote(text: str) -> str:
    return "\n".join("> " + line if line else ">" for line in text.splitlines() or [""])


def stats_line(message: Message) -> str:
    """tokens · tok/s · time to first token · cached prompt tokens, for a reply with stats; "" otherwise."""
    stats = message.stats
    if stats is None:
        return ""
    parts = [f"{stats.generated_tokens} token{'' if stats.generated_tokens == 1 else 's'}"]
    if stats.tokens_per_s > 0:
        parts.append(f"{stats.tokens_per_s:.1f} tok/s")
    if stats.ttft_s is not None:
        parts.append(f"first token after {stats.ttft_s:.2f} s")
    if stats.prompt_tokens:
        parts.append(f"{stats.cached_prompt_tokens} of {stats.prompt_tokens} prompt tokens cached")
    return " · ".join(parts)


def _state_note(message: Message) -> str:
    if message.state == "stopped":
        return "Stopped before the end."
    if message.state in ("interrupted", "streaming"):
        return "Interrupted: Tandem closed while this reply was being written; this is what was saved."
    if message.state == "error":
        return f"Failed: {message.error}" if message.error else "Failed."
    return ""


ModelName = Callable[[str], str]


def model_display_name(model_id: str) -> str:
    """What a model is called where no registry is at hand: "default" is the
    bundled model's alias, a path is its folder's name."""
    if model_id == "default":
        return DEFAULT_MODEL_NAME
    return Path(model_id).name if os.path.isabs(model_id) else model_id


def _message_markdown(
    message: Message, heading: str = "###", version: str = "", model_name: ModelName = model_display_name,
    system_note: str = "",
) -> str:
    if message.role == "notice":
        return _quote(f"**Note:** {message.text}")
    name = {"user": "User", "assistant": "Assistant", "system": "System"}[message.role]
    if message.role == "assistant" and message.model_id:
        name += f" ({model_name(message.model_id)})"
    if message.versions is not None and not version:
        version = f"version {message.versions.current + 1} of {message.versions.count}, shown"
    if version:
        name += f" — {version}"
    parts = [f"{heading} {name}", "", reply_markdown(message), *map(_attachment_markdown, message.attachments)]
    # Each reply's own sampling: the conversation's may have changed since it was written.
    sampling = f"Sampling: {_params_line(message.params)}" if message.params is not None else ""
    footer = [x for x in (stats_line(message), _state_note(message), sampling, system_note) if x]
    if footer:
        parts += ["", *(f"*{x}*" for x in footer)]
    return "\n".join(parts)


def _attachment_markdown(document: Document) -> str:
    """An attached document: its name and figures, its text in a collapsed block, fenced as it is."""
    figures = [f"{document.pages} page{'s' if document.pages != 1 else ''}"] if document.pages is not None else []
    figures.append(f"{document.size:,} bytes")
    if not document.complete:
        figures.append("first part only")
    fence = "`" * max([3, *(len(run) + 1 for run in re.findall(r"`+", document.text))])
    text = document.text.replace("</details>", "&lt;/details&gt;")  # cannot close the block early
    return (f"\n<details>\n<summary>Attached: {document.name} ({', '.join(figures)})</summary>\n\n"
            f"{fence}text\n{text}\n{fence}\n\n</details>")


def reply_markdown(message: Message) -> str:
    """A message's text; a reasoning model's think block as a collapsed
    "Thinking" <details> block above its answer."""
    parts = message.parts
    if message.role != "assistant" or not parts.reasoning:
        return (parts.answer if message.role == "assistant" else message.text) or "*(no text)*"
    summary = "Thinking" if parts.reasoning_finished else "Thinking (unfinished)"
    reasoning = parts.reasoning.replace("</details>", "&lt;/details&gt;")  # cannot close the block early
    return f"<details>\n<summary>{summary}</summary>\n\n{reasoning}\n\n</details>\n\n{parts.answer or '*(no answer)*'}"


def _other_versions_markdown(message: Message, heading: str, model_name: ModelName = model_display_name) -> list[str]:
    """The versions of a reply the conversation does not show, each marked, after the one it shows."""
    versions = message.versions
    if versions is None:
        return []
    lines: list[str] = []
    for n, version in enumerate(versions.versions):
        if version is None:
            continue
        label = f"version {n + 1} of {versions.count}"
        lines += ["", f"{heading} Other version: {label}", "", _quote(f"In reply to: {version.user_text}")]
        for i, other in enumerate(version.messages):
            lines += ["", _message_markdown(other, heading + "#", label if i == 0 else "", model_name)]
            lines += _other_versions_markdown(other, heading + "#", model_name)
    return lines


def _params_line(p: SamplingParams) -> str:
    items = [f"temperature {p.temperature:g}", f"max tokens {p.max_tokens}"]
    if p.top_k:
        items.append(f"top-k {p.top_k}")
    if p.top_p < 1:
        items.append(f"top-p {p.top_p:g}")
    if p.min_p > 0:
        items.append(f"min-p {p.min_p:g}")
    if p.repetition_penalty != 1:
        items.append(f"repetition penalty {p.repetition_penalty:g}")
    if p.seed is not None:
        items.append(f"seed {p.seed}")
    return ", ".join(items)


def _system_prompt_text(prompt: str | None) -> str:
    if prompt is None:
        return "System prompt not known (saved before Tandem recorded each reply's)"
    return f"System prompt: “{' '.join(prompt.split())}”" if prompt else "No system prompt"


def to_markdown(conversation: Conversation, model_name: ModelName = model_display_name) -> str:
    """The conversation as a Markdown document: title, model, system prompt, then every message.

    `model_name` names a model id as people know it (the window passes its registry's names).
    """
    lines = [
        f"# {_display_title(conversation)}",
        "",
        f"- Model: {model_name(conversation.model_id)}",
        f"- Started: {_when(conversation.created_at)}",
        f"- Sampling of new replies: {_params_line(conversation.params)}",
    ]
    current = conversation.system_prompt
    # A system prompt set midway did not apply to the replies before it: each
    # reply then says which it had. So do replies stored before their prompt
    # was (None), beside ones whose prompt is known: the one header would
    # claim the current prompt for them.
    prompts = [m.system_prompt for m in conversation.messages if m.role == "assistant"]
    known = [prompt for prompt in prompts if prompt is not None]
    changed = any(prompt != current for prompt in known) or (bool(known) and None in prompts)
    if changed:
        lines += ["", "## System prompt of new replies", "", _quote(current) if current else "*(none)*"]
    elif current:
        lines += ["", "## System prompt", "", _quote(current)]
    lines += ["", "## Messages"]
    seen: list[str | None] = []  # the prompt of the reply before; the first reply always says its own
    for message in conversation.messages:
        note = ""
        if changed and message.role == "assistant":
            if not seen or message.system_prompt != seen[-1]:
                note = _system_prompt_text(message.system_prompt)
            seen.append(message.system_prompt)
        lines += ["", _message_markdown(message, model_name=model_name, system_note=note)]
        lines += _other_versions_markdown(message, "####", model_name)
    return "\n".join(lines) + "\n"


def comparison_markdown(
    panes: Sequence[tuple[str, Conversation]], model_name: ModelName = model_display_name
) -> str:
    """Several panes' conversations as one document, their replies to the same prompts next to each other.

    One section per prompt (the n-th user message of each pane): the prompt
    once when every pane was sent the same text, then each pane's reply
    under the pane's name. Panes that were sent different text show their
    own prompt above their reply.
    """
    lines = ["# Comparison", "", "| Pane | Model | Sampling | System prompt |", "| --- | --- | --- | --- |"]
    for name, conv in panes:
        system = " ".join(conv.system_prompt.split()) or "(none)"
        sampling = _params_line(conv.params)
        lines.append(f"| {_cell(name)} | {_cell(model_name(conv.model_id))} | {_cell(sampling)} | {_cell(system)} |")
    turns = [_turns(conv) for _, conv in panes]
    count = max((len(t) for t in turns), default=0)
    for n in range(count):
        # The panes that have an n-th prompt: is it the same text in all of them?
        prompts = {t[n][0].text for t in turns if n < len(t) and t[n][0] is not None}
        same = len(prompts) == 1
        lines += ["", f"## Prompt {n + 1}"]
        if same:
            lines += ["", _quote(next(iter(prompts)))]
        for (name, _), pane_turns in zip(panes, turns):
            lines += ["", f"### {name}"]
            if n >= len(pane_turns):
                lines += ["", "*(no message in this pane)*"]
                continue
            prompt, replies = pane_turns[n]
            if not same and prompt is not None:
                lines += ["", _quote(prompt.text)]
            if not replies:
                lines += ["", "*(no reply)*"]
            for reply in replies:
                lines += ["", _message_markdown(reply, "####", model_name=model_name)]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _turns(conversation: Conversation) -> list[tuple[Message | None, list[Message]]]:
    """(user message, the messages after it up to the next one).

    Anything before the first user message (a notice) goes with the first
    turn, so prompt n is the n-th user message in every pane.
    """
    turns: list[tuple[Message | None, list[Message]]] = []
    leading: list[Message] = []
    for message in conversation.messages:
        if message.role == "user":
            turns.append((message, leading if not turns else []))
            leading = []
        elif turns:
            turns[-1][1].append(message)
        else:
            leading.append(message)
    if leading:  # no user message at all
        turns.append((None, leading))
    return turns
