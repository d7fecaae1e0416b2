"""Tandem's inference engine: load a model, serve many requests at once.

`from engine import Engine, EngineConfig, SamplingParams`. Nothing here imports Qt.

The public surface, the only engine modules the app and the window import
(tests/architecture checks it): this package's names below; engine.params,
engine.errors, engine.progress, engine.config (options and their rules);
engine.reasoning (think blocks); engine.inspect (a model before it is
loaded: family, shape, kept formats, sizing); engine.model_files (the data
folder, the default model, GGUF import, staged writes); engine.documents and
engine.structured; and engine.entrypoints.openai.server (the HTTP server).
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> the module that defines it, imported on first use so that
# `python -m engine --help` and argument errors answer before torch is imported.
_EXPORTS = {
    "Engine": "engine.llm",
    "EngineStats": "engine.llm",
    "EngineConfig": "engine.config",
    "SamplingParams": "engine.params",
    "Tokenizer": "engine.model.tokenizer",
    "AsyncBatch": "engine.core.batch",
    "RequestOutput": "engine.core.sequence",
    "StreamEvent": "engine.core.sequence",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
