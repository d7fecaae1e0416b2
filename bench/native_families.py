"""Decode speed of the native CPU path on the new families' blocks.

    .venv/bin/python bench/native_families.py [--families gemma3,qwen3] [--batch-sizes 1,16] [--threads 2]

Random-weight models of the published shapes of Gemma 3 270M and Qwen3
0.6B, made by transformers (in bfloat16, to halve the bytes written),
quantized to int8 (q8_0 blocks; embeddings and LM head as the loader's
quantized copy keeps them) and run through DecoderModel's native path by the
CPU runner: 40 prompt tokens per sequence, then 48 decode steps of B
sequences, logits included. Prints the median and the fastest step time
and tokens per second of each (on a busy machine the fastest step is the
steadier figure), and the machine line. The folders are kept under
--work-dir (default: a temporary folder) and reused when they exist.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench.common import machine_line  # noqa: E402

SHAPES = {
    # google/gemma-3-270m's config: 5 sliding layers of 512 keys to 1 global.
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
        sliding_window=512, max_position_embeddings=32768, rope_theta=1e6, tie_word_embeddings=True,
    )),
    # Qwen/Qwen3-0.6B's config.
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
        rope_theta=1e6, tie_word_embeddings=True,
    )),
}
PROMPT, STEPS, PAGE = 40, 48, 16


def random_folder(family: str, work: Path) -> Path:
    import transformers

    folder = work / f"{family}-random"
    if (folder / "config.json").is_file():
        return folder
    config_class, model_class, shape = SHAPES[family]
    config = getattr(transformers, config_class)(**shape)
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    return folder


def decode_ms(model, batch: int) -> tuple[float, float]:
    from engine.core.scheduler import ScheduledChunk, ScheduleResult
    from engine.runner.cpu import ModelRunner

    pages = (PROMPT + STEPS) // PAGE + 1
    runner = ModelRunner(model, model.new_kv_cache(batch * pages, PAGE))
    seqs = [
        SimpleNamespace(token_ids=[(31 * i + 7 * j) % 1000 + 10 for j in range(PROMPT + STEPS)],
                        pages=list(range(i * pages, (i + 1) * pages)), sampler=None)
        for i in range(batch)
    ]
    runner.forward(ScheduleResult(decodes=[], prefills=[ScheduledChunk(s, 0, PROMPT) for s in seqs]))
    times = []
    for pos in range(PROMPT, PROMPT + STEPS):
        start = time.perf_counter()
        hidden, _, _ = runner.forward(ScheduleResult(decodes=[ScheduledChunk(s, pos, 1) for s in seqs], prefills=[]))
        model.logits(hidden)
        times.append(time.perf_counter() - start)
    return min(times) * 1000, statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", default="gemma3,qwen3")
    parser.add_argument("--batch-sizes", default="1,16")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--work-dir", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from engine.formats.loader import load_model, quantized_copy

    work = args.work_dir or Path(tempfile.mkdtemp(prefix="tandem-families-"))
    print(machine_line(), file=sys.stderr)
    for family in args.families.split(","):
        folder = quantized_copy(random_folder(family, work), "int8", cache_dir=work)
        model = load_model(folder, "cpu", "float32")
        assert model.native_forward, "the native path did not take the model"
        for batch in map(int, args.batch_sizes.split(",")):
            fastest, median = decode_ms(model, batch)
            print(f"{family} int8 B={batch}: median {median:.1f} ms per step ({batch * 1000 / median:.1f} tok/s), "
                  f"fastest {fastest:.1f} ms ({batch * 1000 / fastest:.1f} tok/s)", flush=True)
        del model


if __name__ == "__main__":
    main()
