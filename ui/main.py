"""`tandem`: open the window; `tandem chats ...`, `tandem models ...` and
`tandem arena ...`: the command-line tools (no window, no Qt).

The window's first frame is on screen a few tenths of a second after
launch; the window's own imports come after it (ui/startup.py), then the
window itself, and the model loads behind it (with progress; torch is
imported then, on the loading thread): the message box becomes usable when
it is ready. Before Qt starts, a Linux
machine is checked for the system libraries Qt's X11 plugin needs
(ui/platform_check.py): a missing one is named, with the `apt` line that
installs it. `--smoke-test OUT.png` runs the real app end to end for
packaging and CI (see ui/smoke.py).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import signal
import sys
from importlib import metadata
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from PySide6.QtWidgets import QApplication

    from app.models.registry import ModelRegistry
    from app.settings import Settings


def version() -> str:
    try:
        return metadata.version("tandem")
    except metadata.PackageNotFoundError:
        return "0.1.0"


# `tandem NAME ...`: the module whose `main(argv) -> int` runs the subcommand.
# A module that is not there (an older install) is reported, not imported.
def _chats(argv: list[str]) -> int:
    from app.store.cli import main  # list, export and import saved conversations

    return main(argv)


def _models(argv: list[str]) -> int:
    from app.models.cli import main  # search, download, list and remove models

    return main(argv)


def _arena(argv: list[str]) -> int:
    from app.arena.cli import main  # the blind arena's leaderboard and votes

    return main(argv)


# Plain imports inside functions, not module names looked up at run time: the
# installer bundle carries only the modules PyInstaller sees imported.
SUBCOMMANDS: dict[str, Callable[[list[str]], int]] = {"chats": _chats, "models": _models, "arena": _arena}


def run_subcommand(argv: list[str]) -> int | None:
    """Run `tandem NAME ...` when argv[0] names a subcommand; None when it does not."""
    if not argv or argv[0] not in SUBCOMMANDS:
        return None
    return SUBCOMMANDS[argv[0]](argv[1:])


def window_size(text: str) -> tuple[int, int]:
    """'1024x700' -> (1024, 700), for --window-size."""
    width, sep, height = text.lower().replace("×", "x").partition("x")
    try:
        size = (int(width), int(height))
    except ValueError:
        size = (0, 0)
    if not sep or not (320 <= size[0] <= 16384 and 240 <= size[1] <= 16384):
        raise argparse.ArgumentTypeError(
            f"expected WIDTHxHEIGHT in pixels, at least 320x240, such as 1024x700; got {text!r}")
    return size


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="tandem",
        description="Tandem: local language models in several side-by-side conversations.",
        epilog="Settings are kept in the user config folder ($TANDEM_CONFIG_DIR overrides it); "
        "options given here apply to this run only. "
        "`tandem chats --help`: list, export and import saved conversations; "
        "`tandem models --help`: the models; "
        "`tandem arena --help`: the blind arena's leaderboard.",
    )
    parser.add_argument("--model", help="a model folder, a .gguf file, or 'default' (SmolLM2-135M-Instruct)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), help="where the model runs (default: auto)")
    parser.add_argument(
        "--dtype", choices=("auto", "float32", "bfloat16", "float16"), help="weights' precision (default: auto)"
    )
    parser.add_argument("--threads", type=int, metavar="N", help="engine CPU threads (default: the engine's policy)")
    parser.add_argument(
        "--panes", type=int, metavar="N",
        help="panes to open with when there is no saved layout to restore (default: 2)",
    )
    parser.add_argument(
        "--window-size", type=window_size, metavar="WxH",
        help="the window's size for this run, e.g. 1024x700 (default: the saved size, else 1280x800)",
    )
    parser.add_argument(
        "--theme", choices=("system", "light", "dark"), help="colours (default: the saved choice, else the system's)"
    )
    parser.add_argument(
        "--smoke-test",
        metavar="OUT.png",
        help="open two panes (or --panes N), send one prompt to all of them on the model, save a screenshot "
        "of the window (at --window-size, default 1280x800) to OUT.png, print the start-up times and exit "
        "(0 on success; otherwise one line says why). Never touches your saved settings; its "
        "conversations are saved among your chats, titled 'Smoke test: ...', so a second start can check them.",
    )
    parser.add_argument("--version", action="version", version=f"tandem {version()}")
    args = parser.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be at least 1")
    if args.panes is not None and not 1 <= args.panes <= 12:
        parser.error("--panes must be between 1 and 12")
    return args


def _run_settings(saved: Settings, args: argparse.Namespace) -> Settings:
    """The saved settings with this run's command-line choices on top (not saved back)."""
    overrides = {k: v for k, v in (("model", args.model), ("device", args.device), ("dtype", args.dtype),
                                   ("threads", args.threads), ("theme", args.theme)) if v is not None}
    return dataclasses.replace(saved, **overrides)


def resources_dir() -> Path:
    """resources/ (icons, the .desktop file): inside the bundle when frozen
    (packaging/tandem.spec puts it there), else beside the source tree."""
    bundle = getattr(sys, "_MEIPASS", None)
    if bundle is not None:
        return Path(bundle) / "resources"
    return Path(__file__).resolve().parent.parent / "resources"


