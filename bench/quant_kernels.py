"""The weight products of one decode step, kernel by kernel.

    .venv/bin/python bench/quant_kernels.py [--rows 1,16] [--threads 2]

For the default model's shapes (30 layers of fused q/k/v, o, fused
gate/up and down products, plus the 49152-row LM head), the time of every
product of one step with M rows: oneDNN fp32 (engine.model.linear.Linear, the
dequantized model), bf16, and the quantized formats on the native kernel
(engine.model.quant.QuantLinear), beside torch's own weight-only CPU kernels where
this build has them. Random weights: the time depends on shapes only.
Prints one JSON object: milliseconds per step, best of --repeats, and the
machine (CPU model and flags, threads, load average).
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
from engine.model.linear import Linear  # noqa: E402
from engine.model.quant import QuantLinear, quantize  # noqa: E402

LAYERS = 30
HIDDEN, INTER, QKV, VOCAB = 576, 1536, 960, 49152
SHAPES = [(QKV, HIDDEN), (HIDDEN, HIDDEN), (2 * INTER, HIDDEN), (HIDDEN, INTER)]


def timed(step: Callable[[], None], repeats: int) -> float:
    step()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - start)
    return round(best * 1000, 2)


def weights(gen: torch.Generator) -> list[torch.Tensor]:
    layer = [torch.randn(shape, generator=gen) * 0.02 for shape in SHAPES]
    return layer * LAYERS + [torch.randn(VOCAB, HIDDEN, generator=gen) * 0.02]


def products(name: str, floats: list[torch.Tensor]) -> list[Callable[[torch.Tensor], torch.Tensor]]:
    if name == "float32":
        return [Linear(w) for w in floats]
    if name == "bfloat16":
        layers = [Linear(w.bfloat16()) for w in floats]
        return [lambda x, layer=layer: layer(x.bfloat16()) for layer in layers]
    if name in ("q8_0", "q4_0", "q4_1"):
        # The LM head stays q8_0, as llama.cpp's 4-bit mixes keep it.
        return [QuantLinear(quantize(w, name if i < len(floats) - 1 else "q8_0")) for i, w in enumerate(floats)]
    if name == "torch_int8pack":
        out = []
        for w in floats:
            scale = w.abs().amax(1) / 127
            q = torch.round(w / scale[:, None]).to(torch.int8)
            out.append(lambda x, q=q, s=scale: torch.ops.aten._weight_int8pack_mm(x, q, s))
        return out
    raise ValueError(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", default="1,16")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--kernels", default="float32,bfloat16,q8_0,q4_0,q4_1,torch_int8pack")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    floats = weights(gen)
    result: dict = {"ms_per_step": {}}
    for name in args.kernels.split(","):
        layers = products(name, floats)
        row_times = {}
        for rows in (int(r) for r in args.rows.split(",")):
            inputs = {cols: torch.randn(rows, cols, generator=gen) for cols in (HIDDEN, INTER)}
            pairs = [(layer, inputs[w.shape[1]]) for layer, w in zip(layers, floats, strict=True)]

            def step(pairs=pairs) -> None:
                for layer, x in pairs:
                    layer(x)

            with torch.inference_mode():
                row_times[str(rows)] = timed(step, args.repeats)
        result["ms_per_step"][name] = row_times
        del layers
    result["machine"] = machine()
    print(json.dumps(result))
    print(f"machine: {machine_line(result['machine'])}", file=sys.stderr)


if __name__ == "__main__":
    main()
