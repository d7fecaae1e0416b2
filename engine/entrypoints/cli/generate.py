"""`python -m engine generate`: replies for one or more inputs, then exit.

`generate --json` prints one JSON object per input, in input order; other
tools parse it, so its keys are a contract.
"""

from __future__ import annotations

import argparse
import json
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
)
from engine.errors import EngineError, RequestTooLargeError
from engine.params import SamplingParams


def _chat_input(text: str) -> tuple[str, str]:
    return ("chat", text)


def _raw_input(text: str) -> tuple[str, str]:
    return ("prompt", text)


def add_generate_parser(sub: Any, prog: str) -> argparse.ArgumentParser:
    gen = sub.add_parser(
        "generate",
        help="generate replies for one or more inputs, then exit",
        description=paragraphs(
            "Generate a reply for each --chat or --prompt input; all inputs run as one "
            "continuous batch. One input streams its reply to stdout as it is generated, "
            "several print in input order, and --json prints one JSON object per input. "
            "Loading progress, --stats and errors go to stderr."
        ),
        epilog=(
            "examples:\n"
            f"  {prog} generate --chat \"What is the capital of France?\" --temperature 0\n"
            f"  {prog} generate --chat \"Hi\" --chat \"Name a color\" --json\n"
            f"  {prog} generate --prompt \"The three primary colors are\" --max-tokens 24 --stop .\n\n"
            + paragraphs(
                "--json prints, for each input, a line {\"index\", \"prompt_token_ids\", "
                "\"token_ids\", \"text\", \"finish_reason\"}; token_ids include the end-of-turn "
                "token that stopped the reply (finish_reason \"stop\"), text does not."
            )
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    gen.set_defaults(run=run_generate)
    inputs = gen.add_argument_group("inputs (at least one --chat or --prompt)")
    inputs.add_argument(
        "--chat", dest="inputs", action="append", type=_chat_input, default=[], metavar="TEXT",
        help="a user message, rendered through the model's chat template (repeatable)",
    )
    inputs.add_argument(
        "--prompt", dest="inputs", action="append", type=_raw_input, metavar="TEXT",
        help="raw text fed to the model as it is, no template (repeatable)",
    )
    inputs.add_argument(
        "--system", default=None, metavar="TEXT", help="system prompt for the --chat inputs"
    )
    gen.add_argument(
        "--json", action="store_true",
        help="print one JSON object per input (ids, text, finish reason) instead of text",
    )
    add_stats_option(gen)
    add_sampling_options(gen)
    add_engine_options(gen)
    return gen


def _messages(system: str | None, text: str) -> list[dict[str, str]]:
    if not text.strip():
        raise EngineError("The message is empty")
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": text})
    return messages


def run_generate(args: argparse.Namespace) -> int:
    if not args.inputs:
        raise EngineError("Nothing to generate: give at least one --chat TEXT or --prompt TEXT")
    params = sampling_params(args)
    prompts: list[Any] = []
    for kind, text in args.inputs:
        if kind == "chat":
            prompts.append(_messages(args.system, text))
        elif not text:
            raise EngineError("The prompt is empty")
        else:
            prompts.append(text)
    with open_engine(args) as engine:
        params = sampling_params(args, engine.recommended_sampling)
        try:
            _write_replies(engine, prompts, params, args.json)
        except RequestTooLargeError as exc:
            raise EngineError(request_error(exc, args)) from exc
        if args.stats:
            print_stats(engine)
    return 0


def _write_replies(engine: Any, prompts: list[Any], params: SamplingParams, as_json: bool) -> None:
    if as_json:
        for i, out in enumerate(engine.generate_outputs(prompts, params)):
            record = {
                "index": i,
                "prompt_token_ids": out.prompt_token_ids,
                # Includes the end-of-turn token that stopped the reply, if one did.
                "token_ids": out.token_ids,
                "text": engine.tokenizer.decode(out.token_ids, skip_special_tokens=True),
                "finish_reason": out.finish_reason,
            }
            print(json.dumps(record, ensure_ascii=False), flush=True)
    elif len(prompts) == 1:
        for delta in engine.generate(prompts[0], stream=True, params=params):
            sys.stdout.write(delta)
            sys.stdout.flush()
        sys.stdout.write("\n")
    else:
        for i, out in enumerate(engine.generate_outputs(prompts, params)):
            sys.stdout.write(f"--- [{i}] ---\n{out.text}\n")
        sys.stdout.flush()
