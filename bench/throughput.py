"""Decode and prefill throughput of the engine against its peers, in one run.

    .venv/bin/python bench/throughput.py [--batch-sizes 1,4,16,32] [--new-tokens 64] [--llamacpp]
                                         [--variants quantized] [--repeats 2] [--processes 2]
                                         [--threads N | --adaptive-threads] [--deterministic] [--memory]

Greedy, 64 new tokens, short distinct chat prompts (about 40 tokens each), the
default model. The peers:

- Tandem, as each of --variants (default: the folder's q4_1/q8_0 blocks on
  the native kernels, reported as "tandem"; "float32", "bfloat16", "auto" are
  the same folder dequantized or the app's defaults);
- Hugging Face transformers on the same weights dequantized, in fp32 and bf16
  (--transformers-dtypes); "transformers_fastest" is the faster of them at
  each batch size, the peer the ratios and goals use;
- with --llamacpp, llama.cpp's `llama-batched-bench` on the very GGUF file the
  default model is imported from, with as many prompt tokens per sequence as
  Tandem's prompts have (built once per machine by bench/llamacpp.py).

Every peer runs in processes of its own (no peer inherits another's heap,
threads or warm caches), --processes times, the peers taking turns, and each
process keeps the best of --repeats runs: a figure is the best of
processes × repeats. Beside each run: the load average and how many cores
other programs kept busy during it (`other_busy_cores`), so a figure taken
beside someone's test run shows as such. All peers get the same thread count
(--threads, default the cores this process may use); --adaptive-threads lets
Tandem choose as the app does.

Also: this machine's read bandwidth (a sum over 1 GiB) over the bytes of
weights one decoded token reads gives the B=1 limit, and each peer's B=1 as a
share of it; the goals of issue 20 as PASS/FAIL lines. Prints one JSON object
on stdout and a readable report with the CPU line on stderr.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (  # noqa: E402
    OtherLoad, chat_prompts, gguf_bytes_per_token, machine, machine_line, read_bandwidth_gbs, usable_cores,
)


# --- Tandem, in a worker process ---------------------------------------------------------------

def tandem_run(engine, batch: int, new_tokens: int) -> tuple[float, float, int]:
    """(decode tok/s, prefill tok/s, prompt tokens shared) for one batch, prefix cache emptied first.

    Prefill counts the prompt tokens the engine computed: the chat template's
    system prompt is the same in every sequence, and a batch computes the
    pages they share once, where the peers compute every token. The tokens so
    shared are returned beside it."""
    from engine import SamplingParams

    engine.reset_prefix_cache()
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    computed_before = engine.stats().prompt_tokens_computed
    start = time.perf_counter()
    outputs = engine.generate_outputs(chat_prompts(batch), params)
    end = time.perf_counter()
    computed = engine.stats().prompt_tokens_computed - computed_before
    first = max(o.metrics.first_token_time for o in outputs)
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    decoded = sum(len(o.token_ids) - 1 for o in outputs)
    return decoded / (end - first), computed / (first - start), prompt_tokens - computed


def tandem_cpu_ms_per_token(engine, batch: int, new_tokens: int) -> float:
    """CPU time of this process per decoded token (prefill subtracted by a
    1-token run). Unlike wall time, it holds on a busy machine: the work the
    engine does, not how long it waited for a core."""
    from engine import SamplingParams

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


def memory_phases(engine, rss: dict) -> None:
    """Resident memory after a chat grown to about 2,000 tokens, and once the
    KV pool has been filled (distinct long prompts, kept as cached prefixes
    until every page has been used)."""
    from bench.multiturn import message
    from engine import SamplingParams

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


VARIANTS = {
    # name: Engine keyword arguments
    "quantized": {"dtype": "float32", "quantized": "kernel"},  # the folder's q4_1/q8_0 blocks, native kernels
    "bfloat16": {"dtype": "bfloat16", "quantized": "dequantize"},
    "float32": {"dtype": "float32", "quantized": "dequantize"},
    "auto": {},  # what the app runs: Engine defaults
}


def tandem_worker(name: str, args: argparse.Namespace, sizes: list[int]) -> dict:
    from engine import Engine

    options = dict(VARIANTS[name])
    if args.dtype != "auto" and name == "auto":
        options["dtype"] = args.dtype
    with Engine(
        args.model, device=args.device, deterministic=args.deterministic, threads=args.threads, **options,
    ) as engine:
        info: dict = {
            "variant": name,
            "dtype": str(engine.dtype).removeprefix("torch."),
            "weights": engine.stats().weights,
            "deterministic": engine.deterministic,
            "device": engine.device.type,
        }
        rss: dict = {"start": resident_mb()}
        if args.memory:
            memory_phases(engine, rss)
        tandem_run(engine, 2, 8)  # warm-up
        runs = {b: [tandem_run(engine, b, args.new_tokens) for _ in range(args.repeats)] for b in sizes}
        if args.cpu_time:
            info["decode_cpu_ms_per_token"] = {
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
    info["decode_tok_s"] = {str(b): round(max(r[0] for r in runs[b]), 1) for b in sizes}
    info["prefill_tok_s"] = {str(b): round(max(r[1] for r in runs[b]), 1) for b in sizes}
    info["prompt_tokens_shared"] = {str(b): runs[b][0][2] for b in sizes}
    return info


# --- transformers, in a worker process ---------------------------------------------------------

def transformers_run(model, tokenizer, batch: int, new_tokens: int) -> tuple[float, float]:
    import torch

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


TRANSFORMERS_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def transformers_worker(dtype_name: str, args: argparse.Namespace, sizes: list[int]) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.hf_folder)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    device = "cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu"
    model = AutoModelForCausalLM.from_pretrained(args.hf_folder, dtype=getattr(torch, dtype_name))
    model = model.to(device).eval()
    model.generation_config.eos_token_id = None  # always generate new_tokens
    transformers_run(model, tokenizer, 2, 8)  # warm-up
    runs = {b: [transformers_run(model, tokenizer, b, args.new_tokens) for _ in range(args.repeats)] for b in sizes}
    return {
        "dtype": dtype_name,
        "attention": getattr(model.config, "_attn_implementation", None),
        "threads": torch.get_num_threads(),
        "device": device,
        "decode_tok_s": {str(b): round(max(r[0] for r in runs[b]), 1) for b in sizes},
        "prefill_tok_s": {str(b): round(max(r[1] for r in runs[b]), 1) for b in sizes},
    }


# --- the run: peers in their own processes, taking turns ---------------------------------------

def worker_command(spec: str, args: argparse.Namespace, hf_folder: Path | None) -> list[str]:
    command = [
        sys.executable, str(Path(__file__).resolve()), "--worker", spec,
        "--batch-sizes", args.batch_sizes, "--new-tokens", str(args.new_tokens),
        "--repeats", str(args.repeats), "--device", args.device, "--dtype", args.dtype,
        "--model", args.model,
    ]
    if args.threads and not (args.adaptive_threads and spec.startswith("tandem:")):
        command += ["--threads", str(args.threads)]
    for flag in ("deterministic", "memory", "cpu_time"):
        if getattr(args, flag) and spec.startswith("tandem:"):
            command.append("--" + flag.replace("_", "-"))
    if hf_folder is not None and spec.startswith("transformers:"):
        command += ["--hf-folder", str(hf_folder)]
    return command


def run_worker(spec: str, args: argparse.Namespace, hf_folder: Path | None) -> dict:
    """One peer's figures from a fresh process, with the machine's load during it."""
    with OtherLoad() as other:
        done = subprocess.run(worker_command(spec, args, hf_folder), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{spec} failed:\n{done.stderr[-3000:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    figures.update(other.summary())
    return figures


def run_llamacpp(args: argparse.Namespace, sizes: list[int], prompt_tokens: int) -> dict:
    from bench import llamacpp

    with OtherLoad() as other:
        rows = llamacpp.run_batched_bench(
            gguf_file(args.model), sizes, args.threads, prompt_tokens, args.new_tokens,
        )
    return {
        "threads": args.threads,
        "prompt_tokens": prompt_tokens,
        "decode_tok_s": {str(r.batch): r.decode_tok_s for r in rows},
        "prefill_tok_s": {str(r.batch): r.prefill_tok_s for r in rows},
        **other.summary(),
    }


def best_of(runs: list[dict]) -> dict:
    """Per batch size, the best decode and the best prefill over the runs; the
    other fields of the run with the best decode at the largest batch."""
    sizes = runs[0]["decode_tok_s"].keys()
    best = dict(max(runs, key=lambda r: r["decode_tok_s"][max(sizes, key=int)]))
    for kind in ("decode_tok_s", "prefill_tok_s"):
        best[kind] = {b: max(r[kind][b] for r in runs) for b in sizes}
    best["runs"] = [
        {"decode_tok_s": r["decode_tok_s"], "other_busy_cores": r.get("other_busy_cores"),
         "load_average_before": r.get("load_average_before")}
        for r in runs
    ]
    return best


def gguf_file(model: str) -> Path:
    """The GGUF file of --model: the default model's, or the file named."""
    from engine.formats.default_model import default_gguf_path

    return default_gguf_path() if model == "default" else Path(model)


