"""What the screenshot scripts beside this file share: waiting, inside the
window's event loop, for the app to reach a state, and closing the window
as a user does (its close saves what it must)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any


async def until(predicate: Callable[[], bool], timeout: float = float(os.environ.get("SHOTS_TIMEOUT", 900))) -> None:
    """Return once `predicate()` holds; TimeoutError after `timeout` seconds
    (the model took too long, or a step failed: its message is in the window)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise TimeoutError("the app did not get there in time")
        await asyncio.sleep(0.1)


async def close_window(window: Any) -> None:
    """Close the main window and wait until it has finished closing."""
    closed = asyncio.Event()
    window.closed.connect(closed.set)
    window.close()
    await closed.wait()
