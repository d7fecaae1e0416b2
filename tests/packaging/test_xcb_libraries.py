"""The bundle's X11 libraries: what packaging/tandem.spec copies
(ui.platform_check.bundled_xcb_binaries), and packaging/check_xcb.sh (run by
build.sh) on a bundle-shaped folder, with the libraries copied in or left out.

The checks' logic runs on a fake xcb plugin and fake libraries (empty shared
libraries with the real sonames, built here), so it is tested on any machine
with a C compiler, whatever X11 libraries it has; the real plugin is checked
where this machine has what it loads."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.xcb_libraries import build_library, fake_xcb_plugin, skip_unless_this_machine_has_them
from ui import platform_check
from ui.platform_check import BUNDLE_LIBRARY_FOLDER, BUNDLED_XCB_LIBRARIES, bundled_xcb_binaries

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("ldd") is None,
                                reason="the Linux bundle, checked with ldd")


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A "system library folder": a fake libqxcb.so and every library it needs."""
    return fake_xcb_plugin(tmp_path_factory.mktemp("system"), BUNDLED_XCB_LIBRARIES).parent


def test_the_spec_copies_every_library_by_its_soname(system: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform_check, "xcb_plugin", lambda: system / "libqxcb.so")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(system))
    binaries = bundled_xcb_binaries()
    assert [Path(source).name for source, _ in binaries] == list(BUNDLED_XCB_LIBRARIES)
    assert all(Path(source).parent == system and folder == BUNDLE_LIBRARY_FOLDER for source, folder in binaries)
    for wanted in ("libxcb-icccm.so.4", "libxcb-keysyms.so.1", "libxcb-cursor.so.0", "libxkbcommon-x11.so.0"):
        assert wanted in BUNDLED_XCB_LIBRARIES
    assert "libxcb.so.1" not in BUNDLED_XCB_LIBRARIES  # the desktop's own, as PyInstaller leaves it


# A library no machine has: what the checks say must not depend on which of
# the real ones this machine happens to have.
ABSENT = ("libxcb-tandem-absent.so.4", "libxcb-tandem-absent4")


def _plugin_needing_an_absent_library(system: Path, folder: Path) -> Path:
    """A fake libqxcb.so needing every bundled library and ABSENT, which is
    built (to link against) and then removed."""
    folder.mkdir()
    build_library(folder, ABSENT[0])
    for soname in BUNDLED_XCB_LIBRARIES:
        shutil.copy2(system / soname, folder / soname)
    plugin = build_library(folder, "libqxcb.so", needs=[*BUNDLED_XCB_LIBRARIES, ABSENT[0]],
                           runpath="$ORIGIN/../../lib")
    for built in folder.iterdir():
        if built != plugin:
            built.unlink()
    return plugin


def test_a_building_machine_without_them_is_told_the_apt_line(
    system: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin = _plugin_needing_an_absent_library(system, tmp_path / "plugin")
    monkeypatch.setattr(platform_check, "xcb_plugin", lambda: plugin)
    monkeypatch.setattr(platform_check, "BUNDLED_XCB_LIBRARIES", (*BUNDLED_XCB_LIBRARIES, ABSENT[0]))
    monkeypatch.setenv("LD_LIBRARY_PATH", str(system))
    with pytest.raises(SystemExit) as stop:
        bundled_xcb_binaries()
    message = str(stop.value)
    assert message.startswith("The building machine lacks libraries the bundle must carry: libxcb-tandem-absent.so.4;")
    assert message.endswith(f"sudo apt install {ABSENT[1]}")


def test_the_real_plugins_libraries_are_found_where_this_machine_has_them() -> None:
    skip_unless_this_machine_has_them()
    binaries = bundled_xcb_binaries()
    assert [Path(source).name for source, _ in binaries] == list(BUNDLED_XCB_LIBRARIES)
    assert all(Path(source).is_file() for source, _ in binaries)


def _fake_bundle(root: Path, system: Path, *, leave_out: str | None = None) -> Path:
    """dist/tandem's shape: the xcb plugin under PySide6/Qt/plugins/platforms
    (its RUNPATH, $ORIGIN/../../lib, is PySide6/Qt/lib) and the X11 libraries
    copied into PySide6/Qt/lib as the spec does."""
    lib = root / "_internal" / BUNDLE_LIBRARY_FOLDER
    platforms = root / "_internal" / "PySide6" / "Qt" / "plugins" / "platforms"
    lib.mkdir(parents=True)
    platforms.mkdir(parents=True)
    shutil.copy2(system / "libqxcb.so", platforms / "libqxcb.so")
    for soname in BUNDLED_XCB_LIBRARIES:
        if soname != leave_out:
            shutil.copy2(system / soname, lib / soname)
    return root


def _check(bundle: Path, library_path: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHON=sys.executable)
    env.pop("LD_LIBRARY_PATH", None)
    if library_path is not None:
        env["LD_LIBRARY_PATH"] = str(library_path)
    return subprocess.run(["bash", "packaging/check_xcb.sh", str(bundle)], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120, env=env)


def test_check_xcb_passes_when_the_bundle_carries_them(system: Path, tmp_path: Path) -> None:
    result = _check(_fake_bundle(tmp_path / "tandem", system))
    assert result.returncode == 0, result.stderr
    assert f"finds all {len(BUNDLED_XCB_LIBRARIES)} bundled X11 libraries" in result.stdout


def test_check_xcb_fails_naming_a_library_taken_from_the_system(system: Path, tmp_path: Path) -> None:
    # The machine's copy (here: a folder on the loader's path) stands in for the one the bundle lacks.
    elsewhere = tmp_path / "usr-lib"
    elsewhere.mkdir()
    shutil.copy2(system / "libxcb-icccm.so.4", elsewhere / "libxcb-icccm.so.4")
    result = _check(_fake_bundle(tmp_path / "tandem", system, leave_out="libxcb-icccm.so.4"), elsewhere)
    assert result.returncode == 1
    assert "libxcb-icccm.so.4" in result.stderr and "not from the bundle" in result.stderr


def test_check_xcb_fails_naming_a_library_found_nowhere(system: Path, tmp_path: Path) -> None:
    bundle = _fake_bundle(tmp_path / "tandem", system)
    plugin = _plugin_needing_an_absent_library(system, tmp_path / "plugin")
    shutil.copy2(plugin, bundle / "_internal" / "PySide6" / "Qt" / "plugins" / "platforms" / "libqxcb.so")
    result = _check(bundle)
    assert result.returncode == 1
    assert "misses libraries" in result.stderr and f"{ABSENT[0]} => not found" in result.stderr
