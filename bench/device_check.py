"""CUDA greedy vs CPU greedy on the default model, for a machine with a GPU.

    .venv/bin/python bench/device_check.py [--device cuda] [--reference cpu]

Runs the same chat prompts greedily on both devices in fp32 (TF32 off, so
CUDA matmuls are true fp32) and in the device's `auto` dtype, and reports per
prompt whether the generated ids are equal and, if not, where they first
differ. Prints one JSON object. With `--device cpu` it is a self-check.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import chat_prompts, machine  # noqa: E402
from engine import Engine, SamplingParams  # noqa: E402


def greedy_ids(device: str, dtype: str, prompts: list, new_tokens: int) -> tuple[str, list[list[int]]]:
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens)
    with Engine("default", device=device, dtype=dtype) as engine:
        outputs = engine.generate_outputs(prompts, params)
        return str(engine.dtype).removeprefix("torch."), [o.token_ids for o in outputs]


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--reference", default="cpu")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    prompts = chat_prompts(args.prompts)
    _, reference = greedy_ids(args.reference, "float32", prompts, args.new_tokens)
    result: dict = {"reference": f"{args.reference}/float32"}
    for dtype in ("float32", "auto"):
        picked, ids = greedy_ids(args.device, dtype, prompts, args.new_tokens)
        diffs = [first_difference(r, o) for r, o in zip(reference, ids)]
        result[f"{args.device}/{picked}"] = {
            "equal": sum(d is None for d in diffs),
            "of": len(diffs),
            "first_difference_at": diffs,
        }
    result["machine"] = machine()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
