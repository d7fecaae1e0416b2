"""View > Compare replies: the word differences of two panes' last replies, highlighted in place."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.workspace.compare import word_diff

if TYPE_CHECKING:
    from ui.window.main_window import MainWindow


class CompareReplies:
    def __init__(self, window: MainWindow) -> None:
        self._window = window

    @property
    def on(self) -> bool:
        action = self._window.menu_actions.get("compare")  # None while the menus are being built
        return action is not None and action.isChecked()

    def set_compare(self, on: bool) -> None:
        window = self._window
        window.compare_bar.setVisible(on)
        if not on:
            self._clear()
            return
        if len(window.panes) < 2:
            window.statusBar().showMessage("Comparing needs two panes; add one with Ctrl+T.", 8000)
        self.refresh()

    def _clear(self) -> None:
        for view in self._window.panes.values():
            for message in view.messages.values():
                message.body.set_highlight(None)

    def refresh(self) -> None:
        """Highlight again (the replies or the chosen panes changed); nothing while comparing is off."""
        if not self.on:
            return
        window = self._window
        self._clear()
        summary = window.compare_bar.summary
        chosen = window.compare_bar.chosen()
        if chosen is None or chosen[0] == chosen[1]:
            summary.setText("Choose two different panes.")
            return
        views = [window.panes.get(pid) for pid in chosen]
        if any(v is None for v in views):
            return
        indices = [v.last_reply_index() for v in views]
        if any(i is None for i in indices):
            summary.setText("Both panes need a reply to compare.")
            return
        texts = [v.pane.conversation.messages[i].text for v, i in zip(views, indices)]
        left, right = word_diff(texts[0], texts[1])
        for view, index, segments in zip(views, indices, (left, right)):
            view.messages[index].body.set_highlight(segments)
        changed = sum(len(s.text.split()) for s in left if s.changed), sum(len(s.text.split()) for s in right if s.changed)
        total = len(texts[0].split()), len(texts[1].split())
        if changed == (0, 0):
            summary.setText("The replies are identical word for word.")
        else:
            summary.setText(
                f"Highlighted: {changed[0]} of {total[0]} words differ on the left, {changed[1]} of {total[1]} on the right."
            )
