"""`tandem --smoke-test OUT.png`: the real app, end to end, for packaging and CI.

Two panes (or `--panes N`), one prompt broadcast to all of them on the model
(the default one unless --model says otherwise), every reply awaited, a
screenshot of the whole window (1280x800, or `--window-size WxH`) saved, so
that an installation can be checked at any size. Exit 0 on success; otherwise one line on stderr says why and
the exit status is 1. Settings go to a temporary config folder, so the
user's own are never read or written; imported models (TANDEM_DATA_DIR) are
shared, so a second run does not import the model again.

The conversations are saved to the chat store in the data folder
(through app.store.session.ChatSession, as a run of the app saves them), titled
"Smoke test: ...", so that a later start, or `tandem chats list`, proves the
store written here is the one found there: that is what tells a packaged
app from one that keeps its data somewhere else. The saved window layout is
left alone (the user's open panes are not replaced by the smoke test's).

A line `startup: ...` gives the seconds from the process's start to the
window's first frame on screen, to the full window, and to the model being
ready (docs/packaging.md); a line `loading: ...` when the load was asked for
and when each of its stages began, as the window saw them (before the
first report the engine imports PyTorch and loads or, the first time,
builds its CPU kernels; docs/benchmarks.md "First launch" has each stage
measured alone). The smoke test starts as `tandem` does (ui/startup.py: the
frame first, the heavy imports behind it).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

from ui.startup import process_age

__all__ = ["process_age", "run_smoke_test"]

PROMPT = "In one sentence, what is a tandem bicycle?"
LOAD_TIMEOUT_S = 900.0  # the first run imports the GGUF file
REPLY_TIMEOUT_S = 300.0
MAX_TOKENS = 48
SMOKE_TITLE = "Smoke test"  # the saved conversations' titles start with it


class SmokeFailure(Exception):
    pass


def run_smoke_test(args: argparse.Namespace) -> int:
    out = Path(args.smoke_test)
    if out.suffix.lower() != ".png":
        print(f"smoke test failed: the screenshot path must end in .png, not {out.name!r}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="tandem-smoke-") as config:
        os.environ["TANDEM_CONFIG_DIR"] = config
        try:
            _run(args, out)
        except SmokeFailure as exc:
            print(f"smoke test failed: {exc}", file=sys.stderr)
            return 1
        except Exception as exc:  # whatever broke, one line, non-zero
            print(f"smoke test failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
    print(f"smoke test passed: {args.panes or 2} replies, screenshot saved to {out}")
    return 0


def _run(args: argparse.Namespace, out: Path) -> None:
    from app.settings import Settings
    from ui import crash_log
    from ui.main import _run_settings, _set_app_identity, version
    from ui.startup import import_in_background, show_startup_frame, start_application
    from ui.theme import apply_theme

    timings: dict[str, float | None] = {}
    stages: dict[str, float | None] = {}  # when each loading stage was first reported
    shown: list[str] = []  # the window's size on screen
    settings = _run_settings(Settings.load(), args)  # the temporary folder's: the defaults
    app = start_application(sys.argv[:1])
    app.setApplicationName("Tandem")
    _set_app_identity(app)
    apply_theme(app, settings.theme)
    frame = show_startup_frame(app, None, args.window_size or (1280, 800))
    timings["frame"] = process_age()
    import_in_background()

    from ui.event_loop import TandemEventLoop
    from app.store.chat_store import StoreError
    from app.store.session import ChatSession
    from app.workspace.workspace import Workspace
    from ui.window.main_window import MainWindow

    loop = TandemEventLoop(app)
    asyncio.set_event_loop(loop)
    crash_log.attach_loop(loop)
    try:
        session = ChatSession.open()
    except StoreError as exc:
        raise SmokeFailure(f"the chat store cannot be used: {exc}") from None
    workspace = Workspace(settings)
    panes = [workspace.add_pane() for _ in range(args.panes or 2)]
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    for number, pane in enumerate(panes):
        kind = "greedy" if number == 0 else f"sampled, seed {6 + number}"
        pane.conversation.title = f"{SMOKE_TITLE}: {kind} ({stamp})"
    window = MainWindow(workspace, settings, version=version(), save_settings=False)

    async def scenario() -> None:
        frame.hand_over(window)
        await asyncio.sleep(0)  # one turn of the loop: the window's first paint
        timings["window"] = process_age()
        shown.append(f"{window.width()}x{window.height()}")
        unsubscribe = workspace.subscribe(lambda event: _note_stage(event, stages))
        stages["asked"] = process_age()
        window.load_engine()
        try:
            await _wait_ready(workspace)
        finally:
            unsubscribe()
        timings["ready"] = process_age()
        stats = workspace.stats()
        weights = stats.weights if stats is not None else "unknown"
        base = dataclasses.replace(settings.default_params, max_tokens=MAX_TOKENS)
        for number, pane in enumerate(panes):
            sampled = dataclasses.replace(base, temperature=0.7, seed=6 + number)
            workspace.set_params(pane.id, dataclasses.replace(base, temperature=0.0, seed=None) if number == 0 else sampled)
        # Through the window, as a user would: the message box and Send.
        window.composer.edit.setPlainText(PROMPT)
        window.composer.send_button.click()
        for _ in range(600):  # the send task queues the requests at once, or says why not
            if window.composer.notice.isVisible():
                raise SmokeFailure(f"the window refused the message: {window.composer.notice.text()}")
            if all(p.conversation.messages for p in panes):
                break
            await asyncio.sleep(0.1)
        else:
            raise SmokeFailure("sending the message did not start any reply within 60 s")
        try:
            await asyncio.wait_for(_replies_done(workspace, panes), REPLY_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise SmokeFailure(f"the replies did not finish within {REPLY_TIMEOUT_S:.0f} s") from None
        for pane in panes:
            reply = pane.conversation.messages[-1]
            if reply.role != "assistant" or reply.state != "complete":
                raise SmokeFailure(f"{pane.title}'s reply ended as {reply.state!r}: {reply.error or 'no error given'}")
            if not reply.text.strip():
                raise SmokeFailure(f"{pane.title}'s reply is empty")
        window.flush_panes()
        window.refresh_status()
        await asyncio.sleep(0.2)  # let layouts settle before the picture
        out.parent.mkdir(parents=True, exist_ok=True)
        if not window.grab().save(str(out), "PNG"):
            raise SmokeFailure(f"could not write the screenshot to {out}")
        await _save_conversations(session, panes)
        print(f"weights: {weights}")

    failure: list[BaseException] = []

    async def main() -> None:
        try:
            await scenario()
        except BaseException as exc:
            failure.append(exc)
        finally:
            closed = asyncio.Event()
            window.closed.connect(closed.set)
            window.close()
            try:
                await asyncio.wait_for(closed.wait(), 10)
            except asyncio.TimeoutError:
                failure.append(SmokeFailure("the window did not close within 10 s"))

    with loop:
        loop.run_until_complete(main())
        # Closed whatever happened: an open session would read as a crash at the next start.
        if not loop.run_until_complete(session.aclose()):
            failure.append(SmokeFailure(f"the chat store's writer did not finish saving to {session.store.path}"))
    if failure:
        raise failure[0]
    print(
        f"startup: window shown {_seconds(timings.get('frame'))} (its first frame; the full window "
        f"{_seconds(timings.get('window'))}), model ready {_seconds(timings.get('ready'))} after the process started"
    )
    print("loading: " + ", ".join(f"{_STAGE_NAMES.get(stage, stage)} {_seconds(at)}" for stage, at in stages.items())
          + " after the process started")
    print(f"window: {shown[0] if shown else 'never shown'}, {len(panes)} panes")


_STAGE_NAMES = {"asked": "asked", "import": "GGUF import", "weights": "weights", "warmup": "warm-up", "ready": "ready"}


def _note_stage(event: object, stages: dict[str, float | None]) -> None:
    from app.events import EngineStateChanged

    if not isinstance(event, EngineStateChanged):
        return
    stage = event.progress.stage if event.progress is not None else event.state
    if stage in _STAGE_NAMES and stage not in stages:
        stages[stage] = process_age()


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} s"


async def _save_conversations(session: object, panes: list) -> None:
    """Queue both conversations for the store's writer and wait until it has
    written them (a write failure comes back as the writer's failure count)."""
    writer = session.writer
    failures = writer.failures
    for pane in panes:
        writer.save_conversation(pane.conversation)
    if not await asyncio.to_thread(writer.flush, 30.0):
        raise SmokeFailure(f"saving the conversations to {session.store.path} took longer than 30 s")
    if writer.failures != failures:
        raise SmokeFailure(f"the conversations could not be saved to {session.store.path}")


async def _wait_ready(workspace: object) -> None:
    ready = asyncio.Event()
    unsubscribe = workspace.subscribe(lambda e: ready.set() if getattr(e, "state", None) in ("ready", "error") else None)
    try:
        if workspace.engine_state not in ("ready", "error"):
            await asyncio.wait_for(ready.wait(), LOAD_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise SmokeFailure(f"the model did not load within {LOAD_TIMEOUT_S:.0f} s") from None
    finally:
        unsubscribe()
    if workspace.engine_state != "ready":
        raise SmokeFailure(f"the model could not be loaded: {workspace.load_error}")


async def _replies_done(workspace: object, panes: list) -> None:
    """Until every pane has a reply that is no longer streaming."""
    done = asyncio.Event()

    def check(_event: object = None) -> None:
        if all(p.conversation.messages and p.conversation.messages[-1].role == "assistant"
               and not p.busy for p in panes):
            done.set()

    unsubscribe = workspace.subscribe(check)
    try:
        check()
        await done.wait()
    finally:
        unsubscribe()
