"""Regenerate the user guide's screenshots from the real app on the default model.

    QT_QPA_PLATFORM=offscreen .venv/bin/python docs/images/make_screenshots.py

Writes, next to this file: panes-light.png and panes-dark.png (three panes
mid-comparison, with the chats sidebar, 1440x860), fork.png (a pane forked
from a reply, its next turn served from the cache), compare.png (word-level
differences).
Uses a temporary config folder and chat store; the user's settings and
chats are not touched.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ["TANDEM_CONFIG_DIR"] = tempfile.mkdtemp(prefix="tandem-shots-")

HERE = Path(__file__).resolve().parent
QUESTION = "What is a prefix cache in an LLM server? Answer briefly, then show a tiny Python example."


async def until(predicate, timeout: float = 900.0) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise TimeoutError("the model took too long")
        await asyncio.sleep(0.1)


def main() -> None:
    from ui.event_loop import TandemEventLoop
    from PySide6.QtWidgets import QApplication

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
    settings.default_params = dataclasses.replace(SamplingParams(), max_tokens=120)
    workspace = Workspace(settings)
    scratch = Path(os.environ["TANDEM_CONFIG_DIR"])
    session = ChatSession.open(scratch / "chats.sqlite3")
    panes = session.restore(workspace, default_panes=3)
    registry = ModelRegistry(scratch / "models.json")
    window = MainWindow(workspace, settings, version=version(), save_settings=False, session=session,
                        registry=registry)
    window.resize(1440, 860)

    async def grab(name: str) -> None:
        window._flush_panes()
        window.refresh_status()
        # Let layouts settle through the loop (processEvents here would run
        # asyncio callbacks inside this task).
        await asyncio.sleep(0.3)
        window.grab().save(str(HERE / name), "PNG")
        print("wrote", HERE / name)

    async def scenario() -> None:
        window.show()
        window.load_engine()
        await until(lambda: workspace.engine_state in ("ready", "error"))
        if workspace.engine_state != "ready":
            raise SystemExit(f"model failed to load: {workspace.load_error}")
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
        window._close_pane_now(fork.id)

        window.compare_bar.set_chosen(panes[0].id, panes[1].id)
        window.compare_action.setChecked(True)
        window.refresh_compare()
        await grab("compare.png")
        window.compare_action.setChecked(False)


        closed = asyncio.Event()
        window.closed.connect(closed.set)
        window.close()
        await closed.wait()

    with loop:
        loop.run_until_complete(scenario())


if __name__ == "__main__":
    main()
