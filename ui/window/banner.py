"""The banners above the panes: the models' loading state, and the chat store's trouble.

`LoadingBanner.show_models` decides which model needs the user's attention
(one loading, one that failed, one not loaded) and what its button does;
the window only tells it what the panes want.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QProgressBar, QPushButton, QWidget

if TYPE_CHECKING:
    from app.workspace.workspace import Workspace
    from engine.progress import LoadProgress

_STAGES = {"import": "Importing", "weights": "Reading the weights", "warmup": "Warming up", "ready": "Ready"}
# Before the engine's first report it is starting: importing PyTorch (seconds). After a
# one-time import it prepares its kernels (on a first launch from source, the C compiler
# builds the CPU ones: seconds) before the weights' first report (docs/benchmarks.md).
STARTING = "starting the engine"
IMPORTED = "the one-time import is done; preparing the kernels and the weights"


def describe_stage(stage: str, detail: str) -> str:
    """What loading is doing now, once: the engine's own sentence ("Reading the
    weights onto cpu, kept as q4_1+q8_0 for the quantized kernels"), else the stage's name."""
    detail = (detail or "").strip()
    return detail or _STAGES.get(stage, stage)


def loading_text(name: str, progress: LoadProgress | None) -> str:
    """The banner's one sentence: 'Loading SmolLM2: reading the weights onto cpu, kept as q4_1'."""
    if progress is not None and progress.stage == "ready":
        return f"{name or 'The model'} is ready."
    if progress is None:
        doing = STARTING
    elif progress.stage == "import" and progress.total and progress.done >= progress.total:
        doing = IMPORTED
    else:
        doing = describe_stage(progress.stage, progress.detail)
    first = doing.split(maxsplit=1)[0] if doing.strip() else ""
    if first[:1].isupper() and first[1:].islower():  # "Reading …" continues the sentence; "SmolLM2 …" stays
        doing = doing[0].lower() + doing[1:]
    return f"Loading {name or 'the model'}: {doing.rstrip('.…')}…"


class LoadingBanner(QFrame):
    """'Loading model…' with the engine's progress; the load error if it
    fails; a model that is not loaded (after a crash) with a button to load it.
    `model_id` is the model the banner is about (its button loads it)."""

    retry_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("loadingBanner")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.model_id: str | None = None
        layout = QHBoxLayout(self)
        layout.setContentsMargins(8, 4, 8, 4)
        self.label = QLabel("Loading model…", self)
        self.label.setWordWrap(True)
        self.progress = QProgressBar(self)
        self.progress.setRange(0, 0)
        self.progress.setMaximumWidth(self.fontMetrics().averageCharWidth() * 30)
        self.retry = QPushButton("Try again", self)
        self.retry.clicked.connect(self.retry_requested)
        self.retry.hide()
        layout.addWidget(self.label, 1)
        layout.addWidget(self.progress)
        layout.addWidget(self.retry)

    def show_progress(self, progress: LoadProgress | None, name: str = "") -> None:
        self.retry.hide()
        self.progress.show()
        self.label.setText(loading_text(name, progress))
        if progress is None:
            self.progress.setRange(0, 0)
            return
        if progress.total:
            self.progress.setRange(0, progress.total)
            self.progress.setValue(progress.done)
        else:
            self.progress.setRange(0, 0)

    def show_error(self, error: str, name: str = "") -> None:
        self.label.setText(f"{name or 'The model'} could not be loaded: {error}")
        self.progress.hide()
        self.retry.setText("Try again")
        self.retry.show()

    def show_unloaded(self, text: str, button: str) -> None:
        self.label.setText(text)
        self.progress.hide()
        self.retry.setText(button)
        self.retry.show()

    def show_models(
        self,
        workspace: Workspace,
        wanted: Sequence[str],
        name_of: Callable[[str], str],
        *,
        crash_recovery: bool,
        load_requested: bool,
    ) -> str | None:
        """Show the first of `wanted` (the models the panes run) that needs
        attention, plus any model being loaded or that failed to; hide when
        none does. Returns what it shows: "loading" | "error" | "unloaded" | None."""
        wanted = list(dict.fromkeys(wanted))
        # Also any model being loaded or that failed to (asked for, if no pane runs it yet).
        wanted += [m for m in workspace.slot_model_ids()
                   if m not in wanted and workspace.model_state(m) in ("loading", "error")]
        loading = [m for m in wanted if workspace.model_state(m) == "loading"]
        failed = [m for m in wanted if workspace.model_state(m) == "error"]
        unloaded = [m for m in wanted if workspace.model_state(m) == "unloaded"]
        if loading:
            slot = workspace.model_slot(loading[0])
            self.show_progress(slot.progress if slot is not None else None, name_of(loading[0]))
            shown, self.model_id = "loading", loading[0]
        elif failed:
            slot = workspace.model_slot(failed[0])
            self.show_error((slot.error if slot is not None else None) or "unknown error", name_of(failed[0]))
            shown, self.model_id = "error", failed[0]
        elif unloaded and not (crash_recovery or load_requested):
            # Not asked for yet: the load starts as soon as the window is up.
            self.show_progress(None, name_of(unloaded[0]))
            shown, self.model_id = "unloaded", unloaded[0]
        elif unloaded:
            name = name_of(unloaded[0])
            if crash_recovery:
                text = (f"Tandem did not close properly last time, so no model was loaded in case the model caused "
                        f"it. Your chats are all here. Load {name} when you are ready, or pick another model in a pane.")
            else:
                text = f"{name} is not loaded; the panes on it cannot reply until it is."
            self.show_unloaded(text, f"Load {name}")
            shown, self.model_id = "unloaded", unloaded[0]
        else:
            self.hide()
            self.model_id = None
            return None
        self.show()
        return shown


class StoreBanner(QLabel):
    """The chat store's trouble (it cannot be written, or was kept aside), and what still works."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("storeBanner")
        self.setWordWrap(True)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.hide()

    def show_problem(self, text: str) -> None:
        self.setText(text)
        self.show()

    def show_write_failure(self, error: Exception) -> None:
        self.show_problem(f"{error} Nothing open is lost: File → Export saves a chat anywhere you choose.")

    def show_unavailable(self, problem: str) -> None:
        """The chat store could not be opened at all: chats work, but are not saved."""
        self.show_problem(
            f"{problem} Chats are not being saved in this session; File → Export saves one anywhere you choose."
        )
