"""Errors a user can cause through the application core.

Each message says what went wrong and what to do about it, in words the
window can show as they are. Errors from the engine itself (an overlong
prompt, a broken model folder) come from `engine.errors` and are not wrapped.
"""

from __future__ import annotations

from collections.abc import Sequence


class AppError(Exception):
    """Base class for every error the application core raises on purpose."""


class EngineNotReadyError(AppError):
    """A message was sent before the model finished loading (or after loading failed)."""

    def __init__(self, state: str, load_error: str | None = None, *, model: str | None = None) -> None:
        self.state = state
        self.model = model
        name = f"The model {model}" if model else "The model"
        if state == "loading":
            message = f"{name} is still loading; send the message once it is ready."
        elif state == "error":
            message = f"{name} could not be loaded ({load_error}). Fix the problem and load it again."
        elif state == "closed":
            message = "The application is shutting down; the message was not sent."
        elif model:
            message = f"{name} is not loaded; load it (the pane's model menu) before sending a message."
        else:
            message = "No model is loaded yet; load one before sending a message."
        super().__init__(message)


class PaneBusyError(AppError):
    """A targeted pane is still writing its reply; nothing was sent to any pane."""

    def __init__(self, titles: Sequence[str], pane_ids: Sequence[int]) -> None:
        self.pane_ids = list(pane_ids)
        self.titles = list(titles)
        names = ", ".join(titles)
        verb = "is" if len(titles) == 1 else "are"
        super().__init__(
            f"{names} {verb} still replying. Wait for the reply to finish or stop it, then send again."
        )


class UnknownPaneError(AppError, KeyError):
    """A pane id that is not (or no longer) in the workspace."""

    def __init__(self, pane_id: int) -> None:
        self.pane_id = pane_id
        super().__init__(f"There is no pane {pane_id}; it may have been closed.")

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class LastPaneError(AppError):
    """The only pane of the workspace cannot be closed."""

    def __init__(self) -> None:
        super().__init__("The window needs at least one pane. Add another pane before closing this one.")


class EmptyMessageError(AppError):
    def __init__(self) -> None:
        super().__init__("The message is empty. Type something to send.")


class NoTargetError(AppError):
    def __init__(self) -> None:
        super().__init__("No pane is selected to receive the message. Select at least one pane.")


class MessageIndexError(AppError, IndexError):
    """A message index that does not name a message the operation applies to."""


class NothingToRegenerateError(AppError):
    def __init__(self, title: str) -> None:
        super().__init__(f"{title} has no message to reply to yet. Send a message first.")


class ContextFullError(AppError):
    """The next turn would not fit in the model's context window."""

    def __init__(self, title: str, prompt_tokens: int, max_tokens: int, context_limit: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.context_limit = context_limit
        super().__init__(
            f"{title}: the conversation has {prompt_tokens} tokens and the reply may add up to "
            f"{max_tokens}, but the model's context holds {context_limit}. Lower the pane's "
            "maximum reply length, or fork the pane from an earlier message to continue with less history."
        )


class ArenaError(AppError):
    """The arena cannot do that now (too few panes, a vote before the replies ended, ...)."""


class SweepError(AppError):
    """The sweep's values cannot be used (empty, malformed, out of range, too many)."""


class CarryError(AppError):
    """The reply cannot be used in the other panes (it is not a finished last reply)."""


class DocumentsTooLargeError(AppError):
    """The attached documents fit none of the target panes' contexts."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"{reason} Choose to send only the first part that fits, or attach less.")
