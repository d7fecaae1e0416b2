"""A pane: one column of the window, a conversation and the backend it runs on."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.remote.remote_pane import RemoteBackend, RemoteReply
    from app.workspace.conversation import Conversation
    from app.workspace.replies import ReplyBatch


_AUTOMATIC = re.compile(r"Pane \d+")


def automatic_title(number: int) -> str:
    return f"Pane {number}"


def is_automatic_title(title: str) -> bool:
    """Whether `title` is a number the workspace gave (a layout saved before
    panes were renumbered kept those): such a pane takes its current number."""
    return _AUTOMATIC.fullmatch(title) is not None


@dataclass(eq=False)
class Pane:
    """One column of the window: a conversation and the backend it runs on."""

    id: int  # stable and unique for the workspace's lifetime
    # The name the user gave it; "" for the automatic "Pane <number>".
    name: str
    conversation: Conversation
    # None: the workspace's local engine serves the pane; otherwise a remote
    # OpenAI-compatible server does (its repr leaves the API key out).
    remote: RemoteBackend | None = None
    # The reply streaming into the pane, if any: its engine batch or its
    # remote request. The workspace's bookkeeping; views read `busy`.
    running: ReplyBatch | RemoteReply | None = field(default=None, repr=False)
    # Its place on screen, counted from 1 left to right; the workspace renumbers
    # the panes whenever one is added, closed or moved, so numbers read 1..N.
    number: int = 0
    # Where its sampling settings came from while the user has not changed them
    # (app.workspace.pane_defaults.AUTOMATIC_SOURCES); "" once the user has.
    params_source: str = ""

    @property
    def title(self) -> str:
        """The name the user gave the pane, else "Pane <number>"."""
        return self.name or automatic_title(self.number)

    @property
    def backend(self) -> str:
        """"local" or "remote"."""
        return "local" if self.remote is None else "remote"

    @property
    def busy(self) -> bool:
        """True while a reply is streaming into the pane."""
        return self.conversation.streaming
