#!/usr/bin/env bash
# The frozen smoke test: run the bundle as a user's machine would, with no
# Python of ours anywhere (an empty environment, PATH=/usr/bin:/bin), then
# start it a second time and check that it finds the conversations the
# first run saved.
#
#     packaging/smoke_frozen.sh [BUNDLE_DIR [OUT_DIR]]    (defaults: dist/tandem, a new temporary folder)
#
# Data, logs and settings go to OUT_DIR (TANDEM_DATA_DIR, TANDEM_LOG_DIR; the
# smoke test uses a temporary config folder itself), so your own are never
# touched; the first run imports the default model there. The screenshot is
# OUT_DIR/smoke.png. Offscreen unless QT_QPA_PLATFORM says otherwise.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUNDLE=$(cd "${1:-$ROOT/dist/tandem}" && pwd)
OUT=${2:-$(mktemp -d "${TMPDIR:-/tmp}/tandem-frozen-smoke.XXXXXX")}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
EXE=$BUNDLE/tandem
[ -x "$EXE" ] || { echo "smoke_frozen.sh: no bundle at $BUNDLE (build it: packaging/build.sh)" >&2; exit 1; }

frozen() {
    # CC=false: a machine without a C compiler, so the bundle's own
    # prebuilt kernels must be what runs the quantized model.
    env -i PATH=/usr/bin:/bin HOME="$HOME" LANG=C.UTF-8 CC=false \
        TANDEM_KERNEL_CACHE="$OUT/kernel-cache" \
        QT_QPA_PLATFORM="${QT_QPA_PLATFORM:-offscreen}" \
        TANDEM_DATA_DIR="$OUT/data" TANDEM_LOG_DIR="$OUT/log" \
        "$EXE" "$@"
}

echo "smoke_frozen.sh: $EXE --smoke-test $OUT/smoke.png"
frozen --smoke-test "$OUT/smoke.png"

echo "smoke_frozen.sh: second start: $EXE chats list --json"
listing=$(frozen chats list --json)
count=$(printf '%s\n' "$listing" | grep -c '"title": "Smoke test: ' || true)
if [ "$count" -lt 2 ]; then
    echo "smoke_frozen.sh: the second start did not find the smoke test's two conversations in $OUT/data:" >&2
    printf '%s\n' "$listing" >&2
    exit 1
fi
echo "smoke_frozen.sh: passed; the second start found $count smoke-test conversations. Screenshot: $OUT/smoke.png"
