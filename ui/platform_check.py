"""Before Qt starts on Linux: can its X11 (xcb) platform plugin load?

When a system library the plugin links against is missing, Qt prints a
message that blames the wrong library ("xcb-cursor0 ... is needed", with
xcb-cursor0 installed) and aborts. So Tandem looks first (`platform_problem`),
and should Qt fail all the same, explains its fatal message
(`explain_qt_failure`, from ui/startup.py's Qt message handler): each library of
`XCB_LIBRARIES` is opened with dlopen (a few milliseconds, at every start);
only when one fails is `ldd` run on the plugin itself, which names every
library the loader cannot find, and the message names them with the one
`apt` line that installs them (Debian and Ubuntu package names).

No Qt import here: this runs before PySide6's GUI libraries are loaded.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# Every system library Qt's xcb plugin (libqxcb.so and libQt6XcbQpa.so) loads
# that a minimal Debian 12 or Ubuntu may lack, and the package holding it.
# From `ldd` on PySide6 6.x's plugin; README.md ("A minimal Linux desktop")
# lists the same packages, and packaging/tandem.spec bundles these libraries.
XCB_LIBRARIES: tuple[tuple[str, str], ...] = (
    ("libxcb.so.1", "libxcb1"),
    ("libX11.so.6", "libx11-6"),
    ("libX11-xcb.so.1", "libx11-xcb1"),
    ("libxcb-cursor.so.0", "libxcb-cursor0"),
    ("libxcb-icccm.so.4", "libxcb-icccm4"),
    ("libxcb-image.so.0", "libxcb-image0"),
    ("libxcb-keysyms.so.1", "libxcb-keysyms1"),
    ("libxcb-randr.so.0", "libxcb-randr0"),
    ("libxcb-render.so.0", "libxcb-render0"),
    ("libxcb-render-util.so.0", "libxcb-render-util0"),
    ("libxcb-shape.so.0", "libxcb-shape0"),
    ("libxcb-shm.so.0", "libxcb-shm0"),
    ("libxcb-sync.so.1", "libxcb-sync1"),
    ("libxcb-util.so.1", "libxcb-util1"),
    ("libxcb-xfixes.so.0", "libxcb-xfixes0"),
    ("libxcb-xkb.so.1", "libxcb-xkb1"),
    ("libxkbcommon.so.0", "libxkbcommon0"),
    ("libxkbcommon-x11.so.0", "libxkbcommon-x11-0"),
    ("libfontconfig.so.1", "libfontconfig1"),
    ("libfreetype.so.6", "libfreetype6"),
    ("libGL.so.1", "libgl1"),
    ("libEGL.so.1", "libegl1"),
    ("libdbus-1.so.3", "libdbus-1-3"),
    ("libglib-2.0.so.0", "libglib2.0-0"),
)
PACKAGE_OF = dict(XCB_LIBRARIES)
# Those that come with every X11 desktop and must match its drivers and X
# server (PyInstaller leaves libxcb and GL out for the same reason): the
# bundle uses the system's. The others it carries (packaging/tandem.spec).
SYSTEM_ONLY = frozenset({"libxcb.so.1", "libX11.so.6", "libGL.so.1", "libEGL.so.1", "libfontconfig.so.1",
                         "libfreetype.so.6", "libdbus-1.so.3", "libglib-2.0.so.0"})
BUNDLED_XCB_LIBRARIES: tuple[str, ...] = tuple(s for s, _ in XCB_LIBRARIES if s not in SYSTEM_ONLY)
# Where the bundle puts them: beside libQt6XcbQpa, whose RUNPATH ($ORIGIN) finds them there.
BUNDLE_LIBRARY_FOLDER = "PySide6/Qt/lib"

_NOT_FOUND = re.compile(r"^\s*(\S+)\s+=>\s+not found", re.MULTILINE)


@dataclass(slots=True, frozen=True)
class MissingLibrary:
    soname: str  # "libxcb-icccm.so.4"
    package: str  # "libxcb-icccm4"


def package_for(soname: str) -> str:
    """The Debian package of a library: the table's, else the usual naming
    ("libxcb-foo.so.3" -> "libxcb-foo3")."""
    if soname in PACKAGE_OF:
        return PACKAGE_OF[soname]
    match = re.match(r"^(lib[A-Za-z0-9_+-]+?)\.so\.(\d+)", soname)
    if not match:
        return soname
    stem, major = match.group(1).lower(), match.group(2)
    return f"{stem}-{major}" if stem[-1].isdigit() else f"{stem}{major}"


def apt_line(missing: Sequence[MissingLibrary]) -> str:
    packages = sorted({m.package for m in missing})
    return "sudo apt install " + " ".join(packages)


def uses_xcb(env: Mapping[str, str] | None = None, platform: str | None = None) -> bool:
    """Whether Qt will start on its xcb plugin: on Linux, when QT_QPA_PLATFORM
    asks for xcb first, or says nothing outside a Wayland session."""
    env = os.environ if env is None else env
    platform = sys.platform if platform is None else platform
    if not platform.startswith("linux"):
        return False
    chosen = env.get("QT_QPA_PLATFORM", "").strip()
    if chosen:
        return chosen.split(";")[0].split(":")[0].strip() == "xcb"
    wayland = env.get("XDG_SESSION_TYPE", "").lower() == "wayland" and bool(env.get("WAYLAND_DISPLAY"))
    return not wayland


def xcb_plugin() -> Path | None:
    """PySide6's libqxcb.so (in the bundle: under _internal), found without importing Qt."""
    import importlib.util

    spec = importlib.util.find_spec("PySide6")
    roots = [Path(p) for p in (spec.submodule_search_locations or ())] if spec else []
    bundle = getattr(sys, "_MEIPASS", None)
    if bundle is not None:
        roots.append(Path(bundle) / "PySide6")
    for root in roots:
        plugin = root / "Qt" / "plugins" / "platforms" / "libqxcb.so"
        if plugin.is_file():
            return plugin
    return None


