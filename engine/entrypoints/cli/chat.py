"""`python -m engine chat`: an interactive multi-turn chat in the terminal.

Each turn's prompt extends the ids of the turns before it exactly as they were
fed and generated, so the prefix cache serves the whole earlier conversation.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from engine.entrypoints.cli.loading import open_engine
from engine.entrypoints.cli.options import (
    add_engine_options,
    add_sampling_options,
    add_stats_option,
    paragraphs,
    print_stats,
    request_error,
    sampling_params,
    sampling_source,
)
from engine.errors import EngineError
from engine.params import SamplingParams


def add_chat_parser(sub: Any, prog: str) -> argparse.ArgumentParser:
    chat = sub.add_parser(
        "chat",
        help="interactive multi-turn chat in the terminal",
        description=paragraphs(
            "Chat with the model in the terminal; replies stream as they are generated, and "
            "each turn reuses the earlier turns' KV cache. Type /reset to start over and /exit "
            "(or Ctrl+D) to leave; Ctrl+C stops a reply, or leaves at the empty prompt."
        ),
        epilog=(
            "examples:\n"
            f"  {prog} chat\n"
            f"  {prog} chat --system \"You are a terse assistant.\" --temperature 0.2 --seed 1"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    chat.set_defaults(run=run_chat)
    chat.add_argument("--system", default=None, metavar="TEXT", help="system prompt")
    add_stats_option(chat)
    add_sampling_options(chat)
    add_engine_options(chat)
    return chat


def run_chat(args: argparse.Namespace) -> int:
    sampling_params(args)  # a bad combination of flags is refused before the model loads
    print("Loading model...", file=sys.stderr, flush=True)
    with open_engine(args) as engine:
        recommended = engine.recommended_sampling
        params = sampling_params(args, recommended)
        source = sampling_source(args, recommended)
        print(
            f"Chatting with {engine.model_path.name}"
            + (f", sampling with {source}" if source else "")
            + ". Commands: /reset, /exit.",
            file=sys.stderr,
            flush=True,
        )
        code = _chat_loop(engine, args, params)
        if args.stats:
            print_stats(engine)
        return code


def _chat_loop(engine: Any, args: argparse.Namespace, params: SamplingParams) -> int:
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages: list[dict[str, str]] = list(system)
    # The conversation's ids exactly as fed and generated, so each turn's
    # prompt extends the last one and the prefix cache serves all of it.
    history_ids: list[int] = []
    while True:
        try:
            line = input("> ")
        except EOFError:
            # The cursor is still after "> ": end that line so the shell's
            # prompt starts on its own.
            print()
            return 0
        except KeyboardInterrupt:
            print()
            return 130
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            return 0
        if text == "/reset":
            messages, history_ids = list(system), []
            print("(conversation cleared)", file=sys.stderr)
            continue
        messages.append({"role": "user", "content": text})
        reply_text: list[str] = []
        reply_ids: list[int] = []
        prompt = history_ids  # if interrupted before the new prompt exists
        try:
            prompt = engine.tokenizer.encode_next_turn(history_ids, messages)
            for _, event in engine.events(prompt, params):
                reply_ids.extend(event.token_ids)
                reply_text.append(event.text)
                sys.stdout.write(event.text)
                sys.stdout.flush()
        except KeyboardInterrupt:
            sys.stdout.write(" [stopped]")
        except EngineError as exc:
            messages.pop()
            print(f"error: {request_error(exc, args)}", file=sys.stderr)
            continue
        sys.stdout.write("\n")
        history_ids = prompt + reply_ids
        messages.append({"role": "assistant", "content": "".join(reply_text)})
