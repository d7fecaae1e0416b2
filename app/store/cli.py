"""`tandem chats ...`: the saved conversations from the command line, for scripts and for
anyone who cannot open the window.

    tandem chats list [--json] [--search TEXT]
    tandem chats export ID --format md|json [-o FILE]
    tandem chats import FILE.json

ID may be any unique start of a conversation's id (`list` shows 8 characters).
`list`'s UPDATED is the time of a conversation's newest message, in local
time, as the Chats sidebar shows it (app.store.chat_store LAST_UPDATE_SQL,
app.store.records local_time_text).
No Qt here, and `list` does not import torch: it reads the store only.
Exit status: 0 done, 1 the store could not be used or the output file is
not a regular file (export never replaces a link, a FIFO or a device), 2 a
wrong argument (unknown or ambiguous id, an import file that is not a chat:
any content gives one line, and nothing is stored).

Titles and texts come from models and from whoever wrote an imported file,
so what reaches a terminal cannot steer it (app.files.terminal_text): `list`
spells out control characters in its table and escapes them in its JSON
(still the same JSON), and `export` does the same when standard output is a
terminal (a file, `-o` or a pipe, gets the text as it is). A conversation
whose time is no date (an older version imported one) is listed with an
unknown date (null in JSON) and a warning on standard error, never a failure.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TextIO

from app.store.chat_store import ChatStore
from app.store.connection import default_path
from app.store.records import ConversationSummary, is_showable_time, local_time_text
from app.errors import AppError
from app.files import terminal_json, terminal_text, write_text_atomically

SHORT_ID = 8
PROG = "tandem chats"


class _UsageError(AppError):
    """A wrong argument (exit status 2)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tandem chats",
        description="List, export and import the conversations Tandem saved.",
        epilog="The store is chats.sqlite3 in Tandem's data folder ($TANDEM_DATA_DIR overrides the folder).",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    listing = commands.add_parser("list", help="the saved conversations, most recent first")
    listing.add_argument(
        "--json", action="store_true", help="print JSON (one object per conversation) instead of a table"
    )
    listing.add_argument("--search", metavar="TEXT", help="only conversations whose title or messages contain TEXT")

    export = commands.add_parser("export", help="write one conversation as Markdown or JSON")
    export.add_argument("id", metavar="ID", help="the conversation's id, or a unique start of it")
    export.add_argument("--format", choices=("md", "json"), default="md", help="md (default) or json")
    export.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of standard output")

    imp = commands.add_parser("import", help="add a conversation from a Tandem JSON export")
    imp.add_argument("file", metavar="FILE.json")
    return parser


def main(argv: list[str] | None = None, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    args = build_parser().parse_args(argv)
    path = default_path()
    try:
        if args.command == "import":
            return _import(path, Path(args.file), out)
        if not path.exists():
            # Reading must not create a store where there was none.
            if args.command == "list":
                print("[]" if args.json else "No saved conversations.", file=out)
                return 0
            raise _UsageError(f"There are no saved conversations yet ({path} does not exist).")
        problems: list[str] = []
        try:
            with ChatStore.open(path, recover=False) as store:
                if args.command == "list":
                    _list(store, args.json, args.search, out, problems)
                else:
                    _export(store, args.id, args.format, args.output, out, problems)
        finally:
            for problem in problems:
                print(f"{PROG}: warning: {terminal_text(problem)}", file=err)
        return 0
    except _UsageError as exc:
        print(f"{PROG}: {terminal_text(str(exc))}", file=err)
        return 2
    except AppError as exc:
        print(f"{PROG}: {terminal_text(str(exc))}", file=err)
        return 1
    except OSError as exc:
        print(terminal_text(f"{PROG}: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")), file=err)
        return 1


def _time_json(value: float) -> float | None:
    # null, not a number JSON cannot hold (inf) or no reader can show (1e12).
    return value if is_showable_time(value) else None


def _summary_json(s: ConversationSummary) -> dict[str, object]:
    return {
        "id": s.id,
        "title": s.title,
        "created_at": _time_json(s.created_at),
        "updated_at": _time_json(s.updated_at),
        "message_count": s.message_count,
        "model_id": s.model_id,
        "preview": s.preview,
    }


def _list(store: ChatStore, as_json: bool, search: str | None, out: TextIO, problems: list[str]) -> None:
    summaries = store.list_conversations(search, problems=problems)
    if as_json:
        out.write(terminal_json(json.dumps([_summary_json(s) for s in summaries], ensure_ascii=False, indent=2)))
        out.write("\n")
        return
    if not summaries:
        print("No conversations match." if search else "No saved conversations.", file=out)
        return
    rows = [
        (terminal_text(s.id[:SHORT_ID]), local_time_text(s.updated_at), str(s.message_count),
         terminal_text(s.title or f"({s.preview[:60] or 'untitled'})"))
        for s in summaries
    ]
    headers = ("ID", "UPDATED", "MESSAGES", "TITLE")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers[:3])]
    for row in (headers, *rows):
        print(f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]:>{widths[2]}}  {row[3]}", file=out)


def _resolve(store: ChatStore, prefix: str) -> str:
    if not prefix:
        raise _UsageError("Give a conversation id (see `tandem chats list`).")
    ids = store.find_ids(prefix)
    if not ids:
        raise _UsageError(f"No saved conversation has an id starting with {prefix!r}. See `tandem chats list`.")
    if len(ids) > 1:
        shown = ", ".join(ids[:5]) + (", ..." if len(ids) > 5 else "")
        raise _UsageError(f"{prefix!r} starts {len(ids)} conversation ids ({shown}); give more of the id.")
    return ids[0]


def _export(
    store: ChatStore, prefix: str, fmt: str, output: str | None, out: TextIO, problems: list[str]
) -> None:
    conversation_id = _resolve(store, prefix)
    from app.store import export as chat_export  # imports torch (through SamplingParams); only now that there is work

    conversation = store.load_conversation(conversation_id, problems=problems)
    if fmt == "json":
        text = json.dumps(chat_export.to_json(conversation), ensure_ascii=False, indent=2) + "\n"
    else:
        text = chat_export.to_markdown(conversation)
    if output is None:
        if _is_terminal(out):
            text = terminal_json(text) if fmt == "json" else _terminal_lines(text)
        out.write(text)
        return
    write_text_atomically(Path(output), text)


def _is_terminal(out: TextIO) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):  # a closed or unusual stream
        return False


def _terminal_lines(text: str) -> str:
    """Markdown for a terminal: controls spelled out, the line breaks and tabs kept (they steer nothing)."""
    return "\n".join("\t".join(terminal_text(part) for part in line.split("\t")) for line in text.split("\n"))


def _import(path: Path, file: Path, out: TextIO) -> int:
    from app.store.export import ChatImportError, read_chat_file

    try:
        # Any content: a conversation or one sentence (app.store.export), nothing stored before.
        conversation = read_chat_file(file)
    except ChatImportError as exc:
        raise _UsageError(str(exc)) from None
    with ChatStore.open(path, recover=False) as store:
        store.save_conversation(conversation)
    # A sentence, not a bare id: what was added, and the id the other commands take.
    short = conversation.id[:SHORT_ID]
    title = f"“{terminal_text(conversation.title)}”" if conversation.title else "an untitled chat"
    count = len(conversation.messages)
    print(f"Imported {title} ({count} message{'' if count == 1 else 's'}) as {short}.", file=out)
    print(f"It is listed in the window's Chats sidebar; print it with: tandem chats export {short}", file=out)
    return 0


__all__ = ["build_parser", "main"]
