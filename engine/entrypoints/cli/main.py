"""Command line: `python -m engine generate | chat` (and `serve`, from engine/entrypoints/openai/server.py).

`generate --json` prints one JSON object per input, in input order; other
tools parse it, so its keys are a contract. Loading progress, statistics and
errors go to stderr, replies to stdout.

Options are checked here, in the words of the command line (`argument
--max-tokens: must be at least 1`), before a model is loaded; the engine's
own messages cover what only it can know (a prompt too long for the model),
with the flag that moves the limit added where there is one.

A further subcommand can plug in from its own module: `build_parser` offers
the subparsers to `engine.entrypoints.openai.server.add_serve_parser` when that module exists
(see `_add_serve_parser` for the hand-off).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import sys
import textwrap
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any, NoReturn, TextIO

from engine.errors import EngineError, KVCacheTooSmallError, RequestTooLargeError
from engine.params import InvalidSamplingParams, SamplingParams

_DEFAULTS = SamplingParams()

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


# -- option types: each says what is wrong in the words of its flag ---------------
# argparse prefixes the message with "argument --flag:".


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def _int_at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = _integer(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    return parse


def _number_in(
    low: float, high: float | None = None, *, low_open: bool = False, high_open: bool = False
) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = _number(text)
        too_low = value <= low if low_open else value < low
        too_high = high is not None and (value >= high if high_open else value > high)
        if too_low or too_high:
            lo = f"above {low:g}" if low_open else f"at least {low:g}"
            hi = "" if high is None else (f" and below {high:g}" if high_open else f" and at most {high:g}")
            raise argparse.ArgumentTypeError(f"must be {lo}{hi}, got {text}")
        return value

    return parse


def _text(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def _chat_input(text: str) -> tuple[str, str]:
    return ("chat", text)


def _raw_input(text: str) -> tuple[str, str]:
    return ("prompt", text)


# -- the parser ---------------------------------------------------------------


def _add_engine_options(p: argparse.ArgumentParser) -> None:
    from engine.runner.cpu import DETERMINISTIC_DEFAULT

    g = p.add_argument_group("model and device")
    g.add_argument(
        "--model", default="default", metavar="PATH",
        help="a Hugging Face Llama-family folder (config.json, *.safetensors, tokenizer.json), "
        "a .gguf file (imported once), or 'default' for the bundled SmolLM2-135M-Instruct "
        "(default: %(default)s)",
    )
    g.add_argument(
        "--device", default="auto", choices=["auto", "cpu", "cuda"],
        help="where the model runs; auto picks CUDA when PyTorch sees a GPU, else the CPU "
        "(default: %(default)s)",
    )
    g.add_argument(
        "--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
        help="weight and activation type; auto is bfloat16 on CUDA and on CPUs with native "
        "bf16 (AVX512-BF16 or AMX), float32 elsewhere (default: %(default)s)",
    )
    g.add_argument(
        "--quantize", default=None, choices=["int8", "int4"],
        help="keep a float checkpoint's weights quantized (8-bit or 4-bit groups, run by "
        "weight-only quantized kernels): less memory and faster one-sequence decoding; quantized "
        "once and cached; GGUF files keep their own quantization (default: none, run as stored)",
    )
    g.add_argument(
        "--quantized", default="auto", choices=["auto", "kernel", "dequantize"],
        help="how block-quantized weights (GGUF imports, --quantize) run: kernel keeps them "
        "quantized in memory, dequantize expands them to --dtype at load (what the GGUF file "
        "means exactly, at float memory and speed); auto runs the kernels where this machine "
        "has them (default: %(default)s)",
    )
    g.add_argument(
        "--threads", type=_int_at_least(1), default=None, metavar="N",
        help="a fixed number of CPU threads for the model's math (default: the engine's CPU "
        "thread policy, which measures as it runs whether all cores or one fewer is faster, "
        "so that a busy machine does not stall it)",
    )
    g.add_argument(
        "--deterministic", action=argparse.BooleanOptionalAction, default=None,
        help="reproducible replies: a request's output does not depend on what else runs "
        "beside it in the batch, on chunking or on prefix-cache hits (batch-invariant "
        f"kernels, somewhat slower) (default: {'on' if DETERMINISTIC_DEFAULT else 'off'})",
    )
    c = p.add_argument_group("KV cache")
    c.add_argument(
        "--kv-pages", type=_int_at_least(1), default=None, metavar="N",
        help="KV-cache size in pages of --page-size tokens (default: sized from the "
        "device's memory)",
    )
    c.add_argument(
        "--page-size", type=_int_at_least(1), default=16, metavar="N",
        help="tokens per KV-cache page; the prefix cache reuses whole pages "
        "(default: %(default)s)",
    )
    c.add_argument(
        "--no-prefix-cache", action="store_true",
        help="recompute every prompt in full instead of reusing cached prefixes",
    )


def _add_stats_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--stats", action="store_true",
        help="at the end, print decode tokens/s, time to first token and KV-cache use "
        "to stderr as one JSON object",
    )


def _add_sampling_options(p: argparse.ArgumentParser) -> None:
    d = _DEFAULTS
    g = p.add_argument_group("sampling")
    g.add_argument(
        "--max-tokens", type=_int_at_least(1), default=d.max_tokens, metavar="N",
        help="most tokens a reply may have (default: %(default)s)",
    )
    g.add_argument(
        "--temperature", type=_number_in(0), default=d.temperature, metavar="T",
        help="randomness; 0 always picks the most likely token (greedy) (default: %(default)s)",
    )
    g.add_argument(
        "--top-k", type=_int_at_least(0), default=d.top_k, metavar="K",
        help="sample only from the K most likely tokens; 0 = off (default: %(default)s)",
    )
    g.add_argument(
        "--top-p", type=_number_in(0, 1, low_open=True), default=d.top_p, metavar="P",
        help="sample only from the most likely tokens whose probabilities add up to P; "
        "1 = off (default: %(default)s)",
    )
    g.add_argument(
        "--min-p", type=_number_in(0, 1, high_open=True), default=d.min_p, metavar="P",
        help="drop tokens less likely than P times the most likely one; 0 = off "
        "(default: %(default)s)",
    )
    g.add_argument(
        "--repetition-penalty", type=_number_in(0, low_open=True),
        default=d.repetition_penalty, metavar="X",
        help="above 1 discourages tokens already in the prompt or reply; 1 = off "
        "(default: %(default)s)",
    )
    g.add_argument(
        "--seed", type=_integer, default=None, metavar="N",
        help="the same seed, prompt and settings give the same reply (default: a random seed)",
    )
    g.add_argument(
        "--stop", action="append", type=_text, default=[], metavar="TEXT",
        help="end the reply where TEXT appears, TEXT left out (repeatable; "
        "the model's own end-of-turn token always stops it)",
    )


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


def _paragraphs(*texts: str) -> str:
    # The raw formatter keeps the examples' layout, so prose is wrapped here.
    return "\n\n".join(textwrap.fill(t, 79) for t in texts)


def build_parser() -> argparse.ArgumentParser:
    prog = _prog()
    raw = argparse.RawDescriptionHelpFormatter
    parser = _Parser(
        prog=prog,
        description=_paragraphs(
            "Tandem's inference engine from the command line: one-shot generation (several "
            "inputs run as one continuous batch) or an interactive chat."
        ),
        epilog=_EXAMPLES.replace("%(prog)s", prog)
        + f"\nRun '{prog} COMMAND --help' for a command's options.",
        formatter_class=raw,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s (tandem {_version()})")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    gen = sub.add_parser(
        "generate",
        help="generate replies for one or more inputs, then exit",
        description=_paragraphs(
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
            + _paragraphs(
                "--json prints, for each input, a line {\"index\", \"prompt_token_ids\", "
                "\"token_ids\", \"text\", \"finish_reason\"}; token_ids include the end-of-turn "
                "token that stopped the reply (finish_reason \"stop\"), text does not."
            )
        ),
        formatter_class=raw,
    )
    gen.set_defaults(run=_generate)
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
    _add_stats_option(gen)
    _add_sampling_options(gen)
    _add_engine_options(gen)

    chat = sub.add_parser(
        "chat",
        help="interactive multi-turn chat in the terminal",
        description=_paragraphs(
            "Chat with the model in the terminal; replies stream as they are generated, and "
            "each turn reuses the earlier turns' KV cache. Type /reset to start over and /exit "
            "(or Ctrl+D) to leave; Ctrl+C stops a reply, or leaves at the empty prompt."
        ),
        epilog=(
            "examples:\n"
            f"  {prog} chat\n"
            f"  {prog} chat --system \"You are a terse assistant.\" --temperature 0.2 --seed 1"
        ),
        formatter_class=raw,
    )
    chat.set_defaults(run=_chat)
    chat.add_argument("--system", default=None, metavar="TEXT", help="system prompt")
    _add_stats_option(chat)
    _add_sampling_options(chat)
    _add_engine_options(chat)

    # What a further subcommand that runs a model shares with these two.
    engine_options = argparse.ArgumentParser(add_help=False)
    _add_engine_options(engine_options)
    _add_serve_parser(sub, engine_options)
    return parser


# -- loading --------------------------------------------------------------------


class ProgressPrinter:
    """Shows the engine's loading progress (engine.progress.LoadProgress) on a stream.

    On a terminal: one line rewritten in place (percentage first, cut to the
    terminal's width so that it never wraps), cleared once the model is
    ready. Elsewhere (a log, a pipe): a line when the GGUF import starts and
    one when it ends, since only the import is slow enough to need saying;
    the other stages stay quiet so that scripts get a clean stderr. Called
    from the engine's loading thread while the caller waits.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._tty = bool(getattr(stream, "isatty", lambda: False)())
        self._stage: str | None = None
        self._shown = ""

    def __call__(self, progress: Any) -> None:
        if self._tty:
            self._update_line(progress)
        elif progress.stage != self._stage:
            if progress.stage == "import":
                self._write(f"{progress.detail}...\n")
            elif self._stage == "import":
                self._write("Import done.\n")
        self._stage = progress.stage

    def _update_line(self, progress: Any) -> None:
        if progress.stage == "ready":
            if self._shown:
                self._write("\r\x1b[K")
                self._shown = ""
            return
        percent = 100 * progress.done // progress.total if progress.total else 100
        width = shutil.get_terminal_size().columns - 1
        line = f"{percent:3d}% {progress.detail}"[:width]
        if line != self._shown:
            self._write(f"\r\x1b[K{line}")
            self._shown = line

    def finish(self) -> None:
        """End a progress line left open (loading failed or was interrupted)."""
        if self._shown:
            self._write("\n")
            self._shown = ""

    def _write(self, text: str) -> None:
        self._stream.write(text)
        self._stream.flush()


def open_engine(args: argparse.Namespace) -> Any:
    """The Engine for the model, device and KV-cache options in `args`,
    showing its loading progress on stderr."""
    from engine.llm import Engine  # heavy import (torch) after argument errors

    options: dict[str, Any] = {}
    if args.deterministic is not None:
        options["deterministic"] = args.deterministic
    if getattr(args, "quantize", None) is not None:
        options["quantize"] = args.quantize
    if getattr(args, "quantized", "auto") != "auto":
        options["quantized"] = args.quantized
    progress = ProgressPrinter(sys.stderr)
    try:
        return Engine(
            args.model,
            device=args.device,
            dtype=args.dtype,
            page_size=args.page_size,
            kv_pages=args.kv_pages,
            enable_prefix_cache=not args.no_prefix_cache,
            threads=args.threads,
            on_progress=progress,
            **options,
        )
    finally:
        progress.finish()


# -- generate -------------------------------------------------------------------


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


def _messages(system: str | None, text: str) -> list[dict[str, str]]:
    if not text.strip():
        raise EngineError("The message is empty")
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": text})
    return messages


def _in_flags(exc: RequestTooLargeError, args: argparse.Namespace) -> str:
    """The engine's "too large" message, with the flags that move the limit it hit."""
    if isinstance(exc, KVCacheTooSmallError):
        if args.kv_pages is None:
            return str(exc)
        return (
            f"{exc} (--kv-pages {args.kv_pages} holds {args.kv_pages * args.page_size} "
            "tokens: raise --kv-pages, lower --max-tokens, or leave --kv-pages out to size "
            "the cache from memory)"
        )
    return f"{exc} (--max-tokens is {args.max_tokens})"


def _generate(args: argparse.Namespace) -> int:
    if not args.inputs:
        raise EngineError("Nothing to generate: give at least one --chat TEXT or --prompt TEXT")
    params = _sampling(args)
    prompts: list[Any] = []
    for kind, text in args.inputs:
        if kind == "chat":
            prompts.append(_messages(args.system, text))
        elif not text:
            raise EngineError("The prompt is empty")
        else:
            prompts.append(text)
    with open_engine(args) as engine:
        try:
            _write_replies(engine, prompts, params, args.json)
        except RequestTooLargeError as exc:
            raise EngineError(_in_flags(exc, args)) from exc
        if args.stats:
            _print_stats(engine)
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


# -- chat -----------------------------------------------------------------------


def _chat(args: argparse.Namespace) -> int:
    params = _sampling(args)
    print("Loading model...", file=sys.stderr, flush=True)
    with open_engine(args) as engine:
        print(
            f"Chatting with {engine.model_path.name}. Commands: /reset, /exit.",
            file=sys.stderr,
            flush=True,
        )
        code = _chat_loop(engine, args, params)
        if args.stats:
            _print_stats(engine)
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
        except RequestTooLargeError as exc:
            messages.pop()
            print(f"error: {_in_flags(exc, args)}", file=sys.stderr)
            continue
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
