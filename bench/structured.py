"""The cost of grammar-constrained decoding: constrained against free decode, in one run.

    .venv/bin/python bench/structured.py [--new-tokens 64] [--repeats 3] [--threads N]

The default model, greedy, short distinct chat prompts. Each batch runs
free (no constraint), constrained (every request under one JSON schema) and,
at B=16, mixed (8 constrained + 8 free), the kinds taking turns, each the
best of --repeats. The schema is an object holding an array of at least 50
short strings, so no constrained reply can end before --new-tokens, and the
free replies ignore their end token: every run decodes the same number of
tokens. Decode speed is decoded tokens over the time from the batch's last
first token to its end (the prefill is not in it).

Beside the speeds: per constrained step, how long llguidance computed the
masks (on the mask worker's thread, while the forward ran) and how long the
engine thread then still waited for them after the logits existed: the part
the overlap did not hide.

Prints one JSON object on stdout and a readable report with the CPU line on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import OtherLoad, chat_prompts, machine, machine_line, usable_cores  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "notes": {"type": "array", "items": {"type": "string", "maxLength": 40}, "minItems": 50},
    },
    "required": ["notes"],
    "additionalProperties": False,
}


def decode_speed(engine, batch: int, constrained: int, new_tokens: int) -> float:
    """Decode tokens per second of `batch` requests, the first `constrained` of them under SCHEMA."""
    from engine import SamplingParams
    from engine.structured import Constraint

    free = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    bound = SamplingParams(
        temperature=0.0, max_tokens=new_tokens, constraint=Constraint("json_schema", json.dumps(SCHEMA))
    )
    engine.reset_prefix_cache()
    params = [bound] * constrained + [free] * (batch - constrained)
    outputs = engine.generate_outputs(chat_prompts(batch), params)
    end = time.perf_counter()
    if any(len(o.token_ids) != new_tokens for o in outputs):
        raise RuntimeError("a reply ended early: the runs would not decode the same tokens")
    first = max(o.metrics.first_token_time for o in outputs)
    return sum(len(o.token_ids) - 1 for o in outputs) / (end - first)


class MaskTimes:
    """Times the mask worker's computing and the engine thread's waiting for it
    (bench-only wrappers around engine.structured.token_masks)."""

    def __init__(self) -> None:
        self.compute_s = 0.0
        self.wait_s = 0.0
        self.steps = 0

    def install(self, engine) -> None:
        from engine.structured import token_masks

        times = self
        result = token_masks.PendingMasks.result

        def timed_result(pending):
            start = time.perf_counter()
            try:
                return result(pending)
            finally:
                times.wait_s += time.perf_counter() - start
                times.steps += 1

        token_masks.PendingMasks.result = timed_result

        class TimedExecutor:
            def __init__(self, executor) -> None:
                self.executor = executor

            def unsafe_compute_mask_ptr(self, *args):
                start = time.perf_counter()
                try:
                    return self.executor.unsafe_compute_mask_ptr(*args)
                finally:
                    times.compute_s += time.perf_counter() - start

        worker = engine.run_on_engine_thread(lambda: engine._core.mask_worker)
        worker._executor = TimedExecutor(worker._executor)

    def reset(self) -> None:
        self.compute_s = self.wait_s = 0.0
        self.steps = 0

    def per_step_ms(self) -> dict[str, float]:
        steps = max(self.steps, 1)
        return {"compute_ms": round(1000 * self.compute_s / steps, 3),
                "wait_ms": round(1000 * self.wait_s / steps, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=usable_cores())
    args = parser.parse_args()

    from engine import Engine
    from engine.structured import Constraint

    engine = Engine("default", threads=args.threads)
    engine.check_constraint(Constraint("json_schema", json.dumps(SCHEMA)))  # compiled once, outside the runs
    runs = {"B=1 free": (1, 0), "B=1 constrained": (1, 1),
            "B=16 free": (16, 0), "B=16 constrained": (16, 16), "B=16 mixed 8+8": (16, 8)}
    best = {name: 0.0 for name in runs}
    masks = MaskTimes()
    mask_times: dict[str, dict[str, float]] = {}
    with OtherLoad() as other:
        decode_speed(engine, 16, 8, 8)  # warm: the mask worker, the grammar tokenizer, the kernels
        masks.install(engine)
        for _ in range(args.repeats):
            for name, (batch, constrained) in runs.items():
                masks.reset()
                best[name] = max(best[name], decode_speed(engine, batch, constrained, args.new_tokens))
                if constrained:
                    mask_times[name] = masks.per_step_ms()
    cost = {
        "B=1 constrained": 1 - best["B=1 constrained"] / best["B=1 free"],
        "B=16 constrained": 1 - best["B=16 constrained"] / best["B=16 free"],
        "B=16 mixed 8+8": 1 - best["B=16 mixed 8+8"] / best["B=16 free"],
    }
    report = {
        "machine": machine(args.threads),
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "decode_tokens_per_s": {k: round(v, 1) for k, v in best.items()},
        "cost": {k: round(v, 3) for k, v in cost.items()},
        "masks_per_step": mask_times,
        **other.summary(),
    }
    print(json.dumps(report, indent=2))
    print(machine_line(report["machine"]), file=sys.stderr)
    for name, speed in best.items():
        extra = f"  (costs {cost[name]:.1%} against free)" if name in cost else ""
        if name in mask_times:
            extra += (f"; masks {mask_times[name]['compute_ms']:.2f} ms computed, "
                      f"{mask_times[name]['wait_ms']:.2f} ms waited per step")
        print(f"{name:>18}: {speed:7.1f} tok/s{extra}", file=sys.stderr)
    verdict = "PASS" if cost["B=16 constrained"] <= 0.10 and cost["B=16 mixed 8+8"] <= 0.10 else "FAIL"
    print(f"{verdict}: constrained decode costs at most 10% at B=16", file=sys.stderr)


if __name__ == "__main__":
    main()
