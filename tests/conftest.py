"""Fixtures shared by all tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# Tests compare against transformers, which must never reach for a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def default_model_dir() -> Iterator[Path]:
    """The default model's imported folder.

    The import lives in .pytest_cache (or $TANDEM_TEST_DATA_DIR) so that later
    runs reuse it; TANDEM_DATA_DIR points there for the rest of the session.
    """
    from engine.default_model import resolve_model

    previous = os.environ.get("TANDEM_DATA_DIR")
    os.environ["TANDEM_DATA_DIR"] = os.environ.get("TANDEM_TEST_DATA_DIR") or str(
        REPO_ROOT / ".pytest_cache" / "tandem-data"
    )
    try:
        yield resolve_model("default")
    finally:
        if previous is None:
            os.environ.pop("TANDEM_DATA_DIR", None)
        else:
            os.environ["TANDEM_DATA_DIR"] = previous
