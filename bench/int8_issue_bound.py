"""How near the AVX2 q8_0 tile runs to what its instructions allow on this core.

    .venv/bin/python bench/int8_issue_bound.py [--seconds 0.3] [--repeats 5]

Without VNNI, each 32 multiply-adds of a q8_0 product (4 inputs of one row
against 8 columns) cost a vpsignb (the weight's sign moved onto the input,
since vpmaddubsw multiplies unsigned bytes by signed ones), a vpmaddubsw, a
vpmaddwd (int16 pairs to int32: two full-range products already fill an
int16) and a vpaddd, after a broadcast load of the row's 4 inputs;
llama.cpp's AVX2 q8_0 dot product does the same. Each 32-input group then
turns its sums to float and scales them (vcvtdq2ps, vmulps, vfmadd231ps per
row).

This times, in nanoseconds per 32 multiply-adds:

- `engine`: the engine's own product, 16 rows of 1024 inputs against 3072
  columns, one thread, weights in cache (what a 16-sequence decode step
  spends most of its time in on a Q8_0 file);
- `loop`: the same instructions as the engine's 4-row tile issues them for
  one 32-input group, written out by hand with every operand in L1, so that
  nothing but the instructions themselves costs time;
- `loop_no_epilogue`: the loop without the per-group float step (its int32
  sums kept across groups);
- `loop_no_sign` and `loop_no_madd`: the loop without vpsignb, or without
  vpmaddwd: what a scheme that found a way around either could reach at
  most (their sums are wrong: timing only);
- `loop_nibbles`: a scheme with neither, that computes the same sums: the
  weights stored offset to unsigned (w + 128) and split into their two
  nibbles, each multiplied by vpmaddubsw and summed in int16 over the
  whole group (room q4_0's nibbles leave and full bytes do not), then per
  group two vpmaddwd (x1, x16) and the offset's 128 * sum(x) taken off.

`engine / loop` is the share of the time any rescheduling of these
instructions could win; `engine / loop_no_sign` bounds every sign-free
scheme. Needs an x86-64 CPU with AVX2 and a C compiler (the one the
engine's kernels are built with). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.common import cpu_description, machine, machine_line  # noqa: E402
from engine.kernels import native  # noqa: E402
from engine.model.quant import pack_weight, quantize  # noqa: E402

ROWS = 4  # the engine's AVX2 tile: 4 rows of x by one octet of 8 columns
PIECES = 8  # 4-input pieces in a 32-input group
MACS_PER_GROUP = ROWS * PIECES * 32



def group_instructions(sign: bool, madd: bool, epilogue: bool) -> list[str]:
    """One 32-input group of the 4-row q8_0 tile, in AT&T syntax. ymm0-3:
    int32 sums per row, ymm4-7: float accumulators, ymm8-11: each row's
    piece, ymm12: the group's column scales, ymm13: |w|, ymm14: w, ymm15:
    int16 ones; rsi: weights (int16 ones at 512, sixteens at 544, float
    column scales at 576, 0x0F bytes at 608), rdi: 4 rows of x, rdx: the
    rows' scales (and sums, and the nibble loop's float sums)."""
    # Constants, and the float sums zeroed (a zero idiom: no vector pipe).
    lines = ["vmovdqu 512(%%rsi), %%ymm15", "vmovdqu 576(%%rsi), %%ymm12"]
    lines += [f"vxorps %%ymm{4 + r}, %%ymm{4 + r}, %%ymm{4 + r}" for r in range(ROWS)]
    lines += [f"vpxor %%ymm{r}, %%ymm{r}, %%ymm{r}" for r in range(ROWS)] if epilogue else []
    for j in range(PIECES):
        lines.append(f"vmovdqu {32 * j}(%%rsi), %%ymm14")
        lines.append("vpsignb %%ymm14, %%ymm14, %%ymm13")
        for r in range(ROWS):
            piece = f"%%ymm{8 + r}"
            lines.append(f"vpbroadcastd {1024 * r + 4 * j}(%%rdi), {piece}")
            if sign:
                lines.append(f"vpsignb %%ymm14, {piece}, {piece}")
            lines.append(f"vpmaddubsw {piece}, %%ymm13, {piece}")
            if madd:
                lines.append(f"vpmaddwd %%ymm15, {piece}, {piece}")
            lines.append(f"vpaddd {piece}, %%ymm{r}, %%ymm{r}")
    if epilogue:
        for r in range(ROWS):
            lines.append(f"vcvtdq2ps %%ymm{r}, %%ymm{r}")
            lines.append(f"vbroadcastss {4 * r}(%%rdx), %%ymm{8 + r}")
            lines.append(f"vmulps %%ymm12, %%ymm{8 + r}, %%ymm{8 + r}")
            lines.append(f"vfmadd231ps %%ymm{r}, %%ymm{8 + r}, %%ymm{4 + r}")
    return lines


def nibble_group_instructions() -> list[str]:
    """One 32-input group of the nibble scheme for 4 rows. ymm0-3: low-nibble
    int16 sums per row, ymm4-7: high-nibble ones, ymm8-11: each row's
    piece, ymm12: products, ymm13 / ymm14: the piece's low / high nibbles,
    ymm15: 0x0F bytes; the float accumulators in memory at rdx + 64."""
    lines = ["vmovdqu 608(%%rsi), %%ymm15"] + [f"vpxor %%ymm{r}, %%ymm{r}, %%ymm{r}" for r in range(2 * ROWS)]
    for j in range(PIECES):
        lines += [f"vmovdqu {32 * j}(%%rsi), %%ymm14", "vpand %%ymm15, %%ymm14, %%ymm13",
                  "vpsrlw $4, %%ymm14, %%ymm14", "vpand %%ymm15, %%ymm14, %%ymm14"]
        for r in range(ROWS):
            piece = f"%%ymm{8 + r}"
            lines += [f"vpbroadcastd {1024 * r + 4 * j}(%%rdi), {piece}",
                      f"vpmaddubsw {piece}, %%ymm13, %%ymm12", f"vpaddw %%ymm12, %%ymm{r}, %%ymm{r}",
                      f"vpmaddubsw {piece}, %%ymm14, %%ymm12", f"vpaddw %%ymm12, %%ymm{4 + r}, %%ymm{4 + r}"]
    for r in range(ROWS):
        lines += [f"vpmaddwd 512(%%rsi), %%ymm{r}, %%ymm{r}",  # x1
                  f"vpmaddwd 544(%%rsi), %%ymm{4 + r}, %%ymm{4 + r}",  # x16
                  f"vpaddd %%ymm{r}, %%ymm{4 + r}, %%ymm{r}",
                  f"vpbroadcastd {16 + 4 * r}(%%rdx), %%ymm{8 + r}",  # 128 * sum(x)
                  f"vpsubd %%ymm{8 + r}, %%ymm{r}, %%ymm{r}",
                  f"vcvtdq2ps %%ymm{r}, %%ymm{r}",
                  f"vbroadcastss {4 * r}(%%rdx), %%ymm{8 + r}",
                  f"vmulps 576(%%rsi), %%ymm{8 + r}, %%ymm{8 + r}",
                  f"vfmadd213ps {64 + 32 * r}(%%rdx), %%ymm{r}, %%ymm{8 + r}",
                  f"vmovups %%ymm{8 + r}, {64 + 32 * r}(%%rdx)"]
    return lines


LOOPS: dict[str, Callable[[], list[str]]] = {
    "loop": partial(group_instructions, sign=True, madd=True, epilogue=True),
    "loop_no_epilogue": partial(group_instructions, sign=True, madd=True, epilogue=False),
    "loop_no_sign": partial(group_instructions, sign=False, madd=True, epilogue=True),
    "loop_no_madd": partial(group_instructions, sign=True, madd=False, epilogue=True),
    "loop_nibbles": nibble_group_instructions,
}


def program(seconds: float, repeats: int) -> str:
    """A C program that times each loop (best of `repeats` runs of about
    `seconds`) and prints `name ns_per_32_macs` lines."""
    clobbers = ", ".join(f'"xmm{i}"' for i in range(16))
    functions, calls = [], []
    for name, instructions in LOOPS.items():
        body = "\\n\\t".join(instructions())
        functions.append(
            f"static void {name}(const char *w, const char *x, const char *d, long groups) {{\n"
            f"    for (long g = 0; g < groups; g++)\n"
            f'        __asm__ volatile("{body}"\n'
            f'                         :: "S"(w), "D"(x), "d"(d) : {clobbers}, "memory");\n'
            f"}}\n")
        calls.append(f'    report("{name}", {name}, w, x, d);')
    return f"""#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void) {{ struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }}
{''.join(functions)}
typedef void (*loop_fn)(const char *, const char *, const char *, long);
static void report(const char *name, loop_fn fn, const char *w, const char *x, const char *d) {{
    long groups = 1000;
    double start = now();
    while (fn(w, x, d, groups), now() - start < 0.01) groups *= 2;
    groups = (long)(groups * {seconds} / 0.01) + 1;
    double best = 1e30;
    for (int i = 0; i < {repeats}; i++) {{
        start = now();
        fn(w, x, d, groups);
        double t = (now() - start) / groups;
        if (t < best) best = t;
    }}
    printf("%s %.6f\\n", name, best * 1e9 / ({MACS_PER_GROUP} / 32.0));
}}
int main(void) {{
    char *w = aligned_alloc(64, 1024), *x = aligned_alloc(64, {ROWS} * 1024), *d = aligned_alloc(64, 256);
    if (!w || !x || !d) return 1;
    for (int i = 0; i < 1024; i++) w[i] = (char)(i * 37 + 11);
    for (int i = 0; i < 32; i += 2) {{ w[512 + i] = 1; w[512 + i + 1] = 0; w[544 + i] = 16; w[544 + i + 1] = 0; }}
    for (int i = 576; i < 1024; i++) w[i] = i < 608 || i >= 640 ? 0 : 0x0F;
    for (int i = 0; i < {ROWS} * 1024; i++) x[i] = (char)(i * 13 + 5);
    for (int i = 0; i < 256; i++) d[i] = 0;
{chr(10).join(calls)}
    return 0;
}}
"""


def time_loops(seconds: float, repeats: int) -> dict[str, float]:
    compiler = native.c_compiler()
    if compiler is None:
        raise SystemExit("no C compiler (cc or gcc; set CC)")
    with tempfile.TemporaryDirectory(prefix="tandem-issue-bound-") as scratch:
        source, binary = Path(scratch) / "loops.c", Path(scratch) / "loops"
        source.write_text(program(seconds, repeats))
        subprocess.run([compiler, "-O2", "-std=c11", str(source), "-o", str(binary)], check=True)
        out = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout
    return {name: float(value) for name, value in (line.split() for line in out.splitlines())}


def time_engine(seconds: float, repeats: int, n: int = 3072, k: int = 1024, rows: int = 16) -> float:
    """The engine's q8_0 product, ns per 32 multiply-adds, one thread, weights in cache."""
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    weight = pack_weight(quantize(torch.randn(n, k, generator=gen), "q8_0"))
    x, out = torch.randn(rows, k, generator=gen), torch.empty(rows, n)
    best = float("inf")
    for _ in range(repeats):
        calls, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds or calls < 3:
            native.quant_matmul_into("q8_0", x, weight.data, weight.scales, None, None, out)
            calls += 1
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e9 / (rows * n * k / 32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=0.3, help="about how long each timed run lasts")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    flags = set(cpu_description().get("flags") or [])
    if "avx2" not in flags:
        raise SystemExit("this measures the AVX2 tile: the CPU has no AVX2")
    figures = {"engine": time_engine(args.seconds, args.repeats), **time_loops(args.seconds, args.repeats)}
    if native.loaded_variant() != "avx2":
        print(f"note: the engine runs its {native.loaded_variant()} kernels here: `engine` times those, "
              "the loops time AVX2's", file=sys.stderr)
    ratios = {f"engine_over_{name}": figures["engine"] / figures[name] for name in LOOPS}
    info = machine(1)
    print(machine_line(info) + f", kernels {native.loaded_variant()}", file=sys.stderr)
    for name, value in figures.items():
        print(f"{name:>18}: {value:.3f} ns per 32 multiply-adds", file=sys.stderr)
    print(json.dumps({"ns_per_32_macs": {k: round(v, 4) for k, v in figures.items()},
                      "ratios": {k: round(v, 3) for k, v in ratios.items()}, "machine": info}, indent=1))


if __name__ == "__main__":
    main()
