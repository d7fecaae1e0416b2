"""`tandem --smoke-test` end to end on the default model, in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT


def test_help_lists_the_options() -> None:
    result = subprocess.run([sys.executable, "-m", "ui.main", "--help"], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0
    for option in ("--model", "--device", "--dtype", "--threads", "--panes", "--smoke-test", "--version"):
        assert option in result.stdout


def test_smoke_test_passes_and_writes_a_png(default_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "shot.png"
    config = tmp_path / "user-config"
    config.mkdir()
    (config / "settings.json").write_text('{"theme": "dark"}', encoding="utf-8")
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", TANDEM_CONFIG_DIR=str(config),
               TANDEM_LOG_DIR=str(tmp_path / "log"))
    result = subprocess.run(
        # faulthandler: should the process ever die of a signal, its threads' stacks are in stderr.
        [sys.executable, "-X", "faulthandler", "-m", "ui.main", "--smoke-test", str(out)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1200,
    )
    assert result.returncode == 0, f"stdout: {result.stdout[-1000:]}\nstderr: {result.stderr[-6000:]}"
    assert "smoke test passed" in result.stdout
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from PySide6.QtGui import QImage

    image = QImage(str(out))
    assert image.width() >= 1000 and image.height() >= 600
    # The user's settings folder was neither read nor written.
    assert (config / "settings.json").read_text(encoding="utf-8") == '{"theme": "dark"}'
    assert sorted(p.name for p in config.iterdir()) == ["settings.json"]


def test_smoke_test_failure_is_one_line_and_non_zero(tmp_path: Path) -> None:
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", TANDEM_CONFIG_DIR=str(tmp_path / "c"))
    result = subprocess.run(
        [sys.executable, "-m", "ui.main", "--smoke-test", str(tmp_path / "x.png"), "--model", str(tmp_path / "missing")],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.startswith("smoke test failed")]
    assert len(lines) == 1 and "missing" in lines[0]
    assert not (tmp_path / "x.png").exists()


def test_smoke_test_at_a_given_size_with_more_panes_reports_the_start_up(default_model_dir: Path, tmp_path: Path) -> None:
    import re

    out = tmp_path / "small.png"
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", TANDEM_CONFIG_DIR=str(tmp_path / "c"),
               TANDEM_LOG_DIR=str(tmp_path / "log"))
    result = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-m", "ui.main", "--smoke-test", str(out),
         "--panes", "3", "--window-size", "1024x700"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1200,
    )
    assert result.returncode == 0, f"stdout: {result.stdout[-1000:]}\nstderr: {result.stderr[-6000:]}"
    assert "smoke test passed: 3 replies" in result.stdout
    assert "window: 1024x700, 3 panes" in result.stdout
    times = re.search(r"startup: window shown ([\d.]+) s \(its first frame; the full window ([\d.]+) s\), "
                      r"model ready ([\d.]+) s", result.stdout)
    assert times is not None, result.stdout
    first_frame, window, ready = map(float, times.groups())
    assert first_frame <= window <= ready  # the frame before the heavy imports, the model after the window
    stages = re.search(r"loading: asked ([\d.]+) s, .*weights ([\d.]+) s, warm-up ([\d.]+) s, ready ([\d.]+) s",
                       result.stdout)
    assert stages is not None, result.stdout
    asked, weights, warm_up, loaded = map(float, stages.groups())
    assert window <= asked <= weights <= warm_up <= loaded <= ready
    # The windows' minimum sizes are set once: no size hints for the offscreen platform to refuse.
    assert "propagateSizeHints" not in result.stderr
    from PySide6.QtGui import QImage

    image = QImage(str(out))
    assert (image.width(), image.height()) == (1024, 700)
