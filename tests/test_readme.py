"""The README's set-up commands are the ones CI and users actually run."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Set-up: two commands", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", section, re.S)]


def test_readme_has_exactly_two_setup_commands() -> None:
    commands = _readme_commands()
    assert len(commands) == 2
    run, test = commands
    assert run.startswith("python3 -m venv .venv") and run.endswith(".venv/bin/tandem")
    assert test.startswith("python3 -m venv .venv") and "pytest" in test


def test_ci_runs_the_readme_test_command() -> None:
    lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    commands = [ln for ln in lines if ln.strip() and not ln.startswith("#")]
    assert commands[-1] == _readme_commands()[1]
