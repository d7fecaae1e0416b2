"""Sweeps on the real tiny model: one pane per value with that setting, each
a fork of the conversation whose next prompt starts on the source's cached
pages; values read from text, each wrong one with a message that says why."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from app.settings import Settings
from app.errors import SweepError
from app.workspace.sweep import MAX_SWEEP_VALUES, open_sweep, parse_values
from app.workspace.workspace import Workspace
from engine import Engine, SamplingParams

BASE = SamplingParams(temperature=0.8, max_tokens=6, ignore_eos=True)


def pages_below(tokens: int, page_size: int) -> int:
    """Prompt tokens that full pages of a `tokens`-long sequence cover (its last token was sampled, never fed)."""
    return (tokens - 1) // page_size * page_size


def test_a_sweep_opens_one_fork_per_value_and_the_forks_share_the_prefix(tiny_engine: Engine) -> None:
    workspace = Workspace(Settings(), engine=tiny_engine)
    source, neighbour = workspace.add_pane(), workspace.add_pane()
    workspace.set_params(source.id, BASE)
    page_size = tiny_engine.stats().page_size

    async def main() -> None:
        await (await workspace.send("Describe the sea in a long paragraph, please." * 3, targets=[source.id])).wait()
        shared = source.conversation.kept_ids
        values = parse_values("seed", "1-4", BASE)
        panes = open_sweep(workspace, source.id, "seed", values)
        assert [p.id for p in workspace.panes] == [source.id, *(p.id for p in panes), neighbour.id]
        assert [p.conversation.params.seed for p in panes] == [1, 2, 3, 4]
        assert all(p.conversation.params.temperature == 0.8 for p in panes)
        assert [p.title for p in panes] == ["seed 1", "seed 2", "seed 3", "seed 4"]
        for pane in panes:
            assert [m.text for m in pane.conversation.messages] == [m.text for m in source.conversation.messages]
            assert pane.conversation.kept_ids == shared

        await (await workspace.send("Now the mountains.", targets=[p.id for p in panes])).wait()
        replies = [p.conversation.messages[3] for p in panes]
        for reply in replies:
            assert reply.stats.cached_prompt_tokens >= pages_below(len(shared), page_size) > 0
        assert [r.params.seed for r in replies] == [1, 2, 3, 4]

        temperatures = open_sweep(workspace, source.id, "temperature", parse_values("temperature", "0.2, 1.5", BASE))
        assert [p.conversation.params.temperature for p in temperatures] == [0.2, 1.5]
        assert all(p.conversation.params.seed is None for p in temperatures)
        prompts = open_sweep(workspace, source.id, "system_prompt",
                             parse_values("system_prompt", "Be brief.\n\nAnswer in French.\n", BASE))
        assert [p.conversation.system_prompt for p in prompts] == ["Be brief.", "Answer in French."]
        models = open_sweep(workspace, source.id, "model", parse_values("model", "Tiny\n", BASE, {"tiny": "Tiny"}),
                            {"tiny": "Tiny"})
        assert [(p.conversation.model_id, p.title) for p in models] == [("tiny", "Tiny")]
        assert workspace.pane_model_state(models[0].id) == "unloaded"  # loading is the window's choice
        # An empty pane sweeps too: new panes with its settings and the value.
        fresh = workspace.add_pane()
        (top,) = open_sweep(workspace, fresh.id, "top_p", [0.5])
        assert top.conversation.messages == [] and top.conversation.params.top_p == 0.5
        await workspace.shutdown()

    asyncio.run(main())


def test_a_busy_pane_is_not_swept(tiny_engine: Engine) -> None:
    workspace = Workspace(Settings(), engine=tiny_engine)
    pane = workspace.add_pane()
    workspace.set_params(pane.id, SamplingParams(temperature=0.0, max_tokens=1500, ignore_eos=True))

    async def main() -> None:
        turn = await workspace.send("Go on forever.")
        with pytest.raises(SweepError, match="still replying"):
            open_sweep(workspace, pane.id, "seed", [1, 2])
        assert len(workspace.panes) == 1
        turn.stop()
        await turn.wait()
        await workspace.shutdown()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("parameter", "text", "message"),
    [
        ("temperature", "", "at least one value"),
        ("seed", "  , ", "at least one value"),
        ("temperature", "0.2, warm", "'warm' is not a number"),
        ("temperature", "-1", "Temperature must be at least 0"),
        ("top_p", "0", "Top-p must be above 0 and at most 1"),
        ("min_p", "0.1 1", "Min-p must be at least 0 and below 1"),
        ("temperature", "nan", "Temperature must be"),
        ("seed", "1.5", "not a whole number"),
        ("seed", "4-1", "runs backwards"),
        ("seed", "1-20", f"at most {MAX_SWEEP_VALUES}"),
        ("seed", "-3", "out of range"),
        ("seed", "3, 3", "listed twice"),
        ("temperature", ", ".join(str(i / 10) for i in range(MAX_SWEEP_VALUES + 1)), "one pane per value"),
        ("model", "Llama 70B", "no model called 'Llama 70B'. The models you can choose: Tiny"),
        ("stop", "x", "cannot be swept"),
    ],
)
def test_wrong_values_say_what_is_wrong(parameter: str, text: str, message: str) -> None:
    with pytest.raises(SweepError, match=message):
        parse_values(parameter, text, BASE, {"tiny": "Tiny"})


def test_values_in_the_ways_people_write_them() -> None:
    assert parse_values("seed", "1 – 3, 7", BASE) == [1, 2, 3, 7]
    assert parse_values("seed", "5 6;7", BASE) == [5, 6, 7]
    assert parse_values("temperature", "0 0.7\n1.2", BASE) == [0.0, 0.7, 1.2]
    assert parse_values("model", "tiny", BASE, {"tiny": "Tiny"}) == ["tiny"]


def test_the_sweep_rules_import_without_torch() -> None:
    code = "import sys, app.workspace.sweep; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])
