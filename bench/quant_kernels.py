"""The weight products of one decode step, kernel by kernel.

    .venv/bin/python bench/quant_kernels.py [--rows 1,16] [--threads 2] [--shapes qwen3-0.6b]

For a model's shapes (default: the default model's 30 layers of fused
q/k/v, o, fused gate/up and down products, plus the 49152-row LM head), the
time of every product of one step with M rows: oneDNN fp32
(engine.model.linear.Linear, the dequantized model), bf16, and the quantized
formats on the native kernel (engine.model.quant.QuantLinear), beside
torch's own weight-only CPU kernels where this build has them. Random
weights: the time depends on shapes only. The GGUF block formats (q4_k,
q6_k, ...) run as a llama.cpp file holds them: the LM head q6_k (Q4_K_M's
choice) and, where a matrix's inputs are not whole 256-weight super-blocks
(the default model's 576), llama-quantize's fallback type instead.
Prints one JSON object: milliseconds per step, best of --repeats, and the
machine (CPU model and flags, threads, load average).

`--inputs` adds what a product does to its input before the int8 products,
per call with --rows rows: the fused RMSNorm and SwiGLU alone
(`prepare_rows`), and the rounding to int8 blocks (a product of 8 output
columns, whose own arithmetic is a few percent of it), at the model's
widths, in microseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench.common import machine, machine_line  # noqa: E402
from engine.kernels import native  # noqa: E402
from engine.model.linear import Linear  # noqa: E402
from engine.model.quant import RAW_BLOCK_FORMATS, QuantLinear, quantize, random_raw_weight  # noqa: E402

# name -> (layers, hidden, intermediate, q/k/v rows, attention output width, vocabulary)
MODEL_SHAPES = {
    "smollm2-135m": (30, 576, 1536, 960, 576, 49152),
    "qwen3-0.6b": (28, 1024, 3072, 4096, 2048, 151936),
}
# llama-quantize's type for a matrix whose inputs are not whole super-blocks.
K_QUANT_FALLBACK = {"q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0"}


def timed(step: Callable[[], None], repeats: int) -> float:
    step()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - start)
    return round(best * 1000, 2)


def weights(gen: torch.Generator, shapes: str) -> list[torch.Tensor]:
    layers, hidden, inter, qkv, attention, vocab = MODEL_SHAPES[shapes]
    matrices = [(qkv, hidden), (hidden, attention), (2 * inter, hidden), (hidden, inter)]
    layer = [torch.randn(shape, generator=gen) * 0.02 for shape in matrices]
    return layer * layers + [torch.randn(vocab, hidden, generator=gen) * 0.02]


def raw_weight(fmt: str, w: torch.Tensor, gen: torch.Generator) -> QuantLinear:
    """`w`'s shape in the GGUF block format `fmt` (random blocks), or in
    llama-quantize's fallback where its inputs are not whole super-blocks."""
    if w.shape[1] % RAW_BLOCK_FORMATS[fmt][0]:
        fmt = K_QUANT_FALLBACK[fmt]
        if fmt not in RAW_BLOCK_FORMATS:
            return QuantLinear(quantize(w, fmt))
    return QuantLinear(random_raw_weight(fmt, w.shape[0], w.shape[1], gen))


def products(name: str, floats: list[torch.Tensor]) -> list[Callable[[torch.Tensor], torch.Tensor]]:
    if name == "float32":
        return [Linear(w) for w in floats]
    if name == "bfloat16":
        layers = [Linear(w.bfloat16()) for w in floats]
        return [lambda x, layer=layer: layer(x.bfloat16()) for layer in layers]
    if name in ("q8_0", "q4_0", "q4_1"):
        # The LM head stays q8_0, as llama.cpp's 4-bit mixes keep it.
        return [QuantLinear(quantize(w, name if i < len(floats) - 1 else "q8_0")) for i, w in enumerate(floats)]
    if name in RAW_BLOCK_FORMATS:
        gen = torch.Generator().manual_seed(1)
        return [raw_weight(name if i < len(floats) - 1 else "q6_k", w, gen) for i, w in enumerate(floats)]
    if name == "torch_int8pack":
        out = []
        for w in floats:
            scale = w.abs().amax(1) / 127
            q = torch.round(w / scale[:, None]).to(torch.int8)
            out.append(lambda x, q=q, s=scale: torch.ops.aten._weight_int8pack_mm(x, q, s))
        return out
    raise ValueError(name)


def input_preparation(shapes: str, rows: list[int], repeats: int) -> dict:
    """Microseconds per call of each input step, per row count, at the model's widths."""
    _, hidden, inter, *_ = MODEL_SHAPES[shapes]
    gen = torch.Generator().manual_seed(2)
    out: dict = {}
    for m in rows:
        x = torch.randn(m, 2 * inter, generator=gen)
        norm = torch.ones(hidden)
        q5 = QuantLinear(random_raw_weight("q5_0", 8, inter, gen))
        q4k = QuantLinear(random_raw_weight("q4_k", 8, inter, gen))
        y = torch.empty(m, 8)
        steps = {
            f"rms_norm_{hidden}": lambda: native.prepare_rows("rms_norm", x[:, :hidden], norm_weight=norm, eps=1e-5),
            f"swiglu_{inter}": lambda: native.prepare_rows("swiglu", x),
            f"int8_blocks_of_32_{inter}": lambda: q5.product_into(x[:, :inter], y),
            f"int8_blocks_of_256_{inter}": lambda: q4k.product_into(x[:, :inter], y),
        }
        # timed() answers in ms for one call; a call here is tens of microseconds
        out[str(m)] = {name: round(timed(lambda f=f: [f() for _ in range(100)], repeats) * 10, 2)
                       for name, f in steps.items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", default="1,16")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--kernels", default="float32,bfloat16,q8_0,q4_0,q4_1,q4_k,q6_k,torch_int8pack")
    parser.add_argument("--shapes", choices=sorted(MODEL_SHAPES), default="smollm2-135m")
    parser.add_argument("--inputs", action="store_true", help="also time the input preparation (microseconds)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    floats = weights(gen, args.shapes)
    result: dict = {"shapes": args.shapes, "ms_per_step": {}}
    for name in args.kernels.split(","):
        layers = products(name, floats)
        row_times = {}
        for rows in (int(r) for r in args.rows.split(",")):
            inputs = {cols: torch.randn(rows, cols, generator=gen) for cols in {w.shape[1] for w in floats}}
            pairs = [(layer, inputs[w.shape[1]]) for layer, w in zip(layers, floats, strict=True)]

            def step(pairs=pairs) -> None:
                for layer, x in pairs:
                    layer(x)

            with torch.inference_mode():
                row_times[str(rows)] = timed(step, args.repeats)
        result["ms_per_step"][name] = row_times
        del layers
    if args.inputs:
        result["input_us_per_call"] = input_preparation(args.shapes, [int(r) for r in args.rows.split(",")],
                                                        args.repeats)
    result["machine"] = machine()
    print(json.dumps(result))
    print(f"machine: {machine_line(result['machine'])}", file=sys.stderr)


if __name__ == "__main__":
    main()
