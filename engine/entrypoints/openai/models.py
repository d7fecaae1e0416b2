"""The models a server serves, and the endpoints that list them:
`GET /v1/models`, `GET /v1/models/{id}`, and `GET /health`.

One server can serve several engines, each under its own model id: a
request's `model` picks the engine, and `GET /v1/models` lists them all.

Model ids are the names people see, as a slug (`served_model_id`): the
window's "SmolLM2-135M-Instruct" is served as `smollm2-135m-instruct`, and
`python -m engine serve` names its model by the same rule. A request may
also spell the name as shown (any text whose slug is a served id), or say
`default` (an alias of the first model served, unless a model is served
under that very id); a caller may add aliases of its own (the desktop app
adds its registry's ids, so a second Tandem window's remote pane works).
`ServedModels` holds that mapping and may change while the server runs (the
desktop app loads and unloads models); a request keeps the engine it started
on, and one whose engine is closed under it ends with a clean 503 error, never
a hang. An engine that is closed is no longer served.
"""

from __future__ import annotations

import re
import threading
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engine.entrypoints.openai import protocol as proto
from engine.entrypoints.openai import responses
from engine.entrypoints.openai.request_log import note_model

if TYPE_CHECKING:
    from engine.llm import Engine


# Asking for this id reaches the first model served (unless one is served under it).
DEFAULT_ALIAS = "default"
# A served id is at most this long: it is typed, and shown in lists.
MAX_MODEL_ID_CHARS = 64


def served_model_id(name: str) -> str:
    """The id a model shown as `name` is served under: lower case, letters,
    digits and dots, other runs of characters as one '-'.
    'SmolLM2-135M-Instruct' -> 'smollm2-135m-instruct';
    'Qwen2.5 0.5B Instruct (Q4_K_M)' -> 'qwen2.5-0.5b-instruct-q4-k-m'."""
    ascii_text = unicodedata.normalize("NFKD", str(name)).encode("ascii", "ignore").decode()
    result = re.sub(r"[^a-z0-9.]+", "-", ascii_text.lower()).strip("-.")
    return result[:MAX_MODEL_ID_CHARS].strip("-.") or "model"


@dataclass(slots=True, frozen=True)
class _Served:
    engine: Engine
    created: int  # when it started being served under its id: the model card's `created`


class ServedModels:
    """The engines a server serves, by model id; safe to change from any
    thread while the server runs.

    The engines stay their owner's: closing one (after taking it out, or
    not) is the owner's business. A closed engine is no longer served, and
    the requests it was running end with a 503 error.
    """

    def __init__(self, engines: Mapping[str, Engine] | None = None) -> None:
        self._lock = threading.Lock()
        # Replaced whole, never changed in place: readers on the server's
        # thread take the current mapping without locking.
        self._served: Mapping[str, _Served] = {}
        self._aliases: Mapping[str, str] = {}
        if engines:
            self.set(engines)

    def set(self, engines: Mapping[str, Engine], aliases: Mapping[str, str] | None = None) -> None:
        """Serve exactly `engines` from now on. A request already running
        keeps its engine; an id that stays on the same engine keeps its card.
        `aliases` (other id -> served id) are further names a request may
        use; they are not listed."""
        checked = dict(engines)
        alias_map = {str(alias): target for alias, target in (aliases or {}).items()
                     if target in checked and alias not in checked}
        for model_id, engine in checked.items():
            if not isinstance(model_id, str) or not model_id.strip():
                raise ValueError(f"A model id must be a non-empty string, not {model_id!r}")
            if not hasattr(engine, "submit"):
                raise TypeError(f"The model '{model_id}' maps to {type(engine).__name__}, not an Engine")
        with self._lock:
            old = self._served
            now = responses.now()
            self._served = {
                model_id: old[model_id] if model_id in old and old[model_id].engine is engine
                else _Served(engine, now)
                for model_id, engine in checked.items()
            }
            self._aliases = alias_map

    def resolve(self, requested: str) -> str | None:
        """The served id a request's `model` names: the id itself, an alias,
        the name as shown (its slug is the id), or `default` (the first
        model); None when it names none."""
        served, aliases = self._served, self._aliases
        if requested in served:
            return requested
        if requested in aliases:
            return aliases[requested]
        if not isinstance(requested, str) or not requested:
            return None
        wanted = served_model_id(requested)
        for model_id in served:
            if served_model_id(model_id) == wanted:
                return model_id
        if requested == DEFAULT_ALIAS and served:
            return next(iter(served))
        return None

    def get(self, model_id: str) -> Engine | None:
        """The open engine a request for `model_id` reaches (see `resolve`), else None."""
        resolved = self.resolve(model_id)
        served = self._served.get(resolved) if resolved is not None else None
        return served.engine if served is not None and not served.engine.closed else None

    def require(self, model_id: str) -> Engine:
        """The open engine served as `model_id`; an APIError 404 naming the
        served ids when there is none."""
        note_model(model_id)
        engine = self.get(model_id)
        if engine is None:
            raise proto.model_not_found(model_id, self.ids())
        return engine

    def cards(self) -> list[dict[str, Any]]:
        """The model cards of the open engines, in the order they were given."""
        return [responses.model_card(model_id, served.created) for model_id, served in self._served.items()
                if not served.engine.closed]

    def ids(self) -> list[str]:
        return [card["id"] for card in self.cards()]

    def engines(self) -> dict[str, Engine]:
        """A snapshot of the mapping (closed engines included)."""
        return {model_id: served.engine for model_id, served in self._served.items()}


def served_models(
    engines: Engine | Mapping[str, Engine] | ServedModels, model_name: str | None = None
) -> ServedModels:
    """`engines` as a ServedModels (the same object when it already is one)."""
    if isinstance(engines, ServedModels):
        if model_name is not None:
            raise TypeError("model_name names a single engine; a ServedModels has its own ids")
        return engines
    if isinstance(engines, Mapping):
        if model_name is not None:
            raise TypeError("model_name names a single engine; a mapping has its own ids")
        return ServedModels(engines)
    return ServedModels({model_name or model_name_for(engines): engines})


def model_name_for(engine: Engine) -> str:
    """The id a served engine goes by when its owner names none: its model
    folder's name (what the window and the CLI show), as `served_model_id`."""
    return served_model_id(engine.model_path.name)


# -- endpoints ----------------------------------------------------------------------


async def list_models(request: Request, models: ServedModels) -> Response:
    """GET /v1/models"""
    return JSONResponse(responses.model_list(models.cards()))


async def retrieve_model(request: Request, models: ServedModels) -> Response:
    """GET /v1/models/{model}"""
    model = request.path_params["model"]
    resolved = models.resolve(model)
    card = next((c for c in models.cards() if c["id"] == resolved), None)
    if card is None:
        raise proto.model_not_found(model, models.ids())
    return JSONResponse(card)


async def health(request: Request, models: ServedModels) -> Response:
    """GET /health: the server answers (for load balancers; needs no API key)."""
    return JSONResponse({"status": "ok"})
