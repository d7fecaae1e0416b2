"""The user guide's screenshots of the comparison features, from the real app
on the default model, at 1280x800, light and dark:

    QT_QPA_PLATFORM=offscreen .venv/bin/python docs/images/make_compare_screenshots.py

Writes, next to this file (each as NAME-light.png and NAME-dark.png):
arena (two panes under labels A and B, the vote open), arena-revealed (after
the vote), leaderboard (the dialog after three votes), carry (a reply used
in all panes: the other pane shows it as version 2/2), sweep (the Sweep…
dialog), sweep-panes (the panes a seed sweep opened, the sidebar hidden),
turn-summary (the dialog). Uses a temporary config folder and chat store.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ["TANDEM_CONFIG_DIR"] = tempfile.mkdtemp(prefix="tandem-shots-")
os.environ.setdefault("TANDEM_DATA_DIR", tempfile.mkdtemp(prefix="tandem-shots-data-"))

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from shots import close_window, until  # noqa: E402 - the screenshot scripts' shared waits
QUESTIONS = ("Give me one tip for writing clear commit messages.",
             "What is a prefix cache? One sentence.",
             "Name a good first programming language and say why.")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="the folder to write into (default: next to this file)")
    parser.add_argument("--size", default="1280x800", help="the window's size, WIDTHxHEIGHT (default: 1280x800)")
    args = parser.parse_args(argv)
    width, height = (int(n) for n in args.size.lower().split("x"))
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)

    from PySide6.QtWidgets import QApplication, QWidget

    from app.models.registry import ModelRegistry
    from app.settings import Settings
    from app.store.session import ChatSession
    from app.workspace.workspace import Workspace
    from engine.params import SamplingParams
    from ui.event_loop import TandemEventLoop
    from ui.main import version
    from ui.theme import apply_theme
    from ui.window.main_window import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    apply_theme(app, "light")
    loop = TandemEventLoop(app)
    asyncio.set_event_loop(loop)
    settings = Settings()
    settings.default_params = dataclasses.replace(SamplingParams(), max_tokens=70, temperature=0.0)
    workspace = Workspace(settings)
    scratch = Path(os.environ["TANDEM_CONFIG_DIR"])
    session = ChatSession.open(scratch / "chats.sqlite3")
    panes = session.restore(workspace, default_panes=2)
    registry = ModelRegistry(scratch / "models.json")
    window = MainWindow(workspace, settings, version=version(), save_settings=False, session=session,
                        registry=registry)
    window.resize(width, height)

    async def grab(name: str, widget: Callable[[], QWidget] | None = None,
                   prepare: Callable[[], Awaitable[None]] | None = None) -> None:
        """NAME-light.png and NAME-dark.png of the window (or of `widget()`)."""
        for theme in ("light", "dark"):
            apply_theme(app, theme)
            window.flush_panes()
            window.refresh_status()
            if prepare is not None:
                await prepare()
            # Let layouts settle through the loop (processEvents here would run asyncio callbacks inside this task).
            await asyncio.sleep(0.4)
            path = out / f"{name}-{theme}.png"
            (widget() if widget is not None else window).grab().save(str(path), "PNG")
            print("wrote", path)
        apply_theme(app, "light")

    def idle() -> bool:
        return not any(p.busy for p in workspace.panes)

    async def send(text: str) -> None:
        before = sum(len(p.conversation.messages) for p in workspace.panes)
        window.composer.edit.setPlainText(text)
        window.composer.send_button.click()
        await until(lambda: sum(len(p.conversation.messages) for p in workspace.panes) > before)
        await until(idle)

    async def scenario() -> None:
        try:
            await steps()
        except TimeoutError:
            # What the window said (a refused step shows its message there), and each pane's state.
            print("timed out;", window.composer.notice.text(), "|", window.statusBar().currentMessage())
            for pane in workspace.panes:
                print(pane.title, pane.busy, [(m.role, m.state, m.versions is not None) for m in pane.conversation.messages])
            raise

    async def steps() -> None:
        window.show()
        window.load_engine()
        await until(lambda: workspace.engine_state in ("ready", "error"))
        if workspace.engine_state != "ready":
            raise SystemExit(f"model failed to load: {workspace.load_error}")
        first, second = panes
        workspace.set_params(first.id, dataclasses.replace(settings.default_params, temperature=0.0))
        workspace.set_params(second.id, dataclasses.replace(settings.default_params, temperature=0.9, seed=3))
        workspace.set_system_prompt(second.id, "You are a concise senior engineer.")

        # The arena: three turns, the first shown before and after its vote.
        window.menu_actions["arena"].trigger()
        for n, question in enumerate(QUESTIONS):
            await send(question)
            await until(lambda: window.arena_bar.voting)
            if n == 0:
                await grab("arena")
            window.arena.vote("win", "A" if n % 2 == 0 else "B") if n < 2 else window.arena.vote("tie", None)
            if n == 0:
                await grab("arena-revealed")
        window.menu_actions["arena_leaderboard"].trigger()
        board = window.arena.leaderboard
        assert board is not None
        await until(lambda: board.table.rowCount() > 0)
        await grab("leaderboard", lambda: board)
        board.close()
        window.menu_actions["arena"].trigger()

        # The turn summary of the last arena turn.
        window.menu_actions["turn_summary"].trigger()
        summary = window.compare.summary_dialog
        assert summary is not None
        await until(lambda: summary.table.rowCount() > 0)
        await grab("turn-summary", lambda: summary)
        summary.close()

        # Use in all panes: the first pane's reply becomes the second's answer, as version 2/2.
        window.commands.use_in_all_panes(first.id, len(first.conversation.messages) - 1)
        await grab("carry")

        # Sweep…: seeds 1-3 of the first pane at temperature 0.8, each answering its last message again.
        workspace.set_params(first.id, dataclasses.replace(settings.default_params, temperature=0.8))
        window.set_current_pane(first.id)
        window.sweeps.open_current()
        dialog = window.sweeps.dialog
        assert dialog is not None
        dialog.values_edit.setPlainText("1-3")
        await grab("sweep", lambda: dialog)
        dialog.open_button.click()
        await until(lambda: len(workspace.panes) == 5)
        swept = [p for p in workspace.panes if p.title.startswith("seed ")]
        await until(lambda: all(p.conversation.messages[-1].versions is not None for p in swept))
        await until(idle)
        window.close_pane_now(second.id)
        window.sidebar_dock.hide()
        await grab("sweep-panes")
        await close()

    async def close() -> None:
        await close_window(window)

    with loop:
        loop.run_until_complete(scenario())


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)
