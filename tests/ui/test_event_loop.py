"""The window's loop runs callbacks handed over from other threads on its own
thread, in order, without any Qt call on the other thread."""

from __future__ import annotations

import asyncio
import threading

from tests.ui.conftest import on_loop


@on_loop(timeout=60)
async def test_callbacks_from_threads_run_on_the_loop_thread_in_order(loop) -> None:
    loop_thread = threading.get_ident()
    seen: list[tuple[int, int, int]] = []
    done = asyncio.Event()
    per_thread = 2000

    def record(worker: int, n: int) -> None:
        seen.append((worker, n, threading.get_ident()))
        if len(seen) == 2 * per_thread:
            done.set()

    def produce(worker: int) -> None:
        for n in range(per_thread):
            loop.call_soon_threadsafe(record, worker, n)

    workers = [threading.Thread(target=produce, args=(w,)) for w in range(2)]
    for w in workers:
        w.start()
    await asyncio.wait_for(done.wait(), 30)
    for w in workers:
        w.join()
    assert {thread for _, _, thread in seen} == {loop_thread}
    for worker in range(2):
        assert [n for w, n, _ in seen if w == worker] == list(range(per_thread))


@on_loop(timeout=60)
async def test_a_cancelled_handle_does_not_run(loop) -> None:
    ran: list[str] = []
    gate = threading.Event()

    def produce() -> None:
        handle = loop.call_soon_threadsafe(ran.append, "cancelled")
        handle.cancel()
        loop.call_soon_threadsafe(ran.append, "kept")
        gate.set()

    # The loop's thread waits here without yielding, so the handle is
    # cancelled before the loop can run what was handed off (waiting with
    # `await` let the loop run it first now and then, between the hand-off
    # and the cancel, on a busy machine).
    threading.Thread(target=produce).start()
    assert gate.wait(10)
    for _ in range(50):
        if ran:
            break
        await asyncio.sleep(0.01)
    assert ran == ["kept"]
