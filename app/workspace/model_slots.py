"""The models a workspace runs: one engine per model, loaded and closed off the loop's thread.

Panes on the same model share its one engine (one batch, one prefix cache),
so the workspace keeps one `ModelSlot` per model id and `ModelSlots` is that
collection. Loading builds the `Engine` on its own daemon thread, reporting
progress back through the asyncio loop; closing an engine does the same. A
load that is superseded (a newer load, an unload, a shutdown) is cancelled
and its engine, if it still arrived, is closed without ever being used.

Like the workspace, every method runs on the loop's thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from engine.errors import EngineError, LoadCancelled, ModelLoadError

from app.errors import AppError

if TYPE_CHECKING:
    from engine import Engine
    from engine.progress import LoadProgress

log = logging.getLogger(__name__)

T = TypeVar("T")

SlotState = Literal["loading", "ready", "error"]

# Seconds a shutdown (or an unload) gives running replies to end and an engine
# to close before it lets the (daemon) engine thread go.
SHUTDOWN_TIMEOUT_S = 1.5


@dataclass(eq=False, slots=True)
class ModelSlot:
    """One model the workspace has loaded, is loading, or failed to load.

    What a view may read (the window's banner shows the model being loaded
    or the one that failed from these):

    - `model_id`: the model, as panes name it (`Conversation.model_id`).
    - `state`: "loading", "ready" or "error".
    - `progress`: the latest `engine.progress.LoadProgress` while loading
      (None before the first report).
    - `error`: why the load failed, a sentence a person can act on (state "error").
    - `engine`: the loaded Engine when "ready", else None.
    - `options`: the per-model Engine arguments it was loaded with
      ({"quantize": "int4"}); a choice changed since applies at the next load.
    """

    model_id: str
    state: SlotState = "loading"
    engine: Engine | None = None
    progress: LoadProgress | None = None
    error: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    # Set to stop the load in progress; None once the load has ended.
    _cancel: threading.Event | None = field(default=None, init=False, repr=False)

    @property
    def load_cancelled(self) -> bool:
        """Whether a newer request (a reload, an unload, a shutdown) superseded this slot's load."""
        return self._cancel is not None and self._cancel.is_set()

    def cancel_load(self) -> None:
        """Ask the load in progress, if any, to stop at its next checkpoint."""
        if self._cancel is not None:
            self._cancel.set()


