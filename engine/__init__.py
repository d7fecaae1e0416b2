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
import os
from typing import Any

# How long an idle OpenMP worker spins before it sleeps, read once when torch
# loads libgomp (so here, before any engine module imports torch). libgomp
# spins 300,000 times (~8 ms here) by default, but only 100 once it counts
# more OpenMP threads than cores, and it does in this process: every thread
# that ever ran a parallel op (the loading thread, the engine thread) keeps
# a pool of its own. Then the worker slept between the ~180 parallel regions
# of a decode step and each region waited for its futex wake-up: 800 sleeps
# a step at 16 sequences (strace), 3 with libgomp's default. On a quiet
# machine one-sequence decode gained 10-25% and 16 sequences ~3%; more on a
# busy host, where a wake-up takes longer (docs/benchmarks.md). The window's
# worst stall did not change. A value the user set wins.
os.environ.setdefault("GOMP_SPINCOUNT", "300000")

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