def _opens(soname: str) -> bool:
    bundle = getattr(sys, "_MEIPASS", None)
    candidates = [os.path.join(bundle, folder, soname) for folder in (BUNDLE_LIBRARY_FOLDER, ".")] if bundle else []
    for name in (*(c for c in candidates if os.path.exists(c)), soname):
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            continue
    return False


def ldd_missing(plugin: Path) -> list[str] | None:
    """The libraries `ldd` cannot find for `plugin`; None when ldd cannot say."""
    ldd = shutil.which("ldd")
    if ldd is None:
        return None
    try:
        result = subprocess.run([ldd, str(plugin)], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return sorted(set(_NOT_FOUND.findall(result.stdout)))


def ldd_resolved(binary: Path) -> dict[str, str | None]:
    """soname -> the file `ldd` resolves it to (None: not found), for `binary`
    and everything it loads."""
    ldd = shutil.which("ldd")
    if ldd is None:
        raise OSError("ldd is not installed")
    result = subprocess.run([ldd, str(binary)], capture_output=True, text=True, timeout=60)
    resolved: dict[str, str | None] = {}
    for line in result.stdout.splitlines():
        name, arrow, rest = line.strip().partition(" => ")
        if arrow:
            target = rest.split(" (", 1)[0].strip()
            resolved[name] = None if target == "not found" else target
    return resolved


def bundled_xcb_binaries() -> list[tuple[str, str]]:
    """(file on this machine, folder in the bundle) for each library of
    BUNDLED_XCB_LIBRARIES, for PyInstaller's `binaries`. SystemExit with the
    apt line when the building machine lacks one (a bundle without them
    would not start on a minimal desktop)."""
    plugin = xcb_plugin()
    if plugin is None:
        raise SystemExit("PySide6's xcb platform plugin (libqxcb.so) is not installed in the building Python")
    resolved = ldd_resolved(plugin)
    missing = [MissingLibrary(s, package_for(s)) for s in BUNDLED_XCB_LIBRARIES if not resolved.get(s)]
    if missing:
        raise SystemExit("The building machine lacks libraries the bundle must carry: "
                         f"{', '.join(m.soname for m in missing)}; {apt_line(missing)}")
    # By their sonames (the path ldd gives, not the versioned file behind it): the loader looks for those.
    return [(str(resolved[s]), BUNDLE_LIBRARY_FOLDER) for s in BUNDLED_XCB_LIBRARIES]


def missing_xcb_libraries() -> list[MissingLibrary]:
    """The system libraries the xcb plugin needs that cannot be loaded."""
    failed = [soname for soname, _ in XCB_LIBRARIES if not _opens(soname)]
    if not failed:
        return []
    plugin = xcb_plugin()
    named = ldd_missing(plugin) if plugin is not None else None
    sonames = sorted(set(failed) | set(named or ()))
    return [MissingLibrary(soname, package_for(soname)) for soname in sonames]


def missing_libraries_message(missing: Sequence[MissingLibrary]) -> str:
    names = ", ".join(m.soname for m in missing)
    return (
        f"Tandem cannot open its window: Qt's X11 (xcb) platform plugin needs system libraries "
        f"that are not installed: {names}.\n"
        f"On Debian or Ubuntu, install them with:\n    {apt_line(missing)}\n"
        "(Other distributions: the packages holding those files. Under Wayland, "
        "QT_QPA_PLATFORM=wayland uses Qt's Wayland plugin instead.)"
    )


def explain_qt_failure(qt_message: str) -> str | None:
    """Tandem's words for Qt's fatal "could not load the Qt platform plugin"
    message (a library this module's list does not know of): what `ldd`
    finds missing for the xcb plugin, with the apt line; None otherwise."""
    if "platform plugin" not in qt_message:
        return None
    plugin = xcb_plugin()
    named = ldd_missing(plugin) if plugin is not None else None
    if not named:
        return None
    return missing_libraries_message([MissingLibrary(s, package_for(s)) for s in named])


def platform_problem(env: Mapping[str, str] | None = None) -> str | None:
    """Why Qt's platform plugin would fail to start, in words a person can act
    on, or None (not Linux, another platform plugin, nothing missing)."""
    env = os.environ if env is None else env
    if not uses_xcb(env):
        return None
    if not env.get("DISPLAY") and not env.get("QT_QPA_PLATFORM"):
        return ("Tandem needs a desktop session to open its window: DISPLAY is not set. "
                "Start it from the desktop, or run `tandem --smoke-test out.png` with "
                "QT_QPA_PLATFORM=offscreen to check an installation without one.")
    missing = missing_xcb_libraries()
    return missing_libraries_message(missing) if missing else None
