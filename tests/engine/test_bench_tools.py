"""The benchmarks' helpers that decide what a figure says: llama-batched-bench's
table read back, the CPU line, the weight bytes behind the read-bandwidth limit,
and the goals' PASS/FAIL. No timing here: speed is measured in bench/."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from bench.common import cpu_description, gguf_bytes_per_token, machine_line, parse_cpuinfo
from bench.llamacpp import BatchedRow, parse_batched_bench
from bench.perplexity import round_to_int8_groups
from bench.throughput import goals
from engine.model.quant import QuantLinear, cpu_kernel_available, quantize

# Captured from `llama-batched-bench -m SmolLM2-135M-Instruct.Q4_1.gguf -t 2 -tb 2 -c 3392
# -b 2048 -ub 512 -npp 40 -ntg 64 -npl 1,4,16,32` (llama.cpp from llama-cpp-python 0.3.36),
# stdout and stderr together, on a 2-core machine busy with other work (hence the low figures).
BATCHED_BENCH_OUTPUT = """\
0.00.166.777 W llama_context: n_ctx is not divisible by n_seq_max - rounding down to 8192

llama_batched_bench: n_kv_max = 8192, n_batch = 2048, n_ubatch = 512, flash_attn = -1, is_pp_shared = 0, is_tg_separate = 0, n_gpu_layers = -1, n_threads = 2, n_threads_batch = 2

|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|
|    40 |     64 |    1 |    104 |    1.288 |    31.06 |    9.211 |     6.95 |   10.499 |     9.91 |
|    40 |     64 |    4 |    416 |    3.252 |    49.20 |   10.708 |    23.91 |   13.960 |    29.80 |
|    40 |     64 |   16 |   1664 |   10.804 |    59.24 |   50.557 |    20.25 |   61.361 |    27.12 |
|    40 |     64 |   32 |   3328 |   20.077 |    63.76 |   75.764 |    27.03 |   95.841 |    34.72 |
"""

CPUINFO_X86 = """\
processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R)   Platinum 8488C
flags\t\t: fpu vme sse2 avx avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni avx512_bf16 amx_tile amx_int8 amx_bf16

