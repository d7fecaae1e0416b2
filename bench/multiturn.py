"""Time to first token over a growing conversation, prefix cache on vs off.

    .venv/bin/python bench/multiturn.py [--turns 10]

A 10-turn conversation grows to about 2,000 tokens. Each turn's prompt is the
previous turns' ids exactly as they were fed and generated plus the new
message, as the app's conversations build it. Prints one JSON object, and on
stderr the turn-10 / cold time-to-first-token ratio against its goal (<= 0.1x,
issue 20) with the CPU line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import OtherLoad, machine, machine_line  # noqa: E402
from engine import Engine, SamplingParams  # noqa: E402

TOPICS = [
    "the history of the printing press", "how bees communicate", "the water cycle",
    "why bread rises", "how a bicycle stays upright", "the life of a star",
    "how vaccines train the immune system", "the rules of chess", "how tides work",
    "what makes music sound sad or happy",
]


def message(turn: int) -> str:
    # About 120 tokens per user turn.
    return (
        f"Turn {turn}. I am writing notes for a class and I would like your help. "
        f"Please explain {TOPICS[turn % len(TOPICS)]} in plain words, mention one "
        "surprising fact, one common misunderstanding, and one question a curious "
        "student might ask next. Keep the explanation friendly, concrete and short, "
        "avoid jargon where you can, and when you must use a technical word, say what "
        "it means. Finally, suggest a simple experiment or observation that anyone "
        "could do at home to see the idea in action."
    )


def conversation(engine: Engine, turns: int, reply_tokens: int) -> tuple[list[float], list[float], list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=reply_tokens, ignore_eos=True)
    tok = engine.tokenizer
    messages: list[dict[str, str]] = []
    ids: list[int] = []
    ttft, reused, lengths = [], [], []
    for turn in range(turns):
        messages.append({"role": "user", "content": message(turn)})
        prompt = tok.encode_next_turn(ids, messages)
        out = engine.generate_outputs([prompt], params)[0]
        ttft.append(round(out.metrics.time_to_first_token, 4))
        reused.append(round(out.metrics.cached_prompt_tokens / len(prompt), 3))
        lengths.append(len(prompt))
        ids = prompt + out.token_ids
        messages.append({"role": "assistant", "content": out.text})
    return ttft, reused, lengths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--reply-tokens", type=int, default=96)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--threads", type=int, default=None, help="fix the CPU thread count")
    args = parser.parse_args()
    result: dict = {"ttft_s": {}}
    for name, cache in (("cache_on", True), ("cache_off", False)):
        with Engine(
            "default", device=args.device, dtype=args.dtype, enable_prefix_cache=cache, threads=args.threads,
        ) as engine:
            engine.generate("Hello", max_tokens=4)  # warm-up
            with OtherLoad() as other:
                ttft, reused, lengths = conversation(engine, args.turns, args.reply_tokens)
        result["ttft_s"][name] = ttft
        result.setdefault("other_busy_cores", {})[name] = other.cores
        if cache:
            result["reused_fraction"] = reused
            result["prompt_tokens"] = lengths
    on, off = result["ttft_s"]["cache_on"], result["ttft_s"]["cache_off"]
    result["last_turn_ttft_ratio"] = round(on[-1] / off[-1], 3)
    result["goal"] = {"goal": f"turn-{args.turns} TTFT <= 0.1x cold", "pass": result["last_turn_ttft_ratio"] <= 0.1}
    result["machine"] = machine(args.threads)
    print(json.dumps(result))
    print(f"machine: {machine_line(result['machine'])}\n"
          f"turn {args.turns}: {on[-1]} s with the prefix cache, {off[-1]} s cold ({result['prompt_tokens'][-1]} prompt tokens; "
          f"other programs' busy cores meanwhile: {result['other_busy_cores']})\n"
          f"{'PASS' if result['goal']['pass'] else 'FAIL'}  {result['goal']['goal']}: "
          f"{result['last_turn_ttft_ratio']}x", file=sys.stderr)


if __name__ == "__main__":
    main()
