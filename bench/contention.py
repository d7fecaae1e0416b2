"""Decode speed beside a busy process, per CPU thread policy.

    .venv/bin/python bench/contention.py [--policies adaptive,cores,cores-1,passive] [--repeats 3]

A desktop shares its cores with the GUI and other programs. For each policy
this starts a fresh process (OpenMP settings only take effect before torch
loads its runtime), which loads the engine and measures greedy decode tok/s
at B=1 and B=16, quiet and then beside one busy process (a Python loop it
starts and kills itself), alternating `--repeats` times. Prints one JSON
object: per policy, the figures of every repeat and the loaded/quiet ratio
of the medians. The machine must otherwise be idle for the quiet figures to
mean anything.

Policies: "adaptive" (the engine's default, engine/runner/threads.py),
"cores" (one thread per core, fixed: PyTorch's default and the engine's
before), "cores-1" (fixed), "passive" (one per core with OMP_WAIT_POLICY=PASSIVE);
`--deterministic` measures the engine's deterministic mode instead of the
default one (its thread count is fixed at one per core).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BUSY = "while True: pass"


def policy_env(policy: str) -> dict[str, str]:
    env = dict(os.environ)
    if policy == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    return env


def worker(args: argparse.Namespace) -> None:
    """One policy in this process: prints one JSON line of measurements."""
    from bench.throughput import tandem_run
    from engine import Engine
    from engine.runner.threads import available_cores

    cores = available_cores()
    threads = {"adaptive": None, "cores": cores, "cores-1": max(1, cores - 1), "passive": cores}[
        args.worker
    ]
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    runs: dict[str, dict[str, list[float]]] = {
        "quiet": {str(b): [] for b in sizes},
        "loaded": {str(b): [] for b in sizes},
    }
    with Engine(
        "default", device="cpu", dtype=args.dtype, threads=threads,
        deterministic=args.deterministic,
    ) as engine:
        tandem_run(engine, 2, 8)  # warm-up
        for _ in range(args.repeats):
            for state in ("quiet", "loaded"):
                busy = None
                if state == "loaded":
                    busy = subprocess.Popen([sys.executable, "-c", BUSY])
                    time.sleep(0.5)
                try:
                    for b in sizes:
                        runs[state][str(b)].append(round(tandem_run(engine, b, args.new_tokens)[0], 1))
                finally:
                    if busy is not None:
                        busy.kill()
                        busy.wait()
        dtype = str(engine.dtype).removeprefix("torch.")
    print(json.dumps({"runs": runs, "dtype": dtype, "threads": threads, "cores": cores}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policies", default="adaptive,cores,cores-1,passive")
    parser.add_argument("--batch-sizes", default="1,16")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--deterministic", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    result: dict = {
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "deterministic": args.deterministic,
        "load_before": os.getloadavg()[0],
        "policies": {},
    }
    for policy in args.policies.split(","):
        cmd = [
            sys.executable, __file__, "--worker", policy, "--batch-sizes", args.batch_sizes,
            "--new-tokens", str(args.new_tokens), "--repeats", str(args.repeats),
            "--dtype", args.dtype,
        ] + (["--deterministic"] if args.deterministic else [])
        done = subprocess.run(cmd, env=policy_env(policy), capture_output=True, text=True, check=False)
        if done.returncode != 0:
            result["policies"][policy] = {"error": done.stderr.strip().splitlines()[-1:]}
            continue
        measured = json.loads(done.stdout.strip().splitlines()[-1])
        runs = measured.pop("runs")
        quiet = {b: statistics.median(v) for b, v in runs["quiet"].items()}
        loaded = {b: statistics.median(v) for b, v in runs["loaded"].items()}
        result["policies"][policy] = {
            **measured,
            "quiet_tok_s": runs["quiet"],
            "loaded_tok_s": runs["loaded"],
            "loaded_over_quiet": {b: round(loaded[b] / quiet[b], 2) for b in quiet},
        }
        # Progress on stderr, so a long run's finished policies are not lost.
        print(policy, json.dumps(result["policies"][policy]), file=sys.stderr, flush=True)
    result["load_after"] = os.getloadavg()[0]
    from bench.common import machine

    result["machine"] = machine()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
