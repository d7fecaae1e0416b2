"""Command line: `python -m engine generate ...` and `python -m engine chat`.

`generate --json` prints one JSON object per input, in input order; other
tools parse it, so its keys are a contract.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from engine.errors import EngineError
from engine.sampling import InvalidSamplingParams, SamplingParams

_DEFAULTS = SamplingParams()


def _chat_input(text: str) -> tuple[str, str]:
    return ("chat", text)


def _raw_input(text: str) -> tuple[str, str]:
    return ("prompt", text)


def _add_engine_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default", help="model folder, .gguf file, or 'default'")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--no-prefix-cache", action="store_true", help="recompute every prompt fully")
    p.add_argument("--kv-pages", type=int, default=None, help="KV-cache size in pages")
    p.add_argument("--page-size", type=int, default=16, help="tokens per KV-cache page")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: one per core)")
    p.add_argument("--stats", action="store_true", help="print engine statistics to stderr at the end")


def _add_sampling_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=_DEFAULTS.max_tokens)
    p.add_argument("--temperature", type=float, default=_DEFAULTS.temperature, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=_DEFAULTS.top_k)
    p.add_argument("--top-p", type=float, default=_DEFAULTS.top_p)
    p.add_argument("--min-p", type=float, default=_DEFAULTS.min_p)
    p.add_argument("--repetition-penalty", type=float, default=_DEFAULTS.repetition_penalty)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine", description="Tandem inference engine")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate replies for one or more inputs")
    gen.add_argument("--chat", dest="inputs", action="append", type=_chat_input, default=[],
                     help="a user message, rendered through the chat template (repeatable)")
    gen.add_argument("--prompt", dest="inputs", action="append", type=_raw_input,
                     help="raw text fed as is, no template (repeatable)")
    gen.add_argument("--system", default=None, help="system prompt for --chat inputs")
    gen.add_argument("--json", action="store_true", help="one JSON object per input")
    _add_engine_options(gen)
    _add_sampling_options(gen)

    chat = sub.add_parser("chat", help="interactive chat in the terminal")
    chat.add_argument("--system", default=None, help="system prompt")
    _add_engine_options(chat)
    _add_sampling_options(chat)
    return parser


def _sampling(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        seed=args.seed,
        stop=tuple(args.stop),
    )


def _engine(args: argparse.Namespace) -> Any:
    from engine.engine import Engine  # heavy import (torch) after argument errors

    return Engine(
        args.model,
        device=args.device,
        dtype=args.dtype,
        page_size=args.page_size,
        kv_pages=args.kv_pages,
        enable_prefix_cache=not args.no_prefix_cache,
        threads=args.threads,
    )


def _messages(system: str | None, text: str) -> list[dict[str, str]]:
    if not text.strip():
        raise EngineError("The message is empty")
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": text})
    return messages


def _generate(args: argparse.Namespace) -> int:
    if not args.inputs:
        raise EngineError("Nothing to generate: give at least one --chat or --prompt")
    params = _sampling(args)
    prompts: list[Any] = []
    for kind, text in args.inputs:
        if kind == "chat":
            prompts.append(_messages(args.system, text))
        elif not text:
            raise EngineError("The prompt is empty")
        else:
            prompts.append(text)
    with _engine(args) as engine:
        if args.json:
            for i, out in enumerate(engine.generate_outputs(prompts, params)):
                record = {
                    "index": i,
                    "prompt_token_ids": out.prompt_token_ids,
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
        if args.stats:
            _print_stats(engine)
    return 0


def _print_stats(engine: Any) -> None:
    stats = engine.stats()
    summary = {
        "device": engine.device.type,
        "dtype": str(engine.dtype).removeprefix("torch."),
        "decode_tok_s": round(stats.decode_tokens_per_s, 1),
        "ttft_s": [round(t, 4) for t in stats.recent_ttft_s],
        "prompt_tokens_computed": stats.prompt_tokens_computed,
        "prompt_tokens_reused": stats.prompt_tokens_reused,
        "pages_used": stats.pages_used,
        "pages_cached": stats.pages_cached,
        "pages_free": stats.pages_free,
        "preemptions": stats.preemptions,
    }
    print(json.dumps(summary), file=sys.stderr)


def _chat(args: argparse.Namespace) -> int:
    params = _sampling(args)
    print("Loading model...", file=sys.stderr, flush=True)
    with _engine(args) as engine:
        print(
            f"Chatting with {engine.model_path.name}. Commands: /reset, /exit.",
            file=sys.stderr,
            flush=True,
        )
        code = _chat_loop(engine, args.system, params)
        if args.stats:
            _print_stats(engine)
        return code


def _chat_loop(engine: Any, system_prompt: str | None, params: SamplingParams) -> int:
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages: list[dict[str, str]] = list(system)
    # The conversation's ids exactly as fed and generated, so each turn's
    # prompt extends the last one and the prefix cache serves all of it.
    history_ids: list[int] = []
    while True:
        try:
            line = input("> ")
        except EOFError:
            print(file=sys.stderr)
            return 0
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
            print(f"error: {exc}", file=sys.stderr)
            continue
        sys.stdout.write("\n")
        history_ids = prompt + reply_ids
        messages.append({"role": "assistant", "content": "".join(reply_text)})


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return _generate(args) if args.command == "generate" else _chat(args)
    except (EngineError, InvalidSamplingParams) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
