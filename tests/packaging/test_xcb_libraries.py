"""The bundle's X11 libraries: what packaging/tandem.spec copies, and
packaging/check_xcb.sh (run by build.sh) on a bundle-shaped folder made from
this machine's PySide6, with the libraries copied in or left out."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from ui.platform_check import BUNDLE_LIBRARY_FOLDER, BUNDLED_XCB_LIBRARIES, bundled_xcb_binaries, xcb_plugin

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("ldd") is None,
                                reason="the Linux bundle, checked with ldd")


def test_the_spec_copies_every_library_by_its_soname() -> None:
    binaries = bundled_xcb_binaries()
    assert [Path(source).name for source, _ in binaries] == list(BUNDLED_XCB_LIBRARIES)
    assert all(Path(source).is_file() and folder == BUNDLE_LIBRARY_FOLDER for source, folder in binaries)
    for wanted in ("libxcb-icccm.so.4", "libxcb-keysyms.so.1", "libxcb-cursor.so.0", "libxkbcommon-x11.so.0"):
        assert wanted in BUNDLED_XCB_LIBRARIES
    assert "libxcb.so.1" not in BUNDLED_XCB_LIBRARIES  # the desktop's own, as PyInstaller leaves it


def _fake_bundle(root: Path, *, leave_out: str | None = None) -> Path:
    """dist/tandem's shape: the real plugin and libQt6XcbQpa (copied: their
    RUNPATH is relative), the other Qt libraries linked, the X11 libraries
    copied in as the spec does."""
    plugin = xcb_plugin()
    assert plugin is not None
    qt = plugin.parents[2]
    lib = root / "_internal" / BUNDLE_LIBRARY_FOLDER
    platforms = root / "_internal" / "PySide6" / "Qt" / "plugins" / "platforms"
    lib.mkdir(parents=True)
    platforms.mkdir(parents=True)
    shutil.copy2(plugin, platforms / plugin.name)
    for item in (qt / "lib").iterdir():
        if item.name.startswith("libQt6XcbQpa"):
            shutil.copy2(item, lib / item.name)
        elif item.is_file():
            os.symlink(item, lib / item.name)
    for source, _ in bundled_xcb_binaries():
        if Path(source).name != leave_out:
            shutil.copy2(source, lib / Path(source).name)  # follows the soname's link, as PyInstaller does
    return root


def _check(bundle: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "packaging/check_xcb.sh", str(bundle)], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHON=sys.executable))


def test_check_xcb_passes_when_the_bundle_carries_them(tmp_path: Path) -> None:
    result = _check(_fake_bundle(tmp_path / "tandem"))
    assert result.returncode == 0, result.stderr
    assert f"finds all {len(BUNDLED_XCB_LIBRARIES)} bundled X11 libraries" in result.stdout


def test_check_xcb_fails_naming_a_library_taken_from_the_system(tmp_path: Path) -> None:
    result = _check(_fake_bundle(tmp_path / "tandem", leave_out="libxcb-icccm.so.4"))
    assert result.returncode == 1
    assert "libxcb-icccm.so.4" in result.stderr and "not from the bundle" in result.stderr