def mean_prompt_tokens(batch: int, model: str = "default") -> int:
    """Tokens per prompt of Tandem's chat prompts, by its tokenizer: llama.cpp gets as many."""
    from engine.formats.default_model import resolve_model
    from engine.model.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_folder(resolve_model(model))
    lengths = [len(tokenizer.encode_chat(p)) for p in chat_prompts(batch)]
    return round(sum(lengths) / len(lengths))


def goals(result: dict) -> list[dict]:
    """Issue 20's throughput goals that this run's figures can decide."""
    tandem = result["decode_tok_s"].get("tandem", {})
    out: list[dict] = []

    def check(text: str, value: float | None, target: float) -> None:
        if value is not None:
            out.append({"goal": text, "value": round(value, 2), "target": target, "pass": value >= target})

    llama = result.get("ratio_vs_llamacpp", {})
    fastest = result.get("ratio_vs_transformers_fastest", {})
    check("B=1 decode >= 1.2x llama.cpp", llama.get("1"), 1.2)
    share = result.get("b1_share_of_read_limit", {}).get("tandem")
    check("B=1 decode >= 50% of the read-bandwidth limit", share, 50.0)
    check("B=4 decode >= 1.5x llama.cpp", llama.get("4"), 1.5)
    check("B=16 decode >= 2x llama.cpp", llama.get("16"), 2.0)
    check("B=16 decode >= 2x the fastest transformers", fastest.get("16"), 2.0)
    if "16" in tandem and "32" in tandem:
        check("B=32 decode >= B=16 (ratio)", tandem["32"] / tandem["16"], 1.0)
    return out


