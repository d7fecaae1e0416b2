"""The summary of the last broadcast turn on the real tiny model: each pane's
figures are its reply's own stats and words, the overlaps are the word
diff's, and the table reads the same as Markdown and CSV."""

from __future__ import annotations

import asyncio
import csv
import io

from app.settings import Settings
from app.workspace.compare import word_diff
from app.workspace.turn_summary import figures_of, last_turn, to_csv, to_markdown
from app.workspace.workspace import Workspace
from engine import Engine, SamplingParams


def test_the_figures_are_the_replies_stats(tiny_engine: Engine) -> None:
    workspace = Workspace(Settings(), engine=tiny_engine)
    panes = [workspace.add_pane() for _ in range(3)]
    for seed, pane in enumerate(panes, 1):
        workspace.set_params(pane.id, SamplingParams(
            temperature=5.0, seed=seed, max_tokens=4 + 3 * seed, ignore_eos=True, top_k=0, top_p=1.0, min_p=0.0
        ))

    async def main() -> None:
        assert last_turn(workspace.panes) is None
        await (await workspace.send("An older message.", targets=[panes[2].id])).wait()
        await (await workspace.send("Name three colours.", targets=[panes[0].id, panes[1].id])).wait()
        message, replies = last_turn(workspace.panes, {"default": "Tiny"})
        # The third pane was not asked the last message: it is not part of the turn.
        assert message == "Name three colours."
        assert [r.pane_id for r in replies] == [panes[0].id, panes[1].id]
        figures = figures_of(replies)
        for pane, row in zip(panes, figures):
            reply = pane.conversation.messages[-1]
            assert row.title == pane.title and row.model == "Tiny"
            assert row.words == len(reply.text.split())
            assert row.tokens == reply.stats.generated_tokens == len(reply.token_ids)
            assert row.ttft_s == reply.stats.ttft_s
            assert row.tokens_per_s == (reply.stats.tokens_per_s or None)
        left, right = word_diff(replies[0].text, replies[1].text)

        def matched(segments: list) -> float:
            total = sum(len(s.text.split()) for s in segments)
            return sum(len(s.text.split()) for s in segments if not s.changed) / total if total else 0.0

        assert figures[0].shared == {panes[1].id: matched(left)}
        assert figures[1].shared == {panes[0].id: matched(right)}

        table = to_markdown(message, figures)
        assert "Name three colours." in table
        assert table.count("\n| ") == 3  # header and two rows
        rows = list(csv.reader(io.StringIO(to_csv(figures))))
        assert rows[0][:8] == ["Pane", "Model", "Words", "Tokens", "Tok/s", "TTFT (s)", "Prompt tokens", "From cache"]
        assert rows[1][3] == str(figures[0].tokens) and rows[2][5] == f"{figures[1].ttft_s:.2f}"
        # Per pane, its prompt and how much of it the prefix cache served.
        for row, pane in zip(rows[1:], panes):
            stats = pane.conversation.messages[-1].stats
            assert row[6:8] == [str(stats.prompt_tokens), str(stats.cached_prompt_tokens)]
        assert rows[1][8] == "—" and rows[1][9] == f"{figures[0].shared[panes[1].id]:.0%}"
        await workspace.shutdown()

    asyncio.run(main())


def test_identical_replies_share_every_word() -> None:
    from app.workspace.turn_summary import TurnReply

    same = [TurnReply(1, "Pane 1", "m", "The sea is blue.", None), TurnReply(2, "Pane 2", "m", "The sea is blue.", None)]
    figures = figures_of(same)
    assert figures[0].shared == {2: 1.0} and figures[0].tokens is None and figures[0].words == 4
    apart = figures_of([TurnReply(1, "A", "m", "red green", None), TurnReply(2, "B", "m", "blue", None)])
    assert apart[0].shared == {2: 0.0}