processor\t: 1
model name\t: Some Other CPU
flags\t\t: fpu
"""

CPUINFO_ARM = """\
processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm asimddp i8mm
CPU implementer\t: 0x41
"""


def test_batched_bench_rows_are_read_from_its_log() -> None:
    rows = parse_batched_bench(BATCHED_BENCH_OUTPUT)
    assert [r.batch for r in rows] == [1, 4, 16, 32]
    assert all(r.prompt_tokens == 40 and r.new_tokens == 64 for r in rows)
    assert rows[-1].decode_tok_s == 27.03 and rows[-1].prefill_tok_s == 63.76
    assert rows[0] == BatchedRow(40, 64, 1, 1.288, 31.06, 9.211, 6.95)


def test_batched_bench_ignores_everything_but_table_rows() -> None:
    text = (
        "main: n_kv_max = 3328, n_batch = 2048\n"
        "|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |\n"
        "|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|\n"
        "|    40 |     64 |    2 |    208 |    0.100 |   800.00 |    1.000 |   128.00 |    1.100 |   189.09 |\n"
        "llama_perf_context_print: total time = 1234.56 ms\n"
    )
    assert parse_batched_bench(text) == [BatchedRow(40, 64, 2, 0.1, 800.0, 1.0, 128.0)]
    assert parse_batched_bench("error: unable to load model") == []


def test_cpu_model_and_the_flags_that_pick_kernels() -> None:
    x86 = parse_cpuinfo(CPUINFO_X86)
    assert x86["model"] == "Intel(R) Xeon(R) Platinum 8488C"
    assert x86["flags"] == [
        "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
        "amx_tile", "amx_int8", "amx_bf16",
    ]
    assert "sse2" in x86["all_flags"] and "sse2" not in x86["flags"]
    arm = parse_cpuinfo(CPUINFO_ARM)
    assert arm["flags"] == ["asimd", "asimddp", "i8mm"]


def test_machine_line_names_cpu_flags_threads_and_load() -> None:
    line = machine_line({
        "cpu": "AMD EPYC", "cpu_flags": ["avx2", "avx512f"], "torch": "2.13.0+cpu",
        "threads": 2, "cores": 2, "load_average": [1.5, 1.0, 0.5], "cuda": None,
    })
    assert line == "AMD EPYC (avx2 avx512f), 2 threads of 2 cores, torch 2.13.0+cpu, load average 1.5 1.0 0.5"


def _write_gguf(path: Path, tied: bool) -> None:
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tensor("token_embd.weight", np.zeros((64, 32), dtype=np.float32))
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((32, 32), dtype=np.float16))
    if not tied:
        writer.add_tensor("output.weight", np.zeros((64, 32), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_weight_bytes_read_per_token(tmp_path: Path) -> None:
    embedding, attention, output = 64 * 32 * 4, 32 * 32 * 2, 64 * 32 * 2
    _write_gguf(tmp_path / "tied.gguf", tied=True)
    _write_gguf(tmp_path / "untied.gguf", tied=False)
    # Tied: the embedding is the LM head, read whole for every token.
    assert gguf_bytes_per_token(tmp_path / "tied.gguf") == embedding + attention
    # Untied: the output matrix is read whole; of the embedding only one row.
    assert gguf_bytes_per_token(tmp_path / "untied.gguf") == attention + output


def test_goals_pass_or_fail_on_the_ratios_they_name() -> None:
    result = {
        "decode_tok_s": {"tandem": {"1": 100.0, "4": 200.0, "16": 400.0, "32": 390.0}},
        "ratio_vs_llamacpp": {"1": 1.25, "4": 1.4, "16": 2.0},
        "ratio_vs_transformers_fastest": {"16": 1.9},
        "b1_share_of_read_limit": {"tandem": 51.0},
    }
    verdicts = {g["goal"]: g["pass"] for g in goals(result)}
    assert verdicts == {
        "B=1 decode >= 1.2x llama.cpp": True,
        "B=1 decode >= 50% of the read-bandwidth limit": True,
        "B=4 decode >= 1.5x llama.cpp": False,
        "B=16 decode >= 2x llama.cpp": True,
        "B=16 decode >= 2x the fastest transformers": False,
        "B=32 decode >= B=16 (ratio)": False,
    }
    # Without llama.cpp in the run, its goals are not claimed either way.
    assert [g["goal"] for g in goals({"decode_tok_s": {"tandem": {"1": 1.0}}})] == []


@pytest.mark.skipif(not cpu_kernel_available(), reason="the native quantized CPU kernel does not run here")
@pytest.mark.parametrize("fmt", ["q8_0", "q4_1"])
def test_perplexity_bench_rounds_inputs_as_the_kernel_does(fmt: str) -> None:
    """bench/perplexity.py's emulated variants are only as true as this rounding."""
    generator = torch.Generator().manual_seed(0)
    weight = quantize(torch.randn(96, 128, generator=generator), fmt)
    x = torch.randn(5, 128, generator=generator) * torch.linspace(0.01, 4.0, 128)  # groups of unlike scales
    kernel = QuantLinear(weight)(x)
    emulated = torch.nn.functional.linear(round_to_int8_groups(x), weight.dequantize())
    unrounded = torch.nn.functional.linear(x, weight.dequantize())
    if weight.mins is not None:
        # A q4_1 weight's mins multiply each input group's scaled sum, which the kernel keeps as
        # fp16(d * sum) as ggml's block_q8_1.s; the bench rounds inputs only (fp16(d) * sum), so its
        # emulation is off by that rounding, at most 2^-10 of each min term.
        groups = x.reshape(x.shape[0], -1, 32)
        amax = groups.abs().amax(-1)
        levels = torch.round(groups * (torch.full_like(amax, 127.0) / amax).unsqueeze(-1)).clamp(-127, 127).sum(-1)
        d = amax / 127
        kept = (d * levels).half().float() - d.half().float() * levels
        assert ((kept.abs() @ weight.mins.float().abs().T) <= 2**-10 * (
            (d * levels).abs() @ weight.mins.float().abs().T)).all()
        emulated = emulated + kept @ weight.mins.float().T
    assert (kernel - emulated).abs().max() < 1e-4 * kernel.abs().max()
    assert (kernel - unrounded).abs().max() > 100 * (kernel - emulated).abs().max()  # rounding is what differs


