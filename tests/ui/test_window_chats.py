"""The window over a real chat store and model registry: saved chats in the
sidebar, reopened in panes, exported and imported; a pane switched to
another model by its header's picker; a store that stops accepting writes."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

from tests.ui.conftest import on_loop, wait_until


def _make(tmp_path: Path, engine_dir: Path, *, registry: Any = None, panes: int = 2) -> Any:
    from app.store.session import ChatSession
    from app.settings import Settings
    from app.workspace.workspace import Workspace
    from engine.params import SamplingParams
    from ui.window.main_window import MainWindow

    settings = Settings(model=str(engine_dir), device="cpu", dtype="float32", threads=1, kv_cache_mb=16)
    settings.default_params = SamplingParams(temperature=0.0, max_tokens=12)
    resolve = options = None
    if registry is not None:
        from ui.main import _model_resolver

        resolve, options = _model_resolver(registry), registry.engine_options  # as ui/main.py wires them
    workspace = Workspace(settings, resolve_model=resolve, model_options=options)
    session = ChatSession.open(tmp_path / "chats.sqlite3")
    session.restore(workspace, default_panes=panes)
    window = MainWindow(workspace, settings, version="test", save_settings=False, session=session, registry=registry)
    window.resize(1400, 800)
    window.show()
    return window


async def _close(window: Any) -> None:
    closed = asyncio.Event()
    window.closed.connect(closed.set)
    window.close()
    await asyncio.wait_for(closed.wait(), 30)


async def _send(window: Any, text: str, targets: list[int] | None = None) -> None:
    ws = window.workspace
    before = sum(len(p.conversation.messages) for p in ws.panes)
    window.composer.edit.setPlainText(text)
    if targets is not None:
        window.composer.set_targets(targets)
    window.composer.send()
    await wait_until(lambda: sum(len(p.conversation.messages) for p in ws.panes) > before, what="the send")
    await wait_until(lambda: not any(p.busy for p in ws.panes), what="the replies")


@on_loop()
async def test_chats_are_listed_reopened_exported_and_imported(loop: Any, tiny_model_dir: Path, tmp_path: Path) -> None:
    window = _make(tmp_path, tiny_model_dir)
    try:
        window.load_engine()
        await wait_until(lambda: window.workspace.engine_state == "ready", what="the model")
        first, second = window.workspace.panes
        await _send(window, "Plan a trip to Lisbon", [first.id])
        await _send(window, "Regex for ISO dates", [second.id])
        # The sidebar follows by itself once the writes are in, newest first,
        # each chat titled from its first message.
        await wait_until(lambda: [s.title for s in window.sidebar.summaries()]
                         == ["Regex for ISO dates", "Plan a trip to Lisbon"], what="the sidebar to list both chats")

        # Closing a pane keeps its chat; the sidebar opens it again in a pane.
        conversation_id = first.conversation.id
        window.close_pane(first.id)
        assert first.id not in window.panes
        window.session.writer.flush(10)
        window.sidebar.refresh()
        assert conversation_id in [s.id for s in window.sidebar.summaries()]
        window.sidebar.open_requested.emit(conversation_id)
        reopened = window.current_view().pane
        assert reopened.conversation.id == conversation_id
        assert [m.role for m in reopened.conversation.messages] == ["user", "assistant"]
        assert reopened.conversation.messages[1].text == first.conversation.messages[1].text

        # Search finds a chat by the text of a message.
        window.sidebar.search.setText("lisbon")
        await wait_until(lambda: [s.id for s in window.sidebar.summaries()] == [conversation_id], what="the search")

        # Export as Markdown and JSON; the JSON imports into a new pane that equals the original.
        window.set_current_pane(reopened.id)
        md = window.export_current("md", str(tmp_path / "trip.md"))
        js = window.export_current("json", str(tmp_path / "trip.json"))
        assert md is not None and "Plan a trip to Lisbon" in md.read_text()
        data = json.loads(js.read_text())
        assert [m["text"] for m in data["conversation"]["messages"]] == [m.text for m in reopened.conversation.messages]
        comparison = window.export_comparison(str(tmp_path / "all.md"))
        assert comparison is not None and "Regex for ISO dates" in comparison.read_text()
        panes_before = len(window.workspace.panes)
        window.import_chat(str(js))
        assert len(window.workspace.panes) == panes_before + 1
        imported = window.current_view().pane.conversation
        assert imported.id != conversation_id
        assert [(m.role, m.text) for m in imported.messages] == [(m.role, m.text) for m in reopened.conversation.messages]

        # A file that is not a chat: a clear message, and the app goes on.
        bad = tmp_path / "bad.json"
        bad.write_text("{not json")
        window.import_chat(str(bad))
        assert "not a Tandem chat" in window.composer.notice.text()
        assert len(window.workspace.panes) == panes_before + 1

        # Rename and delete from the sidebar: written by the store's thread,
        # then shown; the open pane follows.
        window.sidebar.search.setText("")
        window.sidebar.rename(second.conversation.id, "ISO 8601 regex")
        assert second.conversation.title == "ISO 8601 regex"
        await wait_until(lambda: "ISO 8601 regex" in [s.title for s in window.sidebar.summaries()], what="the rename")
        deleted_id = second.conversation.id
        position = window.pane_order().index(second.id)
        panes_before = len(window.workspace.panes)
        window.sidebar.delete(deleted_id)
        await wait_until(lambda: "ISO 8601 regex" not in [s.title for s in window.sidebar.summaries()],
                         what="the delete")
        assert second.id not in window.panes  # a deleted chat leaves its pane
        window.sidebar.undo_delete()
        await wait_until(lambda: "ISO 8601 regex" in [s.title for s in window.sidebar.summaries()], what="the undo")
        # Undo brings the pane back too, where it was, with its conversation.
        back = [v for v in window.panes.values() if v.pane.conversation.id == deleted_id]
        assert len(back) == 1 and back[0].pane.conversation is second.conversation
        assert window.pane_order().index(back[0].pane_id) == position
        assert len(window.workspace.panes) == panes_before
        assert [w.pane.title for w in map(window.panes.get, window.pane_order())] == [
            f"Pane {n}" for n in range(1, panes_before + 1)
        ]
    finally:
        await _close(window)


@on_loop()
async def test_a_store_that_refuses_writes_is_reported_and_nothing_is_lost(loop: Any, tiny_model_dir: Path, tmp_path: Path) -> None:
    window = _make(tmp_path, tiny_model_dir, panes=1)
    try:
        window.load_engine()
        await wait_until(lambda: window.workspace.engine_state == "ready", what="the model")
        # SQLite's own "database or disk is full": the writer's connection may not grow the file.
        window.session.writer.submit(lambda store: store._conn.execute("PRAGMA max_page_count = 1"))
        window.session.writer.flush(10)
        await _send(window, "A message while the disk is full " + "x" * 5000)
        await wait_until(lambda: window.store_banner.isVisible(), what="the store's error to show")
        assert "full" in window.store_banner.text() and "Export" in window.store_banner.text()
        pane = window.workspace.panes[0]
        assert [m.role for m in pane.conversation.messages] == ["user", "assistant"]
        path = window.export_current("md", str(tmp_path / "rescued.md"))  # the chat can still be saved elsewhere
        assert path is not None and "A message while the disk is full" in path.read_text()
    finally:
        await _close(window)


@on_loop()
async def test_the_header_picker_moves_a_pane_to_another_model(loop: Any, tiny_model_dir: Path, tmp_path: Path) -> None:
    from app.models.registry import ModelRegistry

    other_dir = tmp_path / "other-tiny"
    shutil.copytree(tiny_model_dir, other_dir)
    registry = ModelRegistry(tmp_path / "models.json")
    other = registry.add_folder(other_dir)
    window = _make(tmp_path, tiny_model_dir, registry=registry)
    try:
        window.load_engine()
        ws = window.workspace
        await wait_until(lambda: ws.engine_state == "ready", what="the model")
        first, second = ws.panes
        view = window.panes[second.id]
        assert view.model_picker.isVisible()
        assert view.model_picker.findData(other.id) >= 0
        view.model_picker.setCurrentIndex(view.model_picker.findData(other.id))
        view.model_picker.activated.emit(view.model_picker.currentIndex())  # as a user's pick does
        assert second.conversation.model_id == other.id
        await wait_until(lambda: ws.model_state(other.id) == "ready", what="the second model")
        assert ws.engine_for(other.id) is not ws.engine_for(str(tiny_model_dir))
        await _send(window, "Hello, both")
        assert all(p.conversation.messages[-1].state == "complete" for p in (first, second))
        assert second.conversation.messages[-1].model_id == other.id
    finally:
        await _close(window)


@on_loop()
async def test_the_window_serves_its_models_and_a_remote_pane_needs_no_local_model(
    loop: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    import httpx

    from engine.entrypoints.openai.models import served_model_id

    server_window = _make(tmp_path / "a", tiny_model_dir, panes=1)
    (tmp_path / "b").mkdir()
    client_window = _make(tmp_path / "b", tiny_model_dir / "never-loaded", panes=1)
    try:
        server_window.load_engine()
        await wait_until(lambda: server_window.workspace.engine_state == "ready", what="the model")
        server_window.serve_port = 0  # any free port: 8000 may be taken on a test machine
        server_window.serve_action.setChecked(True)
        assert server_window.server is not None and server_window.server.running
        url = server_window.server.url
        async with httpx.AsyncClient() as http:
            models = (await http.get(f"{url}/models")).json()
        # Served under the name the window shows, as a slug.
        shown = server_window.models.name(str(tiny_model_dir))
        assert [m["id"] for m in models["data"]] == [served_model_id(shown)]

        # A window whose own model never loaded: its remote pane can still send.
        client = client_window.workspace
        (pane,) = client.panes
        assert not client_window.composer.send_button.isEnabled()
        # The name as the other window shows it is accepted too (GET /v1/models/{name}).
        await client.set_remote(pane.id, url, shown)
        assert client_window.composer.send_button.isEnabled()
        await _send(client_window, "Hello over loopback")
        reply = pane.conversation.messages[-1]
        assert reply.state == "complete" and reply.text

        server_window.serve_action.setChecked(False)
        await wait_until(lambda: server_window.server is None, what="the server to stop")
    finally:
        await _close(client_window)
        await _close(server_window)


@on_loop()
async def test_a_damaged_chat_store_is_kept_aside_and_the_app_starts(loop: Any, tiny_model_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "chats.sqlite3").write_bytes(b"this is not a database" * 100)
    window = _make(tmp_path, tiny_model_dir, panes=1)
    try:
        assert window.store_banner.isVisible()
        assert "kept aside" in window.store_banner.text()
        assert list(tmp_path.glob("chats.sqlite3.corrupt-*"))
        assert window.workspace.panes  # a fresh start: a new, empty store and a pane to type in
    finally:
        await _close(window)


@on_loop()
async def test_a_models_context_cap_shows_in_the_panes_meter_once_loaded(
    loop: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from app.models.registry import ModelRegistry

    capped_dir = tmp_path / "capped-tiny"
    shutil.copytree(tiny_model_dir, capped_dir)
    registry = ModelRegistry(tmp_path / "models.json")
    capped = registry.add_folder(capped_dir)
    registry.set_max_context(capped.id, 256)  # what the model details' "Context length" field saves
    window = _make(tmp_path, tiny_model_dir, registry=registry, panes=2)
    try:
        window.load_engine()
        ws = window.workspace
        await wait_until(lambda: ws.engine_state == "ready", what="the model")
        first, second = ws.panes
        assert window.panes[first.id].context_meter.format().endswith("/ 2.0k tokens")  # the trained 2,048
        window.models.choose(second.id, capped.id)
        await wait_until(lambda: ws.model_state(capped.id) == "ready", what="the capped model")
        assert ws.engine_for(capped.id).max_context == 256
        meter = window.panes[second.id].context_meter
        assert meter.format().endswith("/ 256 tokens") and meter.maximum() == 256
        # The smaller context gives a smaller KV pool.
        assert ws.stats(capped.id).pages_total < ws.stats(str(tiny_model_dir)).pages_total
    finally:
        await _close(window)


@on_loop()
async def test_undo_of_deleting_the_last_panes_chat_brings_its_pane_back(
    loop: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    window = _make(tmp_path, tiny_model_dir, panes=1)
    try:
        window.load_engine()
        await wait_until(lambda: window.workspace.engine_state == "ready", what="the model")
        (pane,) = window.workspace.panes
        await _send(window, "Plan a trip to Lisbon", [pane.id])
        conversation = pane.conversation
        await wait_until(lambda: [s.id for s in window.sidebar.summaries()] == [conversation.id], what="the sidebar")
        window.sidebar.delete(conversation.id)
        # The last pane's chat is gone: a new empty chat stands in for it.
        (stand_in,) = window.workspace.panes
        assert stand_in is not pane and not stand_in.conversation.messages
        window.sidebar.undo_delete()
        (back,) = window.workspace.panes  # the stand-in, still empty, made way
        assert back.conversation is conversation and back.title == "Pane 1"
        assert window.current_pane_id == back.id
        assert window.panes[back.id].messages[1].body.markdown() == conversation.messages[1].text
    finally:
        await _close(window)
