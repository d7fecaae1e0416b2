"""The working tree's quantized products against a git revision's, in one process.

    .venv/bin/python bench/kernel_ab.py --base HEAD~1 [--cases q4_0:1152:6912,q8_0:3072:1024]
        [--rows 16] [--threads 1] [--copies 1] [--alternations 15]

Builds the kernels of `--base` (its engine/kernels/native sources, `git
show`) and of the working tree as the engine builds them (this CPU's
variant, engine.kernels.native.compile_library), loads both, and times the
same product with each in turn, --alternations times: the host's speed
moves between alternations, not within one, so the best of each side
compares code. Each case is `format:N:K` (N output columns, K inputs),
random weights, --rows rows of x. `--copies C` cycles through C different
weights of the case, so that with C times the weight's bytes above the
caches every call reads its weight from memory (a decode step's situation)
instead of from cache. Both builds must give the same bits (the kernels'
contract); a difference is reported and fails the run.

A case `attn:HQ:HKV:D:CONTEXT` times paged attention instead
(`native.paged_attention`): --rows sequences decoding one token each, their
contexts spread over CONTEXT +- 25%, HQ query and HKV key/value heads of D
dimensions, the fp16 KV cache in 16-token pages scattered over the pool
(a decode step's attention: Qwen3 0.6B is attn:16:8:128, Gemma 3 1B
attn:4:1:256).

Between two builds of unchanged code this host showed up to ~8% apart
(code layout), so a change worth keeping shows on several shapes beside an
unchanged format measured as a control.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.common import machine, machine_line  # noqa: E402
from engine.kernels import native  # noqa: E402
from engine.model.quant import RAW_BLOCK_FORMATS, pack_weight, quantize, random_raw_weight  # noqa: E402

NATIVE = "engine/kernels/native"


def base_sources(revision: str, into: Path) -> Path:
    for source in [*native.SOURCES, *native.HEADERS]:
        text = subprocess.run(["git", "-C", str(ROOT), "show", f"{revision}:{NATIVE}/{source.name}"],
                              check=True, capture_output=True).stdout
        (into / source.name).write_bytes(text)
    return into


def weight(fmt: str, n: int, k: int, gen: torch.Generator):
    if fmt in RAW_BLOCK_FORMATS:
        return pack_weight(random_raw_weight(fmt, n, k, gen))
    return pack_weight(quantize(torch.randn(n, k, generator=gen), fmt))


def compare(libs: dict, fmt: str, n: int, k: int, rows: int, copies: int, alternations: int) -> dict:
    gen = torch.Generator().manual_seed(n * 31 + k)
    weights = [weight(fmt, n, k, gen) for _ in range(copies)]
    x = torch.randn(rows, k, generator=gen)
    out = {name: torch.empty(rows, n) for name in libs}

    def call(name: str, lib, i: int) -> None:
        w = weights[i % copies]
        native.quant_matmul_into(fmt, x, w.data, w.scales, w.mins, None, out[name], lib=lib)

    best = best_times(libs, call, max(copies, 5), alternations)
    # each side's last call used the same weight
    return summary(f"{fmt}:{n}:{k}", rows, best, rows * n * k, torch.equal(out["base"], out["work"]))


def best_times(libs: dict, call, calls: int, alternations: int) -> dict[str, float]:
    """Each build's best time per call(name, lib, i) over `alternations` turns of `calls` calls."""
    best = {name: float("inf") for name in libs}
    for _ in range(alternations):
        for name, lib in libs.items():
            start = time.perf_counter()
            for i in range(calls):
                call(name, lib, i)
            best[name] = min(best[name], (time.perf_counter() - start) / calls)
    return best


def summary(case: str, rows: int, best: dict[str, float], macs: int, same: bool) -> dict:
    return {
        "case": case,
        "rows": rows,
        "base_us": round(best["base"] * 1e6, 1),
        "work_us": round(best["work"] * 1e6, 1),
        "work_over_base": round(best["work"] / best["base"], 3),
        "gmac_per_s_work": round(macs / best["work"] / 1e9, 1),
        "same_bits": same,
    }


