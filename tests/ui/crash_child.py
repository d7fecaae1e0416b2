"""The real app, driven like a user, for the crash test (tests/ui/test_crash_recovery.py).

    python tests/ui/crash_child.py --model TINY_MODEL_DIR --threads 1

It runs `ui.main.main()` unchanged (offscreen), and a timer plays the user:
it reports what the window restored (a line `RESTORED {json}`), loads the
model from the banner when the app says it crashed last time, opens a new
pane, sends a message that gets a long reply, and once the chat store holds
a checkpoint of that reply with some text, prints `CHECKPOINT {json}` and
keeps streaming until the parent kills it.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine.formats.default_model import data_dir  # noqa: E402
from engine.params import SamplingParams# noqa: E402
from ui import main as tandem  # noqa: E402
from ui.window.main_window import MainWindow  # noqa: E402

ENDLESS = SamplingParams(temperature=0.0, max_tokens=1500, ignore_eos=True)


def say(kind: str, payload: Any) -> None:
    print(f"{kind} {json.dumps(payload)}", flush=True)


class User:
    def __init__(self, app: QApplication, message: str) -> None:
        self.app = app
        self.message = message
        self.step = "restore"
        self.pane_id: int | None = None
        self.timer = QTimer()
        self.timer.timeout.connect(self.tick)
        self.timer.start(50)

    def window(self) -> MainWindow | None:
        for widget in self.app.topLevelWidgets():
            if isinstance(widget, MainWindow) and widget.isVisible():
                return widget
        return None

    def tick(self) -> None:
        window = self.window()
        if window is None:
            return
        ws = window.workspace
        if self.step == "restore":
            say("RESTORED", {
                "crash_recovery": window.crash_recovery,
                "banner": window.banner.label.text() if window.banner.isVisible() else None,
                "panes": [
                    {"conversation": p.conversation.id,
                     "messages": [[m.role, m.state, m.text] for m in p.conversation.messages]}
                    for p in ws.panes
                ],
            })
            if window.crash_recovery:
                window.banner.retry.click()  # "Load <model>": the user chooses to load it
            self.step = "load"
        elif self.step == "load":
            if ws.engine_state != "ready":
                return
            window.add_pane()
            self.pane_id = window.current_pane_id
            ws.set_params(self.pane_id, ENDLESS)
            window.composer.edit.setPlainText(self.message)
            window.send(self.message, [self.pane_id])
            self.step = "stream"
        elif self.step == "stream":
            pane = ws.pane(self.pane_id)
            conversation = pane.conversation
            if conversation.streaming_index is None:
                return
            row = self.stored_reply(conversation.id, conversation.streaming_index)
            if row is not None and row[0] == "streaming" and row[1]:
                say("CHECKPOINT", {"conversation": conversation.id, "position": conversation.streaming_index,
                                   "text": row[1]})
                self.step = "wait"

    @staticmethod
    def stored_reply(conversation_id: str, position: int) -> tuple[str, str] | None:
        path = data_dir() / "chats.sqlite3"
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1)
        try:
            return conn.execute(
                "SELECT state, text FROM messages WHERE conversation_id = ? AND position = ?",
                (conversation_id, position),
            ).fetchone()
        except sqlite3.Error:
            return None
        finally:
            conn.close()


def run() -> int:
    app = QApplication(sys.argv[:1])
    argv = sys.argv[1:]
    message = argv.pop(argv.index("--message") + 1)
    argv.remove("--message")
    user = User(app, message)  # noqa: F841 - kept alive by this frame
    return tandem.main(argv)


if __name__ == "__main__":
    sys.exit(run())
