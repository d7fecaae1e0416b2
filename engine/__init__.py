"""Tandem's inference engine: load a model, serve many requests at once.

`from engine import Engine, EngineConfig, SamplingParams`. Nothing here imports Qt.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Engine", "EngineConfig", "SamplingParams"]


def __getattr__(name: str) -> Any:
    # Lazy, so `python -m engine --help` and argument errors answer before
    # torch is imported.
    if name == "Engine":
        from engine.llm import Engine

        return Engine
    if name == "EngineConfig":
        from engine.config import EngineConfig

        return EngineConfig
    if name == "SamplingParams":
        from engine.params import SamplingParams

        return SamplingParams
    raise AttributeError(name)
