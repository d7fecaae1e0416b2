"""A random-weight model of a real family's shape, as a GGUF file made by llama.cpp's own converter.

    .venv/bin/python bench/random_gguf.py --shape gemma3-1b [--outtype q8_0|Q4_K_M|...] [--out DIR]

For speed comparisons on families whose real weights are not on this machine
(nothing is downloaded from a model hub): transformers builds the model with
its own random initialisation at the real shape (vocabulary included), the
default model's tokenizer files go beside it, and convert_hf_to_gguf.py from
the llama.cpp that bench/llamacpp.py builds writes the GGUF file (its
gguf-py on the path; the converter imports sentencepiece: `pip install
sentencepiece` if it is missing); a K-quant type (`--outtype Q4_K_M`) is
made from the converter's f16 file by llama-quantize, as a user makes one.
Prints the file's path. Speed depends on the shape and the formats, not on
the values, so the figures hold for the real models of that shape.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.llamacpp import Unavailable, cache_root, convert_hf_to_gguf, quantize_gguf  # noqa: E402

# convert_hf_to_gguf.py's own --outtype values; other types go through llama-quantize.
CONVERTER_TYPES = ("f32", "f16", "bf16", "q8_0")
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
    parser.add_argument("--outtype", default="q8_0",
                        help="the converter's --outtype (f32, f16, bf16, q8_0), or a llama-quantize type "
                             "(Q4_K_M, Q5_K_M, Q6_K, ...) made from the converter's f16 file")
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
    try:
        if args.outtype.lower() in CONVERTER_TYPES:
            convert_hf_to_gguf(folder, gguf, args.outtype.lower())
        else:
            f16 = out / f"{args.shape}-random-f16.gguf"
            if not f16.exists():
                convert_hf_to_gguf(folder, f16, "f16")
            quantize_gguf(f16, gguf, args.outtype)
    except Unavailable as why:
        sys.exit(str(why))
    print(gguf)


if __name__ == "__main__":
    main()
