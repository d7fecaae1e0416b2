"""Before Qt starts: the system libraries Qt's xcb plugin needs, named with
the `apt` line that installs them (a missing library is faked: the real
system is left alone)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.xcb_libraries import skip_unless_this_machine_has_them
from ui import platform_check
from ui.platform_check import MissingLibrary, apt_line, package_for, platform_problem, uses_xcb

X11 = {"QT_QPA_PLATFORM": "xcb", "DISPLAY": ":0"}


def test_the_real_plugin_is_found() -> None:
    plugin = platform_check.xcb_plugin()
    assert plugin is not None and plugin.name == "libqxcb.so" and plugin.is_file()


def test_the_real_plugin_loads_where_this_machine_has_its_libraries() -> None:
    skip_unless_this_machine_has_them()
    plugin = platform_check.xcb_plugin()
    assert plugin is not None
    assert platform_check.ldd_missing(plugin) == []
    assert platform_problem(X11) is None


LDD_OUTPUT = """\
\tlinux-vdso.so.1 (0x00007ffd1b5f2000)
\tlibQt6XcbQpa.so.6 => /opt/PySide6/Qt/plugins/platforms/../../lib/libQt6XcbQpa.so.6 (0x00007f3a1c000000)
\tlibxcb-icccm.so.4 => not found
\tlibxcb-cursor.so.0 => /lib/x86_64-linux-gnu/libxcb-cursor.so.0 (0x00007f3a1bf00000)
\tlibxcb-keysyms.so.1 => not found
\tlibxcb-icccm.so.4 => not found
\t/lib64/ld-linux-x86-64.so.2 (0x00007f3a1c400000)
"""


def _fake_ldd(folder: Path, output: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An `ldd` first on PATH that prints `output` for the plugin it is given
    (and records what it was asked), and a fake plugin file."""
    (folder / "bin").mkdir()
    printed = folder / "ldd-output"
    printed.write_text(output)
    ldd = folder / "bin" / "ldd"
    ldd.write_text(f'#!/bin/sh\necho "$@" > "{folder}/asked"\ncat "{printed}"\n')
    ldd.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
    plugin = folder / "plugins" / "platforms" / "libqxcb.so"
    plugin.parent.mkdir(parents=True)
    plugin.write_bytes(b"\x7fELF not really")
    return plugin


def test_ldds_not_found_lines_are_read_from_its_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = _fake_ldd(tmp_path, LDD_OUTPUT, monkeypatch)
    assert platform_check.ldd_missing(plugin) == ["libxcb-icccm.so.4", "libxcb-keysyms.so.1"]
    assert (tmp_path / "asked").read_text().strip() == str(plugin)
    resolved = platform_check.ldd_resolved(plugin)
    assert resolved["libxcb-icccm.so.4"] is None
    assert resolved["libxcb-cursor.so.0"] == "/lib/x86_64-linux-gnu/libxcb-cursor.so.0"
    assert "linux-vdso.so.1" not in resolved


def test_a_plugin_whose_libraries_all_resolve_misses_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = _fake_ldd(tmp_path, "\n".join(line for line in LDD_OUTPUT.splitlines() if "not found" not in line),
                       monkeypatch)
    assert platform_check.ldd_missing(plugin) == []


def test_a_missing_library_found_by_ldd_alone_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole check on a fake plugin: dlopen finds the listed libraries
    save one, and ldd's output names one more that the list lacks."""
    plugin = _fake_ldd(tmp_path, "\tlibxcb-xinerama.so.0 => not found\n\tlibxcb-icccm.so.4 => not found\n",
                       monkeypatch)
    monkeypatch.setattr(platform_check, "xcb_plugin", lambda: plugin)
    monkeypatch.setattr(platform_check, "_opens", lambda soname: soname != "libxcb-icccm.so.4")
    message = platform_problem(X11)
    assert message is not None
    assert "libxcb-icccm.so.4, libxcb-xinerama.so.0" in message
    assert "sudo apt install libxcb-icccm4 libxcb-xinerama0" in message
    monkeypatch.setattr(platform_check, "_opens", lambda soname: True)
    assert platform_problem(X11) is None  # ldd is asked only when a listed library fails to open