def compare_attention(libs: dict, hq: int, hkv: int, d: int, context: int, rows: int, alternations: int) -> dict:
    gen = torch.Generator().manual_seed(hq * 1000 + d + context)
    page = 16
    lengths = [max(1, int(context * (0.75 + 0.5 * i / max(rows - 1, 1)))) for i in range(rows)]
    pages_each = [-(-n // page) for n in lengths]
    pool = sum(pages_each) + 8
    # Each sequence's pages scattered over the pool, as after a while of serving.
    order = torch.randperm(pool, generator=gen)
    page_table = torch.zeros(rows, max(pages_each), dtype=torch.int64)
    at = 0
    for s, n in enumerate(pages_each):
        page_table[s, :n] = order[at:at + n]
        at += n
    k_layer = torch.randn(pool * hkv, page, d, generator=gen).to(torch.float16)
    v_layer = torch.randn(pool * hkv, page, d, generator=gen).to(torch.float16)
    qkv = torch.randn(rows, (hq + 2 * hkv) * d, generator=gen)
    positions = torch.tensor([n - 1 for n in lengths], dtype=torch.int64)
    row_table = torch.arange(rows, dtype=torch.int64)
    out = {name: torch.empty(rows, hq * d) for name in libs}

    def call(name: str, lib, _i: int) -> None:
        native.paged_attention(qkv, hq, hkv, d, positions, row_table, page_table, k_layer, v_layer, page,
                               None, d ** -0.5, out[name], lib=lib)

    best = best_times(libs, call, 20, alternations)
    macs = 2 * hq * d * sum(lengths)
    return summary(f"attn:{hq}:{hkv}:{d}:{context}", rows, best, macs, torch.equal(out["base"], out["work"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="git revision whose kernels to compare with")
    parser.add_argument("--cases", default="q4_0:1152:6912,q4_0:3072:1024,q8_0:3072:1024,q5_0:3072:576")
    parser.add_argument("--rows", default="16", help="comma-separated row counts")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--copies", type=int, default=1, help="weights per case, cycled (>1: from memory)")
    parser.add_argument("--alternations", type=int, default=15)
    args = parser.parse_args()
    cases = []
    for case in args.cases.split(","):
        if case.startswith("attn:"):
            try:
                hq, hkv, d, context = (int(v) for v in case.split(":")[1:])
            except ValueError:
                parser.error(f"{case}: attn:HQ:HKV:D:CONTEXT")
            if hq % hkv or d % 8:
                parser.error(f"{case}: HQ a multiple of HKV, D of 8")
            cases.append(("attn", (hq, hkv, d, context), None))
            continue
        fmt, n, k = case.split(":")
        if fmt not in native.FORMAT_CODES or int(k) % native.BLOCK_WEIGHTS[fmt]:
            parser.error(f"{case}: a format of {sorted(native.FORMAT_CODES)} and inputs a multiple of its "
                         f"block ({native.BLOCK_WEIGHTS.get(fmt, '?')})")
        cases.append((fmt, int(n), int(k)))
    torch.set_num_threads(args.threads)
    variant = native.cpu_variant()
    with tempfile.TemporaryDirectory(prefix="tandem-kernel-ab-") as scratch:
        scratch = Path(scratch)
        (scratch / "base").mkdir()
        libs = {
            "base": native._bind(native.compile_library(variant, scratch / "base.so",
                                                        sources=base_sources(args.base, scratch / "base"))),
            "work": native._bind(native.compile_library(variant, scratch / "work.so")),
        }
        results = []
        for rows in (int(r) for r in args.rows.split(",")):
            for fmt, n, k in cases:
                if fmt == "attn":
                    result = compare_attention(libs, *n, rows, args.alternations)
                else:
                    result = compare(libs, fmt, n, k, rows, args.copies, args.alternations)
                results.append(result)
                print(f"{result['case']:>18} rows {rows:>3}: base {result['base_us']:>9.1f} us, "
                      f"work {result['work_us']:>9.1f} us, work/base {result['work_over_base']:.3f}"
                      f"{'' if result['same_bits'] else '  DIFFERENT BITS'}", file=sys.stderr)
    info = machine(args.threads)
    print(machine_line(info) + f", kernels {variant}, base {args.base}", file=sys.stderr)
    print(json.dumps({"base": args.base, "variant": variant, "copies": args.copies, "results": results,
                      "machine": info}, indent=1))
    if not all(result["same_bits"] for result in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
