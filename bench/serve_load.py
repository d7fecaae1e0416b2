"""Load on the OpenAI-compatible server vs the engine's own throughput.

    .venv/bin/python bench/serve_load.py [--clients 16] [--requests-per-client 2] [--max-tokens 64]

Starts the server on a free 127.0.0.1 port (loopback only) and runs the same
workload twice on one engine: once as `--clients` concurrent streaming
clients (the official `openai` package, each sending its requests one after
another), once straight into the engine with the same concurrency, prompts
and sampling, no HTTP. Every request is greedy and generates exactly
--max-tokens tokens (ignore_eos), and the prefix cache is emptied before each
run, so both do the same work. The clients run in a separate process, as
real clients do, so that their own JSON parsing is not charged to the
server's interpreter. Prints one JSON object:

    clients, requests, errors, completion_tok_s (client side, aggregate),
    ttft_p50_s, ttft_p99_s (client side), engine_tok_s, engine_ttft_p50_s,
    ratio (completion_tok_s / engine_tok_s), wall_s, ...

--rounds N (default 2) runs each path N times in ABBA order and reports the
best of each, since other work on the machine slows whichever run it meets.
Bounded: --time-limit seconds for each run (default 600); requests still
running then count as errors.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import chat_prompts, machine  # noqa: E402
from engine import Engine, SamplingParams  # noqa: E402
from engine.entrypoints.openai.server import model_name_for, serve_in_thread  # noqa: E402


# First calls allocate and connect; this prompt is none of the measured ones.
WARM_UP = [{"role": "user", "content": "Warm up."}]


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 100])."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def _workload(clients: int, per_client: int) -> list[list[list[dict[str, str]]]]:
    prompts = chat_prompts(clients * per_client)
    return [prompts[c * per_client : (c + 1) * per_client] for c in range(clients)]


async def http_run(base_url: str, model: str, work: list[list[Any]], max_tokens: int, limit: float) -> dict[str, Any]:
    import httpx
    import openai

    ttfts: list[float] = []
    tokens = 0
    errors: list[str] = []

    async def one_client(client: openai.AsyncOpenAI, prompts: list[Any]) -> None:
        nonlocal tokens
        for messages in prompts:
            sent = time.perf_counter()
            first = None
            usage = None
            try:
                stream = await client.chat.completions.create(
                    model=model, messages=messages, temperature=0, max_tokens=max_tokens, stream=True,
                    stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
                )
                async for chunk in stream:
                    if first is None and chunk.choices and chunk.choices[0].delta.content:
                        first = time.perf_counter()
                    if chunk.usage is not None:
                        usage = chunk.usage
            except Exception as exc:  # counted, and the client goes on
                errors.append(f"{type(exc).__name__}: {exc}")
                continue
            if usage is None or usage.completion_tokens != max_tokens:
                errors.append(f"incomplete reply: {usage}")
                continue
            tokens += usage.completion_tokens
            if first is not None:
                ttfts.append(first - sent)

    limits = httpx.Limits(max_connections=len(work) + 4, max_keepalive_connections=len(work) + 4)
    async with openai.AsyncOpenAI(
        base_url=base_url, api_key="bench", max_retries=0, timeout=limit,
        http_client=openai.DefaultAsyncHttpxClient(limits=limits),
    ) as client:
        start = time.perf_counter()
        tasks = [asyncio.ensure_future(one_client(client, prompts)) for prompts in work]
        _, pending = await asyncio.wait(tasks, timeout=limit)
        for task in pending:
            task.cancel()
        wall = time.perf_counter() - start
    missing = sum(len(p) for p in work) - len(ttfts) - len(errors)
    errors += ["timed out"] * max(0, missing)
    return {"wall_s": wall, "tokens": tokens, "ttfts": ttfts, "errors": errors}


async def engine_run(engine: Engine, work: list[list[Any]], max_tokens: int, limit: float) -> dict[str, Any]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    ttfts: list[float] = []
    tokens = 0

    async def one_client(prompts: list[Any]) -> None:
        nonlocal tokens
        for messages in prompts:
            async for _, event in engine.events_async(messages, params):
                if event.output is not None:
                    tokens += len(event.output.token_ids)
                    ttfts.append(event.output.metrics.time_to_first_token or 0.0)

    start = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(one_client(p) for p in work)), timeout=limit)
    return {"wall_s": time.perf_counter() - start, "tokens": tokens, "ttfts": ttfts}


def drive(args: argparse.Namespace) -> None:
    """The client process: run the HTTP workload against --drive URL, print its raw figures."""
    work = _workload(args.clients, args.requests_per_client)
    asyncio.run(http_run(args.drive, args.served_model, [[WARM_UP]], 4, args.time_limit))
    print(json.dumps(asyncio.run(http_run(args.drive, args.served_model, work, args.max_tokens, args.time_limit))))


def _run_clients(base_url: str, model: str, args: argparse.Namespace) -> dict[str, Any]:
    command = [
        sys.executable, str(Path(__file__).resolve()), "--drive", base_url, "--served-model", model,
        "--clients", str(args.clients), "--requests-per-client", str(args.requests_per_client),
        "--max-tokens", str(args.max_tokens), "--time-limit", str(args.time_limit),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=2 * args.time_limit + 120)
    if done.returncode != 0:
        raise SystemExit(f"the client process failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--model", default="default")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--time-limit", type=float, default=600.0, help="seconds per run")
    parser.add_argument("--rounds", type=int, default=2,
                        help="runs of each path, in ABBA order; the best of each is reported")
    parser.add_argument("--drive", default=None, help=argparse.SUPPRESS)  # the client process
    parser.add_argument("--served-model", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.drive:
        drive(args)
        return
    if min(args.clients, args.requests_per_client, args.max_tokens, args.rounds) < 1:
        parser.error("--clients, --requests-per-client, --max-tokens and --rounds must be at least 1")

    work = _workload(args.clients, args.requests_per_client)
    with Engine(args.model, device=args.device, dtype=args.dtype) as engine:
        model = model_name_for(engine)
        with serve_in_thread(engine, model, host="127.0.0.1", port=0) as server:
            asyncio.run(engine_run(engine, [[WARM_UP]], 4, args.time_limit))
            directs: list[dict[str, Any]] = []
            serveds: list[dict[str, Any]] = []
            # ABBA order over the rounds, so that a machine getting busier or
            # quieter during the run does not favour one path.
            for r in range(args.rounds):
                for path in ("engine", "http") if r % 2 == 0 else ("http", "engine"):
                    engine.reset_prefix_cache()
                    if path == "engine":
                        directs.append(asyncio.run(engine_run(engine, work, args.max_tokens, args.time_limit)))
                    else:
                        serveds.append(_run_clients(server.base_url, model, args))
        # Best of the rounds for each path (the least disturbed run), as bench/throughput.py does.
        direct = max(directs, key=lambda d: d["tokens"] / d["wall_s"])
        served = max(serveds, key=lambda d: d["tokens"] / d["wall_s"] if not d["errors"] else 0.0)

        completion_tok_s = served["tokens"] / served["wall_s"]
        engine_tok_s = direct["tokens"] / direct["wall_s"]
        result = {
            "clients": args.clients,
            "requests": sum(len(p) for p in work),
            "errors": sum(len(d["errors"]) for d in serveds),  # every round's
            "completion_tok_s": round(completion_tok_s, 1),
            "ttft_p50_s": _round(percentile(served["ttfts"], 50)),
            "ttft_p99_s": _round(percentile(served["ttfts"], 99)),
            "engine_tok_s": round(engine_tok_s, 1),
            "engine_ttft_p50_s": _round(percentile(direct["ttfts"], 50)),
            "engine_ttft_p99_s": _round(percentile(direct["ttfts"], 99)),
            "ratio": round(completion_tok_s / engine_tok_s, 3) if engine_tok_s else None,
            "rounds": args.rounds,
            "all_tok_s": {
                "http": [round(d["tokens"] / d["wall_s"], 1) for d in serveds],
                "engine": [round(d["tokens"] / d["wall_s"], 1) for d in directs],
            },
            "max_tokens": args.max_tokens,
            "wall_s": {"http": round(served["wall_s"], 2), "engine": round(direct["wall_s"], 2)},
            "device": engine.device.type,
            "dtype": str(engine.dtype).removeprefix("torch."),
            "machine": machine(),
        }
        errors = [e for d in serveds for e in d["errors"]]
        if errors:
            result["first_errors"] = errors[:3]
    print(json.dumps(result))


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


if __name__ == "__main__":
    main()