def _set_app_identity(app: QApplication) -> None:
    """The window icon, and the name that ties the window to tandem.desktop
    (Wayland's app id, the taskbar's grouping). Without resources/ (a bare
    pip install) the window just has the desktop's default icon."""
    from PySide6.QtGui import QIcon

    app.setDesktopFileName("tandem")
    icons = resources_dir() / "icons"
    icon = QIcon()
    for png in sorted(icons.glob("tandem-*.png")):
        icon.addFile(str(png))
    if not icon.isNull():
        app.setWindowIcon(icon)


def _model_resolver(registry: ModelRegistry) -> Callable[[str], str]:
    """A pane's model id -> what Engine(model=...) takes: the registry's
    folder for its ids; anything else ("default", a folder or .gguf path
    given with --model) as it is."""
    from app.models.registry import UnknownModelError

    def resolve(model_id: str) -> str:
        try:
            return registry.engine_model(model_id)
        except UnknownModelError:
            return model_id

    return resolve


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    code = run_subcommand(argv)
    if code is not None:
        return code
    args = parse_args(argv)
    from ui.platform_check import platform_problem

    problem = platform_problem()
    if problem is not None:  # Qt would abort blaming the wrong library: say what is missing first
        print(problem, file=sys.stderr)
        return 1
    if args.smoke_test:
        from ui.smoke import run_smoke_test

        return run_smoke_test(args)

    # Ctrl+C in the terminal: during start-up, stop before the window opens;
    # once it is open, close it the normal way (replies stopped, engine closed).
    interrupted = False
    window: MainWindow | None = None

    def on_interrupt(*_: object) -> None:
        nonlocal interrupted
        interrupted = True
        if window is not None:
            QTimer.singleShot(0, window.close)

    signal.signal(signal.SIGINT, on_interrupt)

    # Only what the first frame needs before it shows (no torch): Qt, the
    # settings (for the theme and the saved geometry), the theme.
    from PySide6.QtCore import QTimer

    from app.settings import Settings
    from ui import crash_log
    from ui.startup import import_in_background, show_startup_frame, start_application
    from ui.theme import apply_theme

    saved = Settings.load()
    settings = _run_settings(saved, args)
    app = start_application(sys.argv[:1])
    app.setApplicationName("Tandem")
    app.setApplicationVersion(version())
    _set_app_identity(app)
    apply_theme(app, settings.theme)
    frame = show_startup_frame(app, (saved.ui_state or {}).get("geometry"), args.window_size)

    # The window's imports (torch is not among them), with the frame on screen and painting.
    import_in_background()
    if interrupted or frame.closed_by_user:
        return 130 if interrupted else 0

    from ui.event_loop import TandemEventLoop
    from app.store.chat_store import StoreError
    from app.models.registry import ModelRegistry
    from app.store.session import ChatSession
    from app.workspace.workspace import Workspace
    from ui.window.main_window import MainWindow

    loop = TandemEventLoop(app)
    asyncio.set_event_loop(loop)
    crash_log.attach_loop(loop)

    registry = ModelRegistry()
    workspace = Workspace(settings, resolve_model=_model_resolver(registry), model_options=registry.engine_options)
    store_problem = None
    try:
        session: ChatSession | None = ChatSession.open()
    except StoreError as exc:  # e.g. a read-only data folder: chat on, without saving
        session, store_problem = None, str(exc)
    if session is not None:
        session.restore(workspace, default_panes=args.panes or 2)
    else:
        for _ in range(args.panes or 2):
            workspace.add_pane()
    window = MainWindow(
        workspace, saved, engine_settings=settings, version=version(), session=session, registry=registry
    )
    if store_problem:
        window.show_store_problem(store_problem)

    if interrupted:
        return 130

    async def run() -> None:
        closed = asyncio.Event()
        window.closed.connect(closed.set)
        frame.hand_over(window)  # where the frame is: the saved place, or where the user moved it
        if not window.crash_recovery:  # after a crash the user picks when (and what) to load
            window.load_engine()
        if interrupted:
            window.close()
        await closed.wait()
        await asyncio.sleep(0)  # let the tasks the window cancelled finish cancelling

    # Python runs signal handlers only between bytecodes: a timer wakes it
    # regularly while Qt waits for events.
    wake = QTimer()
    wake.start(250)
    wake.timeout.connect(lambda: None)
    with loop:
        loop.run_until_complete(run())
    return 0


def run() -> None:
    """The `tandem` program: `main()`, then leave without Python's teardown.

    By the time main() returns, everything is saved and closed: the chat
    store's writer has finished, the engines' threads are joined, the
    settings are written. What is left for interpreter teardown is freeing
    memory the OS frees anyway, and running C++ static destructors of Qt,
    torch and OpenMP in an order nobody controls: under heavy load that
    order has aborted the process after a clean run ("terminate called
    without an active exception"), twice in the test suite's full runs. An
    exit code that says failure after a clean run is worse than skipping it.

    Unexpected errors go to a crash report and a dialog (ui.crash_log), in
    development as in the installed bundle.
    """
    from ui import crash_log

    crash_log.install()
    try:
        code = main()
    except SystemExit:  # --help, --version, a wrong option: argparse's exit, nothing crashed
        crash_log.clean_exit()
        raise
    except Exception:  # escaped main(): reported like any other, and the exit status says so
        crash_log.report(*sys.exc_info(), where="start-up or shutdown")  # type: ignore[arg-type]
        code = 1
    else:
        crash_log.clean_exit()
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


if __name__ == "__main__":
    run()

