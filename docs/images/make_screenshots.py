"""Regenerate the user guide's screenshots from the real app on the default model.

    QT_QPA_PLATFORM=offscreen .venv/bin/python docs/images/make_screenshots.py

Writes, next to this file: panes-light.png and panes-dark.png (three panes
mid-comparison, with the chats sidebar, 1440x860), fork.png (a pane forked
from a reply, its next turn served from the cache), compare.png (word-level
differences).
Uses a temporary config folder and chat store; the user's settings and
chats are not touched.

    ... make_screenshots.py --layout-check --size 1024x700 --panes 4 --out /tmp/shots

writes only window.png (the main window after a short reply in each pane)
and model-manager.png (Models > Manage models over it), to check at a
small size that nothing is cut off.

    QT_QPA_PLATFORM=xcb xvfb-run -s '-screen 0 1600x1000x24' .venv/bin/python \
        docs/images/make_screenshots.py --code-reply --size 1024x700 --panes 4

writes code-1024x700-light.png and code-1024x700-dark.png: every pane after
a long reply with a code block has finished (highlighted code that scrolls
sideways inside its block, nothing cut off).

    ... make_screenshots.py --json-panes --size 1440x900 --out /tmp/json_shots

writes only json-panes.png: three panes replying as JSON to one saved
schema, each reply indented with its validity mark (the third pane's
max tokens cut its reply off: invalid); and json-summary.png, the turn summary with its JSON column.
`--help` lists the options.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ["TANDEM_CONFIG_DIR"] = tempfile.mkdtemp(prefix="tandem-shots-")
os.environ.setdefault("TANDEM_DATA_DIR", tempfile.mkdtemp(prefix="tandem-shots-data-"))

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from shots import close_window, until  # noqa: E402 - the screenshot scripts' shared waits
QUESTION = "What is a prefix cache in an LLM server? Answer briefly, then show a tiny Python example."
CODE_QUESTION = "Write a Python function that parses CSV, with a code block"
JSON_QUESTION = "Describe the film Blade Runner: its title, the year it came out and a few tags."
MOVIE_SCHEMA = """{
  "type": "object",
  "properties": {
    "title": {"type": "string"},
    "year": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5}
  },
  "required": ["title", "year"],
  "additionalProperties": false
}"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Screenshots of the real app on the default model.")
    parser.add_argument("--out", type=Path, default=HERE, help="the folder to write into (default: next to this file)")
    parser.add_argument("--size", default="1440x860", help="the window's size, WIDTHxHEIGHT (default: 1440x860)")
    parser.add_argument("--panes", type=int, default=3, help="how many panes (default: 3)")
    parser.add_argument("--layout-check", action="store_true",
                        help="only window.png and model-manager.png, to check a size's layout")
    parser.add_argument("--code-reply", action="store_true",
                        help="only code-WxH-light.png and code-WxH-dark.png: a long code reply in every pane")
    parser.add_argument("--json-panes", action="store_true",
                        help="only json-panes.png: three panes replying to one saved JSON schema, with their marks")
    args = parser.parse_args(argv)
    try:
        args.width, args.height = (int(n) for n in args.size.lower().split("x"))
    except ValueError:
        parser.error(f"--size must be WIDTHxHEIGHT, e.g. 1024x700, not {args.size!r}")
    if not 1 <= args.panes <= 12:
        parser.error("--panes must be from 1 to 12")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)

    from ui.event_loop import TandemEventLoop
    from PySide6.QtWidgets import QApplication, QWidget

    from app.models.registry import ModelRegistry
    from app.store.session import ChatSession
    from app.settings import Settings
    from app.workspace.workspace import Workspace
    from engine.params import SamplingParams
    from ui.main import version
    from ui.window.main_window import MainWindow
    from ui.theme import apply_theme

    app = QApplication.instance() or QApplication(sys.argv[:1])
    apply_theme(app, "light")
    loop = TandemEventLoop(app)
    asyncio.set_event_loop(loop)
    settings = Settings()
    max_tokens = 40 if args.layout_check else 360 if args.code_reply else 120
    settings.default_params = dataclasses.replace(SamplingParams(), max_tokens=max_tokens, temperature=0.0)
    workspace = Workspace(settings)
    scratch = Path(os.environ["TANDEM_CONFIG_DIR"])
    session = ChatSession.open(scratch / "chats.sqlite3")
    panes = session.restore(workspace, default_panes=args.panes)
    registry = ModelRegistry(scratch / "models.json")
    window = MainWindow(workspace, settings, version=version(), save_settings=False, session=session,
                        registry=registry)
    window.resize(args.width, args.height)

    async def grab(name: str, widget: QWidget | None = None) -> None:
        window.flush_panes()
        window.refresh_status()
        # Let layouts settle through the loop (processEvents here would run
        # asyncio callbacks inside this task).
        await asyncio.sleep(0.3)
        (widget or window).grab().save(str(out / name), "PNG")
        print("wrote", out / name)

    async def layout_check() -> None:
        window.composer.edit.setPlainText(QUESTION)
        window.composer.send_button.click()
        await until(lambda: all(len(p.conversation.messages) == 2 for p in panes))
        await until(lambda: not any(p.busy for p in panes))
        await grab("window.png")
        window.models.open_manager()
        manager = window.models.manager
        assert manager is not None
        await grab("model-manager.png", manager)
        manager.close()

    async def code_reply() -> None:
        window.composer.edit.setPlainText(CODE_QUESTION)
        window.composer.send_button.click()
        await until(lambda: all(len(p.conversation.messages) == 2 for p in panes))
        await until(lambda: not any(p.busy for p in panes))
        for view in window.panes.values():  # the start of the reply, with its code block, in view
            view.scroll.verticalScrollBar().setValue(view.messages[1].y() - 4)
        stem = f"code-{args.width}x{args.height}"
        await grab(f"{stem}-light.png")
        apply_theme(app, "dark")
        await grab(f"{stem}-dark.png")
        apply_theme(app, "light")

    async def json_panes() -> None:
        from engine.structured import Constraint

        window.saved_schemas.save_as("movie", MOVIE_SCHEMA)
        movie = Constraint("json_schema", MOVIE_SCHEMA)
        variants = [
            dict(temperature=0.0),
            dict(temperature=0.8, seed=7),
            dict(temperature=0.0, max_tokens=10),  # cut off before the JSON is complete
        ]
        for pane, variant in zip(panes, variants):
            workspace.set_params(pane.id, dataclasses.replace(settings.default_params, constraint=movie, **variant))
            window.panes[pane.id].refresh_header()
        window.composer.edit.setPlainText(JSON_QUESTION)
        window.composer.send_button.click()
        await until(lambda: all(len(p.conversation.messages) == 2 for p in panes))
        await until(lambda: not any(p.busy for p in panes))
        window.flush_panes()
        await until(lambda: all(window.panes[p.id].messages[1].json_verdict is not None for p in panes))
        await grab("json-panes.png")
        window.compare.show_turn_summary()
        dialog = window.compare.summary_dialog
        assert dialog is not None
        await until(lambda: bool(dialog.figures))
        await grab("json-summary.png", dialog)
        dialog.close()

    async def scenario() -> None:
        window.show()
        window.load_engine()
        await until(lambda: workspace.engine_state in ("ready", "error"))
        if workspace.engine_state != "ready":
            raise SystemExit(f"model failed to load: {workspace.load_error}")
        if args.json_panes:
            await json_panes()
            await close()
            return
        if args.layout_check or args.code_reply:
            await (layout_check() if args.layout_check else code_reply())
            await close()
            return
        variants = [
            dict(temperature=0.0),
            dict(temperature=0.8, seed=7),
            dict(temperature=1.1, seed=42, top_p=0.9),
        ]
        for pane, variant in zip(panes, variants):
            workspace.set_params(pane.id, dataclasses.replace(settings.default_params, **variant))
        workspace.set_system_prompt(panes[2].id, "You are a concise senior engineer.")
        window.composer.edit.setPlainText(QUESTION)
        window.composer.send_button.click()

        def replies_have(tokens: int) -> bool:
            return all(len(p.conversation.messages) == 2 and len(p.conversation.messages[1].token_ids) >= tokens
                       for p in panes)

        await until(lambda: all(len(p.conversation.messages) == 2 for p in panes))
        await until(lambda: replies_have(60) or not any(p.busy for p in panes))
        await grab("panes-light.png")
        apply_theme(app, "dark")
        await grab("panes-dark.png")
        apply_theme(app, "light")
        await until(lambda: not any(p.busy for p in panes))

        # Fork the second pane from its reply and ask a follow-up in the fork only.
        window.fork(panes[1].id, 1)
        fork = workspace.panes[2]
        window.composer.set_targets([fork.id])
        window.composer.edit.setPlainText("Now say it in one sentence.")
        window.composer.send_button.click()
        await until(lambda: len(fork.conversation.messages) == 4 and not fork.busy)
        await grab("fork.png")
        window.close_pane_now(fork.id)

        window.compare_bar.set_chosen(panes[0].id, panes[1].id)
        window.compare_action.setChecked(True)
        window.refresh_compare()
        await grab("compare.png")
        window.compare_action.setChecked(False)
        await close()

    async def close() -> None:
        await close_window(window)

    with loop:
        loop.run_until_complete(scenario())


if __name__ == "__main__":
    main()
    # As the app does (ui/main.py): leave without the interpreter's final
    # garbage collection, which can meet Qt objects already torn down.
    sys.stdout.flush()
    os._exit(0)
