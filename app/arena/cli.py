"""`tandem arena ...`: the blind arena's leaderboard and votes from the command line.

    tandem arena list [--json] [--rounds N] [--seed S]
    tandem arena export [--format csv|json] [--votes] [-o FILE] [--rounds N] [--seed S]

The leaderboard rates each model-and-settings that took part in a vote with
a Bradley–Terry rating and a bootstrap 95% interval (app.arena.ratings).
Votes are read from the chat store (chats.sqlite3 in Tandem's data folder;
$TANDEM_DATA_DIR overrides the folder); a vote that cannot be read is left
out with a warning on standard error. No Qt and no torch here.
Exit status: 0 done, 1 the store could not be used or the output file is
not a regular file (export never replaces a link, a FIFO or a device), 2 a
wrong argument.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

from app.arena.export import leaderboard_csv, leaderboard_json, votes_json
from app.arena.leaderboard import LeaderboardRow, count_text, interval_text, leaderboard
from app.arena.votes import ArenaVote
from app.errors import AppError
from app.files import terminal_json, terminal_text, write_text_atomically
from app.store.chat_store import ChatStore
from app.store.connection import default_path

PROG = "tandem arena"
# More rounds only narrow the intervals' own noise; this many takes minutes.
MAX_ROUNDS = 100_000


class _UsageError(AppError):
    """A wrong argument (exit status 2)."""


def _rounds(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_ROUNDS:
        raise argparse.ArgumentTypeError(f"expected a whole number from 1 to {MAX_ROUNDS}, got {text!r}")
    return value


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number, 0 or more, got {text!r}")
    return value


def _add_rating_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=_rounds, default=1000, metavar="N",
                        help="bootstrap resamplings of the votes behind each 95%% interval (default: 1000)")
    parser.add_argument("--seed", type=_seed, default=0, metavar="S",
                        help="the bootstrap's random seed: the same votes and seed give the same intervals "
                        "(default: 0)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="The blind arena's leaderboard: every model-and-settings that took part in a vote, "
        "with its votes, wins, losses, ties, 'all bad' votes, win rate, and a Bradley-Terry rating "
        "(Elo scale, mean 1000) with a bootstrap 95% interval, computed as the LMSYS Chatbot Arena "
        "computes its leaderboard. Vote in the window: View > Arena.",
        epilog="Votes are kept in chats.sqlite3 in Tandem's data folder ($TANDEM_DATA_DIR overrides the folder). "
        "Exit status: 0 done, 1 the store or the output file could not be used, 2 a wrong argument.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    listing = commands.add_parser(
        "list", help="print the leaderboard, best first",
        description="Print the leaderboard, best rating first: rank, rating, 95% interval, votes, "
        "wins/losses/ties/all-bad, win rate, and the model with the settings that differ from the defaults.",
    )
    listing.add_argument("--json", action="store_true", help="print JSON (one object per contender) instead of a table")
    _add_rating_options(listing)

    export = commands.add_parser(
        "export", help="write the leaderboard (or every vote) as CSV or JSON",
        description="Write the leaderboard as CSV or JSON, or with --votes every vote as JSON: its prompt, "
        "outcome, and each side's label, model, settings and reply.",
    )
    export.add_argument("--format", choices=("csv", "json"), default="csv", help="csv (default) or json")
    export.add_argument("--votes", action="store_true",
                        help="every vote instead of the leaderboard (JSON only: a vote holds several replies)")
    export.add_argument("-o", "--output", metavar="FILE",
                        help="write to FILE (replaced whole, never through a link) instead of standard output")
    _add_rating_options(export)
    return parser


def main(argv: list[str] | None = None, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    args = build_parser().parse_args(argv)
    try:
        if args.command == "export" and args.votes and args.format != "json":
            raise _UsageError("--votes is written as JSON only (--format json): a vote holds several replies.")
        problems: list[str] = []
        votes = _read_votes(default_path(), problems)
        for problem in problems:
            print(f"{PROG}: warning: {problem}", file=err)
        if args.command == "list":
            _list(votes, args, out)
        else:
            _export(votes, args, out)
        return 0
    except _UsageError as exc:
        print(f"{PROG}: {exc}", file=err)
        return 2
    except AppError as exc:
        print(f"{PROG}: {exc}", file=err)
        return 1
    except OSError as exc:
        print(f"{PROG}: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), file=err)
        return 1


def _read_votes(path: Path, problems: list[str]) -> list[ArenaVote]:
    if not path.exists():  # reading must not create a store where there was none
        return []
    with ChatStore.open(path, recover=False) as store:
        return store.arena_votes(problems=problems)


def _list(votes: list[ArenaVote], args: argparse.Namespace, out: TextIO) -> None:
    rows = leaderboard(votes, rounds=args.rounds, seed=args.seed)
    if args.json:
        out.write(terminal_json(leaderboard_json(rows)))
        return
    if not rows:
        print("No arena votes yet: vote in the window (View > Arena).", file=out)
        return
    out.write(leaderboard_table(rows))
    print(f"\n{count_text(len(votes), 'vote')}; 95% intervals from {args.rounds} bootstrap rounds (seed {args.seed}).", file=out)


def leaderboard_table(rows: list[LeaderboardRow]) -> str:
    """The leaderboard as aligned columns for a terminal."""
    headers = ("RANK", "RATING", "95% INTERVAL", "VOTES", "W/L/T/BAD", "WIN RATE", "MODEL AND SETTINGS")
    # A model's name comes from its publisher: it must not steer the terminal.
    table = [
        (str(rank), f"{row.rating:.0f}", interval_text(row, " to "), str(row.votes),
         f"{row.wins}/{row.losses}/{row.ties}/{row.both_bad}", f"{row.win_rate:.0%}", terminal_text(row.name))
        for rank, row in enumerate(rows, 1)
    ]
    widths = [max(len(h), *(len(r[i]) for r in table)) for i, h in enumerate(headers[:-1])]
    lines = []
    for row in (headers, *table):
        cells = [f"{cell:>{width}}" for cell, width in zip(row, widths)]
        lines.append("  ".join([*cells, row[-1]]))
    return "\n".join(lines) + "\n"


def _export(votes: list[ArenaVote], args: argparse.Namespace, out: TextIO) -> None:
    if args.votes:
        text = votes_json(votes)
    else:
        rows = leaderboard(votes, rounds=args.rounds, seed=args.seed)
        text = leaderboard_csv(rows) if args.format == "csv" else leaderboard_json(rows)
    if args.output is None:
        out.write(text)
        return
    write_text_atomically(Path(args.output), text)


__all__ = ["build_parser", "leaderboard_table", "main"]