class ModelSlots:
    """Model id -> ModelSlot, and the loading and closing of their engines.

    `on_change(slot)` is called whenever a slot starts loading, reports
    progress or fails; a load that succeeds is announced by the caller (with
    `announce`), which first brings its panes up to date with the new engine.
    """

    def __init__(
        self,
        *,
        resolve_model: Callable[[str], str],
        model_options: Callable[[str], Mapping[str, Any]],
        on_change: Callable[[ModelSlot], None],
    ) -> None:
        self._slots: dict[str, ModelSlot] = {}
        self._resolve_model = resolve_model
        self._model_options = model_options
        self._on_change = on_change

    # -- what is there ------------------------------------------------------------

    def get(self, model_id: str) -> ModelSlot | None:
        return self._slots.get(model_id)

    def model_ids(self) -> list[str]:
        """Every model with a slot (loading, ready or failed), in the order they were asked for."""
        return list(self._slots)

    def all(self) -> list[ModelSlot]:
        return list(self._slots.values())

    def state(self, model_id: str) -> str:
        """"loading" | "ready" | "error", or "unloaded" when the model has no slot."""
        slot = self._slots.get(model_id)
        return slot.state if slot is not None else "unloaded"

    def engine_for(self, model_id: str) -> Engine | None:
        """The model's engine when it is loaded and ready, else None."""
        slot = self._slots.get(model_id)
        return slot.engine if slot is not None and slot.state == "ready" else None

    def ready_engines(self) -> dict[str, Engine]:
        """Model id -> engine, for every model that is ready."""
        return {mid: slot.engine for mid, slot in self._slots.items() if slot.state == "ready" and slot.engine}

    # -- loading and closing ------------------------------------------------------------

    def adopt(self, model_id: str, engine: Engine) -> ModelSlot:
        """Take an engine that is already loaded (tests, scripts) as the model's."""
        slot = ModelSlot(model_id, "ready", engine)
        self._slots[model_id] = slot
        return slot

    async def load(self, model_id: str, engine_kwargs: Mapping[str, Any]) -> ModelSlot | None:
        """Load the model on its own thread with `engine_kwargs` plus its own options.

        Returns its slot, now "ready", for the caller to announce; None when
        the load failed (reported through `on_change` as state "error", not
        raised) or was superseded meanwhile. The model must have no slot
        (retire the old one first).
        """
        loop = asyncio.get_running_loop()
        cancel = threading.Event()
        slot = ModelSlot(model_id, "loading")
        slot._cancel = cancel
        self._slots[model_id] = slot
        self._on_change(slot)

        def on_progress(progress: LoadProgress) -> None:  # on the loading thread
            post(loop, self._on_progress, slot, progress)

        kwargs = dict(engine_kwargs)
        try:
            kwargs["model"] = self._resolve_model(model_id)
            slot.options = dict(self._model_options(model_id))
            kwargs.update(slot.options)
            engine = await in_thread(
                loop, lambda: _new_engine(kwargs, on_progress, cancel), "tandem-load"
            )
        except LoadCancelled:
            return None
        except (EngineError, AppError, OSError) as exc:
            self._failed(slot, load_error_text(exc, slot.options))
            return None
        except Exception as exc:  # an unexpected failure is still shown, not swallowed
            log.exception("loading the model failed")
            self._failed(slot, f"{type(exc).__name__}: {exc}")
            return None
        if cancel.is_set() or self._slots.get(model_id) is not slot:  # superseded, unloaded or shut down meanwhile
            threading.Thread(target=engine.close, name="tandem-close", daemon=True).start()
            return None
        slot._cancel = None
        slot.engine = engine
        slot.state = "ready"
        return slot

    def announce(self, slot: ModelSlot) -> None:
        """Report the slot's state (the caller's half of a successful load)."""
        self._on_change(slot)

    def cancel_loads(self) -> None:
        """Ask every load in progress to stop."""
        for slot in self._slots.values():
            slot.cancel_load()

    def forget(self, slot: ModelSlot) -> Engine | None:
        """Drop the slot (if it is still the model's) and hand back its engine for closing."""
        if self._slots.get(slot.model_id) is slot:
            del self._slots[slot.model_id]
        engine, slot.engine = slot.engine, None
        return engine

    @staticmethod
    async def close_engine(engine: Engine, deadline: float) -> None:
        """Close the engine on its own thread, waiting until `deadline` (loop time) at most."""
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(in_thread(loop, engine.close, "tandem-close"), max(0.0, deadline - loop.time()))
        except TimeoutError:
            log.warning("the engine did not close in time; leaving its thread behind")

    def _failed(self, slot: ModelSlot, error: str) -> None:
        if slot.load_cancelled or self._slots.get(slot.model_id) is not slot:
            return
        slot._cancel = None
        slot.state = "error"
        slot.error = error
        self._on_change(slot)

    def _on_progress(self, slot: ModelSlot, progress: LoadProgress) -> None:
        if self._slots.get(slot.model_id) is slot and slot.state == "loading" and slot._cancel is not None \
                and not slot._cancel.is_set():
            slot.progress = progress
            self._on_change(slot)


def load_error_text(exc: BaseException, options: Mapping[str, Any]) -> str:
    """Why a load failed, for the pane; a failure while quantizing at load
    says so and how to load the model as stored instead."""
    mode = options.get("quantize")
    # OSError: writing the quantized copy (a full disk, a read-only data folder).
    if mode and isinstance(exc, (ModelLoadError, OSError)):
        reason = str(exc).rstrip(".")
        return (
            f"Loading the model quantized to {mode} failed: {reason}. To load it as stored, set "
            "“Quantize at load” to Off in Models › Manage models."
        )
    return str(exc)


def post(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    """Run fn(*args) on the loop from another thread; nothing if the loop has closed."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the loop closed: the program is ending
        pass


async def in_thread(loop: asyncio.AbstractEventLoop, fn: Callable[[], T], name: str) -> T:
    """fn() on a new daemon thread, awaited without blocking the loop.

    Not the loop's default executor: a model load that outlives the window
    must not keep the process from exiting (the executor's threads are joined
    at exit, a daemon thread is not).
    """
    future: asyncio.Future[T] = loop.create_future()

    def settle(setter: Callable[[Any], None], value: Any) -> None:
        if not future.done():
            setter(value)

    def work() -> None:
        try:
            result = fn()
        except BaseException as exc:
            post(loop, settle, future.set_exception, exc)
        else:
            post(loop, settle, future.set_result, result)

    threading.Thread(target=work, name=name, daemon=True).start()
    return await future


def _new_engine(kwargs: dict[str, Any], on_progress: Any, cancel: Any) -> Engine:
    # Imported on the loading thread: torch takes seconds to import, and the
    # window is on screen before any model loads.
    from engine import Engine

    return Engine(**kwargs, on_progress=on_progress, cancel=cancel)
