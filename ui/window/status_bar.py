"""The status bar: the engine's device, weights and KV cache at a glance.

Messages the window flashes (saved, serving, ...) use the bar's own
`showMessage`; the permanent label on its right shows the current pane's
model, refreshed on a timer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import QRect, Qt
from PySide6.QtGui import QPainter, QPaintEvent
from PySide6.QtWidgets import QLabel, QStatusBar, QWidget

if TYPE_CHECKING:
    from engine import EngineStats

STATS_INTERVAL_MS = 500
# Room between a flashed message and the permanent text, in average characters.
MESSAGE_GAP_CHARS = 3


_KERNEL_SUFFIXES = (" (kernel)", " (triton)")  # EngineStats.weights of a model run quantized
_DEQUANTIZED = " (dequantized from "


def describe_arithmetic(weights: str, dtype: str) -> str:
    """How a model's products are computed, from EngineStats.weights:
    "q4_1+q8_0 kernels, int8 activations", "float32, dequantized from q4_1", "bfloat16"."""
    for suffix in _KERNEL_SUFFIXES:
        if weights.endswith(suffix):
            return f"{weights.removesuffix(suffix)} kernels, int8 activations"
    if _DEQUANTIZED in weights:
        kept, source = weights.removesuffix(")").split(_DEQUANTIZED, 1)
        return f"{kept}, dequantized from {source}"
    return weights or dtype


def explain_arithmetic(weights: str, dtype: str) -> str:
    """A sentence for the tooltip: what the arithmetic means for the replies."""
    if weights.endswith(_KERNEL_SUFFIXES):
        return ("The quantized weights run on Tandem's kernels, which round each row of activations to int8 "
                "as llama.cpp does: the same arithmetic as llama.cpp on the same file. Greedy replies can "
                "differ from those of the weights dequantized to floats.")
    if _DEQUANTIZED in weights:
        return ("The quantized weights were expanded to floats at load: float arithmetic throughout, more "
                "memory and slower than the kernels. Greedy replies can differ from llama.cpp's on the same file.")
    return f"Float weights: every product is computed in {weights or dtype}."


def describe_stats(stats: EngineStats) -> str:
    """'cpu · q4_1 kernels, int8 activations · KV pages 3 used / 10 cached / 87 free · prefix hits 80% · 41 tok/s'."""
    dtype = str(stats.dtype).replace("torch.", "")
    text = (
        f"{stats.device} · {describe_arithmetic(stats.weights, dtype)} · KV pages {stats.pages_used} used / "
        f"{stats.pages_cached} cached / {stats.pages_free} free · prefix hits {stats.prefix_hit_rate:.0%}"
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

    def message_rect(self) -> QRect:
        """Where a flashed message is drawn: left of the permanent text, a gap short of it."""
        right = self.width() - 12
        if self.engine_label.isVisible() and self.engine_label.text():
            right = self.engine_label.x() - self.fontMetrics().averageCharWidth() * MESSAGE_GAP_CHARS
        return QRect(6, 0, max(right - 6, 0), self.height())

    def shown_message(self) -> str:
        """The flashed message as drawn: ending in "…" when it does not fit beside the permanent text."""
        return self.fontMetrics().elidedText(self.currentMessage(), Qt.TextElideMode.ElideRight,
                                             self.message_rect().width())

    def paintEvent(self, event: QPaintEvent) -> None:  # noqa: N802
        # QStatusBar draws a message up to the permanent text, cut without "…", so
        # at 1024 pixels "…stop it, the" ran straight into "cpu · q4_1". Drawn here instead.
        if not self.currentMessage():
            super().paintEvent(event)
            return
        painter = QPainter(self)
        painter.setPen(self.palette().color(self.foregroundRole()))
        painter.drawText(self.message_rect(), Qt.AlignmentFlag.AlignLeading | Qt.AlignmentFlag.AlignVCenter
                         | Qt.TextFlag.TextSingleLine, self.shown_message())
        painter.end()

    def show_stats(self, stats: EngineStats | None) -> None:
        """Describe `stats`; None (nothing loaded to ask) keeps what is shown."""
        if stats is not None:
            self.engine_label.setText(describe_stats(stats))
            dtype = str(stats.dtype).replace("torch.", "")
            self.engine_label.setToolTip(explain_arithmetic(stats.weights, dtype))

    def show_no_model(self) -> None:
        self.engine_label.setText("No model loaded")

    def show_model_state(self, state: str) -> None:
        """The current pane's model is `state` ("loading" | "ready" | "error" | "unloaded" | "closed"):
        "Loading model…" only while one loads (never after a crash, when nothing does)."""
        if state == "loading":
            self.engine_label.setText("Loading model…")
        elif state in ("error", "unloaded", "closed"):
            self.show_no_model()
