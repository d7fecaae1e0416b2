"""Nothing cut off: after a long reply with code ends, every message fits its
pane's viewport and every action can be reached; panes keep a usable width.

The clipping was reported on X11 (Xvfb, the xcb platform), so besides the
in-process checks (whatever platform the tests run on, offscreen in CI) the
same probe runs under a real X server whenever Xvfb and Qt's xcb plugin are
there.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ui.conftest import run
from tests.xcb_libraries import skip_unless_this_machine_has_them
from tests.ui.layout_probe import build_window, stream_long_reply, violations

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def probe_window(loop: asyncio.AbstractEventLoop, qapp: Any) -> Iterator[Callable[[int, int, int], Any]]:
    windows: list[Any] = []

    def make(width: int, height: int, panes: int) -> Any:
        window = build_window(width, height, panes)
        windows.append(window)
        settle(qapp)
        return window

    yield make
    for window in windows:
        closed = asyncio.Event()
        window.closed.connect(closed.set)
        window.close()
        run(loop, closed.wait(), timeout=30)


def settle(qapp: Any) -> None:
    for _ in range(5):
        qapp.processEvents()


@pytest.mark.parametrize(("width", "height", "panes"), [(1024, 700, 4), (1440, 900, 3), (1280, 800, 3)])
def test_a_long_code_reply_fits_its_pane_after_it_ends(probe_window: Any, qapp: Any, width: int, height: int,
                                                       panes: int) -> None:
    window = probe_window(width, height, panes)
    stream_long_reply(window, lambda: settle(qapp), stop_last=True)
    settle(qapp)
    assert violations(window) == []
    for view in window.panes.values():
        reply = view.messages[1]
        # The panes scroll: a reply this long needs the vertical scroll bar, and still fits beside it.
        assert view.scroll.verticalScrollBar().isVisible()
        # Code keeps its lines: a line wider than the pane scrolls inside its block.
        block = reply.body.code_blocks()[0]
        assert block.code.horizontalScrollBar().maximum() > 0
        assert block.code.document().blockCount() == block.text().count("\n") + 1


def test_panes_keep_a_usable_width_and_the_row_scrolls_sideways(probe_window: Any, qapp: Any) -> None:
    from ui.panes.pane_view import MIN_PANE_CHARS

    window = probe_window(1024, 700, 6)
    views = list(window.panes.values())
    least = views[0].fontMetrics().averageCharWidth() * MIN_PANE_CHARS
    assert all(view.width() >= least for view in views)
    bar = window.pane_row.horizontalScrollBar()
    assert bar.isVisible() and bar.maximum() > 0
    # The current pane is brought on screen.
    window.set_current_pane(views[-1].pane_id)
    settle(qapp)
    last = views[-1]
    left = last.mapTo(window.pane_row.viewport(), last.rect().topLeft()).x()
    assert 0 <= left and left + last.width() <= window.pane_row.viewport().width() + 1
    # Room again: no scrolling.
    window.resize(2200, 700)
    settle(qapp)
    assert bar.maximum() == 0


def test_headers_elide_with_the_whole_title_in_a_tooltip(probe_window: Any, qapp: Any) -> None:
    window = probe_window(1024, 700, 4)
    view = next(iter(window.panes.values()))
    view.pane.name = "A forked conversation about parsing CSV files in Python, with a long title"
    view.refresh_header()
    settle(qapp)
    title = view.title_label
    assert title.is_elided() and title.text().endswith("…")
    assert title.toolTip() == view.pane.title
    # The title never squeezes the rest of the header out of the pane.
    for button in (view.settings_button, view.stop_button, view.close_button):
        assert button.mapTo(view, button.rect().topRight()).x() <= view.width()


def _xvfb_display() -> Iterator[str]:
    """An Xvfb server for the duration (its display name)."""
    for number in range(97, 120):
        if not Path(f"/tmp/.X{number}-lock").exists():
            break
    display = f":{number}"
    server = subprocess.Popen(["Xvfb", display, "-screen", "0", "1600x1000x24", "-nolisten", "tcp"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):
            if Path(f"/tmp/.X11-unix/X{number}").exists():
                break
            if server.poll() is not None:
                pytest.skip("Xvfb did not start")
            time.sleep(0.1)
        yield display
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.fixture
def xvfb() -> Iterator[str]:
    if shutil.which("Xvfb") is None:
        pytest.skip("Xvfb is not installed (apt-get install xvfb): the X11 check needs a real X server")
    yield from _xvfb_display()


@pytest.mark.parametrize(("size", "panes"), [("1024x700", 4), ("1440x900", 3)])
def test_nothing_is_cut_off_under_a_real_x_server(xvfb: str, tmp_path: Path, size: str, panes: int) -> None:
    skip_unless_this_machine_has_them()
    env = dict(os.environ, DISPLAY=xvfb, QT_QPA_PLATFORM="xcb", TANDEM_CONFIG_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "ui" / "layout_probe.py"), size, str(panes)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["platform"] == "xcb"
    assert result["violations"] == []


class _Entry:
    def __init__(self, model_id: str, name: str) -> None:
        self.id, self.name, self.path, self.kind_label = model_id, name, None, "Built in"

    def available(self) -> bool:
        return True


def test_the_model_picker_keeps_the_start_of_the_name_readable(qtbot: Any) -> None:
    from ui.widgets.model_picker import ModelPicker

    picker = ModelPicker()
    qtbot.addWidget(picker)
    picker.set_models([_Entry("default", "SmolLM2-135M-Instruct")], "default")
    chars = picker.fontMetrics().averageCharWidth()
    # Never squeezed to "Sm": at least MIN_CHARS of the name beside the arrow; the whole name on hover.
    assert picker.minimumSizeHint().width() >= chars * ModelPicker.MIN_CHARS
    assert picker.sizeHint().width() >= picker.fontMetrics().horizontalAdvance("SmolLM2-135M-Instruct")
    assert "SmolLM2-135M-Instruct" in picker.toolTip()


@pytest.mark.parametrize("panes", [1, 3])
def test_a_restored_interrupted_reply_fits_its_pane_at_1024x700(loop: Any, qapp: Any, panes: int) -> None:
    """After a crash the session comes back with the reply "interrupted": its
    note must not widen the pane past the window (text cut, actions off screen)."""
    from app.settings import Settings
    from app.workspace.workspace import Workspace
    from ui.window.main_window import MainWindow

    settings = Settings()
    workspace = Workspace(settings)
    for _ in range(panes):
        conversation = workspace.add_pane().conversation
        conversation.append_user("What is the capital of France? Answer in one long paragraph, please.")
        conversation.begin_reply([1, 2, 3])
        conversation.add_reply_delta("The capital of France is Paris, a city on the Seine known for " * 6, [4])
        conversation.end_reply("interrupted")
    window = MainWindow(workspace, settings, version="test", save_settings=False)
    window.resize(1024, 700)
    window.show()
    try:
        settle(qapp)
        assert violations(window) == []
        for view in window.panes.values():
            reply = view.messages[1]
            assert reply.state == "interrupted"
            # What happened stays readable: a short note on screen, the whole sentence on hover.
            assert reply.state_label.isVisible() and "interrupted" in reply.state_label.text()
            assert "Tandem closed" in reply.state_label.toolTip()
            # Copy and Regenerate are reachable: as buttons, or through "⋯".
            assert reply.actions.isVisible() or reply.more_button.isVisible()
            right = view.mapTo(window, view.rect().topRight()).x()
            assert right <= window.width()
    finally:
        closed = asyncio.Event()
        window.closed.connect(closed.set)
        window.close()
        run(loop, closed.wait(), timeout=30)
