"""A random-weight model of a real family's shape, as a GGUF file made by llama.cpp's own converter.

    .venv/bin/python bench/random_gguf.py --shape gemma3-1b [--outtype q8_0] [--out DIR]

For speed comparisons on families whose real weights are not on this machine
(nothing is downloaded from a model hub): transformers builds the model with
its own random initialisation at the real shape (vocabulary included), the
default model's tokenizer files go beside it, and convert_hf_to_gguf.py from
the llama.cpp that bench/llamacpp.py builds writes the GGUF file (its
gguf-py on the path; the converter imports sentencepiece: `pip install
sentencepiece` if it is missing). Prints the file's path. Speed depends on
the shape and the formats, not on the values, so the figures hold for the
real models of that shape.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.llamacpp import _sdist, cache_root  # noqa: E402

# The shapes of the published checkpoints (their config.json), by name.
SHAPES: dict[str, tuple[str, dict]] = {
    "gemma3-1b": ("Gemma3TextConfig", dict(
        vocab_size=262144, hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
        sliding_window=512, max_position_embeddings=32768, rope_theta=1e6, rope_local_base_freq=1e4,
    )),
    "qwen3-0.6b": ("Qwen3Config", dict(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
        rope_theta=1e6, tie_word_embeddings=True,
    )),
    "qwen3-1.7b": ("Qwen3Config", dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
        rope_theta=1e6, tie_word_embeddings=True,
    )),
}


def converter_source() -> Path:
    """llama.cpp's source folder from the llama-cpp-python sdist, extracted once."""
    root = cache_root() / "llamacpp-source"
    found = sorted(root.glob("*/vendor/llama.cpp"))
    if found:
        return found[0]
    root.mkdir(parents=True, exist_ok=True)
    with tarfile.open(_sdist(lambda line: print(line, file=sys.stderr))) as archive:
        members = [m for m in archive.getmembers() if "/vendor/llama.cpp/" in m.name + "/"]
        archive.extractall(root, members=members, filter="data")
    return next(root.glob("*/vendor/llama.cpp"))


def make_folder(shape: str, folder: Path) -> Path:
    import torch
    import transformers

    from engine.formats.default_model import resolve_model

    class_name, fields = SHAPES[shape]
    tokenizer = resolve_model("default")
    if class_name.startswith("Gemma"):
        # Gemma's converter cuts the embedding to the tokenizer's size but
        # writes the config's vocab_size, which llama.cpp then refuses: with
        # the default model's tokenizer, the table has its 49k rows, not 262k.
        from tokenizers import Tokenizer

        fields = {**fields, "vocab_size": Tokenizer.from_file(str(tokenizer / "tokenizer.json")).get_vocab_size()}
    config = getattr(transformers, class_name)(**fields, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer / name, folder / name)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--outtype", default="q8_0", help="the converter's --outtype: f32, f16, bf16, q8_0")
    parser.add_argument("--out", default=None, help="folder for the model and the file (default: the bench cache)")
    args = parser.parse_args()

    out = Path(args.out) if args.out else cache_root() / "random-models"
    gguf = out / f"{args.shape}-random-{args.outtype}.gguf"
    if gguf.exists():
        print(gguf)
        return
    folder = out / f"{args.shape}-random"
    if not (folder / "config.json").exists():
        make_folder(args.shape, folder)
    source = converter_source()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(source / "gguf-py"), os.environ.get("PYTHONPATH")])))
    done = subprocess.run(
        [sys.executable, str(source / "convert_hf_to_gguf.py"), str(folder), "--outtype", args.outtype,
         "--outfile", str(gguf)],
        env=env, capture_output=True, text=True,
    )
    if done.returncode != 0:
        sys.exit(f"convert_hf_to_gguf.py failed ({done.returncode}):\n{done.stderr[-3000:]}")
    print(gguf)


if __name__ == "__main__":
    main()
