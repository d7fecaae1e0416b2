"""Panes at once against one pane alone.

    .venv/bin/python bench/panes.py [--case all|chat|broadcast] [--panes 4]

chat: greedy, 64 new tokens per pane; the panes started together, and
started 0.5 s apart (a user sending to panes one after another), against one
request alone (wall time ratios).

broadcast: one ~1k-token conversation sent to every pane at once on a cold
prefix cache, against the same prompt sent to one pane: the prompt tokens the
engine computed and the time to first token (the slowest pane's and the
mean), as ratios. Each time is the best of --repeats cold runs, one pane and
all panes taking turns.

Prints one JSON object, with the CPU (model and vector features) and the
load average beside the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import chat_prompts, cpu_description, load_average, machine, machine_line  # noqa: E402
from engine import Engine, SamplingParams  # noqa: E402

# A conversation of earlier turns (fixed replies, nothing generated) that
# the broadcast prompt continues: 7 turns are 1,021 tokens through SmolLM2's template.
_TOPICS = [
    "the history of the printing press", "how bees communicate", "the water cycle",
    "why bread rises", "how a bicycle stays upright", "the life of a star",
]


def history(turns: int) -> list[dict[str, str]]:
    messages: list[dict[str, str]] = [
        {"role": "system", "content": "You are a patient teacher who answers in plain words."}
    ]
    for turn in range(turns):
        topic = _TOPICS[turn % len(_TOPICS)]
        messages.append({"role": "user", "content": (
            f"Please explain {topic} in plain words, with one surprising fact and one "
            "common misunderstanding, and suggest a simple observation anyone could "
            "make at home to see the idea in action."
        )})
        messages.append({"role": "assistant", "content": (
            f"Here is a short explanation of {topic}. The main idea is simpler than it "
            "sounds: a few steps repeat, each one depending on the one before. A "
            "surprising fact is how old the first observations of it are. A common "
            "misunderstanding is that it happens all at once, when in fact it is "
            "gradual. At home, watch it closely for a few minutes and write down what "
            "changes and in what order; you will see the steps one after another."
        )})
    messages.append({"role": "user", "content": "Now summarise everything we discussed in three sentences."})
    return messages


def run(engine: Engine, count: int, stagger: float, params: SamplingParams) -> float:
    engine.reset_prefix_cache()
    done = threading.Semaphore(0)
    prompts = chat_prompts(count)
    start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        delay = start + i * stagger - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        engine.submit(prompt, params, lambda e: e.output is not None and done.release())
    for _ in prompts:
        done.acquire()
    return time.perf_counter() - start


def chat_case(engine: Engine, args: argparse.Namespace) -> dict[str, object]:
    params = SamplingParams(temperature=0.0, max_tokens=args.new_tokens, ignore_eos=True)
    run(engine, 2, 0.0, SamplingParams(temperature=0.0, max_tokens=8))  # warm-up
    one = min(run(engine, 1, 0.0, params) for _ in range(args.repeats))
    together = min(run(engine, args.panes, 0.0, params) for _ in range(args.repeats))
    staggered = min(run(engine, args.panes, args.stagger, params) for _ in range(args.repeats))
    return {
        "one_s": round(one, 3),
        "together_s": round(together, 3),
        "staggered_s": round(staggered, 3),
        "together_ratio": round(together / one, 3),
        "staggered_ratio": round(staggered / one, 3),
        # The last pane started (panes-1)*stagger after the first: its own time.
        "staggered_last_pane_ratio": round((staggered - (args.panes - 1) * args.stagger) / one, 3),
        "stagger_s": args.stagger,
    }


def cold_broadcast(engine: Engine, prompt: list[int], count: int) -> dict[str, object]:
    """Send `prompt` to `count` panes at once on a cold cache."""
    engine.reset_prefix_cache()
    before = engine.stats()
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    outputs = engine.generate_outputs([prompt] * count, params)
    after = engine.stats()
    ttfts = [o.metrics.time_to_first_token for o in outputs]
    return {
        "computed": after.prompt_tokens_computed - before.prompt_tokens_computed,
        "cached": [o.metrics.cached_prompt_tokens for o in outputs],
        "ttft_max_s": max(ttfts),
        "ttft_mean_s": sum(ttfts) / len(ttfts),
    }


def broadcast_case(engine: Engine, args: argparse.Namespace) -> dict[str, object]:
    prompt = engine.encode_prompt(history(args.history_turns))
    cold_broadcast(engine, prompt, 2)  # warm-up
    one, many = [], []
    for _ in range(args.repeats):  # interleaved, so that a change in load touches both alike
        one.append(cold_broadcast(engine, prompt, 1))
        many.append(cold_broadcast(engine, prompt, args.panes))
    one_ttft = min(r["ttft_max_s"] for r in one)
    many_max = min(r["ttft_max_s"] for r in many)
    many_mean = min(r["ttft_mean_s"] for r in many)
    one_computed = one[0]["computed"]
    many_computed = max(r["computed"] for r in many)
    return {
        "prompt_tokens": len(prompt),
        "one_pane_computed": one_computed,
        "panes_computed": many_computed,
        "computed_ratio": round(many_computed / one_computed, 3),
        "panes_cached_prompt_tokens": many[-1]["cached"],
        "one_pane_ttft_s": round(one_ttft, 4),
        "panes_ttft_max_s": round(many_max, 4),
        "panes_ttft_mean_s": round(many_mean, 4),
        "ttft_max_ratio": round(many_max / one_ttft, 3),
        "ttft_mean_ratio": round(many_mean / one_ttft, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--case", choices=("all", "chat", "broadcast"), default="all")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--panes", type=int, default=4)
    parser.add_argument("--stagger", type=float, default=0.5)
    parser.add_argument("--history-turns", type=int, default=7,
                        help="earlier turns in the broadcast conversation (7: about 1,000 tokens)")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each measurement; the best counts")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()
    if args.panes < 1 or args.repeats < 1 or args.history_turns < 0:
        parser.error("--panes and --repeats must be at least 1, --history-turns at least 0")
    load_at_start = load_average()
    result: dict[str, object] = {"panes": args.panes}
    with Engine("default", device=args.device, dtype=args.dtype) as engine:
        if args.case in ("all", "chat"):
            result["chat"] = chat_case(engine, args)
        if args.case in ("all", "broadcast"):
            result["broadcast"] = broadcast_case(engine, args)
        result["weights"] = engine.stats().weights
    cpu = cpu_description()
    result["cpu"] = {"model": cpu["model"], "flags": cpu["flags"]}
    result["load_average"] = {"start": load_at_start, "end": load_average()}
    result["machine"] = machine()
    print(json.dumps(result))
    if "broadcast" in result:
        b = result["broadcast"]
        print(
            f"broadcast to {args.panes} panes, {b['prompt_tokens']} tokens, cold cache: "  # type: ignore[index]
            f"prompt tokens computed {b['computed_ratio']}x one pane (goal <= 1.25x), "  # type: ignore[index]
            f"first tokens {b['ttft_max_ratio']}x (goal <= 1.3x, issue 20)",  # type: ignore[index]
            file=sys.stderr,
        )
    print(machine_line(result["machine"]), file=sys.stderr)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
