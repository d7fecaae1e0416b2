"""The GPU benchmark: kernels against references, then decode throughput vs
transformers and the HBM roofline. Run through bench/gpu.sh.

    python bench/gpu_bench.py [--device cuda] [--out DIR] [--device-check FILE]
    python bench/gpu_bench.py --device cpu     # dry run: every step, toy sizes

Sections, each recorded even when another fails:
  kernels      each Triton kernel against a plain PyTorch reference on random
               data (bf16, fp16, fp32; GQA; ragged lengths; split-KV), and
               the decode kernel's time against the PyTorch gather path
  parity       greedy ids of a small random model: device fp32 vs CPU fp32
  default      the default model (when installed): tok/s at each batch size,
               Tandem and transformers `generate`, same prompts, same card
  llama1b      a ~1B Llama shape with random weights, likewise
  roofline     the 1B model's B=1 decode step against weight bytes / HBM bandwidth
Writes gpu_bench.json into --out and prints a short table last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Nominal HBM bandwidth (bytes/s) by device-name fragment, for the roofline
# beside the measured copy bandwidth. First match wins.
NOMINAL_BANDWIDTH = [
    ("GH200", 4.0e12), ("H200", 4.8e12), ("H100 NVL", 3.9e12), ("H100 PCIe", 2.0e12), ("H100", 3.35e12),
("A100-SXM4-80GB", 2.039e12), ("A100 80GB PCIe", 1.935e12),
    ("A100", 1.555e12), ("L40S", 0.864e12), ("L4", 0.3e12), ("A10G", 0.6e12), ("A10", 0.6e12),
    ("RTX 4090", 1.008e12), ("RTX 3090", 0.936e12), ("RTX 4080", 0.717e12), ("T4", 0.32e12),
]


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_ms(fn, device, repeats: int) -> float:
    """Median milliseconds of `fn()` over `repeats` runs after one warm-up."""
    fn()
    sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


# -- kernels ------------------------------------------------------------------

def _paged(lengths, num_kv, head_dim, page_size, dtype, device, gen):
    import torch

    needed = [-(-n // page_size) for n in lengths]
    num_pages = sum(needed) + 1
    order = torch.randperm(num_pages, generator=gen).tolist()
    # Drawn on the device (seeded by bench_kernels): hundreds of MB at GPU sizes.
    kc = torch.randn(num_pages * num_kv, page_size, head_dim, device=device).to(dtype)
    vc = torch.randn(num_pages * num_kv, page_size, head_dim, device=device).to(dtype)
    tables = [[order.pop() for _ in range(n)] for n in needed]
    width = max(needed)
    table = torch.tensor([t + [t[0]] * (width - len(t)) for t in tables], dtype=torch.int32)
    return kc, vc, tables, table.to(device)


def _gather(cache, pages, num_kv, length):
    rows, ps, d = cache.shape
    import torch

    by_page = cache.view(rows // num_kv, num_kv, ps, d)[torch.tensor(pages, device=cache.device)]
    return by_page.permute(1, 0, 2, 3).reshape(num_kv, -1, d)[:, :length]


def _reference(q, keys, values, query_pos, scale):
    """fp32 causal attention; q [n, Hq, D], keys [Hkv, L, D] -> [n, Hq*D]."""
    import torch

    group = q.shape[1] // keys.shape[0]
    k = keys.float().repeat_interleave(group, 0)
    v = values.float().repeat_interleave(group, 0)
    scores = torch.einsum("nhd,hld->hnl", q.float(), k) * scale
    key_pos = torch.arange(keys.shape[1], device=q.device)
    scores = scores.masked_fill(key_pos[None, None, :] > query_pos[None, :, None], float("-inf"))
    return torch.einsum("hnl,hld->nhd", scores.softmax(-1), v).reshape(q.shape[0], -1)


def bench_kernels(device, dry: bool) -> dict:
    import torch

    from engine.kernels.triton import attention as kernels

    tol = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 4e-2}
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    if dry:
        num_kv, group, head_dim, page_size, batch, max_len = 2, 2, 16, 4, 3, 40
        chunks = [(0, 9), (12, 5)]
    else:
        num_kv, group, head_dim, page_size, batch, max_len = 8, 4, 128, 16, 32, 4096
        chunks = [(0, 512), (100, 1), (1000, 300), (37, 64)]
    result: dict = {"decode": [], "prefill": [], "write_kv": []}
    dtypes = [torch.bfloat16, torch.float16, torch.float32]
    for dtype in dtypes:
        lengths = torch.randint(1, max_len + 1, (batch,), generator=gen).tolist()
        lengths[0] = 1
        kc, vc, tables, table = _paged(lengths, num_kv, head_dim, page_size, dtype, device, gen)
        q = torch.randn(batch, num_kv * group, head_dim, generator=gen).to(dtype).to(device)
        lens = torch.tensor(lengths, dtype=torch.int32, device=device)
        scale = head_dim**-0.5
        want = torch.cat([
            _reference(q[i : i + 1], _gather(kc, tables[i], num_kv, n), _gather(vc, tables[i], num_kv, n),
                       torch.tensor([n - 1], device=device), scale)
            for i, n in enumerate(lengths)
        ])
        auto = kernels.num_kv_splits(batch, num_kv, max(lengths), sms)
        for splits in sorted({1, auto, 8}):
            got = kernels.decode_attention(
                q, kc, vc, table, lens, scale, num_kv_heads=num_kv, num_splits=splits
            )
            err = (got.float() - want).abs().max().item()
            result["decode"].append({
                "dtype": str(dtype).removeprefix("torch."), "splits": splits,
                "max_abs_err": err, "ok": err <= tol[dtype],
            })

        # prefill over cached prefixes: keys of each chunk are context + new tokens
        plen = [c + n for c, n in chunks]
        kc2, vc2, tables2, table2 = _paged(plen, num_kv, head_dim, page_size, dtype, device, gen)
        starts, row = [], 0
        for _, n in chunks:
            starts.append(row)
            row += n
        qp = torch.randn(row, num_kv * group, head_dim, generator=gen).to(dtype).to(device)
        as_i32 = lambda v: torch.tensor(v, dtype=torch.int32, device=device)  # noqa: E731
        got = kernels.prefill_attention(
            qp, kc2, vc2, table2, as_i32(starts), as_i32([n for _, n in chunks]),
            as_i32([c for c, _ in chunks]), max(n for _, n in chunks), scale, num_kv_heads=num_kv,
        )
        err = 0.0
        for i, (ctx, n) in enumerate(chunks):
            ref = _reference(
                qp[starts[i] : starts[i] + n], _gather(kc2, tables2[i], num_kv, ctx + n),
                _gather(vc2, tables2[i], num_kv, ctx + n), torch.arange(ctx, ctx + n, device=device), scale,
            )
            err = max(err, (got[starts[i] : starts[i] + n].float() - ref).abs().max().item())
        result["prefill"].append({
            "dtype": str(dtype).removeprefix("torch."), "max_abs_err": err, "ok": err <= tol[dtype],
        })

        # write_kv against a Python loop of index writes
        tokens = 8
        k = torch.randn(tokens, num_kv, head_dim, generator=gen).to(dtype).to(device)
        v = torch.randn(tokens, num_kv, head_dim, generator=gen).to(dtype).to(device)
        slots = torch.randperm(kc.shape[0] // num_kv * page_size, generator=gen)[:tokens].to(torch.int32)
        slots[3] = -1
        want_k = kc.clone()
        for t, s in enumerate(slots.tolist()):
            if s >= 0:
                page, off = divmod(s, page_size)
                want_k[page * num_kv : (page + 1) * num_kv, off] = k[t]
        kernels.write_kv(k, v, kc, vc, slots.to(device), num_kv)
        result["write_kv"].append({"dtype": str(dtype).removeprefix("torch."), "ok": bool(torch.equal(kc, want_k))})

    # Speed: the decode kernel vs the CPU path's gather + batched matmuls, bf16, B=32 at 1k-2k
    # keys; the prefill kernel on one 2048-token chunk vs SDPA (flash) on contiguous K/V. A dry
    # run goes through the same code at toy sizes (its times mean nothing).
    shortest, longest, new = (8, 24, 24) if dry else (1024, 2048, 2048)
    repeats = 1 if dry else 50
    dtype = torch.bfloat16
    lengths = torch.randint(shortest, longest + 1, (batch,), generator=gen).tolist()
    kc, vc, tables, table = _paged(lengths, num_kv, head_dim, page_size, dtype, device, gen)
    q = torch.randn(batch, num_kv * group, head_dim, generator=gen).to(dtype).to(device)
    lens = torch.tensor(lengths, dtype=torch.int32, device=device)
    splits = kernels.num_kv_splits(batch, num_kv, max(lengths), sms)
    kernel_ms = timed_ms(lambda: kernels.decode_attention(
        q, kc, vc, table, lens, head_dim**-0.5, num_kv_heads=num_kv, num_splits=splits),
        device, repeats)
    rows = (table.long()[:, None, :] * num_kv + torch.arange(num_kv, device=device)[:, None]).reshape(-1)
    max_keys = table.shape[1] * page_size
    key_pos = torch.arange(max_keys, device=device)
    bias = torch.zeros(batch, max_keys, device=device, dtype=dtype).masked_fill_(
        key_pos[None, :] >= lens[:, None], float("-inf"))
    bias = bias[:, None, None, :].expand(batch, num_kv, group, max_keys).reshape(batch * num_kv, group, max_keys)

    def gather_path():
        keys = kc.index_select(0, rows).view(batch * num_kv, max_keys, head_dim)
        values = vc.index_select(0, rows).view(batch * num_kv, max_keys, head_dim)
        s = torch.baddbmm(bias, q.reshape(batch * num_kv, group, head_dim), keys.transpose(1, 2),
                          alpha=head_dim**-0.5)
        return torch.bmm(torch.softmax(s, -1), values)

    gather_ms = timed_ms(gather_path, device, repeats)

    kc2, vc2, _, table2 = _paged([new], num_kv, head_dim, page_size, dtype, device, gen)
    qp = torch.randn(new, num_kv * group, head_dim, generator=gen).to(dtype).to(device)
    as_i32 = lambda v: torch.tensor(v, dtype=torch.int32, device=device)  # noqa: E731
    starts, qlen, ctx = as_i32([0]), as_i32([new]), as_i32([0])
    prefill_ms = timed_ms(lambda: kernels.prefill_attention(
        qp, kc2, vc2, table2, starts, qlen, ctx, new, head_dim**-0.5, num_kv_heads=num_kv),
        device, max(1, repeats // 2))
    kq = torch.randn(1, num_kv, new, head_dim, device=device, dtype=dtype)
    sdpa_ms = timed_ms(lambda: torch.nn.functional.scaled_dot_product_attention(
        qp.transpose(0, 1)[None], kq, kq, is_causal=True, enable_gqa=True),
        device, max(1, repeats // 2))
    flops = 4 * new * new / 2 * num_kv * group * head_dim
    result["prefill_speed"] = {
        "tokens": new, "kernel_ms": round(prefill_ms, 4), "sdpa_contiguous_ms": round(sdpa_ms, 4),
        "kernel_tflops": round(flops / (prefill_ms / 1e3) / 1e12, 1),
    }
    kv_bytes = 2 * sum(lengths) * num_kv * head_dim * 2
    result["decode_speed"] = {
        "batch": batch, "keys_total": sum(lengths), "splits": splits,
        "kernel_ms": round(kernel_ms, 4), "gather_path_ms": round(gather_ms, 4),
        "kernel_kv_gb_per_s": round(kv_bytes / (kernel_ms / 1e3) / 1e9, 1),
    }
    result["ok"] = all(r["ok"] for part in ("decode", "prefill", "write_kv") for r in result[part])
    return result


# -- engine and transformers ---------------------------------------------------

def engine_throughput(folder: Path, device: str, dtype: str, batch_sizes, new_tokens: int,
                      prompt_len: int, vocab: int) -> dict:
    import torch

    from bench.random_model import random_prompts
    from engine import Engine, SamplingParams

    out: dict = {"decode_tok_s": {}, "prefill_tok_s": {}}
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    with Engine(folder, device=device, dtype=dtype, max_running=max(batch_sizes)) as engine:
        out["dtype"] = str(engine.dtype).removeprefix("torch.")
        out["kv_pages"] = engine.pool.num_pages
        runner = engine.runner
        out["runner"] = type(runner).__name__
        graphs = getattr(runner, "graphs", None)
        if graphs is not None:
            out["cuda_graphs"] = {
                "sizes": list(graphs.sizes), "pool_mib": round(graphs.pool_bytes / 2**20, 1),
                "capture_s": round(graphs.capture_seconds, 2),
            }
        out["weight_bytes"] = decode_weight_bytes(engine.model)
        engine.generate_outputs(random_prompts(2, prompt_len, vocab, seed=99), params)  # warm-up
        for b in batch_sizes:
            engine.reset_prefix_cache()
            prompts = random_prompts(b, prompt_len, vocab, seed=b)
            start = time.perf_counter()
            outputs = engine.generate_outputs(prompts, params)
            end = time.perf_counter()
            first = max(o.metrics.first_token_time for o in outputs)
            decoded = sum(len(o.token_ids) - 1 for o in outputs)
            out["decode_tok_s"][str(b)] = round(decoded / (end - first), 1)
            out["prefill_tok_s"][str(b)] = round(b * prompt_len / (first - start), 1)
            if b == 1:
                out["b1_ms_per_token"] = round((end - first) / max(1, decoded) * 1e3, 4)
        if torch.cuda.is_available() and engine.device.type == "cuda":
            out["peak_gpu_mib"] = round(torch.cuda.max_memory_allocated(engine.device) / 2**20)
    return out


def transformers_throughput(folder: Path, device, batch_sizes, new_tokens: int, prompt_len: int,
                            vocab: int, dtype) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from bench.random_model import random_prompts

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    out: dict = {"dtype": str(dtype).removeprefix("torch."), "decode_tok_s": {}}

    def run(ids, n: int) -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                           min_new_tokens=n, do_sample=False)
        sync(device)
        return time.perf_counter() - start

    run(torch.tensor(random_prompts(2, prompt_len, vocab, seed=99), device=device), 4)  # warm-up
    for b in batch_sizes:
        ids = torch.tensor(random_prompts(b, prompt_len, vocab, seed=b), device=device)
        # Decode time = a full generate less a 1-token one (the prefill); best of two each.
        prefill = min(run(ids, 1) for _ in range(2))
        total = min(run(ids, new_tokens) for _ in range(2))
        out["decode_tok_s"][str(b)] = (
            round(b * (new_tokens - 1) / (total - prefill), 1) if total > prefill else None
        )
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def decode_weight_bytes(model) -> int:
    """Bytes of weights one decode step reads: every layer's matrices and norms,
    the final norm and the LM head (the embedding only gives one row per token)."""
    total = 0
    for layer in model.layers:
        for name in ("input_norm", "post_norm"):
            total += getattr(layer, name).nbytes
        for name in ("qkv", "o", "gate_up", "down"):
            linear = getattr(layer, name)
            total += linear.weight.nbytes + (linear.bias.nbytes if linear.bias is not None else 0)
    return total + model.norm.nbytes + model.lm_head.weight.nbytes


def copy_bandwidth(device) -> float:
    """Bytes/s of a large device-to-device copy (read + write)."""
    import torch

    size = (1 << 30) if device.type == "cuda" else (64 << 20)
    src = torch.empty(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = timed_ms(lambda: dst.copy_(src), device, 10 if device.type == "cuda" else 3)
    return 2 * size / (ms / 1e3)


def nominal_bandwidth(name: str | None) -> float | None:
    for fragment, value in NOMINAL_BANDWIDTH:
        if name and fragment in name:
            return value
    return None


def parity(device: str, folder: Path, new_tokens: int, count: int, vocab: int) -> dict:
    from bench.random_model import random_prompts
    from engine import Engine, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    prompts = random_prompts(count, 24, vocab, seed=7)
    runs = [("cpu", "cpu", "1"), (device, device, "1")]
    if device == "cuda":
        runs.append(("cuda-no-graphs", "cuda", "0"))
    ids = {}
    previous = os.environ.get("TANDEM_CUDA_GRAPHS")
    try:
        for name, dev, graphs in runs:
            os.environ["TANDEM_CUDA_GRAPHS"] = graphs
            with Engine(folder, device=dev, dtype="float32") as engine:
                ids[name] = [o.token_ids for o in engine.generate_outputs(prompts, params)]
    finally:
        if previous is None:
            os.environ.pop("TANDEM_CUDA_GRAPHS", None)
        else:
            os.environ["TANDEM_CUDA_GRAPHS"] = previous
    equal = sum(a == b for a, b in zip(ids["cpu"], ids[device]))
    res = {"equal": equal, "of": count, "ok": equal == count}
    if "cuda-no-graphs" in ids:
        same = sum(a == b for a, b in zip(ids["cuda"], ids["cuda-no-graphs"]))
        res["graphs_vs_eager_equal"] = same
        res["ok"] = res["ok"] and same == count
    return res


# -- main ------------------------------------------------------------------------

def section(results: dict, name: str, fn) -> None:
    start = time.perf_counter()
    try:
        results[name] = fn()
    except Exception as exc:  # one broken section must not hide the others' numbers
        results[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]}
    results[name]["seconds"] = round(time.perf_counter() - start, 1)
    print(f"[gpu_bench] {name}: {time.perf_counter() - start:.1f} s"
          + (f" ERROR {results[name]['error']}" if "error" in results[name] else ""), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--out", default=os.environ.get("OUT") or "bench/out")
    parser.add_argument("--device-check", help="device_check.py's JSON output, to include in the table")
    parser.add_argument("--batch-sizes", default=None, help="default 1,8,32,128 (cpu: 1,2)")
    parser.add_argument("--new-tokens", type=int, default=None, help="default 64 (cpu: 4)")
    parser.add_argument("--no-transformers", action="store_true")
    args = parser.parse_args()
    dry = args.device == "cpu"
    if dry:
        # Before triton's first import: the kernels run in Triton's interpreter.
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    from bench.common import machine
    from bench.random_model import LLAMA_1B, SMALL, parameter_count, write_random_llama

    if not dry and not torch.cuda.is_available():
        print("gpu_bench: no CUDA device visible; use --device cpu for a dry run", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    batch_sizes = [int(b) for b in (args.batch_sizes or ("1,2" if dry else "1,8,32,128")).split(",")]
    new_tokens = args.new_tokens or (4 if dry else 64)
    prompt_len = 16 if dry else 32
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    results: dict = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": args.device, "dry_run": dry, "machine": machine(),
        "batch_sizes": batch_sizes, "new_tokens": new_tokens, "prompt_tokens": prompt_len,
    }
    if args.device_check and Path(args.device_check).is_file():
        lines = Path(args.device_check).read_text().strip().splitlines()
        try:
            results["device_check"] = json.loads(lines[-1]) if lines else {
                "error": "no result (see device_check.log)"}
        except ValueError as exc:
            results["device_check"] = {"error": f"unreadable: {exc}"}
    work = Path(tempfile.mkdtemp(prefix="tandem-gpu-bench-"))
    tf_dtype = torch.float32 if dry else torch.bfloat16

    section(results, "kernels", lambda: bench_kernels(device, dry))

    small = write_random_llama(work / "small", SMALL, dtype=torch.float32)
    section(results, "parity", lambda: parity(args.device, small, 8 if dry else 32, 2 if dry else 8,
                                              SMALL["vocab_size"]))

    def default_model() -> dict:
        from engine.formats.default_model import resolve_model
        from engine.model.tokenizer import Tokenizer

        try:
            folder = resolve_model("default")
        except Exception as exc:
            return {"skipped": f"default model not available here: {exc}"}
        vocab = Tokenizer.from_folder(folder).vocab_size
        res = {"tandem": engine_throughput(folder, args.device, "auto", batch_sizes, new_tokens, prompt_len, vocab)}
        if not args.no_transformers:
            res["transformers"] = transformers_throughput(
                folder, device, batch_sizes, new_tokens, prompt_len, vocab, tf_dtype)
        return res

    section(results, "default", default_model)

    def llama_1b() -> dict:
        shape = SMALL if dry else LLAMA_1B
        folder = write_random_llama(
            work / "llama1b", shape, dtype=tf_dtype, device="cuda" if not dry else "cpu")
        res = {"parameters": parameter_count(shape), "shape": shape,
               "tandem": engine_throughput(folder, args.device, "auto", batch_sizes, new_tokens,
                                           prompt_len, shape["vocab_size"])}
        if not args.no_transformers:
            res["transformers"] = transformers_throughput(
                folder, device, batch_sizes, new_tokens, prompt_len, shape["vocab_size"], tf_dtype)
        return res

    section(results, "llama1b", llama_1b)

    def roofline() -> dict:
        tandem = results.get("llama1b", {}).get("tandem", {})
        if "b1_ms_per_token" not in tandem:
            return {"skipped": "no B=1 measurement of the 1B model"}
        measured = copy_bandwidth(device)
        nominal = nominal_bandwidth(results["machine"].get("cuda"))
        weight_bytes = tandem["weight_bytes"]
        step_ms = tandem["b1_ms_per_token"]
        res = {"weight_bytes": weight_bytes, "b1_ms_per_token": step_ms,
               "copy_bandwidth_gb_s": round(measured / 1e9, 1),
               "roofline_ms_measured_bw": round(weight_bytes / measured * 1e3, 4),
               "fraction_of_measured_bw_roofline": round(weight_bytes / measured * 1e3 / step_ms, 3)}
        if nominal:
            res["nominal_bandwidth_gb_s"] = nominal / 1e9
            res["roofline_ms_nominal_bw"] = round(weight_bytes / nominal * 1e3, 4)
            res["fraction_of_nominal_roofline"] = round(weight_bytes / nominal * 1e3 / step_ms, 3)
        return res

    section(results, "roofline", roofline)

    (out_dir / "gpu_bench.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    print(table(results))
    failed = [name for name in ("kernels", "parity") if not results.get(name, {}).get("ok")]
    return 1 if failed else 0


def _ratio(a, b) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def table(results: dict) -> str:
    lines = [
        f"Tandem GPU bench {results['date']} on {results['machine'].get('cuda') or 'CPU (dry run)'}, "
        f"torch {results['machine'].get('torch')}",
    ]
    dc = results.get("device_check")
    if dc:
        parts = [f"{k}: {v['equal']}/{v['of']} equal" for k, v in dc.items()
                 if isinstance(v, dict) and "equal" in v]
        lines.append("device_check (greedy vs CPU fp32, default model): " + ("; ".join(parts) or str(dc)))
    k = results.get("kernels", {})
    if "error" in k:
        lines.append(f"kernels: ERROR {k['error']}")
    else:
        worst = lambda part: max((r["max_abs_err"] for r in k.get(part, [])), default=float("nan"))  # noqa: E731
        lines.append(
            f"kernels vs reference: {'ok' if k.get('ok') else 'FAILED'} (decode max err {worst('decode'):.2e}, "
            f"prefill {worst('prefill'):.2e}, write_kv {'ok' if all(r['ok'] for r in k.get('write_kv', [])) else 'FAILED'})"
        )
        if "prefill_speed" in k:
            s = k["prefill_speed"]
            lines.append(
                f"prefill kernel {s['tokens']} tokens: {s['kernel_ms']} ms ({s['kernel_tflops']} TFLOP/s) "
                f"vs SDPA on contiguous K/V {s['sdpa_contiguous_ms']} ms"
            )
        if "decode_speed" in k:
            s = k["decode_speed"]
            lines.append(
                f"decode kernel B={s['batch']} ({s['keys_total']} keys): {s['kernel_ms']} ms "
                f"({s['kernel_kv_gb_per_s']} GB/s of KV) vs gather path {s['gather_path_ms']} ms"
            )
    p = results.get("parity", {})
    lines.append("parity (small random model, greedy, device fp32 vs CPU fp32): "
                 + (f"{p['equal']}/{p['of']} equal" if "equal" in p else p.get("error", "-"))
                 + (f"; CUDA graphs vs eager {p['graphs_vs_eager_equal']}/{p['of']} equal"
                    if "graphs_vs_eager_equal" in p else ""))
    lines.append(f"{'model':<9} {'B':>4} {'tandem tok/s':>13} {'transformers':>13} {'ratio':>7}")
    for name in ("default", "llama1b"):
        res = results.get(name, {})
        if "error" in res or "skipped" in res:
            lines.append(f"{name:<9} {res.get('error') or res.get('skipped')}")
            continue
        tandem = res.get("tandem", {}).get("decode_tok_s", {})
        hf = res.get("transformers", {}).get("decode_tok_s", {})
        for b, value in tandem.items():
            theirs = hf.get(b) or "-"
            lines.append(
                f"{name:<9} {b:>4} {value:>13} {theirs:>13} {_ratio(value, hf.get(b)):>7}"
            )
    r = results.get("roofline", {})
    if "b1_ms_per_token" in r:
        frac = r.get("fraction_of_nominal_roofline", r["fraction_of_measured_bw_roofline"])
        lines.append(
            f"roofline: 1B B=1 step {r['b1_ms_per_token']} ms; weights {r['weight_bytes'] / 1e9:.2f} GB "
            f"at {r.get('nominal_bandwidth_gb_s', r['copy_bandwidth_gb_s'])} GB/s -> "
            f"{r.get('roofline_ms_nominal_bw', r['roofline_ms_measured_bw'])} ms = {frac:.0%} of roofline "
            f"(copy bandwidth {r['copy_bandwidth_gb_s']} GB/s: {r['fraction_of_measured_bw_roofline']:.0%})"
        )
    else:
        lines.append(f"roofline: {r.get('skipped') or r.get('error', '-')}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
