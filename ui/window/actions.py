"""The window's menus, declared once as a table of actions.

Each row names its menu, text, shortcuts and the window method it calls (a
dotted path from the window: "files.import_chat" is
`window.files.import_chat`). `build_actions` turns the table into QActions in
one loop, and the Help menu's list of keyboard shortcuts is generated from
the same rows, so a new action and its shortcut are listed the moment they
are declared.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtGui import QAction, QActionGroup, QKeyEvent, QKeySequence
from PySide6.QtWidgets import QApplication, QDockWidget, QMenu, QMenuBar, QWidget

from ui.dialogs.shortcuts import shortcut_text

if TYPE_CHECKING:
    from ui.window.main_window import MainWindow

# The port "Serve loaded models" listens on (127.0.0.1 only), as LM Studio's and vLLM's do.
SERVE_PORT = 8000


@dataclass(frozen=True, slots=True)
class ActionSpec:
    """One menu entry. `menu` is a path of menu titles ("&View/Send &to")."""

    id: str
    text: str
    menu: str
    handler: str = ""  # dotted path from the window; empty for an action a widget provides
    shortcuts: tuple[str, ...] = ()
    args: tuple[Any, ...] = ()  # passed to the handler
    enabled_when: str | None = None  # dotted path of a window predicate, asked again by `refresh_enabled`
    checkable: bool = False  # a checkable action without a group calls handler(checked) when toggled
    checked_when: str | None = None  # dotted path of a predicate taking `args`: the initial check
    group: str | None = None  # exclusive choices (the theme): triggering calls handler(*args)
    tip: str = ""
    needs: str | None = None  # "sidebar": only built when the window has a chats sidebar
    provided: bool = False  # the action is a widget's own (the sidebar dock's show/hide toggle)
    listed: bool = True  # a row of its own in Help > Keyboard shortcuts


@dataclass(frozen=True, slots=True)
class Separator:
    menu: str


Row = ActionSpec | Separator

FILE, EDIT, VIEW, MODELS, HELP = "&File", "&Edit", "&View", "&Models", "&Help"
SEND_TO, THEME = f"{VIEW}/Send &to", f"{VIEW}/T&heme"

ACTIONS: tuple[Row, ...] = (
    ActionSpec("new_pane", "&New pane", FILE, "commands.add_pane", ("Ctrl+T",)),
    ActionSpec("new_chat", "New c&hat in this pane", FILE, "commands.new_chat", ("Ctrl+N",)),
    ActionSpec("close_pane", "&Close pane", FILE, "commands.close_current_pane", ("Ctrl+W",), enabled_when="has_several_panes"),
    Separator(FILE),
    ActionSpec("import_chat", "&Import chat…", FILE, "files.import_chat", ("Ctrl+O",)),
    ActionSpec("export_markdown", "Export chat as &Markdown…", FILE, "files.export_current", ("Ctrl+S",), args=("md",)),
    ActionSpec("export_json", "Export chat as &JSON…", FILE, "files.export_current", ("Ctrl+Shift+S",), args=("json",)),
    ActionSpec("export_comparison", "Export side-by-side c&omparison…", FILE, "files.export_comparison", ("Ctrl+Alt+E",)),
    ActionSpec("export_turn_summary", "Export t&urn summary…", FILE, "compare.export_turn_summary", ("Ctrl+Alt+U",),
               tip="The last broadcast turn's lengths, speeds and shared words, as Markdown or CSV"),
    Separator(FILE),
    ActionSpec("quit", "&Quit", FILE, "close", ("Ctrl+Q",)),
    ActionSpec("send", "&Send", EDIT, "composer.send", ("Ctrl+Return", "Ctrl+Enter")),
    ActionSpec("attach", "&Attach files…", EDIT, "attachments.choose_files", ("Ctrl+Shift+O",),
               tip="Attach documents to the next message (or drop or paste files onto the message box or a pane)"),
    ActionSpec("stop_all", "S&top all replies", EDIT, "stop_all", ("Esc",)),
    ActionSpec("stop_pane", "Stop this &pane's reply", EDIT, "commands.stop_current", ("Ctrl+.",)),
    Separator(EDIT),
    ActionSpec("regenerate", "&Regenerate last reply", EDIT, "commands.regenerate_current", ("Ctrl+R",)),
    ActionSpec("edit_last", "&Edit last message…", EDIT, "commands.edit_current", ("Ctrl+E",)),
    ActionSpec("fork", "&Fork pane at last message", EDIT, "commands.fork_current", ("Ctrl+Shift+F",)),
    ActionSpec("copy_reply", "&Copy last reply", EDIT, "commands.copy_current", ("Ctrl+Shift+C",)),
    ActionSpec("use_in_all_panes", "&Use last reply in all panes", EDIT, "commands.use_current_in_all_panes",
               ("Ctrl+Shift+U",), enabled_when="has_several_panes",
               tip="This pane's last reply becomes every other pane's answer; theirs stay as earlier versions"),
    ActionSpec("sweep", "S&weep this pane…", EDIT, "sweeps.open_current", ("Ctrl+Shift+P",),
               tip="One new pane per value of a setting, each a fork of this conversation"),
    Separator(EDIT),
    ActionSpec("pane_settings", "Pane se&ttings…", EDIT, "commands.open_current_settings", ("Ctrl+,",)),
    ActionSpec("focus_message", "Focus the &message box", EDIT, "composer.edit.setFocus", ("Ctrl+L",)),
    Separator(EDIT),
    ActionSpec("preferences", "Pr&eferences…", EDIT, "preferences.open", ("Ctrl+Alt+S",)),
    ActionSpec("compare", "&Compare replies", VIEW, "compare.set_compare", ("Ctrl+D",), checkable=True),
    ActionSpec("turn_summary", "T&urn summary…", VIEW, "compare.show_turn_summary", ("Ctrl+Shift+D",),
               tip="Each pane's reply length, tok/s, time to first token and words shared, for the last turn"),
    ActionSpec("arena", "Arena (&blind vote)", VIEW, "arena.set_arena", ("Ctrl+Shift+A",), checkable=True,
               tip="Hide the panes' models behind labels A, B, … and vote on each turn"),
    ActionSpec("arena_vote", "&Vote in the arena", VIEW, "arena.focus_vote", ("Ctrl+Shift+V",),
               tip="Go to the vote buttons; then 1, 2, … choose"),
    ActionSpec("arena_leaderboard", "Arena lea&derboard…", VIEW, "arena.open_leaderboard", ("Ctrl+Shift+B",)),
    ActionSpec("chats_sidebar", "C&hats sidebar", VIEW, shortcuts=("Ctrl+B",), needs="sidebar", provided=True),
    ActionSpec("search_chats", "&Search chats", VIEW, "chats.search", ("Ctrl+K",), needs="sidebar"),
    Separator(VIEW),
    ActionSpec("move_left", "Move pane &left", VIEW, "commands.move_current", ("Ctrl+Shift+PgUp",), args=(-1,)),
    ActionSpec("move_right", "Move pane &right", VIEW, "commands.move_current", ("Ctrl+Shift+PgDown",), args=(+1,)),
    ActionSpec("previous_pane", "&Previous pane", VIEW, "commands.focus_neighbour", ("Ctrl+PgUp",), args=(-1,)),
    ActionSpec("next_pane", "&Next pane", VIEW, "commands.focus_neighbour", ("Ctrl+PgDown",), args=(+1,)),
    *(
        ActionSpec(f"toggle_target_{n}", f"Toggle pane {n}", SEND_TO, "composer.toggle_target", (f"Alt+{n}",),
                   args=(n - 1,), listed=False)  # one row for all nine: EXTRA_SHORTCUT_ROWS
        for n in range(1, 10)
    ),
    ActionSpec("target_all", "Target all panes", SEND_TO, "commands.target_all", ("Alt+0",)),
    Separator(VIEW),
    # Ctrl+= is where "+" is without Shift on most layouts; Ctrl++ (keypad, or with Shift) does the same.
    ActionSpec("zoom_in", "Zoom &in", VIEW, "preferences.zoom_in", ("Ctrl+=", "Ctrl++"),
               tip="Larger conversation text"),
    ActionSpec("zoom_out", "Zoom &out", VIEW, "preferences.zoom_out", ("Ctrl+-",), tip="Smaller conversation text"),
    ActionSpec("zoom_reset", "&Actual size", VIEW, "preferences.reset_zoom", ("Ctrl+0",),
               tip="The conversation text at its normal size"),
    *(
        ActionSpec(f"theme_{name}", name.capitalize(), THEME, "preferences.set_theme", args=(name,), checkable=True,
                   checked_when="preferences.uses_theme", group="theme")
        for name in ("system", "light", "dark")
    ),
    ActionSpec("manage_models", "&Manage models…", MODELS, "models.open_manager", ("Ctrl+M",)),
    ActionSpec("load_pane_model", "&Load this pane's model", MODELS, "models.load_current_pane_model", ("Ctrl+Shift+L",)),
    ActionSpec("unload_idle", "&Unload idle models", MODELS, "models.unload_idle"),
    Separator(MODELS),
    ActionSpec("server_panel", "Ser&ve…", MODELS, "server_control.open_panel", tip="The API server: port, key, URL, log"),
    ActionSpec("serve", "&Serve loaded models (OpenAI API)", MODELS, "server_control.set_serving", ("Ctrl+Alt+A",), checkable=True,
               tip=f"Let other programs use the loaded models at http://127.0.0.1:{SERVE_PORT}/v1"),
    ActionSpec("shortcuts", "&Keyboard shortcuts", HELP, "show_shortcuts", ("F1",)),
    ActionSpec("about", "&About Tandem", HELP, "show_about"),
)

# Shortcuts that are not menu actions (or are folded into one row), listed after the table's.
EXTRA_SHORTCUT_ROWS: tuple[tuple[str, str], ...] = (
    ("Toggle pane 1…9 as a target", f"{shortcut_text('Alt+1')} … {shortcut_text('Alt+9')}"),
    ("New line in the message box", shortcut_text("Return")),
    # One scheme for any number of arena panes N: 1..N the winner, N+1 a tie, N+2 all bad.
    ("Arena vote (arena bar focused): A, B, … better, then tie, then all bad", "1 … N, N+1, N+2 (two panes: 1, 2, 3, 4)"),
)


# What Qt's text boxes (QLineEdit, QPlainTextEdit, QTextEdit) do with a key on
# Linux (Qt's X11 key-binding table; the offscreen test platform uses another
# scheme, so the table is written out here rather than asked of the platform).
TEXT_BOX_KEYS: dict[str, str] = {
    "Ctrl+A": "select all", "Ctrl+C": "copy", "Ctrl+Insert": "copy", "Ctrl+V": "paste", "Shift+Insert": "paste",
    "Ctrl+X": "cut", "Shift+Delete": "cut", "Ctrl+Z": "undo", "Alt+Backspace": "undo", "Ctrl+Y": "redo",
    "Ctrl+Shift+Z": "redo", "Alt+Shift+Backspace": "redo",
    "Ctrl+K": "delete to the end of the line", "Ctrl+U": "delete the whole line",
    "Ctrl+Backspace": "delete the word before the cursor", "Ctrl+Delete": "delete the word after the cursor",
    "Ctrl+E": "go to the end of the line (one-line boxes)",
    "Ctrl+Left": "previous word", "Ctrl+Right": "next word", "Ctrl+Shift+Left": "select the previous word",
    "Ctrl+Shift+Right": "select the next word", "Ctrl+Home": "start of the text", "Ctrl+End": "end of the text",
    "Ctrl+Shift+Home": "select to the start", "Ctrl+Shift+End": "select to the end",
    "Home": "start of the line", "End": "end of the line", "Shift+Home": "select to the line's start",
    "Shift+End": "select to the line's end", "PgUp": "page up", "PgDown": "page down",
    "Ctrl+Up": "scroll up", "Ctrl+Down": "scroll down", "Shift+Return": "line break", "Return": "new line",
    "Tab": "next field", "Shift+Tab": "previous field",
}

# The window's shortcuts that a text box would otherwise take, each decided:
# the window wins (WindowShortcuts), because the menu promises the key and what
# the text box would do costs the user the draft or is at hand another way.
WINDOW_WINS: dict[str, str] = {
    "Ctrl+K": "Search chats; the draft stays whole (Shift+End, Delete removes to the line's end)",
    "Ctrl+E": "Edit last message; End goes to the end of the line",
}


def text_box_clashes(rows: tuple[Row, ...] = ACTIONS) -> dict[str, str]:
    """{shortcut: action id} for every action key that a text box binds too."""
    bound = {QKeySequence(key).toString(QKeySequence.SequenceFormat.PortableText) for key in TEXT_BOX_KEYS}
    clashes: dict[str, str] = {}
    for row in rows:
        if isinstance(row, ActionSpec):
            for key in row.shortcuts:
                if QKeySequence(key).toString(QKeySequence.SequenceFormat.PortableText) in bound:
                    clashes[key] = row.id
    return clashes


class WindowShortcuts(QObject):
    """Lets the window's shortcuts win over a text box's own binding of the
    same key (Ctrl+K: "delete to the end of the line" in every Qt text box on
    Linux, which erased the draft while Search chats never got the key).

    A text box claims a key by accepting the ShortcutOverride event Qt sends
    it first; this filter answers that event for the box when an enabled
    action of the window has the key, so the key goes to the action and the
    box never sees it. It sits on whichever widget of the window has focus,
    installed (again, so it acts first) as focus arrives."""

    def __init__(self, window: QWidget, actions: dict[str, QAction]) -> None:
        super().__init__(window)
        self._window = window
        self._actions = actions
        app = QApplication.instance()
        if isinstance(app, QApplication):
            app.focusChanged.connect(self._focus_changed)
            self._focus_changed(None, app.focusWidget())

    def _in_window(self, widget: QWidget) -> bool:
        top = widget.window()
        # A floating dock (the chats sidebar) still takes the window's shortcuts, as Qt decides them.
        while isinstance(top, QDockWidget) and top.parentWidget() is not None:
            top = top.parentWidget().window()
        return top is self._window

    def _focus_changed(self, old: QWidget | None, new: QWidget | None) -> None:
        if old is not None:
            old.removeEventFilter(self)  # a filter costs a call per event: only on the focused widget
        if new is not None and self._in_window(new):
            new.installEventFilter(self)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802
        if event.type() == QEvent.Type.ShortcutOverride and isinstance(event, QKeyEvent) and self.owns(event):
            event.ignore()  # not the box's: Qt then tries the window's shortcuts
            return True
        return False

    def owns(self, event: QKeyEvent) -> bool:
        """Whether an enabled window action has this key as one of its shortcuts."""
        pressed = QKeySequence(event.keyCombination())
        return any(
            action.isEnabled() and shortcut.matches(pressed) == QKeySequence.SequenceMatch.ExactMatch
            for action in self._actions.values()
            for shortcut in action.shortcuts()
        )


def _resolve(window: MainWindow, path: str) -> Callable[..., Any]:
    return operator.attrgetter(path)(window)


def build_actions(
    window: MainWindow,
    menu_bar: QMenuBar,
    *,
    features: frozenset[str] = frozenset(),
    provided: dict[str, QAction] | None = None,
    rows: tuple[Row, ...] = ACTIONS,
) -> dict[str, QAction]:
    """Build the menus and their QActions from `rows`; returns them by id.

    `features` are what the window has ("sidebar"): a row that needs one it
    lacks is left out. `provided` holds the actions a widget makes itself
    (a dock's toggle); the row then sets their text and shortcut. Every
    action is also added to the window, so its shortcut works while the menu
    bar is hidden.
    """
    provided = provided or {}
    menus: dict[str, QMenu] = {}
    groups: dict[str, QActionGroup] = {}
    built: dict[str, QAction] = {}

    def menu_for(path: str) -> QMenu:
        if path not in menus:
            parent, _, title = path.rpartition("/")
            menus[path] = menu_for(parent).addMenu(title) if parent else menu_bar.addMenu(title)
        return menus[path]

    for row in rows:
        if isinstance(row, Separator):
            menu_for(row.menu).addSeparator()
            continue
        if row.needs is not None and row.needs not in features:
            continue
        action = provided[row.id] if row.provided else QAction(row.text, window)
        action.setText(row.text)
        if row.shortcuts:
            action.setShortcuts([QKeySequence(keys) for keys in row.shortcuts])
        action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        if row.tip:
            action.setStatusTip(row.tip)
        if row.checkable:
            action.setCheckable(True)
        if row.checked_when is not None:
            action.setChecked(bool(_resolve(window, row.checked_when)(*row.args)))
        if row.group is not None:
            groups.setdefault(row.group, QActionGroup(window)).addAction(action)
        if row.handler:
            handler = _resolve(window, row.handler)
            if row.checkable and row.group is None:
                action.toggled.connect(handler)
            else:
                action.triggered.connect(lambda _checked=False, handler=handler, args=row.args: handler(*args))
        menu_for(row.menu).addAction(action)
        window.addAction(action)
        built[row.id] = action
    refresh_enabled(window, built, rows)
    return built


def refresh_enabled(window: MainWindow, built: dict[str, QAction], rows: tuple[Row, ...] = ACTIONS) -> None:
    """Enable each action whose row has `enabled_when` as its predicate says now."""
    for row in rows:
        if isinstance(row, ActionSpec) and row.enabled_when is not None and row.id in built:
            built[row.id].setEnabled(bool(_resolve(window, row.enabled_when)()))


def shortcut_rows(built: dict[str, QAction], rows: tuple[Row, ...] = ACTIONS) -> list[tuple[str, str]]:
    """(action, keys) for every built action with a shortcut, in menu order, as Help lists them."""
    listed = []
    for row in rows:
        if not isinstance(row, ActionSpec) or not row.listed or row.id not in built:
            continue
        action = built[row.id]
        keys = [s.toString(QKeySequence.SequenceFormat.NativeText) for s in action.shortcuts()]
        if keys:
            listed.append((action.text().replace("&", "").rstrip("…"), ", ".join(keys)))
    listed.extend(EXTRA_SHORTCUT_ROWS)
    return listed
