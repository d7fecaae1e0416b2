"""The window's models: their names, loading them (after a memory check),
switching a pane's model, unloading idle ones, and the model manager.

A load that would not fit in free memory asks first (unload the idle
models, load anyway, or cancel); the estimate is advice and never stops a
load by itself failing.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

if TYPE_CHECKING:
    from app.models.memory_estimate import FitResult
    from app.models.registry import ModelEntry
    from ui.dialogs.model_manager import ModelManagerDialog
    from ui.window.main_window import MainWindow

log = logging.getLogger(__name__)

# The context a pane's settings offer for max tokens while no model is loaded to say.
FALLBACK_MAX_CONTEXT = 32768


class WindowModels:
    def __init__(self, window: MainWindow) -> None:
        self._window = window
        self.manager: ModelManagerDialog | None = None

    # -- names -------------------------------------------------------------------------

    def name(self, model_id: str | None = None) -> str:
        """What people call the model: the registry's name, else the folder's."""
        workspace, registry = self._window.workspace, self._window.registry
        model_id = workspace.default_model if model_id is None else model_id
        if registry is not None:
            try:
                return registry.get(model_id).name
            except Exception:
                pass
        if model_id == "default":
            from engine.model_files import DEFAULT_MODEL_NAME

            return DEFAULT_MODEL_NAME
        engine = workspace.engine_for(model_id)
        return engine.model_path.name if engine is not None else Path(str(model_id)).stem

    def entries(self) -> list[ModelEntry]:
        """The registry's models, plus any model a pane runs that it does not list (a --model path)."""
        from app.models.registry import ModelEntry

        registry = self._window.registry
        entries = list(registry.models()) if registry is not None else []
        known = {e.id for e in entries}
        for view in self._window.panes.values():
            model_id = view.pane.conversation.model_id
            if view.pane.remote is None and model_id not in known:
                known.add(model_id)
                entries.append(ModelEntry(model_id, Path(model_id).stem, Path(model_id), "folder"))
        return entries

    def current(self) -> str:
        """The current pane's model (the default model for a remote pane or none)."""
        view = self._window.current_view()
        if view is not None and view.pane.remote is None:
            return view.pane.conversation.model_id
        return self._window.workspace.default_model

    def current_max_context(self) -> int:
        """The loaded engine's context (capped by the model's max-context setting), in tokens."""
        stats = self._window.workspace.stats(self.current())
        return stats.max_context if stats is not None and stats.max_context > 0 else FALLBACK_MAX_CONTEXT

    # -- loading -----------------------------------------------------------------------

    def load_engine(self) -> None:
        """Load the settings' model and every other model an open pane runs."""
        window = self._window
        window.load_requested = True
        window.crash_recovery = False

        async def load_all() -> None:
            ok = await window.workspace.load_engine(window.engine_settings)
            others = [v.pane.conversation.model_id for v in window.panes.values() if v.pane.remote is None]
            for model_id in dict.fromkeys(others):
                if ok and window.workspace.model_state(model_id) == "unloaded":
                    await self.load_if_it_fits(model_id)

        window.run_task(load_all(), "Loading the model")

    def load_from_banner(self) -> None:
        window = self._window
        model_id = window.banner.model_id
        if model_id is None or (model_id == window.workspace.default_model and window.crash_recovery):
            self.load_engine()
        else:
            self.load(model_id)

    def load(self, model_id: str) -> asyncio.Task[bool]:
        """Start loading; the task (True when loaded) lets the model manager say when it is done."""
        window = self._window
        window.load_requested = True
        window.crash_recovery = False
        return window.run_task(self.load_if_it_fits(model_id), f"Loading {self.name(model_id)}")

    def load_pane_model(self, pane_id: int) -> None:
        view = self._window.panes.get(pane_id)
        if view is not None and view.pane.remote is None:
            self.load(view.pane.conversation.model_id)

    def load_current_pane_model(self) -> None:
        if self._window.current_pane_id is not None:
            self.load_pane_model(self._window.current_pane_id)

    async def load_if_it_fits(self, model_id: str) -> bool:
        """Load the model, after checking its memory estimate against what is
        free; when it does not fit, ask whether to unload idle models first."""
        workspace = self._window.workspace
        verdict = self.memory_verdict(model_id)
        if verdict is not None and not verdict.fits:
            choice = await self._ask_memory(verdict)
            if choice == "cancel":
                self._window.apply_engine_state("unloaded", None, None)
                return False
            if choice == "unload":
                for other in verdict.unload:
                    await workspace.unload_model(other)
        return await workspace.load_model(model_id)

    def memory_verdict(self, model_id: str) -> FitResult | None:
        """The fit of loading `model_id` now, or None when it cannot be estimated."""
        registry, workspace = self._window.registry, self._window.workspace
        if registry is None:
            return None
        from app.models.memory_estimate import LoadedModel, available_memory, check_fits

        s = self._window.engine_settings
        try:
            estimate = registry.estimate_memory(model_id, s.device, s.dtype, s.kv_cache_mb, s.page_size)
            available = available_memory(s.device)
            loaded = []
            for other in workspace.loaded_models():
                try:
                    size = registry.estimate_memory(other, s.device, s.dtype, s.kv_cache_mb, s.page_size).total_bytes
                except Exception:
                    continue
                loaded.append(LoadedModel(other, size, not workspace.model_busy(other)))
        except Exception as exc:  # an estimate is advice: never stop a load over it
            log.info("no memory estimate for %s: %s", model_id, exc)
            return None
        names = {m.model_id: self.name(m.model_id) for m in loaded}
        return check_fits(estimate, available, loaded, model_name=self.name(model_id), names=names)

    async def _ask_memory(self, verdict: FitResult) -> str:
        """"unload" | "load" | "cancel"."""
        window = self._window
        box = QMessageBox(QMessageBox.Icon.Warning, "Not enough memory", verdict.message,
                          QMessageBox.StandardButton.NoButton, window)
        unload = box.addButton("&Unload and load", QMessageBox.ButtonRole.AcceptRole) if verdict.unload else None
        anyway = box.addButton("Load &anyway", QMessageBox.ButtonRole.DestructiveRole)
        cancel = box.addButton(QMessageBox.StandardButton.Cancel)
        box.setDefaultButton(unload or cancel)
        window.confirm_box = box
        done: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        def finished(_result: int) -> None:
            clicked = box.clickedButton()
            answer = "unload" if clicked is unload and unload is not None else "load" if clicked is anyway else "cancel"
            if not done.done():
                done.set_result(answer)
            window.confirm_box = None

        box.finished.connect(finished)
        box.open()
        return await done

    # -- switching and unloading -------------------------------------------------------

    def choose(self, pane_id: int, model_id: str) -> None:
        """The pane's header picked another model: switch the pane, and load the model when it is not loaded."""
        window = self._window
        view = window.panes.get(pane_id)
        if view is None:
            return
        try:
            window.workspace.set_model(pane_id, model_id)
        except Exception as exc:
            view.refresh_header()  # back to the model it still runs
            window.report_error("Changing the model", exc)
            return
        window.apply_engine_state(window.workspace.model_state(model_id), None, None)
        if window.workspace.model_state(model_id) in ("unloaded", "error"):
            self.load(model_id)

    def unload_idle(self) -> None:
        """Free the memory of every loaded model that no pane is set to."""
        window = self._window
        workspace = window.workspace
        idle = [m for m in workspace.loaded_models() if not workspace.model_in_use(m)]
        if not idle:
            window.statusBar().showMessage("Every loaded model is in use by a pane.", 8000)
            return

        async def unload() -> None:
            for model_id in idle:
                await workspace.unload_model(model_id)
            window.statusBar().showMessage(f"Unloaded {', '.join(self.name(m) for m in idle)}.", 8000)

        window.run_task(unload(), "Unloading models")

    # -- the model manager -------------------------------------------------------------

    def open_manager(self) -> None:
        window = self._window
        if window.registry is None:
            return
        from ui.dialogs.model_manager import ModelManagerDialog

        if self.manager is not None:
            self.manager.raise_()
            self.manager.activateWindow()
            return
        workspace = window.workspace
        dialog = ModelManagerDialog(
            window.registry,
            window,
            is_in_use=workspace.model_in_use,
            is_loaded=lambda model_id: workspace.model_state(model_id) == "ready",
            reload_model=self.load,
        )
        s = window.engine_settings
        try:
            dialog.set_engine_settings(s.device, s.dtype, s.kv_cache_mb, s.page_size)
        except Exception:
            log.debug("model manager: no engine settings", exc_info=True)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.models_changed.connect(self._models_changed)
        dialog.destroyed.connect(self._manager_closed)
        self.manager = dialog
        dialog.open()

    def _manager_closed(self) -> None:
        self.manager = None

    def _models_changed(self) -> None:
        entries = self.entries()
        for view in self._window.panes.values():
            view.set_model_entries(entries)
            view.refresh_header()
