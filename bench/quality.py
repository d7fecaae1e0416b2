"""Accuracy of kept-quantized weights against the same weights dequantized.

    .venv/bin/python bench/quality.py [--model default] [--new-tokens 48] [--threads 2]

Loads the model twice: with its block-quantized weights dequantized to
float32 at load (what the GGUF file means, and what transformers computes),
and kept quantized behind the weight-only kernels (engine.model.quant). Prints one
JSON object with, for each: the perplexity over bench/data/public_domain.txt
(a fixed public-domain text, checked in), and the greedy replies to the chat
prompts of bench/common.py, with how many agree token for token. On stderr:
the perplexity change against its goal (within 1%, issue 20) with the CPU line.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import PROMPTS, chat, machine, machine_line
from engine.formats.default_model import resolve_model
from engine.formats.loader import load_model, quantized_formats
from engine.model.decoder import DecoderModel
from engine.runner.cpu import ModelRunner
from engine.core.scheduler import ScheduledChunk, ScheduleResult
from engine.model.tokenizer import Tokenizer

TEXT = Path(__file__).resolve().parent / "data" / "public_domain.txt"
PAGE_SIZE = 16
CHUNK = 256  # prefill chunk: bounds the logits held at once to CHUNK x vocab


def _runner(model: DecoderModel, tokens: int) -> ModelRunner:
    return ModelRunner(model, model.new_kv_cache(-(-tokens // PAGE_SIZE) + 1, PAGE_SIZE))


def _step(runner: ModelRunner, seq: SimpleNamespace, start: int, count: int, decode: bool) -> torch.Tensor:
    chunk = ScheduledChunk(seq, start, count)  # type: ignore[arg-type]
    step = ScheduleResult(decodes=[chunk], prefills=[]) if decode else ScheduleResult(decodes=[], prefills=[chunk])
    hidden, _, _ = runner.forward(step)
    return runner.model.logits(hidden)


def perplexity(model: DecoderModel, ids: list[int]) -> float:
    runner = _runner(model, len(ids))
    seq = SimpleNamespace(token_ids=ids, pages=list(range(-(-len(ids) // PAGE_SIZE))), sampler=None)
    nll = 0.0
    for start in range(0, len(ids) - 1, CHUNK):
        count = min(CHUNK, len(ids) - 1 - start)
        logits = _step(runner, seq, start, count, decode=False)
        targets = torch.tensor(ids[start + 1 : start + 1 + count])
        nll += F.cross_entropy(logits, targets, reduction="sum").item()
    return math.exp(nll / (len(ids) - 1))


def greedy(model: DecoderModel, prompt: list[int], new_tokens: int) -> list[int]:
    ids = list(prompt)
    runner = _runner(model, len(ids) + new_tokens)
    seq = SimpleNamespace(token_ids=ids, pages=list(range(-(-(len(ids) + new_tokens) // PAGE_SIZE))), sampler=None)
    logits = _step(runner, seq, 0, len(ids), decode=False)
    for _ in range(new_tokens):
        ids.append(int(logits[-1].argmax()))
        if len(ids) == len(prompt) + new_tokens:
            break
        logits = _step(runner, seq, len(ids) - 1, 1, decode=True)
    return ids[len(prompt) :]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    folder = resolve_model(args.model)
    if not quantized_formats(folder):
        sys.exit(f"{folder} keeps no quantized weights; nothing to compare.")
    tokenizer = Tokenizer.from_folder(folder)
    text_ids = tokenizer.encode(TEXT.read_text(encoding="utf-8"))
    prompts = [tokenizer.encode_chat(chat(p)) for p in PROMPTS]

    results: dict[str, dict[str, object]] = {}
    replies: dict[str, list[list[int]]] = {}
    for name, compute in (("fp32_dequantized", "dequantize"), ("kept_quantized", "kernel")):
        model = load_model(folder, "cpu", "float32", quantized=compute)
        start = time.perf_counter()
        ppl = perplexity(model, text_ids)
        replies[name] = [greedy(model, p, args.new_tokens) for p in prompts]
        results[name] = {"perplexity": round(ppl, 4), "seconds": round(time.perf_counter() - start, 1)}
        del model

    ref, quant = replies["fp32_dequantized"], replies["kept_quantized"]
    common = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(x)) for x, y in zip(ref, quant)]
    base = results["fp32_dequantized"]["perplexity"]
    report = {
        "model": str(folder),
        "text_tokens": len(text_ids),
        **results,
        "perplexity_change_pct": round(100 * (results["kept_quantized"]["perplexity"] / base - 1), 3),  # type: ignore[operator]
        "greedy": {
            "prompts": len(prompts),
            "new_tokens": args.new_tokens,
            "identical_replies": sum(x == y for x, y in zip(ref, quant)),
            "mean_common_prefix_tokens": round(sum(common) / len(common), 1),
            "first_divergence": {PROMPTS[i]: common[i] for i in range(len(prompts)) if ref[i] != quant[i]},
        },
        "machine": machine(args.threads),
    }
    change = report["perplexity_change_pct"]
    report["goal"] = {"goal": "perplexity kept quantized within 1% of dequantized", "pass": abs(change) <= 1.0}
    print(json.dumps(report, indent=2))
    print(f"machine: {machine_line(report['machine'])}\n"
          f"perplexity: {base} dequantized (fp32), {results['kept_quantized']['perplexity']} kept quantized\n"
          f"{'PASS' if report['goal']['pass'] else 'FAIL'}  {report['goal']['goal']}: {change:+}%", file=sys.stderr)


if __name__ == "__main__":
    main()
