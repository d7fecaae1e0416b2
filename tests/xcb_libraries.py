"""What tests of Qt's X11 (xcb) plugin need from this machine.

The README's commands install no system packages, so a fresh machine may lack
some of the libraries the real plugin loads (a minimal Debian lacks
libxcb-icccm4 and libxcb-keysyms1). Tests of the checks' logic run on fake
libraries and fake `ldd` output everywhere; a test that needs the real plugin
to load skips where it cannot, naming what is missing and the apt line.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest

from ui import platform_check


def skip_unless_this_machine_has_them() -> None:
    missing = platform_check.missing_xcb_libraries()
    if missing:
        pytest.skip(f"this machine lacks {', '.join(m.soname for m in missing)} "
                    f"({platform_check.apt_line(missing)}): the real xcb plugin cannot load here")


def compiler() -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build fake shared libraries")
    return cc


def build_library(folder: Path, soname: str, needs: Iterable[str] = (), runpath: str | None = None) -> Path:
    """An empty ELF shared library named `soname` (its DT_SONAME too), that
    needs each of `needs` (found in `folder` at link time) and has `runpath`."""
    source = folder / "empty.c"
    if not source.exists():
        source.write_text("int tandem_fake_symbol;\n")
    args = [compiler(), "-shared", "-fPIC", "-o", str(folder / soname), str(source), f"-Wl,-soname,{soname}",
            "-Wl,--no-as-needed", f"-L{folder}", *(f"-l:{name}" for name in needs)]
    if runpath is not None:
        args.append(f"-Wl,--enable-new-dtags,-rpath,{runpath}")
    subprocess.run(args, check=True, capture_output=True, timeout=60)
    return folder / soname


def fake_xcb_plugin(folder: Path, libraries: Iterable[str]) -> Path:
    """`folder`/libqxcb.so needing `libraries` (built beside it), with the
    real plugin's RUNPATH: $ORIGIN/../../lib, PySide6/Qt/lib in a bundle."""
    folder.mkdir(parents=True, exist_ok=True)
    libraries = list(libraries)
    for soname in libraries:
        build_library(folder, soname)
    return build_library(folder, "libqxcb.so", needs=libraries, runpath="$ORIGIN/../../lib")
