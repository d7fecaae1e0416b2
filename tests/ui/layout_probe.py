"""Does everything in a pane fit it? A window with N panes, a long reply with
code streamed into each (through the window's own event router, as the
workspace delivers it), then the geometry of every message after the end.

Used in-process by tests/ui/test_layout_geometry.py, and run as a script under
a real X server (Xvfb, the xcb platform), where the clipping was first seen:

    QT_QPA_PLATFORM=xcb python tests/ui/layout_probe.py 1440x900 3

prints one JSON object: {"violations": [...], "pane_widths": [...], ...}.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

# A reply as a model writes it: prose, a table, a long inline identifier, a
# URL, and code with lines far wider than a pane.
LONG_CODE_REPLY = (
    "Here is a function that parses CSV files. It handles quoting, and reports the line number when a row "
    "is malformed, so a bad file is easy to fix.\n\n"
    "```python\n"
    "import csv\n"
    "from pathlib import Path\n\n"
    "def parse_csv(path: Path, delimiter: str = ',', encoding: str = 'utf-8') -> list[dict[str, str]]:\n"
    "    with path.open(newline='', encoding=encoding) as handle:\n"
    "        reader = csv.DictReader(handle, delimiter=delimiter)  # the header row names the fields of every row\n"
    "        return [dict(row) for row in reader]\n"
    "```\n\n"
    "| Argument | Meaning |\n|---|---|\n| `delimiter` | the separator between the fields of a row |\n\n"
    "- `a_very_long_identifier_that_does_not_break_anywhere_in_the_text_of_this_reply_at_all`\n"
    "- see https://docs.python.org/3/library/csv.html#csv.DictReader/and/a/long/path/without/spaces\n\n"
    "Call it as `parse_csv(Path('data.csv'))`: a list of dictionaries, one per row.\n\n"
) * 3


def build_window(width: int, height: int, panes: int) -> Any:
    """A shown MainWindow over a workspace with `panes` panes and no engine."""
    from app.settings import Settings
    from app.workspace.workspace import Workspace
    from ui.window.main_window import MainWindow

    settings = Settings()
    workspace = Workspace(settings)
    for _ in range(panes):
        workspace.add_pane()
    window = MainWindow(workspace, settings, version="test", save_settings=False)
    window.resize(width, height)
    window.show()
    return window


def stream_long_reply(window: Any, process_events: Any, text: str = LONG_CODE_REPLY, stop_last: bool = False) -> None:
    """Every pane: a question, then `text` streamed in chunks and finished, as the workspace reports it."""
    from app import events as ev
    from app.workspace.messages import ReplyStats

    stats = ReplyStats(300, 41.2, 0.05, 812, 800, None, 3.0)
    views = list(window.panes.values())
    for view in views:
        conversation = view.pane.conversation
        window.events(ev.MessageAppended(view.pane_id, conversation.append_user(
            "Write a Python function that parses CSV, with a code block")))
        index = conversation.begin_reply([1, 2, 3])
        window.events(ev.MessageAppended(view.pane_id, index))
    chunk = 60
    for start in range(0, len(text), chunk):
        for view in views:
            piece = text[start:start + chunk]
            view.pane.conversation.add_reply_delta(piece, [1])
            window.events(ev.ReplyDelta(view.pane_id, len(view.pane.conversation.messages) - 1, piece, stats))
        if start % (chunk * 8) == 0:
            window.flush_panes()
            process_events()
    for n, view in enumerate(views):
        state = "stopped" if stop_last and n == len(views) - 1 else "complete"
        final = ReplyStats(300, 41.2, 0.05, 812, 800, "stop" if state == "complete" else "abort", 3.0)
        view.pane.conversation.end_reply(state, stats=final)
        window.events(ev.ReplyFinished(view.pane_id, len(view.pane.conversation.messages) - 1))
    window.flush_panes()
    process_events()


def violations(window: Any) -> list[dict[str, Any]]:
    """Every shown part of a message that reaches past its pane's viewport, or
    an action that cannot be reached (neither its button nor the "⋯" menu shown)."""
    from PySide6.QtCore import QPoint

    found: list[dict[str, Any]] = []
    for pane_id, view in window.panes.items():
        viewport = view.scroll.viewport()
        if view.scroll.widget().width() > viewport.width():
            found.append({"pane": pane_id, "what": "content", "right": view.scroll.widget().width(),
                          "viewport": viewport.width()})
        for index, message in view.messages.items():
            parts: list[tuple[str, Any]] = [("message", message), ("body", message.body),
                                            ("stats", message.stats_label), ("role", message.role_label)]
            parts += [(f"block{n}", w) for n, w in enumerate(message.body.block_widgets())]
            for n, block in enumerate(message.body.code_blocks()):
                parts += [(f"code{n}", block.code), (f"copy{n}", block.copy_button)]
            if message.actions.isVisible():
                parts += [(f"action:{b.text()}", b) for b in message._buttons if b.isVisible()]
            elif message.more_button.isVisible():
                parts.append(("more", message.more_button))
            elif any(b.isVisibleTo(message.actions) for b in message._buttons):
                found.append({"pane": pane_id, "message": index, "what": "actions", "right": -1,
                              "viewport": viewport.width()})
            for name, widget in parts:
                if not widget.isVisible():
                    continue
                right = widget.mapTo(viewport, QPoint(widget.width(), 0)).x()
                if right > viewport.width():
                    found.append({"pane": pane_id, "message": index, "what": name, "right": right,
                                  "viewport": viewport.width()})
    return found


def _main(argv: list[str]) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from PySide6.QtWidgets import QApplication

    from ui.theme import apply_theme

    size, panes = argv[0], int(argv[1])
    width, height = (int(n) for n in size.split("x"))
    app = QApplication.instance() or QApplication(sys.argv[:1])
    apply_theme(app, "light")

    def settle() -> None:
        for _ in range(5):
            app.processEvents()

    window = build_window(width, height, panes)
    settle()
    stream_long_reply(window, settle, stop_last=True)
    settle()
    print(json.dumps({
        "platform": QApplication.platformName(),
        "violations": violations(window),
        "pane_widths": [v.width() for v in window.panes.values()],
        "viewports": [v.scroll.viewport().width() for v in window.panes.values()],
    }), flush=True)
    os._exit(0)  # as the app does: no final collection over Qt objects


if __name__ == "__main__":
    _main(sys.argv[1:])
