"""A child program for tests/packaging/test_crash_log.py: the crash hooks as
the `tandem` program installs them, in a process of their own (they replace
process-wide hooks that pytest relies on).

    python tests/packaging/crash_child.py errors|segfault|clean

`errors` raises in a Qt slot, in a background thread and in an asyncio
callback, waits for their reports, and prints one JSON line saying what it
saw; `segfault` dies of SIGSEGV; `clean` ends cleanly.
"""

from __future__ import annotations

import asyncio
import faulthandler
import json
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ui import crash_log  # noqa: E402


def errors() -> int:
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from ui.event_loop import TandemEventLoop

    app = QApplication(sys.argv[:1])
    loop = TandemEventLoop(app)
    asyncio.set_event_loop(loop)
    crash_log.attach_loop(loop)

    def slot() -> None:
        raise RuntimeError("raised in a slot")

    def worker() -> None:
        raise ValueError("raised in a thread")

    def callback() -> None:
        raise KeyError("raised in a callback")

    async def scenario() -> dict[str, object]:
        QTimer.singleShot(0, slot)
        threading.Thread(target=worker, name="tandem-test-worker").start()
        loop.call_soon(callback)
        folder = crash_log.log_dir()
        for _ in range(500):
            if len(list(folder.glob("crash-*.log"))) >= 3:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)  # the thread's dialog request comes through the loop
        dialogs = [w for w in app.topLevelWidgets() if w.objectName() == "crashDialog" and w.isVisible()]
        return {
            "reports": sorted(p.read_text(encoding="utf-8") for p in folder.glob("crash-*.log")),
            "dialogs": len(dialogs),
            "dialog_text": dialogs[0].informativeText() if dialogs else "",
            "still_running": True,  # this line runs after all three errors
        }

    with loop:
        result = loop.run_until_complete(scenario())
    print(json.dumps(result), flush=True)
    crash_log.clean_exit()
    return 0


def main() -> int:
    scenario = sys.argv[1]
    crash_log.install()
    if scenario == "errors":
        return errors()
    if scenario == "segfault":
        faulthandler._sigsegv()
    if scenario == "clean":
        crash_log.clean_exit()
        return 0
    raise SystemExit(f"unknown scenario {scenario!r}")


if __name__ == "__main__":
    sys.exit(main())
