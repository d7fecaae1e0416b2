"""The window's saved settings: Preferences, the theme, the window's geometry
and whether the Chats sidebar is shown.

`settings` are the saved ones (written back on change and at close);
`engine_settings` what this run loads models with (the saved ones plus
command-line choices): a preference changes both.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from PySide6.QtCore import QByteArray
from PySide6.QtWidgets import QApplication

from app.settings import MAX_TEXT_ZOOM, MIN_TEXT_ZOOM
from ui.theme import apply_theme

if TYPE_CHECKING:
    from app.settings import Settings
    from ui.dialogs.settings_dialog import SettingsDialog
    from ui.window.main_window import MainWindow

log = logging.getLogger(__name__)

# The zoom steps Ctrl+= and Ctrl+- go through, in percent of the normal text size.
ZOOM_STEPS = (50, 67, 80, 90, 100, 110, 125, 150, 175, 200, 250, 300)
assert ZOOM_STEPS[0] == MIN_TEXT_ZOOM and ZOOM_STEPS[-1] == MAX_TEXT_ZOOM

# What Preferences edits; the engine's fields apply at the next model load.
ENGINE_KEYS = ("device", "dtype", "threads", "kv_cache_mb", "page_size")
PREFERENCE_KEYS = (*ENGINE_KEYS, "default_params", "default_system_prompt", "context_policy", "theme")
SIDEBAR_STATE_KEY = "sidebar_shown"  # in settings.ui_state: False once the user hid the Chats sidebar


class WindowPreferences:
    def __init__(self, window: MainWindow, *, save: bool) -> None:
        self._window = window
        self._save = save
        self.dialog: SettingsDialog | None = None

    def open(self) -> None:
        from ui.dialogs.settings_dialog import open_settings_dialog

        if self.dialog is not None:
            self.dialog.raise_()
            return
        window = self._window

        def accepted(new: Settings) -> None:
            engine_changes = any(getattr(new, k) != getattr(window.settings, k) for k in ENGINE_KEYS)
            for key in PREFERENCE_KEYS:
                setattr(window.settings, key, getattr(new, key))
                setattr(window.engine_settings, key, getattr(new, key))
            apply_theme(QApplication.instance(), new.theme)
            self.persist()
            if engine_changes:
                window.statusBar().showMessage(
                    "Saved. Engine settings apply the next time a model loads (Models → Load this pane's model).", 15000
                )

        dialog = open_settings_dialog(window.settings, window, accepted)
        self.dialog = dialog
        dialog.finished.connect(self._closed)

    def _closed(self, _result: int) -> None:
        self.dialog = None

    def uses_theme(self, theme: str) -> bool:
        return self._window.settings.theme == theme

    def set_theme(self, theme: str) -> None:
        window = self._window
        window.settings.theme = theme
        window.engine_settings.theme = theme
        apply_theme(QApplication.instance(), theme)
        self.persist()

    # -- the conversation text's zoom --------------------------------------------------

    @property
    def zoom(self) -> int:
        return self._window.settings.text_zoom

    def zoom_in(self) -> None:
        self.set_zoom(next((z for z in ZOOM_STEPS if z > self.zoom), ZOOM_STEPS[-1]))

    def zoom_out(self) -> None:
        self.set_zoom(next((z for z in reversed(ZOOM_STEPS) if z < self.zoom), ZOOM_STEPS[0]))

    def reset_zoom(self) -> None:
        self.set_zoom(100)

    def set_zoom(self, percent: int) -> None:
        """Show every pane's messages at `percent` of the normal size, and save it."""
        percent = min(max(int(percent), MIN_TEXT_ZOOM), MAX_TEXT_ZOOM)
        window = self._window
        changed = percent != window.settings.text_zoom
        window.settings.text_zoom = percent
        window.engine_settings.text_zoom = percent
        self.apply_zoom()
        if changed:
            window.statusBar().showMessage(f"Text size {percent}% (Ctrl+0: normal size)", 3000)
            self.persist()

    def apply_zoom(self) -> None:
        """Every pane at the saved zoom (a new pane too: the window calls this when its panes change)."""
        for view in self._window.panes.values():
            view.set_zoom(self.zoom)

    def follow_color_scheme(self, *_: object) -> None:
        """The desktop switched light/dark: follow it when the theme says "system"."""
        if self.uses_theme("system"):
            apply_theme(QApplication.instance(), "system")

    def restore_window_state(self) -> None:
        """The window where it was, and the Chats sidebar hidden if the user hid it (Ctrl+B)."""
        window = self._window
        state = window.settings.ui_state or {}
        geometry = state.get("geometry")
        if isinstance(geometry, str):
            window.restoreGeometry(QByteArray.fromBase64(geometry.encode("ascii")))
        dock = window.sidebar_dock
        if dock is not None:
            if state.get(SIDEBAR_STATE_KEY) is False:
                dock.hide()
            # Saved when toggled, not only at exit: a crash does not bring it back either.
            dock.toggleViewAction().toggled.connect(lambda _shown: self.persist())

    def persist(self) -> None:
        if not self._save:
            return
        window = self._window
        try:
            state = dict(window.settings.ui_state or {})
            state["geometry"] = bytes(window.saveGeometry().toBase64().data()).decode("ascii")
            if window.sidebar_dock is not None:
                # The action, not the dock: it is already checked while its toggled signal runs.
                state[SIDEBAR_STATE_KEY] = window.sidebar_dock.toggleViewAction().isChecked()
            window.settings.ui_state = state
            window.settings.save()
        except Exception as exc:  # a read-only config folder must not stop the app closing
            log.warning("could not save settings: %s", exc)
