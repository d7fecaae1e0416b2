"""The status bar: the engine's device, weights and KV cache at a glance.

Messages the window flashes (saved, serving, ...) use the bar's own
`showMessage`; the permanent label on its right shows the current pane's
model, refreshed on a timer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtWidgets import QLabel, QStatusBar, QWidget

if TYPE_CHECKING:
    from engine.llm import EngineStats

STATS_INTERVAL_MS = 500


def describe_stats(stats: EngineStats) -> str:
    """'cpu · q4_1 · KV pages 3 used / 10 cached / 87 free · prefix hits 80% · 41 tok/s'."""
    device = stats.device
    dtype = str(stats.dtype).replace("torch.", "")
    weights = stats.weights
    if weights.endswith(" (kernel)"):  # kept quantized: the formats say more than the input dtype
        dtype = weights.removesuffix(" (kernel)")
    text = (
        f"{device} · {dtype} · KV pages {stats.pages_used} used / {stats.pages_cached} cached / "
        f"{stats.pages_free} free · prefix hits {stats.prefix_hit_rate:.0%}"
    )
    if stats.running:
        text += f" · {stats.decode_tokens_per_s:.0f} tok/s"
    return text


class WindowStatusBar(QStatusBar):
    """A status bar whose permanent `engine_label` describes the engine."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        # Until the window hears how the models are (show_model_state), nothing is claimed.
        self.engine_label = QLabel("", self)
        self.addPermanentWidget(self.engine_label)

    def show_stats(self, stats: EngineStats | None) -> None:
        """Describe `stats`; None (nothing loaded to ask) keeps what is shown."""
        if stats is not None:
            self.engine_label.setText(describe_stats(stats))

    def show_no_model(self) -> None:
        self.engine_label.setText("No model loaded")

    def show_model_state(self, state: str) -> None:
        """The current pane's model is `state` ("loading" | "ready" | "error" | "unloaded" | "closed"):
        "Loading model…" only while one loads (never after a crash, when nothing does)."""
        if state == "loading":
            self.engine_label.setText("Loading model…")
        elif state in ("error", "unloaded", "closed"):
            self.show_no_model()
