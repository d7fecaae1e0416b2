"""Chats to and from files: export the current chat (Markdown or JSON) or a
side-by-side comparison of every pane, import a chat exported as JSON."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

from app.files import write_text_atomically

if TYPE_CHECKING:
    from ui.window.main_window import MainWindow


class ChatFiles:
    def __init__(self, window: MainWindow) -> None:
        self._window = window

    def _save_path(self, caption: str, name: str, filters: str) -> str | None:
        from PySide6.QtWidgets import QFileDialog

        path, _ = QFileDialog.getSaveFileName(self._window, caption, str(Path.home() / name), filters)
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
                text = to_markdown(conversation)
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
            return self._save_text(Path(path), comparison_markdown(panes))
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

            path, _ = QFileDialog.getOpenFileName(window, "Import chat", str(Path.home()), "Tandem chat (*.json)")
            if not path:
                return
        try:
            pane = window.workspace.open_conversation(read_chat_file(path), after=window.current_pane_id)
        except Exception as exc:
            window.report_error("Importing", exc)
            return
        window.set_current_pane(pane.id)
        window.apply_engine_state(window.workspace.pane_model_state(pane.id), None, None)


def file_stem(title: str) -> str:
    """A file name from a chat's title: letters, digits, '-' and '_', at most 60 characters."""
    stem = re.sub(r"[^\w\- ]+", "", title).strip().replace(" ", "-")[:60]
    return stem or "chat"
