"""Decode and prefill throughput of the engine vs Hugging Face transformers.

    .venv/bin/python bench/throughput.py [--batch-sizes 1,4,16,32] [--new-tokens 64] [--deterministic]
                                         [--memory] [--variants quantized,bfloat16]

Greedy, short chat prompts, the default model, as each of --variants in
turn (default: its quantized blocks on the native kernels, reported as
"tandem", then dequantized to bf16; ratios between them). Prints one JSON
object, with each engine's resident memory (`rss_mb`, MiB: at start, after the runs, the
peak, and the KV pool's committed and total size; with --memory also after a
2k-token chat and with the pool full) where /proc reports it.
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


def resident_mb(field: str = "VmRSS") -> float | None:
    """This process's resident memory (VmRSS) or its peak (VmHWM), in MiB;
    None where /proc is not there to say."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def memory_phases(engine: Engine, rss: dict) -> None:
    """Resident memory after a chat grown to about 2,000 tokens, and once the
    KV pool has been filled (distinct long prompts, kept as cached prefixes
    until every page has been used)."""
    from bench.multiturn import message

    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    turns: list[dict[str, str]] = []
    tokens = 0
    while tokens < 2000:
        turns.append({"role": "user", "content": message(len(turns) // 2)})
        out = engine.generate_outputs([turns], params)[0]
        turns.append({"role": "assistant", "content": out.text})
        tokens = len(out.prompt_token_ids) + len(out.token_ids)
    rss["chat_2k"] = resident_mb()
    rss["chat_2k_tokens"] = tokens
    rss["kv_committed_chat_2k"] = round(engine.stats().kv_bytes_committed / (1 << 20), 1)
    one = SamplingParams(temperature=0.0, max_tokens=1)
    filler, committed = 0, -1
    # Stops early if the pool stops growing (the prefix cache is off).
    while committed < engine.stats().kv_bytes_committed < engine.stats().kv_bytes_total:
        committed = engine.stats().kv_bytes_committed
        text = f"({filler}) " + " ".join(message(filler + i) for i in range(12))
        engine.generate_outputs([[{"role": "user", "content": text}]], one)
        filler += 1
    rss["kv_committed_pool_full"] = round(engine.stats().kv_bytes_committed / (1 << 20), 1)
    rss["pool_full"] = resident_mb()


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


VARIANTS = {
    # name: Engine keyword arguments
    "quantized": {"dtype": "float32", "quantized": "kernel"},  # the folder's q4_1/q8_0 blocks, native kernels
    "bfloat16": {"dtype": "bfloat16", "quantized": "dequantize"},
    "float32": {"dtype": "float32", "quantized": "dequantize"},
    "auto": {},  # what the app runs: Engine defaults
}


def run_variant(name: str, args: argparse.Namespace, sizes: list[int], result: dict) -> Path:
    options = dict(VARIANTS[name])
    if args.dtype != "auto" and name == "auto":
        options["dtype"] = args.dtype
    key = "tandem" if name == args.variants.split(",")[0] else f"tandem_{name}"
    with Engine(
        "default", device=args.device, deterministic=args.deterministic, threads=args.threads, **options,
    ) as engine:
        info = {
            "variant": name,
            "dtype": str(engine.dtype).removeprefix("torch."),
            "weights": engine.stats().weights,
        }
        result["deterministic"] = engine.deterministic
        result["device"] = engine.device.type
        folder = engine.model_path
        rss: dict = {"start": resident_mb()}
        if args.memory:
            memory_phases(engine, rss)
        tandem_run(engine, 2, 8)  # warm-up
        decode, prefill = {}, {}
        for b in sizes:
            runs = [tandem_run(engine, b, args.new_tokens) for _ in range(args.repeats)]
            decode[str(b)] = round(max(r[0] for r in runs), 1)
            prefill[str(b)] = round(max(r[1] for r in runs), 1)
        result["decode_tok_s"][key] = decode
        result["prefill_tok_s"][key] = prefill
        if args.cpu_time:
            result.setdefault("decode_cpu_ms_per_token", {})[key] = {
                str(b): round(min(tandem_cpu_ms_per_token(engine, b, args.new_tokens)
                                  for _ in range(args.repeats)), 2)
                for b in sizes
            }
        rss["after_runs"] = resident_mb()
        rss["peak"] = resident_mb("VmHWM")
        stats = engine.stats()
        rss["kv_committed"] = round(stats.kv_bytes_committed / (1 << 20), 1)
        rss["kv_total"] = round(stats.kv_bytes_total / (1 << 20), 1)
        info["rss_mb"] = rss
        result["engines"][key] = info
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch-sizes", default="1,4,16,32")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto", help="dtype of the 'auto' variant")
    parser.add_argument(
        "--variants", default="quantized,bfloat16",
        help=f"engines to measure, one after the other in this run: {', '.join(VARIANTS)} "
        "(the first is reported as 'tandem')",
    )
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
    parser.add_argument(
        "--memory", action="store_true",
        help="also measure resident memory after a 2k-token chat and with the KV pool full",
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")

    result: dict = {"decode_tok_s": {}, "prefill_tok_s": {}, "new_tokens": args.new_tokens, "engines": {}}
    folder = None
    for name in names:
        folder = run_variant(name, args, sizes, result)
    first = result["decode_tok_s"]["tandem"]
    for name in names[1:]:
        other = result["decode_tok_s"][f"tandem_{name}"]
        result[f"ratio_vs_tandem_{name}"] = {b: round(first[b] / other[b], 2) for b in other}

    if not args.no_transformers:
        import tempfile

        from transformers import AutoModelForCausalLM, AutoTokenizer

        from engine.formats.loader import dequantized_copy

        with tempfile.TemporaryDirectory() as tmp:
            hf_folder = dequantized_copy(folder, Path(tmp) / "float")
            tokenizer = AutoTokenizer.from_pretrained(hf_folder)
            tokenizer.padding_side = "left"
            if tokenizer.pad_token_id is None:
                tokenizer.pad_token = tokenizer.eos_token
            device = "cuda" if result["device"] == "cuda" else "cpu"
            for name, dtype in (("transformers_bf16", torch.bfloat16), ("transformers_fp32", torch.float32)):
                model = AutoModelForCausalLM.from_pretrained(hf_folder, dtype=dtype).to(device).eval()
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
