#!/usr/bin/env bash
# Remove what install.sh installed for this user: the app folder
# (~/.local/share/tandem), the `tandem` link in ~/.local/bin, the menu entry
# and the icons ($XDG_DATA_HOME replaces ~/.local/share).
#
#     ~/.local/share/tandem/uninstall.sh    (or ./uninstall.sh from the archive)
#
# Your conversations, settings, imported models and logs stay where they are
# (~/.local/share/Tandem, ~/.config/Tandem, ~/.local/state/Tandem): delete
# those folders yourself if you want them gone.
set -euo pipefail

DATA_HOME=${XDG_DATA_HOME:-$HOME/.local/share}
APP_DIR=$DATA_HOME/tandem
BIN_DIR=${TANDEM_BIN_DIR:-$HOME/.local/bin}
MENU_DIR=$DATA_HOME/applications
ICON_DIR=$DATA_HOME/icons/hicolor
MARKER=.tandem-install

removed=0
say() { echo "uninstall.sh: $*"; }

# The link, only if it is ours (it points into APP_DIR).
if [ -L "$BIN_DIR/tandem" ] && [ "$(readlink "$BIN_DIR/tandem")" = "$APP_DIR/tandem" ]; then
    rm -f "$BIN_DIR/tandem"; say "removed $BIN_DIR/tandem"; removed=1
fi

# The menu entry, only if it is ours (it runs APP_DIR/tandem).
if [ -f "$MENU_DIR/tandem.desktop" ] && grep -qF "$APP_DIR/tandem" "$MENU_DIR/tandem.desktop"; then
    rm -f "$MENU_DIR/tandem.desktop"; say "removed $MENU_DIR/tandem.desktop"; removed=1
fi

for icon in "$ICON_DIR"/*/apps/tandem.png "$ICON_DIR"/scalable/apps/tandem.svg; do
    [ -f "$icon" ] || continue
    rm -f "$icon"; removed=1
done
[ "$removed" = 1 ] && say "removed the icons from $ICON_DIR" || true

# The app folder, only if install.sh made it, and never when it is the data
# folder under another name (a case-insensitive file system).
if [ -d "$APP_DIR" ]; then
    if [ ! -f "$APP_DIR/$MARKER" ]; then
        say "left $APP_DIR alone: install.sh did not make it"
    elif [ -e "$DATA_HOME/Tandem" ] && [ "$DATA_HOME/Tandem" -ef "$APP_DIR" ]; then
        say "left $APP_DIR alone: it is Tandem's data folder too"
    else
        rm -rf "$APP_DIR"; say "removed $APP_DIR"; removed=1
    fi
fi

# Refresh only the caches that exist (as install.sh does).
if [ -f "$ICON_DIR/icon-theme.cache" ] && command -v gtk-update-icon-cache >/dev/null; then
    gtk-update-icon-cache -q -t "$ICON_DIR" 2>/dev/null || true
fi
if [ -f "$MENU_DIR/mimeinfo.cache" ] && command -v update-desktop-database >/dev/null; then
    update-desktop-database -q "$MENU_DIR" 2>/dev/null || true
fi

if [ "$removed" = 0 ]; then
    say "Tandem was not installed for this user; nothing removed"
else
    say "done. Your conversations and settings are kept (${DATA_HOME}/Tandem, ${XDG_CONFIG_HOME:-$HOME/.config}/Tandem)."
fi
