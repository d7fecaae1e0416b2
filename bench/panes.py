"""Four panes at once vs one pane alone: wall time ratio.

    .venv/bin/python bench/panes.py [--new-tokens 64]

Greedy, 64 new tokens per pane; four requests started together, and four
started 0.5 s apart (a user sending to panes one after another), against one
request alone. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import chat_prompts, machine  # noqa: E402
from engine import Engine, SamplingParams  # noqa: E402


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--panes", type=int, default=4)
    parser.add_argument("--stagger", type=float, default=0.5)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()
    params = SamplingParams(temperature=0.0, max_tokens=args.new_tokens, ignore_eos=True)
    with Engine("default", device=args.device, dtype=args.dtype) as engine:
        run(engine, 2, 0.0, SamplingParams(temperature=0.0, max_tokens=8))  # warm-up
        one = min(run(engine, 1, 0.0, params) for _ in range(3))
        together = min(run(engine, args.panes, 0.0, params) for _ in range(3))
        staggered = min(run(engine, args.panes, args.stagger, params) for _ in range(3))
    print(json.dumps({
        "one_s": round(one, 3),
        "together_s": round(together, 3),
        "staggered_s": round(staggered, 3),
        "together_ratio": round(together / one, 3),
        "staggered_ratio": round(staggered / one, 3),
        # The last pane started (panes-1)*stagger after the first: its own time.
        "staggered_last_pane_ratio": round((staggered - (args.panes - 1) * args.stagger) / one, 3),
        "panes": args.panes,
        "stagger_s": args.stagger,
        "machine": machine(),
    }))


if __name__ == "__main__":
    main()
