#!/usr/bin/env bash
# Install Tandem for this user, from the unpacked archive this script is in.
#
#     ./install.sh
#
# Puts the app in ~/.local/share/tandem, a `tandem` command in ~/.local/bin,
# a menu entry in ~/.local/share/applications and the icons in
# ~/.local/share/icons/hicolor ($XDG_DATA_HOME replaces ~/.local/share).
# Nothing needs root, nothing outside those places is touched, and running
# it again replaces an earlier install. ./uninstall.sh removes all of it;
# conversations, settings and imported models (in ~/.local/share/Tandem and
# ~/.config/Tandem) are the user's and are never touched by either script.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DATA_HOME=${XDG_DATA_HOME:-$HOME/.local/share}
APP_DIR=$DATA_HOME/tandem
BIN_DIR=${TANDEM_BIN_DIR:-$HOME/.local/bin}
MENU_DIR=$DATA_HOME/applications
ICON_DIR=$DATA_HOME/icons/hicolor
MARKER=.tandem-install  # in APP_DIR: what uninstall.sh checks before deleting anything

fail() { echo "install.sh: $*" >&2; exit 1; }

BUNDLE=$HERE/tandem
[ -x "$BUNDLE/tandem" ] || fail "no bundle next to this script (expected $BUNDLE/tandem): run it from the unpacked archive"
RESOURCES=$BUNDLE/_internal/resources
[ -f "$RESOURCES/tandem.desktop" ] || fail "the bundle has no resources/tandem.desktop"

# The app folder must never be the data folder: on a case-insensitive file
# system ~/.local/share/tandem and ~/.local/share/Tandem are the same place.
if [ -e "$DATA_HOME/Tandem" ] && [ "$DATA_HOME/Tandem" -ef "$APP_DIR" ]; then
    fail "$APP_DIR is the same folder as Tandem's data folder $DATA_HOME/Tandem (a case-insensitive file system); not installing there"
fi
if [ -e "$APP_DIR" ] && [ ! -f "$APP_DIR/$MARKER" ]; then
    fail "$APP_DIR exists and was not made by this script; move it away first"
fi

# Copy beside the old install, then swap, so a failed copy leaves the old one working.
mkdir -p "$DATA_HOME"
STAGING=$(mktemp -d "$DATA_HOME/.tandem-install.XXXXXX")
trap 'rm -rf "$STAGING"' EXIT
cp -a "$BUNDLE/." "$STAGING/"
cp "$HERE/uninstall.sh" "$STAGING/uninstall.sh"
echo "Tandem, installed by install.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ)" > "$STAGING/$MARKER"
if [ -e "$APP_DIR" ]; then
    rm -rf "$APP_DIR"
fi
mv "$STAGING" "$APP_DIR"
trap - EXIT
chmod 755 "$APP_DIR"

mkdir -p "$BIN_DIR"
ln -sfn "$APP_DIR/tandem" "$BIN_DIR/tandem"

for png in "$RESOURCES"/icons/tandem-*.png; do
    size=$(basename "$png" .png)
    size=${size#tandem-}
    mkdir -p "$ICON_DIR/${size}x${size}/apps"
    cp "$png" "$ICON_DIR/${size}x${size}/apps/tandem.png"
done
mkdir -p "$ICON_DIR/scalable/apps"
cp "$RESOURCES/icons/tandem.svg" "$ICON_DIR/scalable/apps/tandem.svg"

# The menu entry runs the installed program by its full path: ~/.local/bin is
# not on every desktop session's PATH.
mkdir -p "$MENU_DIR"
# Quoted as the Desktop Entry spec asks: " ` $ escaped inside the quotes, a
# backslash written as four (string escaping comes before quoting), % doubled.
exec_path=$APP_DIR/tandem
exec_path=${exec_path//\\/\\\\\\\\}
exec_path=${exec_path//\"/\\\"}
exec_path=${exec_path//\`/\\\`}
exec_path=${exec_path//\$/\\\$}
exec_path=${exec_path//%/%%}
while IFS= read -r line || [ -n "$line" ]; do
    case $line in
        Exec=*) printf 'Exec="%s"\n' "$exec_path" ;;
        *) printf '%s\n' "$line" ;;
    esac
done < "$RESOURCES/tandem.desktop" > "$MENU_DIR/tandem.desktop"
chmod 644 "$MENU_DIR/tandem.desktop"

# Refresh the desktop's caches, but only those that exist: menus and icon
# lookups work without them, and a cache made here would hide icons that
# other programs add later without refreshing it.
if [ -f "$ICON_DIR/icon-theme.cache" ] && command -v gtk-update-icon-cache >/dev/null; then
    gtk-update-icon-cache -q -t "$ICON_DIR" 2>/dev/null || true
fi
if [ -f "$MENU_DIR/mimeinfo.cache" ] && command -v update-desktop-database >/dev/null; then
    update-desktop-database -q "$MENU_DIR" 2>/dev/null || true
fi

echo "Tandem is installed in $APP_DIR."
echo "Start it from your applications menu, or run: tandem"
case ":$PATH:" in
    *":$BIN_DIR:"*) ;;
    *) echo "($BIN_DIR is not on your PATH; the menu entry works anyway, or run $APP_DIR/tandem)" ;;
esac
echo "To remove it: $APP_DIR/uninstall.sh"
