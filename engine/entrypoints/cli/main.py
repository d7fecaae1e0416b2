"""Command line: `python -m engine generate | chat | serve`.

This module builds the parser, dispatches to the command and turns engine
errors into one line on stderr; each command lives in its own module
(generate.py, chat.py, serve.py), the options they share in options.py (the
engine's from engine.config, the sampling ones from engine.params), and
opening the engine with its loading progress in loading.py.

Loading progress, statistics and errors go to stderr, replies to stdout.
Options are checked in the words of the command line (`argument
--max-tokens: must be at least 1`), before a model is loaded; the engine's
own messages cover what only it can know (a prompt too long for the model),
with the flag that moves the limit added where there is one.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any, NoReturn

from engine.entrypoints.cli.chat import add_chat_parser
from engine.entrypoints.cli.generate import add_generate_parser
from engine.entrypoints.cli.loading import ProgressPrinter, open_engine
from engine.entrypoints.cli.options import add_engine_options, paragraphs
from engine.errors import EngineError
from engine.params import InvalidSamplingParams

__all__ = ["ProgressPrinter", "build_parser", "main", "open_engine"]

_EXAMPLES = """\
examples:
  %(prog)s chat
  %(prog)s chat --system "Answer in one sentence." --temperature 0.3
  %(prog)s generate --chat "Name a color" --chat "Name a fruit" --temperature 0 --json
  %(prog)s generate --prompt "Once upon a time" --max-tokens 64 --seed 7
  %(prog)s generate --model ~/models/Qwen2.5-0.5B-Instruct --chat "Hi" --device cpu

The first start imports the default model (a 98 MB GGUF file) once into
Tandem's data folder (about 540 MB; TANDEM_DATA_DIR moves it); later starts
skip the import.
"""


def _prog() -> str:
    # Run as `python -m engine`, argv[0] is the path of this file; an installed
    # console script carries its own name.
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return "python -m engine" if name in ("", "__main__.py", "-c") else name


def _version() -> str:
    try:
        return version("tandem")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _add_serve_parser(sub: Any, engine_options: argparse.ArgumentParser) -> None:
    """`serve` (engine/entrypoints/cli/serve.py), with the shared engine options and the
    same loading progress on stderr as `generate` and `chat`. Imported here,
    not at the top, so that `generate --help` does not import the server's libraries."""
    from engine.entrypoints.cli.serve import add_serve_parser

    add_serve_parser(sub, engine_options=engine_options, open_engine=open_engine)


class _Parser(argparse.ArgumentParser):
    """argparse, but a mistake is answered in two lines, not with the whole usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\nTry '{self.prog} --help' for the options.\n")


def build_parser() -> argparse.ArgumentParser:
    prog = _prog()
    parser = _Parser(
        prog=prog,
        description=paragraphs(
            "Tandem's inference engine from the command line: one-shot generation (several "
            "inputs run as one continuous batch) or an interactive chat."
        ),
        epilog=_EXAMPLES.replace("%(prog)s", prog)
        + f"\nRun '{prog} COMMAND --help' for a command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s (tandem {_version()})")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_generate_parser(sub, prog)
    add_chat_parser(sub, prog)
    # What a further subcommand that runs a model shares with these two.
    engine_options = argparse.ArgumentParser(add_help=False)
    add_engine_options(engine_options)
    _add_serve_parser(sub, engine_options)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except (EngineError, InvalidSamplingParams) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # Interrupted while loading or between replies: leave the line clean.
        print(file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