@pytest.mark.skipif(not cpu_kernel_available(), reason="the native quantized CPU kernel does not run here")
def test_kernel_ab_times_both_builds_and_checks_their_bits(tmp_path: Path) -> None:
    from bench import kernel_ab
    from engine.kernels import native

    lib = native.library()
    result = kernel_ab.compare({"base": lib, "work": lib}, "q4_0", 24, 64, rows=3, copies=2, alternations=1)
    assert result["case"] == "q4_0:24:64" and result["rows"] == 3
    assert result["same_bits"] is True and result["base_us"] > 0 and result["work_us"] > 0
    # A revision's kernel sources, every file the build reads, as git holds them.
    kernel_ab.base_sources("HEAD", tmp_path)
    wanted = [*native.SOURCES, *native.HEADERS]
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(path.name for path in wanted)
    assert b"int tandem_quant_gemm(" in (tmp_path / "quant_matmul.c").read_bytes()


def test_kernel_ab_times_paged_attention_of_a_decode_step() -> None:
    from bench import kernel_ab
    from engine.kernels import native

    lib = native.library()
    result = kernel_ab.compare_attention({"base": lib, "work": lib}, 4, 2, 16, 40, rows=3, alternations=1)
    assert result["case"] == "attn:4:2:16:40" and result["rows"] == 3
    assert result["same_bits"] is True and result["base_us"] > 0 and result["gmac_per_s_work"] > 0


def test_issue_bound_loop_is_the_q8_0_tile_group() -> None:
    from bench.int8_issue_bound import LOOPS, group_instructions

    def count(lines: list[str], op: str) -> int:
        return sum(line.split()[0] == op for line in lines)

    group = group_instructions(sign=True, madd=True, epilogue=True)
    # 4 rows x 8 pieces of 4 inputs: one broadcast, sign, maddubs, madd and
    # add each, plus each piece's load and |w|; the float step per row.
    assert count(group, "vpbroadcastd") == count(group, "vpmaddubsw") == count(group, "vpmaddwd") == 32
    assert count(group, "vpaddd") == 32 and count(group, "vpsignb") == 32 + 8
    assert count(group, "vmovdqu") == 8 + 2  # the pieces, and two constants
    assert count(group, "vcvtdq2ps") == count(group, "vfmadd231ps") == count(group, "vmulps") == 4
    assert group == LOOPS["loop"]()
    no_sign = LOOPS["loop_no_sign"]()
    assert count(no_sign, "vpsignb") == 8 and len(no_sign) == len(group) - 32
    assert count(LOOPS["loop_no_madd"](), "vpmaddwd") == 0
    assert count(LOOPS["loop_no_epilogue"](), "vcvtdq2ps") == 0
    # The nibble scheme: two maddubs per piece and row, no sign, the int16
    # sums widened once per group (x1 and x16 per row).
    nibbles = LOOPS["loop_nibbles"]()
    assert count(nibbles, "vpmaddubsw") == 64 and count(nibbles, "vpsignb") == 0
    assert count(nibbles, "vpaddw") == 64 and count(nibbles, "vpmaddwd") == 2 * 4


@pytest.mark.skipif(not cpu_kernel_available() or "avx2" not in (cpu_description().get("flags") or []),
                    reason="needs an x86-64 CPU with AVX2 and a C compiler")
def test_issue_bound_loops_compile_and_run() -> None:
    from bench.int8_issue_bound import LOOPS, time_loops

    figures = time_loops(seconds=0.001, repeats=1)
    assert sorted(figures) == sorted(LOOPS) and all(value > 0 for value in figures.values())
