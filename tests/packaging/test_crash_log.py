"""Unexpected errors in the `tandem` program: crash reports, the dialog, the fatal log (ui/crash_log.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

CHILD = Path(__file__).with_name("crash_child.py")


def _env(log_dir: Path) -> dict[str, str]:
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", TANDEM_LOG_DIR=str(log_dir))
    env.pop("PYTHONFAULTHANDLER", None)  # that would keep the native-crash stacks on stderr
    return env


def test_errors_in_slots_threads_and_callbacks_are_reported_and_the_app_runs_on(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    result = subprocess.run([sys.executable, str(CHILD), "errors"], cwd=REPO_ROOT, env=_env(logs),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    reports = seen["reports"]
    assert len(reports) == 3
    joined = "\n".join(reports)
    for expected in ("RuntimeError: raised in a slot", "ValueError: raised in a thread",
                     "KeyError: 'raised in a callback'", "thread 'tandem-test-worker'", "Traceback"):
        assert expected in joined, expected
    assert all(report.startswith("Tandem hit an unexpected error in ") and "Python 3." in report for report in reports)
    # One dialog for the burst, naming its report's file; the program went on.
    assert seen["dialogs"] == 1 and str(logs) in seen["dialog_text"]
    assert seen["still_running"]
    # One line per error on stderr, each naming its report; no bare traceback.
    lines = [line for line in result.stderr.splitlines() if line.startswith("Tandem: unexpected error")]
    assert len(lines) == 3 and all(f"details saved to {logs}" in line for line in lines)
    assert "Traceback" not in result.stderr
    # A clean end leaves no fatal log behind.
    assert sorted(p.name.split("-")[0] for p in logs.iterdir() if p.suffix == ".log") == ["crash"] * 3


def test_a_native_crash_leaves_the_stacks_in_a_fatal_log(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    result = subprocess.run([sys.executable, str(CHILD), "segfault"], cwd=REPO_ROOT, env=_env(logs),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == -signal.SIGSEGV
    fatal = list(logs.glob("fatal-*.log"))
    assert len(fatal) == 1
    text = fatal[0].read_text(encoding="utf-8")
    assert "Segmentation fault" in text and "crash_child.py" in text


def test_a_clean_run_removes_its_empty_fatal_log_and_stale_ones_go(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    # An empty fatal log of a run that was killed (its pid is not alive), and a non-empty one (kept: it has stacks).
    dead_pid = 2**22 + 12345  # above the kernel's default pid_max, so never a live process
    (logs / f"fatal-20250101-000000-{dead_pid}.log").write_text("", encoding="utf-8")
    (logs / f"fatal-20250101-000001-{dead_pid}.log").write_text("Fatal Python error", encoding="utf-8")
    result = subprocess.run([sys.executable, str(CHILD), "clean"], cwd=REPO_ROOT, env=_env(logs),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in logs.iterdir()) == [f"fatal-20250101-000001-{dead_pid}.log"]


def test_an_error_that_escapes_main_is_reported_and_exits_1(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    code = ("import sys; sys.argv = ['tandem']; import ui.main as m\n"
            "def boom(argv=None):\n    raise OSError('the disk went away')\n"
            "m.main = boom; m.run()")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=_env(logs),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    (report,) = logs.glob("crash-*.log")
    assert "OSError: the disk went away" in report.read_text(encoding="utf-8")
    assert f"OSError: the disk went away (details saved to {report})" in result.stderr


def test_reports_are_kept_to_the_newest_few(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ui import crash_log

    monkeypatch.setenv("TANDEM_LOG_DIR", str(tmp_path))
    paths = []
    for n in range(crash_log.KEEP_REPORTS + 3):
        try:
            raise RuntimeError(f"error {n}")
        except RuntimeError as exc:
            path = crash_log.write_report(type(exc), exc, exc.__traceback__, where="a test")
        assert path is not None
        os.utime(path, (1_000_000 + n, 1_000_000 + n))  # distinct ages, oldest first
        paths.append(path)
    kept = sorted(tmp_path.glob("crash-*.log"))
    assert len(kept) == crash_log.KEEP_REPORTS
    assert set(kept) == set(paths[-crash_log.KEEP_REPORTS:])


def test_an_unwritable_log_folder_still_reports_on_stderr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from ui import crash_log

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("", encoding="utf-8")
    monkeypatch.setenv("TANDEM_LOG_DIR", str(blocker / "logs"))
    try:
        raise RuntimeError("nowhere to write")
    except RuntimeError as exc:
        assert crash_log.write_report(type(exc), exc, exc.__traceback__, where="a test") is None
    err = capsys.readouterr().err
    assert "could not write a crash report" in err and "RuntimeError: nowhere to write" in err


def test_the_about_box_names_the_log_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ui.dialogs.shortcuts import about_text

    monkeypatch.setenv("TANDEM_LOG_DIR", str(tmp_path / "my logs"))
    text = about_text("1.2.3", "cpu (float32)", "SmolLM2 <135M>")
    assert str(tmp_path / "my logs") in text
    assert (tmp_path / "my logs").as_uri() in text
    assert "SmolLM2 &lt;135M&gt;" in text
