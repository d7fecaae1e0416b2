"""Engines for the app-core tests: the tiny random model where content does
not matter, the default model where it does.

They run on one CPU thread: these tests check behaviour, not speed, and on a
shared 2-core machine an engine with more threads than free cores was
measured 8x slower (OpenMP workers waiting on each other).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import Engine


@pytest.fixture(autouse=True)
def private_config(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's own config folder, and secrets in its file: a test never
    reads or writes the user's settings or the system keyring."""
    folder = tmp_path_factory.mktemp("config") / "Tandem"
    monkeypatch.setenv("TANDEM_CONFIG_DIR", str(folder))
    monkeypatch.setenv("TANDEM_SECRETS", "file")
    return folder


@pytest.fixture
def tiny_engine(tiny_model_dir: Path) -> Iterator[Engine]:
    engine = Engine(str(tiny_model_dir), device="cpu", dtype="float32", kv_pages=256, threads=1)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def default_engine(default_model_dir: Path) -> Iterator[Engine]:
    # Deterministic: several checks use "greedy, the same prompt gives the same
    # reply" as their oracle, across prefix-cache hits. With the quantized
    # kernels that holds only in deterministic mode (tests/engine/test_engine.py).
    engine = Engine(str(default_model_dir), device="cpu", kv_cache_bytes=256 << 20, threads=1, deterministic=True)
    yield engine
    engine.close()

