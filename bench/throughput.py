"""Decode and prefill throughput of the engine vs Hugging Face transformers.

    .venv/bin/python bench/throughput.py [--batch-sizes 1,4,16,32] [--new-tokens 64] [--deterministic]

Greedy, short chat prompts, the default model. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import chat_prompts, machine  # noqa: E402
from engine import Engine, SamplingParams  # noqa: E402


def tandem_run(engine: Engine, batch: int, new_tokens: int) -> tuple[float, float]:
    """(decode tok/s, prefill tok/s) for one batch, prefix cache emptied first."""
    engine.reset_prefix_cache()
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    start = time.perf_counter()
    outputs = engine.generate_outputs(chat_prompts(batch), params)
    end = time.perf_counter()
    first = max(o.metrics.first_token_time for o in outputs)
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    decoded = sum(len(o.token_ids) - 1 for o in outputs)
    return decoded / (end - first), prompt_tokens / (first - start)


def tandem_cpu_ms_per_token(engine: Engine, batch: int, new_tokens: int) -> float:
    """CPU time of this process per decoded token (prefill subtracted by a
    1-token run). Unlike wall time, it holds on a busy machine: the work the
    engine does, not how long it waited for a core."""

    def cpu(n: int) -> float:
        engine.reset_prefix_cache()
        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        start = time.process_time()
        engine.generate_outputs(chat_prompts(batch), params)
        return time.process_time() - start

    return 1000 * (cpu(new_tokens + 1) - cpu(1)) / (batch * new_tokens)


def transformers_run(model, tokenizer, batch: int, new_tokens: int) -> tuple[float, float]:
    texts = [
        tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False)
        for p in chat_prompts(batch)
    ]
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    enc = enc.to(model.device)
    prompt_tokens = int(enc["attention_mask"].sum())

    def timed(n: int) -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(
                **enc, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
            )
        return time.perf_counter() - start

    prefill = timed(1)
    total = timed(new_tokens)
    return batch * (new_tokens - 1) / (total - prefill), prompt_tokens / prefill


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch-sizes", default="1,4,16,32")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--repeats", type=int, default=2, help="best of N runs")
    parser.add_argument("--no-transformers", action="store_true")
    parser.add_argument(
        "--deterministic", action="store_true",
        help="measure the engine's deterministic (batch-invariant) mode",
    )
    parser.add_argument("--threads", type=int, default=None, help="fix the CPU thread count")
    parser.add_argument(
        "--cpu-time", action="store_true",
        help="also report CPU ms per decoded token (comparable on a busy machine with --threads 1)",
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.batch_sizes.split(",")]

    result: dict = {"decode_tok_s": {}, "prefill_tok_s": {}, "new_tokens": args.new_tokens}
    with Engine(
        "default", device=args.device, dtype=args.dtype,
        deterministic=args.deterministic, threads=args.threads,
    ) as engine:
        result["tandem_dtype"] = str(engine.dtype).removeprefix("torch.")
        result["deterministic"] = engine.deterministic
        result["device"] = engine.device.type
        folder = engine.model_path
        tandem_run(engine, 2, 8)  # warm-up
        decode, prefill = {}, {}
        for b in sizes:
            runs = [tandem_run(engine, b, args.new_tokens) for _ in range(args.repeats)]
            decode[str(b)] = round(max(r[0] for r in runs), 1)
            prefill[str(b)] = round(max(r[1] for r in runs), 1)
        result["decode_tok_s"]["tandem"] = decode
        result["prefill_tok_s"]["tandem"] = prefill
        if args.cpu_time:
            result["decode_cpu_ms_per_token"] = {
                str(b): round(min(tandem_cpu_ms_per_token(engine, b, args.new_tokens)
                                  for _ in range(args.repeats)), 2)
                for b in sizes
            }

    if not args.no_transformers:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(folder)
        tokenizer.padding_side = "left"
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        device = "cuda" if result["device"] == "cuda" else "cpu"
        for name, dtype in (("transformers_bf16", torch.bfloat16), ("transformers_fp32", torch.float32)):
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
            model.generation_config.eos_token_id = None  # always generate new_tokens
            transformers_run(model, tokenizer, 2, 8)
            decode, prefill = {}, {}
            for b in sizes:
                runs = [transformers_run(model, tokenizer, b, args.new_tokens) for _ in range(args.repeats)]
                decode[str(b)] = round(max(r[0] for r in runs), 1)
                prefill[str(b)] = round(max(r[1] for r in runs), 1)
            result["decode_tok_s"][name] = decode
            result["prefill_tok_s"][name] = prefill
            del model
        ref = result["decode_tok_s"]["transformers_bf16"]
        result["ratio_vs_transformers_bf16"] = {
            b: round(result["decode_tok_s"]["tandem"][b] / ref[b], 2) for b in ref
        }
    result["machine"] = machine()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
