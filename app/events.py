"""What the workspace reports to its observers (the window, tests).

Every event is delivered on the asyncio loop's thread, which under qasync is
the Qt GUI thread, in the order things happened. An event names what changed;
the observer reads the details from the workspace (`workspace.pane(id)`),
except for `ReplyDelta`, which carries the new text so that a view can append
it without re-reading the whole reply.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

if TYPE_CHECKING:
    from engine.progress import LoadProgress

    from app.workspace.messages import ReplyStats
    from app.workspace.pane import Pane


@dataclass(slots=True, frozen=True)
class PaneAdded:
    pane: Pane
    index: int  # its position in workspace.panes


@dataclass(slots=True, frozen=True)
class PaneClosed:
    pane_id: int


@dataclass(slots=True, frozen=True)
class PanesReordered:
    order: list[int]  # pane ids in display order


@dataclass(slots=True, frozen=True)
class PaneUpdated:
    """Title, parameters, system prompt, busy state or context limit changed."""

    pane_id: int


@dataclass(slots=True, frozen=True)
class MessageAppended:
    pane_id: int
    index: int  # index into the pane's conversation.messages


@dataclass(slots=True, frozen=True)
class ReplyDelta:
    """New text of a streaming reply (text may be "" when only the stats moved)."""

    pane_id: int
    index: int
    text: str
    stats: ReplyStats


@dataclass(slots=True, frozen=True)
class ReplyFinished:
    """The reply at `index` ended: its message's state is "complete", "stopped" or "error"."""

    pane_id: int
    index: int


@dataclass(slots=True, frozen=True)
class MessagesTruncated:
    """The pane's conversation now has `length` messages (regenerate, edit-and-resend)."""

    pane_id: int
    length: int


@dataclass(slots=True, frozen=True)
class ReplyVersionShown:
    """The pane shows another version of the reply at `index`: messages from
    `first` on (the user message it answers, whose text may differ) changed."""

    pane_id: int
    index: int
    first: int


@dataclass(slots=True, frozen=True)
class EngineStateChanged:
    """A model's engine changed state: "unloaded" | "loading" | "ready" | "error" | "closed"."""

    state: str
    progress: LoadProgress | None
    error: str | None
    model_id: str = "default"


WorkspaceEvent = Union[
    PaneAdded,
    PaneClosed,
    PanesReordered,
    PaneUpdated,
    MessageAppended,
    ReplyDelta,
    ReplyFinished,
    MessagesTruncated,
    ReplyVersionShown,
    EngineStateChanged,
]

Listener = Callable[[WorkspaceEvent], None]
