"""packaging/install.sh and uninstall.sh on an unpacked archive, into a temporary home.

The bundle here is a stand-in program with the real resources/ beside it:
the scripts only copy and link it (tests/packaging/test_bundle.py installs
the real one).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

ICON_SIZES = (16, 24, 32, 48, 64, 128, 256, 512)


def make_archive_dir(root: Path) -> Path:
    """What build.sh puts in the archive: tandem/ (the bundle), install.sh, uninstall.sh."""
    unpacked = root / "tandem-0.1.0-linux-x86_64"
    bundle = unpacked / "tandem"
    (bundle / "_internal").mkdir(parents=True)
    shutil.copytree(REPO_ROOT / "resources", bundle / "_internal" / "resources")
    program = bundle / "tandem"
    program.write_text("#!/bin/sh\necho \"tandem stand-in $*\"\n", encoding="utf-8")
    program.chmod(0o755)
    for script in ("install.sh", "uninstall.sh"):
        shutil.copy(REPO_ROOT / "packaging" / script, unpacked / script)
    return unpacked


def run_script(script: Path, home: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), **extra}
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.is_symlink()}


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    # The user's own things, which neither script may touch.
    (home / ".local" / "share" / "Tandem").mkdir(parents=True)
    (home / ".local" / "share" / "Tandem" / "chats.sqlite3").write_bytes(b"SQLite format 3\0 the user's chats")
    (home / ".config" / "Tandem").mkdir(parents=True)
    (home / ".config" / "Tandem" / "settings.json").write_text('{"theme": "dark"}', encoding="utf-8")
    (home / ".local" / "share" / "applications").mkdir(parents=True)
    (home / ".local" / "share" / "applications" / "other.desktop").write_text("[Desktop Entry]\n", encoding="utf-8")
    return home


def test_install_puts_the_app_in_the_menu_and_uninstall_takes_exactly_that_away(tmp_path: Path, home: Path) -> None:
    before = files_under(home)
    unpacked = make_archive_dir(tmp_path)
    result = run_script(unpacked / "install.sh", home)
    assert result.returncode == 0, result.stderr
    share = home / ".local" / "share"
    app = share / "tandem"
    assert (app / "tandem").is_file() and (app / "_internal" / "resources" / "tandem.desktop").is_file()
    assert (app / "uninstall.sh").is_file()

    link = home / ".local" / "bin" / "tandem"
    assert link.is_symlink() and link.resolve() == (app / "tandem").resolve()
    assert subprocess.run([str(link), "--version"], capture_output=True, text=True).stdout.strip() == (
        "tandem stand-in --version"
    )

    entry = (share / "applications" / "tandem.desktop").read_text(encoding="utf-8").splitlines()
    assert f'Exec="{app / "tandem"}"' in entry
    assert "Icon=tandem" in entry and "Type=Application" in entry and entry[0] == "[Desktop Entry]"
    for size in ICON_SIZES:
        icon = share / "icons" / "hicolor" / f"{size}x{size}" / "apps" / "tandem.png"
        assert icon.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", icon
    assert (share / "icons" / "hicolor" / "scalable" / "apps" / "tandem.svg").is_file()
    assert "installed in" in result.stdout and "not on your PATH" in result.stdout

    # Installing again replaces the install (an upgrade), without complaint.
    assert run_script(unpacked / "install.sh", home).returncode == 0

    # The installed copy of uninstall.sh removes everything install.sh added, and nothing else.
    result = run_script(app / "uninstall.sh", home)
    assert result.returncode == 0, result.stderr
    assert not app.exists() and not link.is_symlink()
    assert files_under(home) == before
    assert "conversations and settings are kept" in result.stdout

    # Running it again finds nothing to do.
    again = run_script(unpacked / "uninstall.sh", home)
    assert again.returncode == 0 and "nothing removed" in again.stdout


def test_install_honours_xdg_data_home(tmp_path: Path, home: Path) -> None:
    unpacked = make_archive_dir(tmp_path)
    data_home = tmp_path / "xdg-data"
    result = run_script(unpacked / "install.sh", home, XDG_DATA_HOME=str(data_home))
    assert result.returncode == 0, result.stderr
    assert (data_home / "tandem" / "tandem").is_file()
    assert (data_home / "applications" / "tandem.desktop").is_file()
    assert not (home / ".local" / "share" / "tandem").exists()
    assert run_script(data_home / "tandem" / "uninstall.sh", home, XDG_DATA_HOME=str(data_home)).returncode == 0
    assert not (data_home / "tandem").exists()


def test_install_refuses_a_folder_it_did_not_make_and_uninstall_leaves_others_things(
    tmp_path: Path, home: Path
) -> None:
    unpacked = make_archive_dir(tmp_path)
    foreign = home / ".local" / "share" / "tandem"
    foreign.mkdir(parents=True)
    (foreign / "notes.txt").write_text("mine", encoding="utf-8")
    result = run_script(unpacked / "install.sh", home)
    assert result.returncode == 1 and "was not made by this script" in result.stderr
    assert (foreign / "notes.txt").read_text(encoding="utf-8") == "mine"

    # Someone else's `tandem` command and the folder stay through an uninstall.
    bin_dir = home / ".local" / "bin"
    bin_dir.mkdir(parents=True)
    os.symlink("/usr/bin/true", bin_dir / "tandem")
    result = run_script(unpacked / "uninstall.sh", home)
    assert result.returncode == 0
    assert (bin_dir / "tandem").is_symlink() and os.readlink(bin_dir / "tandem") == "/usr/bin/true"
    assert (foreign / "notes.txt").is_file() and "left" in result.stdout


def test_install_needs_the_bundle_beside_it(tmp_path: Path, home: Path) -> None:
    lone = tmp_path / "lone"
    lone.mkdir()
    shutil.copy(REPO_ROOT / "packaging" / "install.sh", lone / "install.sh")
    result = run_script(lone / "install.sh", home)
    assert result.returncode == 1 and "no bundle next to this script" in result.stderr
    assert not (home / ".local" / "share" / "tandem").exists()


def test_the_desktop_file_and_icons_are_complete() -> None:
    entry = (REPO_ROOT / "resources" / "tandem.desktop").read_text(encoding="utf-8")
    keys = dict(line.split("=", 1) for line in entry.splitlines() if "=" in line and not line.startswith("#"))
    assert keys["Type"] == "Application" and keys["Name"] == "Tandem" and keys["Icon"] == "tandem"
    assert keys["Exec"] == "tandem" and keys["Categories"].endswith(";")
    from PySide6.QtGui import QImage

    for size in ICON_SIZES:
        image = QImage(str(REPO_ROOT / "resources" / "icons" / f"tandem-{size}.png"))
        assert (image.width(), image.height()) == (size, size)
    assert "<svg" in (REPO_ROOT / "resources" / "icons" / "tandem.svg").read_text(encoding="utf-8")
