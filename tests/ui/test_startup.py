"""Start-up: the first frame before the heavy imports, the window in its
place, `--window-size`, and the subcommands' dispatch."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import Any

import pytest

from tests.conftest import REPO_ROOT


def test_the_frame_shows_then_hands_over_to_the_window(qapp: Any) -> None:
    from PySide6.QtWidgets import QMainWindow

    from ui.startup import import_in_background, show_startup_frame

    frame = show_startup_frame(qapp, None, (1024, 700))
    assert frame.isVisible() and (frame.width(), frame.height()) == (1024, 700)
    assert frame.windowTitle() == "Tandem"
    import_in_background(("json", "colorsys"))
    assert "colorsys" in sys.modules
    frame.move(40, 30)
    window = QMainWindow()
    frame.hand_over(window)
    try:
        assert window.isVisible() and not frame.isVisible() and not frame.closed_by_user
        assert (window.width(), window.height()) == (1024, 700)
    finally:
        window.close()


def test_a_failed_import_is_raised_on_the_gui_thread(qapp: Any) -> None:
    from ui.startup import import_in_background

    with pytest.raises(ModuleNotFoundError):
        import_in_background(("json", "no_such_module_for_tandem"))


def test_the_frame_restores_the_saved_geometry(qapp: Any) -> None:
    from PySide6.QtWidgets import QMainWindow

    from ui.startup import show_startup_frame

    before = QMainWindow()
    before.resize(640, 480)
    saved = bytes(before.saveGeometry().toBase64().data()).decode("ascii")
    frame = show_startup_frame(qapp, saved, None)
    try:
        assert (frame.width(), frame.height()) == (640, 480)
    finally:
        frame.close()
    assert frame.closed_by_user  # closed before a window came: main() stops there


def test_window_size_is_checked() -> None:
    from ui.main import parse_args, window_size

    assert window_size("1024x700") == (1024, 700)
    assert window_size("1440×900") == (1440, 900)
    for bad in ("1024", "x700", "10x10", "big"):
        with pytest.raises(argparse.ArgumentTypeError):
            window_size(bad)
    args = parse_args(["--smoke-test", "a.png", "--panes", "4", "--window-size", "1024x700"])
    assert (args.panes, args.window_size) == (4, (1024, 700))


def test_subcommands_dispatch_to_their_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    import app.models.cli
    import app.store.cli
    import ui.main

    seen: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(app.models.cli, "main", lambda argv: seen.append(("models", argv)) or 0)
    monkeypatch.setattr(app.store.cli, "main", lambda argv: seen.append(("chats", argv)) or 0)
    assert ui.main.main(["models", "list", "--json"]) == 0
    assert ui.main.main(["chats", "list"]) == 0
    assert seen == [("models", ["list", "--json"]), ("chats", ["list"])]
    assert ui.main.run_subcommand(["--panes", "2"]) is None


def test_tandem_chats_still_answers_without_qt() -> None:
    script = ("import sys, ui.main\ntry:\n    ui.main.main(['chats', '--help'])\nexcept SystemExit:\n    pass\n"
              "print('qt loaded' if 'PySide6.QtWidgets' in sys.modules else 'no qt')")
    result = subprocess.run([sys.executable, "-c", script],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert "no qt" in result.stdout, result.stderr[-2000:]


def test_the_window_is_built_without_torch() -> None:
    """Everything the full window needs imports without torch (seconds on a
    warm start): the window comes first, torch loads with the model behind it."""
    from ui.startup import HEAVY_MODULES

    assert {"ui.window.main_window", "app.models.registry", "app.store.session",
            "app.workspace.workspace"} <= set(HEAVY_MODULES)
    script = ("import importlib, sys\n"
              f"for name in {HEAVY_MODULES!r}:\n    importlib.import_module(name)\n"
              "print('torch loaded' if 'torch' in sys.modules else 'no torch')")
    result = subprocess.run([sys.executable, "-c", script],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "no torch" in result.stdout, result.stderr[-2000:]


def test_the_model_registry_works_before_torch_is_imported(tmp_path: Any) -> None:
    """The registry lists its models and describes the default one while the
    window is built, before torch is imported."""
    script = ("import sys\nfrom app.models.registry import ModelRegistry\n"
              "registry = ModelRegistry()\n"
              "print([m.id for m in registry.models()])\n"
              "print('torch loaded' if 'torch' in sys.modules else 'no torch')")
    env = {**os.environ, "TANDEM_DATA_DIR": str(tmp_path / "data"), "TANDEM_CONFIG_DIR": str(tmp_path / "config")}
    result = subprocess.run([sys.executable, "-c", script],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "no torch" in result.stdout, result.stdout + result.stderr[-2000:]
