"""A pane: one column of the window, a conversation and the backend it runs on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.remote.remote_pane import RemoteBackend, RemoteReply
    from app.workspace.conversation import Conversation
    from app.workspace.replies import ReplyBatch


@dataclass(eq=False)
class Pane:
    """One column of the window: a conversation and the backend it runs on."""

    id: int  # stable and unique for the workspace's lifetime
    title: str
    conversation: Conversation
    # None: the workspace's local engine serves the pane; otherwise a remote
    # OpenAI-compatible server does (its repr leaves the API key out).
    remote: RemoteBackend | None = None
    # The reply streaming into the pane, if any: its engine batch or its
    # remote request. The workspace's bookkeeping; views read `busy`.
    running: ReplyBatch | RemoteReply | None = field(default=None, repr=False)

    @property
    def backend(self) -> str:
        """"local" or "remote"."""
        return "local" if self.remote is None else "remote"

    @property
    def busy(self) -> bool:
        """True while a reply is streaming into the pane."""
        return self.conversation.streaming
