"""What the CPU kernels' int8 activations cost in quality, and which products
cause it: perplexity and KL divergence of the default model's arithmetic
variants against float32 inputs.

    .venv/bin/python bench/perplexity.py [--model default] [--threads 2] [--decode-tokens 64] [--decode-only]

The kernels (engine/kernels/native/quant_matmul.c) round every product's
input rows to int8 groups of 32, as llama.cpp does; the dequantized path
(`quantized="dequantize"`) multiplies float32 inputs by the same weights,
dequantized. Both hold the model's own weights bit for bit; only the
products' inputs differ. The variants:

    kernels              every product on the kernels (the default path)
    kernels_float_head   the kernels for every layer; the output product (the
                         LM head) on float32 inputs: the kernels' final hidden
                         states times the dequantized LM head weight
    float_int8_head      the dequantized path with only the LM head's input
                         rounded to int8 groups: the share of the gap the LM
                         head alone causes
    int8_all             every product's input rounded in Python, as the
                         kernel rounds it (checks the emulation against
                         `kernels`)
    int8_but_<product>   as int8_all, but <product> (qkv, o, gate_up, down: that
                         product of every layer) on float32 inputs: what
                         keeping that product's inputs at full precision buys
    dequantized          every product on float32 inputs (the reference)

Only `kernels`, `kernels_float_head` and `dequantized` are paths that run
today; the others are emulated in Python on the dequantized model.

For each: the perplexity over bench/data/public_domain.txt; the mean KL
divergence from the dequantized path's next-token distribution; how often its
most likely next token is the dequantized path's; the share of the kernels'
KL it keeps (1: all of it, 0: none); the greedy reply to "What is the capital
of France?" (issue 29's example) with its first token's two likeliest
choices and how far apart their logits are; and for the paths that run, the
one-sequence decode step (forward pass and LM head) in ms: the median of
`--decode-tokens` steps, the best of three rounds that take the variants in
turn, so a machine's load weighs on each alike. `emulation_max_logit_error`
is the largest logit difference between the Python rounding and the kernel
on the same hidden states through the LM head. `--decode-only` times the
decode steps alone (a minute, where the whole run takes ten or more on two
cores), for a machine that was busy during the full run.

Prints one JSON object; on stderr a table with the machine's CPU line.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import chat, machine, machine_line
from bench.quality import CHUNK, PAGE_SIZE, TEXT
from engine.core.scheduler import ScheduledChunk, ScheduleResult
from engine.formats.default_model import resolve_model
from engine.formats.loader import load_model, quantized_formats
from engine.model.decoder import DecoderModel
from engine.model.tokenizer import Tokenizer
from engine.runner.cpu import ModelRunner

GROUP = 32  # the kernels' activation group (quant_matmul.c GROUP)
PRODUCTS = ("qkv", "o", "gate_up", "down")  # a layer's products (engine.model.decoder.LayerWeights)
FRANCE = "What is the capital of France?"
REPLY_TOKENS = 16
ROUNDS = 3

Head = Callable[[torch.Tensor], torch.Tensor]


def round_to_int8_groups(x: torch.Tensor) -> torch.Tensor:
    """x with each group of 32 inputs rounded as quant_matmul.c `quantize_row`
    (and ggml-cpu's quantize_row_q8_0) does: levels x * (127 / max|x|), half
    to even, times the scale max|x| / 127 in fp16 (ggml's block_q8_0.d).
    127 / max is a true float32 division: torch's `127 / tensor` multiplies
    by a reciprocal, an ulp off for a quarter of all values, which rounds
    inputs on ties (many, after a q8_0 embedding's first norm) the other way."""
    groups = x.float().reshape(x.shape[0], -1, GROUP)
    amax = groups.abs().amax(dim=-1, keepdim=True)
    inverse = torch.where(amax > 0, amax.new_tensor(127.0) / amax, torch.zeros_like(amax))
    levels = torch.round(groups * inverse).clamp(-127, 127)
    return (levels * (amax / 127.0).half().float()).reshape(x.shape)


class Int8Inputs:
    """A float product whose input rows are rounded to int8 groups first, as the kernel rounds them."""

    def __init__(self, product: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.product = product
        self.out_features = getattr(product, "out_features", None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.product(round_to_int8_groups(x))

    def tiled(self, x: torch.Tensor, rows: int) -> torch.Tensor:
        return self(x)


def with_int8_inputs(model: DecoderModel, products: tuple[str, ...]) -> DecoderModel:
    """A copy of the dequantized `model` (sharing its weights) whose layers round the inputs of `products`."""
    emulated = copy.copy(model)
    emulated.layers = [
        dataclasses.replace(layer, **{name: Int8Inputs(getattr(layer, name)) for name in products})
        for layer in model.layers
    ]
    return emulated


@dataclass(slots=True)
class Variant:
    name: str
    model: str  # the key of the model whose layers compute the hidden states
    head: Head
    runnable: bool  # a path Tandem runs today (the others are emulated)


class Sequence:
    """One sequence on its own KV cache: hidden states of a prefill chunk or a decode step."""

    def __init__(self, model: DecoderModel, ids: list[int], capacity: int) -> None:
        pages = -(-capacity // PAGE_SIZE)
        self.runner = ModelRunner(model, model.new_kv_cache(pages + 1, PAGE_SIZE))
        self.seq = SimpleNamespace(token_ids=ids, pages=list(range(pages)), sampler=None)

    def hidden(self, start: int, count: int, decode: bool = False) -> torch.Tensor:
        chunk = ScheduledChunk(self.seq, start, count)  # type: ignore[arg-type]
        step = ScheduleResult(decodes=[chunk], prefills=[]) if decode else ScheduleResult(decodes=[], prefills=[chunk])
        hidden, _, _ = self.runner.forward(step)
        return hidden


def compare_on_text(
    models: dict[str, DecoderModel], variants: list[Variant], ids: list[int]
) -> tuple[dict[str, dict[str, float]], float]:
    """Perplexity, mean KL from the dequantized path and top-1 agreement of
    every variant over `ids`; and the emulation's largest logit error."""
    sequences = {name: Sequence(model, ids, len(ids)) for name, model in models.items()}
    nll = {v.name: 0.0 for v in variants}
    kl = {v.name: 0.0 for v in variants}
    same_top = {v.name: 0 for v in variants}
    emulation_error = 0.0
    positions = len(ids) - 1
    with torch.inference_mode():
        for start in range(0, positions, CHUNK):
            count = min(CHUNK, positions - start)
            hidden = {name: s.hidden(start, count) for name, s in sequences.items()}
            targets = torch.tensor(ids[start + 1 : start + 1 + count])
            reference = F.log_softmax(models["dequantized"].lm_head(hidden["dequantized"]).float(), dim=-1)
            top = reference.argmax(dim=-1)
            for v in variants:
                logprobs = F.log_softmax(v.head(hidden[v.model]).float(), dim=-1)
                nll[v.name] -= logprobs.gather(1, targets[:, None]).sum().item()
                kl[v.name] += F.kl_div(logprobs, reference, log_target=True, reduction="sum").item()
                same_top[v.name] += int((logprobs.argmax(dim=-1) == top).sum())
            emulated = models["dequantized"].lm_head(round_to_int8_groups(hidden["kernels"]))
            kernel = models["kernels"].lm_head(hidden["kernels"])
            emulation_error = max(emulation_error, (emulated - kernel).abs().max().item())
    figures = {
        v.name: {
            "perplexity": round(math.exp(nll[v.name] / positions), 4),
            "mean_kl_from_dequantized": round(kl[v.name] / positions, 5),
            "share_of_kernels_kl": round(kl[v.name] / kl["kernels"], 3) if kl["kernels"] else None,
            "top1_agrees_with_dequantized": round(same_top[v.name] / positions, 4),
        }
        for v in variants
    }
    return figures, emulation_error


def greedy_decode(
    model: DecoderModel, head: Head, prompt: list[int], new_tokens: int
) -> tuple[list[int], list[float], torch.Tensor]:
    """Greedy reply ids, the time of each decode step after the prefill
    (forward + head) in ms, and the logits of the reply's first token."""
    ids = list(prompt)
    sequence = Sequence(model, ids, len(prompt) + new_tokens)
    steps: list[float] = []
    with torch.inference_mode():
        logits = first = head(sequence.hidden(0, len(ids))[-1:]).float()
        while True:
            ids.append(int(logits[-1].argmax()))
            if len(ids) == len(prompt) + new_tokens:
                break
            begin = time.perf_counter()
            logits = head(sequence.hidden(len(ids) - 1, 1, decode=True))
            steps.append((time.perf_counter() - begin) * 1000)
    return ids[len(prompt) :], steps, first[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--decode-only", action="store_true",
                        help="time the decode steps of the paths that run, nothing else")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    folder = resolve_model(args.model)
    if not quantized_formats(folder):
        sys.exit(f"{folder} keeps no quantized weights: the kernels never run on it, so there is nothing to compare.")
    tokenizer = Tokenizer.from_folder(folder)
    text_ids = tokenizer.encode(TEXT.read_text(encoding="utf-8"))
    france = tokenizer.encode_chat(chat(FRANCE))

    kernels = load_model(folder, "cpu", "float32", quantized="kernel")
    dequantized = load_model(folder, "cpu", "float32", quantized="dequantize")
    models = {"kernels": kernels, "dequantized": dequantized, "int8_all": with_int8_inputs(dequantized, PRODUCTS)}
    for kept in PRODUCTS:
        models[f"int8_but_{kept}"] = with_int8_inputs(dequantized, tuple(p for p in PRODUCTS if p != kept))
    # The same weights as the kernels' LM head, in float32.
    float_head = dequantized.lm_head
    int8_head = Int8Inputs(float_head)
    variants = [
        Variant("kernels", "kernels", kernels.lm_head, runnable=True),
        Variant("kernels_float_head", "kernels", float_head, runnable=True),
        Variant("float_int8_head", "dequantized", int8_head, runnable=False),
        Variant("int8_all", "int8_all", int8_head, runnable=False),
        *(Variant(f"int8_but_{p}", f"int8_but_{p}", int8_head, runnable=False) for p in PRODUCTS),
        Variant("dequantized", "dequantized", float_head, runnable=True),
    ]

    report: dict[str, object] = {"model": str(folder)}
    quality: dict[str, dict[str, float]] = {v.name: {} for v in variants}
    if args.decode_only:
        variants = [v for v in variants if v.runnable]
    else:
        start = time.perf_counter()
        quality, emulation_error = compare_on_text(models, variants, text_ids)
        report |= {
            "text": TEXT.name,
            "text_tokens": len(text_ids),
            "text_seconds": round(time.perf_counter() - start, 1),
            "emulation_max_logit_error": round(emulation_error, 6),
        }
        reference = quality["dequantized"]["perplexity"]
        for row in quality.values():
            row["perplexity_change_pct"] = round(100 * (row["perplexity"] / reference - 1), 3)
    results: dict[str, dict[str, object]] = {}
    for variant in variants:
        reply, _, first = greedy_decode(models[variant.model], variant.head, france, REPLY_TOKENS)
        top = first.topk(2)
        results[variant.name] = {
            **quality[variant.name],
            "decode_step_ms": None,
            "greedy_reply": tokenizer.decode(reply),
            # How near the reply's first choice was: its two likeliest tokens and their logits' difference.
            "first_token": {"choices": [tokenizer.decode([int(i)]) for i in top.indices],
                            "logit_margin": round(float(top.values[0] - top.values[1]), 4)},
        }
    runnable = [v for v in variants if v.runnable]
    medians: dict[str, list[float]] = {v.name: [] for v in runnable}
    for _ in range(ROUNDS):
        for variant in runnable:
            _, steps, _ = greedy_decode(models[variant.model], variant.head, france, args.decode_tokens)
            medians[variant.name].append(statistics.median(steps))
    for name, values in medians.items():
        results[name]["decode_step_ms"] = round(min(values), 2)

    info = machine(args.threads)
    report |= {"variants": results, "machine": info}
    print(json.dumps(report, indent=2, ensure_ascii=False))
    print(f"machine: {machine_line(info)}", file=sys.stderr)
    for name, row in results.items():
        step = f"{row['decode_step_ms']:7.2f} ms/step" if row["decode_step_ms"] is not None else "   (emulated)"
        figures = "" if args.decode_only else (
            f"perplexity {row['perplexity']:8.4f} ({row['perplexity_change_pct']:+.2f}%)  "
            f"KL {row['mean_kl_from_dequantized']:.5f} ({row['share_of_kernels_kl']:.2f} of the kernels')  "
        )
        print(f"{name:20} {figures}{step}  {row['greedy_reply']!r}", file=sys.stderr)


if __name__ == "__main__":
    main()
