#!/usr/bin/env bash
# Check that a Linux bundle's Qt xcb plugin finds every X11 library the
# bundle carries inside the bundle (not on this machine), and misses none:
# `ldd` on _internal/PySide6/Qt/plugins/platforms/libqxcb.so. The list is
# ui.platform_check.BUNDLED_XCB_LIBRARIES; packaging/tandem.spec copies them.
#
#     packaging/check_xcb.sh [BUNDLE_DIR]     (default: dist/tandem; build.sh runs it)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUNDLE=${1:-$ROOT/dist/tandem}
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
fail() { echo "check_xcb.sh: $*" >&2; exit 1; }

QXCB=$BUNDLE/_internal/PySide6/Qt/plugins/platforms/libqxcb.so
[ -f "$QXCB" ] || fail "no xcb platform plugin in the bundle ($QXCB)"
command -v ldd >/dev/null || fail "ldd is not installed"
BUNDLE_REAL=$(cd "$BUNDLE" && pwd -P)
resolved=$(ldd "$QXCB")
notfound=$(printf '%s\n' "$resolved" | grep 'not found' || true)
[ -z "$notfound" ] || fail "the xcb plugin misses libraries:
$notfound"
LIBS=$(cd "$ROOT" && "$PYTHON" -c "from ui.platform_check import BUNDLED_XCB_LIBRARIES as L; print(' '.join(L))")
count=0
for lib in $LIBS; do
    where=$(printf '%s\n' "$resolved" | awk -v lib="$lib" '$1 == lib {print $3}')
    [ -n "$where" ] || fail "the xcb plugin does not load $lib at all (has the plugin changed? update ui/platform_check.py)"
    case $(realpath -m "$where") in
        "$BUNDLE_REAL"/*) count=$((count + 1)) ;;
        *) fail "the xcb plugin takes $lib from $where, not from the bundle (packaging/tandem.spec: _xcb_libraries)" ;;
    esac
done
echo "check_xcb.sh: the xcb plugin finds all $count bundled X11 libraries in $BUNDLE and misses none"