def test_without_ldd_the_known_list_still_names_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform_check, "_opens", lambda soname: soname != "libxkbcommon-x11.so.0")
    monkeypatch.setattr(platform_check, "ldd_missing", lambda plugin: None)
    assert platform_check.missing_xcb_libraries() == [MissingLibrary("libxkbcommon-x11.so.0", "libxkbcommon-x11-0")]


def test_nothing_is_said_when_nothing_is_missing_or_xcb_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform_check, "_opens", lambda soname: True)
    assert platform_problem(X11) is None
    monkeypatch.setattr(platform_check, "_opens", lambda soname: False)
    for env in ({"QT_QPA_PLATFORM": "offscreen"}, {"QT_QPA_PLATFORM": "wayland;xcb"},
                {"XDG_SESSION_TYPE": "wayland", "WAYLAND_DISPLAY": "wayland-0", "DISPLAY": ":0"}):
        assert platform_problem(env) is None, env
    assert not uses_xcb(X11, platform="win32")
    assert uses_xcb({"QT_QPA_PLATFORM": "xcb:foo=1"}, platform="linux")
    assert uses_xcb({"DISPLAY": ":0"}, platform="linux")


def test_no_display_is_said_in_words() -> None:
    message = platform_problem({"XDG_SESSION_TYPE": "tty"})
    assert message is not None and "DISPLAY" in message and "offscreen" in message


def test_package_names_follow_debians_rule() -> None:
    assert package_for("libxcb-render-util.so.0") == "libxcb-render-util0"
    assert package_for("libxkbcommon-x11.so.0") == "libxkbcommon-x11-0"
    assert package_for("libxcb-xinput.so.0") == "libxcb-xinput0"
    assert apt_line([MissingLibrary("b", "pkg-b"), MissingLibrary("a", "pkg-a"), MissingLibrary("c", "pkg-a")]) \
        == "sudo apt install pkg-a pkg-b"


def test_tandem_says_so_and_exits_before_qt_starts(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    import ui.main

    monkeypatch.setattr(platform_check, "platform_problem",
                        lambda env=None: platform_check.missing_libraries_message(
                            [MissingLibrary("libxcb-icccm.so.4", "libxcb-icccm4")]))
    assert ui.main.main([]) == 1
    err = capsys.readouterr().err
    assert "libxcb-icccm.so.4" in err and "sudo apt install libxcb-icccm4" in err


def test_qts_fatal_platform_message_is_explained(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    from PySide6.QtCore import QMessageLogContext, QtMsgType

    from ui.startup import qt_message

    monkeypatch.setattr(platform_check, "ldd_missing", lambda plugin: ["libxcb-keysyms.so.1"])
    qt_fatal = ("This application failed to start because no Qt platform plugin could be initialized. "
                "Reinstalling the application may fix this problem.")
    qt_message(QtMsgType.QtFatalMsg, QMessageLogContext(), qt_fatal)
    err = capsys.readouterr().err
    assert err.startswith(qt_fatal)  # Qt's own words stay
    assert "libxcb-keysyms.so.1" in err and "sudo apt install libxcb-keysyms1" in err
    qt_message(QtMsgType.QtWarningMsg, QMessageLogContext(), "qt.qpa.xcb: something minor")
    assert capsys.readouterr().err == "qt.qpa.xcb: something minor\n"


def test_a_real_platform_failure_still_shows_qts_message(tmp_path: Any) -> None:
    """Qt started for real on xcb with no X server: its own fatal message
    stays, and where this machine lacks the plugin's libraries (a fresh
    minimal Debian) Tandem's explanation follows it, naming exactly those."""
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    missing = platform_check.missing_xcb_libraries()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "QT_QPA_PLATFORM": "xcb", "DISPLAY": ":97"}
    result = subprocess.run([sys.executable, "-c", "from ui.startup import start_application; start_application([])"],
                            cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "platform plugin" in result.stderr
    if missing:
        assert ", ".join(m.soname for m in missing) in result.stderr
        assert apt_line(missing) in result.stderr
    else:
        assert "could not connect to display" in result.stderr
        assert "Tandem cannot open its window" not in result.stderr
