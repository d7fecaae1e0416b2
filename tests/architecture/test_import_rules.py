"""The package rules of docs/design.md, checked on the real tree, and each
rule shown to catch a planted violation (so none of these can pass vacuously)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.architecture.import_rules import (
    cycles,
    engine_exports,
    import_sites,
    layering_violations,
    private_attribute_violations,
    private_name_violations,
    public_engine_violations,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sites():
    found = list(import_sites(REPO_ROOT))
    # The tree really was read: the engine's client imports its core.
    assert any(s.module == "engine.llm" and s.target.startswith("engine.core") for s in found)
    return found


def test_dependencies_point_from_ui_to_app_to_engine(sites):
    assert layering_violations(sites) == []


def test_no_layer_takes_a_private_name_from_the_layer_below(sites):
    assert private_name_violations(sites) == []


def test_app_and_ui_use_only_the_engines_public_modules(sites):
    exports = engine_exports(REPO_ROOT)
    assert {"Engine", "Tokenizer", "SamplingParams"} <= exports
    assert public_engine_violations(sites, exports) == []


def test_ui_reads_no_private_attribute_of_another_object():
    assert private_attribute_violations(REPO_ROOT) == []


def test_no_import_cycles_at_load_time(sites):
    assert cycles(sites) == []


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    for package in ("engine", "app", "ui"):
        (tmp_path / package).mkdir(exist_ok=True)
        (tmp_path / package / "__init__.py").touch()
    return tmp_path


def test_each_rule_catches_a_planted_violation(tmp_path):
    root = _tree(tmp_path, {
        "engine/core.py": "from PySide6.QtCore import QObject\nfrom app import settings\n",
        "app/view.py": "from PySide6.QtWidgets import QLabel\nfrom engine.core import _hidden\n",
        "app/settings.py": "import app.view\n",
        "ui/window.py": """
            from app.view import _helper
            from engine import _private_module
            def f(workspace):
                return workspace._closed
        """,
        "app/a.py": "from app import b\n",
        "app/b.py": "from app.a import thing\n",
        "app/lazy.py": "def f():\n    from app import lazy_back\n",
        "app/lazy_back.py": "from app import lazy\n",
        "engine/__init__.py": "_EXPORTS = {'Engine': 'engine.llm'}\n",
        "app/engine_user.py": """
            from engine import Engine, inspect
            from engine.inspect import read_gguf_summary
            from engine import llm
            from engine.formats.loader import resolve_device
            def f():
                from engine.model import quant
        """,
    })
    sites = list(import_sites(root))
    assert sorted(layering_violations(sites)) == [
        "app.view:1: from PySide6.QtWidgets import QLabel",
        "engine.core:1: from PySide6.QtCore import QObject",
        "engine.core:2: from app import settings",
    ]
    assert sorted(private_name_violations(sites)) == [
        "app.view:2: from engine.core import _hidden",
        "ui.window:2: from app.view import _helper",
        "ui.window:3: from engine import _private_module",
    ]
    assert private_attribute_violations(root) == ["ui.window:5: ._closed"]
    assert sorted(public_engine_violations(sites, engine_exports(root))) == [
        "app.engine_user:4: from engine import llm",
        "app.engine_user:5: from engine.formats.loader import resolve_device",
        "app.engine_user:7: from engine.model import quant",
        "app.view:2: from engine.core import _hidden",
        "ui.window:3: from engine import _private_module",
    ]
    # a <-> b at load time is a cycle, and so is engine.core -> app.settings -> app.view -> engine.core;
    # lazy <-> lazy_back is not (one side imports inside a function).
    assert sorted(cycles(sites)) == [["app.a", "app.b"], ["app.settings", "app.view", "engine.core"]]
