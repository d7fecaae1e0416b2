"""Serving the loaded models over the OpenAI API: the window's local server,
its choices (port, this computer or the local network, remembered across
restarts), its API key (in app.secrets, never in the settings), the
status-bar indicator while it serves, and the live log of its requests.

Models → Serve… opens the panel (ui/dialogs/server_panel.py) over this;
the menu's "Serve loaded models" checkmark turns the same server on and off.
The served model ids are the names the window shows, as slugs
(app.remote.local_server.served_mapping); the app's own ids ("default") stay
aliases.

Remembered in `settings.ui_state["server"]`: {"on": bool, "port": int,
"mode": "loopback" | "network"}; a server that was on when the window
closed starts again when it opens. The window's public API used here:
`statusBar().addPermanentWidget` (the indicator), `serve_action`,
`preferences.persist()`, `report_error`, `run_task`, `models.name`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtWidgets import QToolButton

from ui.window.actions import SERVE_PORT

if TYPE_CHECKING:
    from app.remote.local_server import LocalServer, RequestRecord
    from ui.dialogs.server_panel import ServerPanel
    from ui.window.main_window import MainWindow

log = logging.getLogger(__name__)

SERVER_STATE_KEY = "server"  # in settings.ui_state
LOOPBACK = "loopback"
NETWORK = "network"
LOG_LIMIT = 500  # request lines kept for the panel
WHERE = "Models → Serve…"


@dataclass(slots=True)
class ServerChoices:
    """What the user chose for the server; saved in the settings' ui_state."""

    on: bool = False
    port: int = SERVE_PORT
    mode: str = LOOPBACK

    @classmethod
    def from_state(cls, ui_state: dict[str, Any] | None) -> ServerChoices:
        saved = (ui_state or {}).get(SERVER_STATE_KEY)
        choices = cls()
        if isinstance(saved, dict):
            if isinstance(saved.get("on"), bool):
                choices.on = saved["on"]
            port = saved.get("port")
            if isinstance(port, int) and not isinstance(port, bool) and 0 <= port <= 65535:
                choices.port = port
            if saved.get("mode") in (LOOPBACK, NETWORK):
                choices.mode = saved["mode"]
        return choices

    def to_state(self) -> dict[str, Any]:
        return {"on": self.on, "port": self.port, "mode": self.mode}


class _LogRelay(QObject):
    """Hands request records from the server's thread to the GUI thread (a
    queued signal: only the GUI thread touches the log and its widgets)."""

    logged = Signal(object)


