"""A conversation's update time, as `tandem chats list` and the Chats
sidebar show it, through a real session: the writes the window makes
without changing any message (a pane renumbered when another closes, the
headers saved at close; a model load saves every open pane's header the same
way) leave it at the time of the conversation's newest message."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest

from app.settings import Settings
from app.store.chat_store import ChatStore
from app.store.cli import main as chats_cli
from app.store.records import local_time_text
from app.store.session import ChatSession
from app.workspace.workspace import Workspace
from engine import Engine, SamplingParams


def test_bookkeeping_writes_leave_the_update_time_alone(
    tiny_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TANDEM_DATA_DIR", str(tmp_path))
    path = tmp_path / "chats.sqlite3"

    async def run() -> tuple[str, float]:
        session = ChatSession.open(path)
        workspace = Workspace(Settings(), engine=tiny_engine)
        panes = session.restore(workspace, default_panes=2)
        kept = panes[1]
        workspace.set_params(kept.id, SamplingParams(temperature=0.0, max_tokens=6))
        turn = await workspace.send("Name three rivers.", targets=[kept.id])
        await turn.wait()
        await workspace.wait_idle()
        last_message = kept.conversation.messages[-1].created_at
        await asyncio.sleep(0.05)  # the writes below come measurably later
        workspace.close_pane(panes[0].id)  # the kept pane becomes "Pane 1": its header is saved again
        assert await session.aclose()
        return kept.conversation.id, last_message

    conversation_id, last_message = asyncio.run(run())
    with ChatStore.open(path, recover=False) as store:
        [summary] = [s for s in store.list_conversations() if s.id == conversation_id]
        written = store._conn.execute(
            "SELECT updated_at FROM conversations WHERE id = ?", (conversation_id,)).fetchone()[0]
    assert written > last_message  # the row was written after its last message ...
    assert summary.updated_at == last_message  # ... and the update time shown is the message's
    out = io.StringIO()
    assert chats_cli(["list"], stdout=out) == 0
    row = next(line for line in out.getvalue().splitlines() if line.startswith(conversation_id[:8]))
    assert local_time_text(last_message) in row
