"""Chats to and from files: export the current chat (Markdown or JSON) or a
side-by-side comparison of every pane, import a chat exported as JSON."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING

from app.files import write_text_atomically
from ui.widgets.file_folders import remember, start_folder, start_path

if TYPE_CHECKING:
    from ui.panes.pane_view import PaneView
    from ui.window.main_window import MainWindow

log = logging.getLogger(__name__)


class ChatFiles:
    def __init__(self, window: MainWindow) -> None:
        self._window = window

    def _save_path(self, caption: str, name: str, filters: str) -> str | None:
        from PySide6.QtWidgets import QFileDialog

        path, _ = QFileDialog.getSaveFileName(self._window, caption, start_path(name), filters)
        if path:
            remember(path)
        return path or None

    def export_current(self, fmt: str, path: str | None = None) -> Path | None:
        """Save the current pane's chat as Markdown ("md") or JSON ("json"); returns the file written."""
        from app.store.export import to_json, to_markdown

        view = self._window.current_view()
        if view is None:
            return None
        conversation = view.pane.conversation
        stem = file_stem(conversation.title or view.pane.title)
        if path is None:
            filters = "Markdown (*.md)" if fmt == "md" else "JSON (*.json)"
            path = self._save_path("Export chat", f"{stem}.{fmt}", filters)
            if path is None:
                return None
        try:
            if fmt == "md":
                text = to_markdown(conversation, self._window.models.name)
            else:
                text = json.dumps(to_json(conversation), indent=2, ensure_ascii=False) + "\n"
            return self._save_text(Path(path), text)
        except Exception as exc:
            self._window.report_error("Exporting the chat", exc)
            return None

    def export_comparison(self, path: str | None = None) -> Path | None:
        """Save every open pane's chat side by side as one Markdown file."""
        from app.store.export import comparison_markdown

        window = self._window
        panes = [(window.panes[pid].pane.title, window.panes[pid].pane.conversation) for pid in window.pane_order()]
        if path is None:
            path = self._save_path("Export comparison", "comparison.md", "Markdown (*.md)")
            if path is None:
                return None
        try:
            return self._save_text(Path(path), comparison_markdown(panes, window.models.name))
        except Exception as exc:
            window.report_error("Exporting the comparison", exc)
            return None

    def _save_text(self, path: Path, text: str) -> Path:
        try:
            write_text_atomically(path, text)
        except OSError as exc:
            raise OSError(f"{path} could not be written: {exc.strerror or exc}") from None
        self._window.statusBar().showMessage(f"Saved {path}", 10000)
        return path

    def import_chat(self, path: str | None = None) -> None:
        """Open a chat exported as Tandem JSON in a new pane (and save it)."""
        from app.store.export import read_chat_file

        window = self._window
        if path is None:
            from PySide6.QtWidgets import QFileDialog

            path, _ = QFileDialog.getOpenFileName(window, "Import chat", str(start_folder()), "Tandem chat (*.json)")
            if not path:
                return
            remember(path)
        try:
            pane = window.workspace.open_conversation(read_chat_file(path), after=window.current_pane_id)
        except Exception as exc:
            window.report_error("Importing", exc)
            return
        view = window.panes.get(pane.id)
        if view is not None:
            count_tokens_of_text(window, view)
        window.set_current_pane(pane.id)
        window.apply_engine_state(window.workspace.pane_model_state(pane.id), None, None)
        # The store has the chat once its save is in: list it then, as a reply would.
        window.chats.changed()


def count_tokens_of_text(window: MainWindow, view: PaneView) -> None:
    """Let the pane's context meter count a chat that has no kept ids (an
    import holds text only until its next turn): its text through the model's
    tokenizer, once per length, and only while the model is loaded."""
    counts: dict[tuple[str, int, str], int] = {}

    def count() -> int | None:
        conversation = view.pane.conversation
        engine = window.workspace.engine_for(conversation.model_id)
        if engine is None:
            return None
        key = (conversation.model_id, len(conversation.messages), conversation.system_prompt)
        if key not in counts:
            try:
                ids = engine.tokenizer.encode_chat(conversation.chat_messages(), add_generation_prompt=False)
            except Exception:  # a template that refuses this chat: the meter says 0, as before
                log.debug("counting an imported chat's tokens", exc_info=True)
                return None
            counts[key] = len(ids)
        return counts[key]

    view.count_text_tokens = count
    view.refresh_context()


def file_stem(title: str) -> str:
    """A file name from a chat's title: letters, digits, '-' and '_', at most 60 characters."""
    stem = re.sub(r"[^\w\- ]+", "", title).strip().replace(" ", "-")[:60]
    return stem or "chat"
