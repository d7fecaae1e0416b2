"""Reply versions through the workspace, the chat store and the exports, on
the tiny model: regenerate and edit-and-resend keep the earlier replies, a
switch brings back a version with its own token ids (so the next turn hits
the prefix cache), and the versions survive a restart and an export."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from app.events import ReplyVersionShown
from app.settings import Settings
from app.store.chat_store import ChatStore
from app.store.export import to_json, to_markdown
from app.workspace.workspace import Workspace
from engine import Engine, SamplingParams
from tests.app.test_workspace import Recorder, pages_below

SHORT = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def one_pane(engine: Engine) -> tuple[Workspace, Recorder]:
    workspace = Workspace(Settings(), engine=engine)
    recorder = Recorder(workspace)
    pane = workspace.add_pane()
    workspace.set_params(pane.id, SHORT)
    return workspace, recorder


def test_regenerate_keeps_versions_and_a_switch_continues_with_its_own_ids(tiny_engine: Engine) -> None:
    workspace, recorder = one_pane(tiny_engine)
    (pane,) = workspace.panes
    conversation = pane.conversation
    page_size = tiny_engine.stats().page_size

    async def main() -> None:
        await (await workspace.send("Tell me about the sea.")).wait()
        first_text = conversation.messages[1].text
        first_kept = conversation.kept_ids
        # A shorter reply: the random model's versions differ at least in length.
        workspace.set_params(pane.id, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
        await (await workspace.regenerate(pane.id)).wait()
        second_kept = conversation.kept_ids
        versions = conversation.messages[1].versions
        assert versions is not None and (versions.current, versions.count) == (1, 2)
        assert second_kept != first_kept

        workspace.show_version(pane.id, 1, 0)
        assert recorder.of(ReplyVersionShown)[-1] == ReplyVersionShown(pane.id, 1, 0)
        assert conversation.messages[1].text == first_text
        assert conversation.kept_ids == first_kept
        # The first version's own reply is in the prompt of the next turn, and its pages come from the cache.
        await (await workspace.send("And the mountains?")).wait()
        reply = conversation.messages[3]
        assert conversation.kept_ids[: len(first_kept)] == first_kept
        assert reply.stats.cached_prompt_tokens > 0
        assert reply.stats.cached_prompt_tokens >= pages_below(len(first_kept), page_size)

        # Back to the second version: the turn played on the first stays with the first.
        workspace.show_version(pane.id, 1, 1)
        assert len(conversation.messages) == 2 and conversation.kept_ids == second_kept
        await (await workspace.send("And the sky?")).wait()
        assert conversation.messages[3].stats.cached_prompt_tokens >= pages_below(len(second_kept), page_size)

    asyncio.run(main())


def test_edit_and_resend_keeps_the_old_text_and_reply_as_a_version(tiny_engine: Engine) -> None:
    workspace, _ = one_pane(tiny_engine)
    (pane,) = workspace.panes
    conversation = pane.conversation

    async def main() -> None:
        await (await workspace.send("Say hello.")).wait()
        await (await workspace.send("Say goodbye.")).wait()
        before = [m.text for m in conversation.messages]
        await (await workspace.edit_and_resend(pane.id, 2, "Say thanks.")).wait()
        assert conversation.messages[2].text == "Say thanks."
        assert conversation.messages[3].versions is not None
        workspace.show_version(pane.id, 3, 0)
        assert [m.text for m in conversation.messages] == before

    asyncio.run(main())


def test_versions_are_saved_restored_and_exported(tiny_engine: Engine, tmp_path: Path) -> None:
    workspace, _ = one_pane(tiny_engine)
    (pane,) = workspace.panes
    conversation = pane.conversation
    warm = SamplingParams(temperature=0.7, max_tokens=8, seed=1, ignore_eos=True)

    async def main() -> None:
        workspace.set_params(pane.id, warm)
        await (await workspace.send("Hi")).wait()
        await (await workspace.send("Name a colour.")).wait()
        workspace.set_params(pane.id, SamplingParams(temperature=0.0, max_tokens=8, seed=7, ignore_eos=True))
        await (await workspace.edit_and_resend(pane.id, 2, "Name a fruit.")).wait()
        await (await workspace.regenerate(pane.id)).wait()

    asyncio.run(main())
    texts = [m.text for m in conversation.messages]
    shown_kept = conversation.kept_ids
    with ChatStore.open(tmp_path / "chats.sqlite3") as store:
        store.save_conversation(conversation)
    with ChatStore.open(tmp_path / "chats.sqlite3") as store:
        restored = store.load_conversation(conversation.id)
    assert [m.text for m in restored.messages] == texts
    assert restored.kept_ids == shown_kept
    versions = restored.messages[3].versions
    assert versions is not None and (versions.current, versions.count) == (2, 3)
    old = conversation.messages[3].versions.versions[0]
    restored.show_version(3, 0)
    assert [m.text for m in restored.messages][2:] == ["Name a colour.", old.messages[0].text]
    assert restored.kept_ids == old.kept_ids and restored.kept_ids
    assert restored.messages[3].token_ids == old.messages[0].token_ids

    # JSON: every version, the one shown marked.
    data = to_json(conversation)["conversation"]["messages"][3]["versions"]
    assert (data["shown"], data["count"]) == (3, 3)
    assert [v["version"] for v in data["others"]] == [1, 2]
    assert data["others"][0]["user_text"] == "Name a colour."
    assert data["others"][1]["user_text"] == "Name a fruit."
    json.dumps(data)
    # Markdown: every version, marked, each reply with its own sampling.
    md = to_markdown(conversation)
    assert "version 3 of 3, shown" in md
    assert "Other version: version 1 of 3" in md and "Other version: version 2 of 3" in md
    assert "In reply to: Name a colour." in md
    assert old.messages[0].text in md


def test_markdown_lists_each_replys_own_settings(tiny_engine: Engine) -> None:
    workspace, _ = one_pane(tiny_engine)
    (pane,) = workspace.panes

    async def main() -> None:
        workspace.set_params(pane.id, SamplingParams(temperature=0.7, max_tokens=8, ignore_eos=True))
        await (await workspace.send("First question")).wait()
        workspace.set_params(pane.id, SamplingParams(temperature=0.0, max_tokens=8, seed=7, ignore_eos=True))
        await (await workspace.send("Second question")).wait()

    asyncio.run(main())
    md = to_markdown(pane.conversation)
    header, messages = md.split("## Messages")
    first, second = messages.split("Second question")
    # The first reply lists the settings it was made with, not the ones chosen later.
    assert "*Sampling: temperature 0.7, max tokens 8, top-k 40, top-p 0.95, min-p 0.05*" in first
    assert "seed 7" not in first
    assert "*Sampling: temperature 0, max tokens 8, top-k 40, top-p 0.95, min-p 0.05, seed 7*" in second
    assert "- Sampling of new replies: temperature 0, max tokens 8, top-k 40, top-p 0.95, min-p 0.05, seed 7" in header


def test_an_export_with_versions_imports_with_them(tiny_engine: Engine, tmp_path: Path) -> None:
    from app.store.export import ChatImportError, from_json

    workspace, _ = one_pane(tiny_engine)
    (pane,) = workspace.panes

    async def main() -> None:
        await (await workspace.send("Hi")).wait()
        workspace.set_params(pane.id, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
        await (await workspace.regenerate(pane.id)).wait()

    asyncio.run(main())
    data = json.loads(json.dumps(to_json(pane.conversation)))
    imported = from_json(data)
    versions = imported.messages[1].versions
    assert versions is not None and (versions.current, versions.count) == (1, 2)
    imported.show_version(1, 0)
    original = pane.conversation.messages[1].versions.versions[0]
    assert imported.messages[1].text == original.messages[0].text
    assert imported.kept_ids == []  # no token ids in an export: the next turn renders afresh

    data["conversation"]["messages"][1]["versions"]["count"] = 5
    with pytest.raises(ChatImportError, match="version 2 of 5 is shown but lists 1 others; it must list 4"):
        from_json(data)
