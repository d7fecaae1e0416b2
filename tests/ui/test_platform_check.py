"""Before Qt starts: the system libraries Qt's xcb plugin needs, named with
the `apt` line that installs them (a missing library is faked: the real
system is left alone)."""

from __future__ import annotations

from typing import Any

import pytest

from ui import platform_check
from ui.platform_check import MissingLibrary, apt_line, package_for, platform_problem, uses_xcb

X11 = {"QT_QPA_PLATFORM": "xcb", "DISPLAY": ":0"}


def test_the_real_plugin_is_found_and_loads_here() -> None:
    plugin = platform_check.xcb_plugin()
    assert plugin is not None and plugin.name == "libqxcb.so"
    assert platform_check.ldd_missing(plugin) == []


def test_missing_libraries_are_named_with_the_apt_line(monkeypatch: pytest.MonkeyPatch) -> None:
    gone = {"libxcb-icccm.so.4", "libxcb-keysyms.so.1"}
    monkeypatch.setattr(platform_check, "_opens", lambda soname: soname not in gone)
    # ldd names one more that the known list lacks.
    monkeypatch.setattr(platform_check, "ldd_missing", lambda plugin: ["libxcb-icccm.so.4", "libxcb-xinerama.so.0"])
    message = platform_problem(X11)
    assert message is not None
    assert "libxcb-icccm.so.4, libxcb-keysyms.so.1, libxcb-xinerama.so.0" in message
    assert "sudo apt install libxcb-icccm4 libxcb-keysyms1 libxcb-xinerama0" in message
    assert message.count("sudo apt install") == 1


def test_without_ldd_the_known_list_still_names_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform_check, "_opens", lambda soname: soname != "libxkbcommon-x11.so.0")
    monkeypatch.setattr(platform_check, "ldd_missing", lambda plugin: None)
    assert platform_check.missing_xcb_libraries() == [MissingLibrary("libxkbcommon-x11.so.0", "libxkbcommon-x11-0")]


def test_nothing_is_said_when_nothing_is_missing_or_xcb_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    assert platform_problem(X11) is None  # this machine has them all
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
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "QT_QPA_PLATFORM": "xcb", "DISPLAY": ":97"}
    result = subprocess.run([sys.executable, "-c", "from ui.startup import start_application; start_application([])"],
                            cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "could not connect to display" in result.stderr and "platform plugin" in result.stderr
