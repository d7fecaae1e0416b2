"""Models > Serve loaded models: the window's local OpenAI-compatible server.

It serves the workspace's loaded engines on 127.0.0.1 (other tools then
share their prefix cache), follows the models as they load and unload, and
stops on its own thread so the GUI never waits for it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from ui.window.actions import SERVE_PORT

if TYPE_CHECKING:
    from app.remote.local_server import LocalServer
    from ui.window.main_window import MainWindow


class ServerControl:
    def __init__(self, window: MainWindow) -> None:
        self._window = window
        self.server: LocalServer | None = None  # while serving
        self.port = SERVE_PORT

    def set_serving(self, on: bool) -> None:
        """Serve the loaded models over the OpenAI API on 127.0.0.1, or stop."""
        window = self._window
        if not on:
            if self.server is not None:
                server, self.server = self.server, None
                window.run_task(asyncio.to_thread(server.stop), "Stopping the API server")
                window.statusBar().showMessage("The API server has stopped.", 8000)
            return
        from app.remote.local_server import LocalServer

        server = LocalServer(where="Models → Serve loaded models (or quit the program using it)")
        try:
            url = server.start(window.workspace.loaded_models(), host="127.0.0.1", port=self.port)
        except Exception as exc:
            action = window.serve_action
            action.blockSignals(True)
            action.setChecked(False)
            action.blockSignals(False)
            window.report_error("Serving the API", exc)
            return
        self.server = server
        window.statusBar().showMessage(f"Serving the loaded models at {url} (OpenAI API).", 15000)

    def engines_changed(self) -> None:
        """A model loaded or unloaded: serve what is loaded now."""
        if self.server is not None and self.server.running:
            self.server.set_engines(self._window.workspace.loaded_models())

    async def stop(self) -> None:
        """Stop serving (at shutdown), off the GUI thread."""
        if self.server is not None:
            server, self.server = self.server, None
            await asyncio.to_thread(server.stop)
