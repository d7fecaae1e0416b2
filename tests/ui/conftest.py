"""Fixtures for driving the real window: a qasync loop per test, a loaded
engine, and a window over a workspace that uses it."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import gc
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

T = TypeVar("T")


@pytest.fixture(autouse=True)
def _private_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Whatever a test does, the user's own settings stay untouched.
    monkeypatch.setenv("TANDEM_CONFIG_DIR", str(tmp_path / "config"))


@pytest.fixture(autouse=True)
def _qt_garbage_is_collected_on_the_gui_thread() -> Iterator[None]:
    """Python's cyclic collector runs in whichever thread happens to cross
    its threshold. When an engine thread collects a finished test's widgets,
    their C++ objects are deleted off the GUI thread, and the Qt event loop
    of a later test crashes on them (seen: SIGSEGV in the GUI thread inside
    the qasync loop while an engine thread ran). So automatic collection is
    off while a UI test runs, and its garbage is collected here, on the GUI
    thread, once its fixtures have closed their windows."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


@pytest.fixture
def loop(qapp: Any) -> Iterator[asyncio.AbstractEventLoop]:
    from ui.event_loop import TandemEventLoop
    from ui.theme import apply_theme

    apply_theme(qapp, "light")
    event_loop = TandemEventLoop(qapp)
    asyncio.set_event_loop(event_loop)
    try:
        yield event_loop
    finally:
        event_loop.close()
        asyncio.set_event_loop(None)


def run(loop: asyncio.AbstractEventLoop, awaitable: Awaitable[T], timeout: float = 120.0) -> T:
    """Run `awaitable` on the qasync loop (the Qt loop turns meanwhile)."""
    return loop.run_until_complete(asyncio.wait_for(awaitable, timeout))


def on_loop(timeout: float = 300.0) -> Callable[[Callable[..., Awaitable[Any]]], Callable[..., Any]]:
    """Run an async test on its `loop` fixture, start to end in one
    run_until_complete: qasync runs callbacks that arrive after a run ends
    with no running loop, which breaks tasks still waiting on the engine."""

    def wrap(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def test(*args: Any, **kwargs: Any) -> Any:
            return run(kwargs["loop"], fn(*args, **kwargs), timeout)

        return test

    return wrap


async def wait_until(predicate: Callable[[], bool], timeout: float = 120.0, what: str = "condition") -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


@pytest.fixture(scope="module")
def tiny_engine_factory(tiny_model_dir: Path) -> Callable[[], Any]:
    from engine import Engine

    def make() -> Any:
        # One engine thread: the GUI thread keeps the other core of a small machine.
        return Engine(tiny_model_dir, device="cpu", dtype="float32", threads=1)

    return make


@pytest.fixture
def make_window(loop: asyncio.AbstractEventLoop, qtbot: Any, tiny_engine_factory: Callable[[], Any]) -> Iterator[Callable[..., Any]]:
    """make_window(panes=3, engine=None, **default_params) -> MainWindow on a ready workspace."""
    from app.settings import Settings
    from app.workspace.workspace import Workspace
    from engine.params import SamplingParams
    from ui.window.main_window import MainWindow

    windows: list[Any] = []

    def make(panes: int = 3, engine: Any = None, **params: Any) -> Any:
        settings = Settings()
        # Filters off: a test that turns the temperature up wants the random model's whole range.
        defaults = dict(temperature=0.0, max_tokens=16, top_k=0, top_p=1.0, min_p=0.0)
        defaults.update(params)
        settings.default_params = dataclasses.replace(SamplingParams(), **defaults)
        workspace = Workspace(settings, engine=engine if engine is not None else tiny_engine_factory())
        for _ in range(panes):
            workspace.add_pane()
        window = MainWindow(workspace, settings, version="test", save_settings=False)
        # Not qtbot.addWidget: pytest-qt would close it outside the asyncio
        # loop; the teardown below closes it on the loop, as the app does.
        window.resize(1280, 800)
        window.show()
        windows.append(window)
        return window

    yield make
    for window in windows:
        if not window.shut_down:
            closed = asyncio.Event()
            window.closed.connect(closed.set)
            window.close()
            run(loop, closed.wait(), timeout=30)