def ratio(a: dict, b: dict) -> dict:
    return {k: round(a[k] / b[k], 2) for k in b if k in a and b[k]}


# Other programs' average busy cores above which a run is not a quiet one: on two
# cores, a neighbour using a tenth of one already stalls a thread at barriers.
QUIET_CORES = 0.1


def report(result: dict) -> str:
    """The JSON's figures as a reader wants them: tables, ratios, goals, the CPU line."""
    sizes = list(result["decode_tok_s"]["tandem"])
    lines = [f"machine: {machine_line(result['machine'])}"]
    limit = result.get("read_limit")
    if limit:
        lines.append(
            f"read bandwidth {limit['read_bandwidth_gbs']} GB/s (sum over 1 GiB, {limit['threads']} threads, "
            f"best of 5); {limit['weight_bytes_per_token'] / 1e6:.1f} MB of weights read per token "
            f"-> B=1 limit {limit['b1_limit_tok_s']} tok/s (other busy cores meanwhile: {limit['other_busy_cores']})"
        )
    width = max(len(k) for k in result["decode_tok_s"]) + 2
    for kind in ("decode_tok_s", "prefill_tok_s"):
        lines.append(f"{kind:<{width}}" + "".join(f"{'B=' + b:>9}" for b in sizes) + "   other busy cores / load before")
        for peer, figures in result[kind].items():
            runs = result["engines"].get(peer, {}).get("runs", [])
            noise = ", ".join(
                f"{r['other_busy_cores']}/{(r['load_average_before'] or ['?'])[0]}" for r in runs
            )
            lines.append(f"{peer:<{width}}" + "".join(f"{figures.get(b, float('nan')):>9.1f}" for b in sizes)
                         + (f"   {noise}" if kind == "decode_tok_s" else ""))
    for key, value in result.items():
        if key.startswith("ratio_vs_"):
            lines.append(f"tandem / {key.removeprefix('ratio_vs_'):<{width - 9}}"
                         + "".join(f"{value.get(b, float('nan')):>9.2f}" for b in sizes))
    shared = result["engines"]["tandem"].get("prompt_tokens_shared")
    if shared and any(shared.values()):
        lines.append("tandem prefill counts computed tokens; prompt tokens shared in the batch, not computed: "
                     + ", ".join(f"B={b} {n}" for b, n in shared.items()))
    if "transformers_fastest" in result:
        lines.append("fastest transformers: " + ", ".join(f"B={b} {c}" for b, c in result["transformers_fastest"].items()))
    if "b1_share_of_read_limit" in result:
        lines.append("B=1 share of the read limit: " + ", ".join(
            f"{peer} {pct}%" for peer, pct in result["b1_share_of_read_limit"].items()))
    busy = {peer: info["other_busy_cores"] for peer, info in result["engines"].items()
            if (info.get("other_busy_cores") or 0) > QUIET_CORES}
    if busy:
        lines.append(f"NOT QUIET: other programs kept cores busy during the best runs of {busy}; "
                     "these figures are partly the neighbours'. Take final figures on an idle machine.")
    if "llamacpp_skipped" in result:
        lines.append(f"llama.cpp skipped: {result['llamacpp_skipped']}")
    for goal in result.get("goals", []):
        lines.append(f"{'PASS' if goal['pass'] else 'FAIL'}  {goal['goal']}: {goal['value']} (target {goal['target']})")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", default="1,4,16,32")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto", help="dtype of the 'auto' variant")
    parser.add_argument(
        "--variants", default="quantized",
        help=f"Tandem engines to measure: {', '.join(VARIANTS)} (the first is reported as 'tandem')",
    )
    parser.add_argument("--repeats", type=int, default=2, help="best of N runs within each process")
    parser.add_argument("--processes", type=int, default=2, help="fresh processes per peer, taking turns")
    parser.add_argument("--no-transformers", action="store_true")
    parser.add_argument("--transformers-dtypes", default="float32,bfloat16")
    parser.add_argument("--llamacpp", action="store_true",
                        help="also llama.cpp on the same GGUF (built once by bench/llamacpp.py)")
    parser.add_argument(
        "--deterministic", action="store_true",
        help="measure the engine's deterministic (batch-invariant) mode",
    )
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for every peer (default: the cores this process may use)")
    parser.add_argument("--adaptive-threads", action="store_true",
                        help="let Tandem choose its thread count per step, as the app does")
    parser.add_argument(
        "--cpu-time", action="store_true",
        help="also report CPU ms per decoded token (comparable on a busy machine with --threads 1)",
    )
    parser.add_argument(
        "--memory", action="store_true",
        help="also measure resident memory after a 2k-token chat and with the KV pool full",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # tandem:<variant> | transformers:<dtype>
    parser.add_argument("--hf-folder", help=argparse.SUPPRESS)
    parser.add_argument(
        "--model", default="default",
        help="a .gguf file to measure instead of the default model (every peer runs the same file)",
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.batch_sizes.split(",")]

    if args.worker:
        kind, _, name = args.worker.partition(":")
        figures = tandem_worker(name, args, sizes) if kind == "tandem" else transformers_worker(name, args, sizes)
        print(json.dumps(figures))
        return

    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    dtypes = [] if args.no_transformers else args.transformers_dtypes.split(",")
    unknown = [d for d in dtypes if d not in TRANSFORMERS_DTYPES]
    if unknown:
        parser.error(f"unknown transformers dtypes {unknown}; choose from {', '.join(TRANSFORMERS_DTYPES)}")
    args.threads = args.threads or usable_cores()

    import torch

    from engine.formats.default_model import resolve_model

    folder = resolve_model(args.model)
    result: dict = {"new_tokens": args.new_tokens, "decode_tok_s": {}, "prefill_tok_s": {}, "engines": {}}
    on_cpu = args.device == "cpu" or (args.device == "auto" and not torch.cuda.is_available())
    if on_cpu:
        threads = args.threads
        with OtherLoad() as other:
            bandwidth = read_bandwidth_gbs(threads)
        weight_bytes = gguf_bytes_per_token(gguf_file(args.model))
        result["read_limit"] = {
            "read_bandwidth_gbs": bandwidth, "threads": threads, "weight_bytes_per_token": weight_bytes,
            "b1_limit_tok_s": round(bandwidth * 1e9 / weight_bytes, 1), "other_busy_cores": other.cores,
        }

    peers: list[tuple[str, str]] = [
        ("tandem" if i == 0 else f"tandem_{n}", f"tandem:{n}") for i, n in enumerate(names)
    ]
    if args.llamacpp:
        from bench import llamacpp

        try:
            llamacpp.build()
            peers.append(("llamacpp", "llamacpp"))
            prompt_tokens = mean_prompt_tokens(max(sizes), args.model)
        except llamacpp.Unavailable as why:
            result["llamacpp_skipped"] = str(why)
            print(f"llama.cpp skipped: {why}", file=sys.stderr)
    peers += [(f"transformers_{TRANSFORMERS_DTYPES[d]}", f"transformers:{d}") for d in dtypes]

    runs: dict[str, list[dict]] = {key: [] for key, _ in peers}
    with tempfile.TemporaryDirectory() as tmp:
        hf_folder = None
        if dtypes:
            from engine.formats.loader import dequantized_copy

            hf_folder = dequantized_copy(folder, Path(tmp) / "float")
        for round_ in range(args.processes):
            for key, spec in peers:
                print(f"round {round_ + 1}/{args.processes}: {key}", file=sys.stderr)
                if spec == "llamacpp":
                    # One process per batched-bench run; as many runs as the others' repeats.
                    runs[key] += [run_llamacpp(args, sizes, prompt_tokens) for _ in range(args.repeats)]
                else:
                    runs[key].append(run_worker(spec, args, hf_folder))

    for key, _ in peers:
        best = best_of(runs[key])
        result["decode_tok_s"][key] = best.pop("decode_tok_s")
        result["prefill_tok_s"][key] = best.pop("prefill_tok_s")
        result["engines"][key] = best

    tandem = result["decode_tok_s"]["tandem"]
    for key, _ in peers[1 : len(names)]:
        result[f"ratio_vs_{key}"] = ratio(tandem, result["decode_tok_s"][key])
    if "llamacpp" in runs:
        result["ratio_vs_llamacpp"] = ratio(tandem, result["decode_tok_s"]["llamacpp"])
        result["prefill_ratio_vs_llamacpp"] = ratio(result["prefill_tok_s"]["tandem"],
                                                    result["prefill_tok_s"]["llamacpp"])
    tf_keys = [key for key, spec in peers if spec.startswith("transformers:")]
    if tf_keys:
        fastest = {b: max(tf_keys, key=lambda k: result["decode_tok_s"][k][b]) for b in map(str, sizes)}
        result["transformers_fastest"] = fastest
        result["ratio_vs_transformers_fastest"] = {
            b: round(tandem[b] / result["decode_tok_s"][k][b], 2) for b, k in fastest.items()
        }
    if "read_limit" in result and "1" in tandem:
        limit = result["read_limit"]["b1_limit_tok_s"]
        # Only peers that read the file's quantized blocks: a float model reads 3.8-7x the bytes.
        readers = ["tandem"] if names[0] == "quantized" else []
        readers += ["llamacpp"] if "llamacpp" in runs else []
        result["b1_share_of_read_limit"] = {
            peer: round(100 * result["decode_tok_s"][peer]["1"] / limit, 1) for peer in readers
        }
    result["goals"] = goals(result)
    result["quiet"] = all((info.get("other_busy_cores") or 0) <= QUIET_CORES for info in result["engines"].values())
    result["machine"] = machine(args.threads)
    if args.adaptive_threads:
        result["machine"]["threads"] = f"adaptive (Tandem), {args.threads} (peers)"
    print(json.dumps(result))
    print(report(result), file=sys.stderr)


if __name__ == "__main__":
    main()