class ServerControl:
    def __init__(self, window: MainWindow) -> None:
        self._window = window
        self.server: LocalServer | None = None  # while serving
        self.choices = ServerChoices.from_state(getattr(window.settings, "ui_state", None))
        self.log: deque[RequestRecord] = deque(maxlen=LOG_LIMIT)
        self.panel: ServerPanel | None = None
        self.indicator: QToolButton | None = None
        self._changed: list[Callable[[], None]] = []  # the panel's refresh
        self._logged: list[Callable[[RequestRecord], None]] = []  # the panel's new log line
        self._relay = _LogRelay()
        self._relay.logged.connect(self._on_logged)
        # Once the window is built (its status bar exists): the indicator, and
        # the server again when it was on at the last close.
        QTimer.singleShot(0, window, self._attach)

    # -- the choices ---------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self.choices.port

    @port.setter
    def port(self, port: int) -> None:
        self.choices.port = port

    def set_port(self, port: int) -> None:
        self.choices.port = port
        self._remember()

    def set_mode(self, mode: str) -> None:
        if mode not in (LOOPBACK, NETWORK):
            raise ValueError(f"mode must be {LOOPBACK!r} or {NETWORK!r}, not {mode!r}")
        self.choices.mode = mode
        self._remember()

    def api_key(self) -> str | None:
        from app.secrets import SERVER_API_KEY, default_secrets

        try:
            return default_secrets().get(SERVER_API_KEY)
        except Exception as exc:  # a locked keyring: serve without, and say so where it matters
            log.warning("could not read the server's API key: %s", exc)
            return None

    def generate_key(self) -> str:
        """A new API key, saved in the secrets (a running server keeps its old one until restarted)."""
        from app.remote.local_server import new_api_key
        from app.secrets import SERVER_API_KEY, default_secrets

        key = new_api_key()
        default_secrets().set(SERVER_API_KEY, key)
        self._notify()
        return key

    def clear_key(self) -> None:
        from app.secrets import SERVER_API_KEY, default_secrets

        default_secrets().delete(SERVER_API_KEY)
        self._notify()

    # -- state ----------------------------------------------------------------------------

    @property
    def serving(self) -> bool:
        return self.server is not None and self.server.running

    def share_url(self) -> str | None:
        """The URL to give a client: loopback's, or this computer's address on the network."""
        server = self.server
        if server is None or server.url is None:
            return None
        if self.choices.mode == NETWORK:
            from app.remote.local_server import lan_addresses

            names = lan_addresses()
            if names:
                return f"http://{names[0]}:{server.port}/v1"
        return server.url

    def model_ids(self) -> list[str]:
        return self.server.model_ids if self.server is not None else []

    def subscribe(self, changed: Callable[[], None], logged: Callable[[RequestRecord], None]) -> Callable[[], None]:
        """Call `changed()` when the server starts, stops or its key changes, and
        `logged(record)` for each request it answers; returns the unsubscriber."""
        self._changed.append(changed)
        self._logged.append(logged)

        def unsubscribe() -> None:
            if changed in self._changed:
                self._changed.remove(changed)
            if logged in self._logged:
                self._logged.remove(logged)

        return unsubscribe

    # -- control --------------------------------------------------------------------------

    def start(self) -> str:
        """Serve the loaded models with the current choices; returns the URL.
        Raises LocalServerError (a busy port, the network without a key, ...)."""
        from app.remote.local_server import ALL_NETWORKS_HOST, LOOPBACK_HOST, LocalServer, lan_addresses

        if self.serving:
            assert self.server is not None and self.server.url is not None
            return self.server.url
        network = self.choices.mode == NETWORK
        server = LocalServer(where=f"{WHERE} (or quit the program using it)")
        engines, aliases = self._served()
        url = server.start(
            engines, host=ALL_NETWORKS_HOST if network else LOOPBACK_HOST, port=self.choices.port,
            api_key=self.api_key(), aliases=aliases,
            allowed_hosts=lan_addresses() if network else (), on_request=self._relay.logged.emit,
        )
        self.server = server
        self.choices.on = True
        self._remember()
        self._sync()
        return url

    def stop_serving(self) -> None:
        """Stop (off the GUI thread) and remember it is off."""
        self.choices.on = False
        self._remember()
        if self.server is not None:
            server, self.server = self.server, None
            self._window.run_task(asyncio.to_thread(server.stop), "Stopping the API server")
            self._window.statusBar().showMessage("The API server has stopped.", 8000)
        self._sync()

    def set_serving(self, on: bool) -> None:
        """The menu's checkmark: serve the loaded models, or stop."""
        if not on:
            self.stop_serving()
            return
        try:
            url = self.start()
        except Exception as exc:
            self._sync()
            self._window.report_error("Serving the API", exc)
            return
        self._window.statusBar().showMessage(f"Serving the loaded models at {url} (OpenAI API).", 15000)

    def open_panel(self) -> None:
        """Models → Serve…: the server panel (one at a time, not modal)."""
        from ui.dialogs.server_panel import ServerPanel

        if self.panel is not None:
            self.panel.raise_()
            self.panel.activateWindow()
            return
        panel = ServerPanel(self, self._window)
        self.panel = panel
        panel.finished.connect(self._panel_closed)
        # show(), not open(): open() makes a dialog window-modal, and the point
        # of a live log is to watch it while chatting. Never exec().
        panel.show()

    def engines_changed(self) -> None:
        """A model loaded or unloaded: serve what is loaded now."""
        if self.serving:
            assert self.server is not None
            self.server.set_engines(*self._served())
            self._notify()

    async def stop(self) -> None:
        """Stop serving at shutdown, off the GUI thread; "on" stays remembered."""
        if self.server is not None:
            server, self.server = self.server, None
            await asyncio.to_thread(server.stop)

    # -- inside ---------------------------------------------------------------------------

    def _served(self) -> tuple[dict[str, Any], dict[str, str]]:
        from app.remote.local_server import served_mapping

        workspace = self._window.workspace
        return served_mapping(workspace.loaded_models(), self._window.models.name, workspace.default_model)

    def _attach(self) -> None:
        window = self._window
        indicator = QToolButton(window)
        indicator.setAutoRaise(True)
        indicator.setObjectName("serverIndicator")
        indicator.clicked.connect(self.open_panel)
        indicator.hide()
        window.statusBar().addPermanentWidget(indicator)
        self.indicator = indicator
        if self.choices.on and not self.serving:
            try:
                self.start()
            except Exception as exc:  # a busy port after a restart: say so, keep the choice
                window.statusBar().showMessage(f"The API server did not start again: {exc}", 20000)
        self._sync()

    def _panel_closed(self, _result: int) -> None:
        self.panel = None

    def _on_logged(self, record: RequestRecord) -> None:
        self.log.append(record)
        for listener in list(self._logged):
            listener(record)

    def _sync(self) -> None:
        """The menu's checkmark and the indicator say whether it serves."""
        window = self._window
        action = getattr(window, "serve_action", None)
        if action is not None and action.isChecked() != self.serving:
            action.blockSignals(True)
            action.setChecked(self.serving)
            action.blockSignals(False)
        if self.indicator is not None:
            if self.serving:
                assert self.server is not None
                where = "local network" if self.choices.mode == NETWORK else "this computer"
                self.indicator.setText(f"● serving :{self.server.port}")
                self.indicator.setToolTip(f"The OpenAI API is on at {self.share_url()} ({where}). Click for the panel.")
                self.indicator.show()
            else:
                self.indicator.hide()
        self._notify()

    def _notify(self) -> None:
        for listener in list(self._changed):
            listener()

    def _remember(self) -> None:
        settings = self._window.settings
        state = dict(settings.ui_state or {})
        state[SERVER_STATE_KEY] = self.choices.to_state()
        settings.ui_state = state
        self._window.preferences.persist()
