"""Every family Tandem runs, as a GGUF file made by llama.cpp's own tools from a transformers-made model.

    .venv/bin/python bench/family_ggufs.py [--families llama,gemma3,...] [--types q8_0,Q4_K_M] [--out DIR]

For each family: transformers builds a small random-weight model (its own
initialisation, scaled up so that greedy choices are not near-ties), the
default model's tokenizer goes beside it (Gemma 2's converter reads only a
SentencePiece model: one is trained on bench/data/public_domain.txt, which
the converter pads to the model's vocabulary; the comparisons are of ids), and
llama.cpp's convert_hf_to_gguf.py writes the GGUF file (q8_0; a K-quant type
through llama-quantize from the converter's f16 file, as a user makes one).
Then, on the same prompt ids:

- transformers' greedy continuation of the folder;
- Tandem's on the folder (float32): must equal transformers' (the folder path);
- Tandem's on each GGUF file: `python -m engine generate --model FILE.gguf`
  must run, and its tokens are compared with the folder's (a quantized file
  may part from it after a few tokens: random weights leave small margins).

Needs llama.cpp's source and tools (bench/llamacpp.py fetches and builds
them) and `sentencepiece` for the converter (`pip install sentencepiece`).
Nothing is downloaded from a model hub.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.llamacpp import Unavailable, cache_root, convert_hf_to_gguf, quantize_gguf  # noqa: E402
from engine.errors import EngineError  # noqa: E402

PROMPT = "The old lighthouse keeper climbed the stairs"
NEW_TOKENS = 12
COMMON = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=4096, initializer_range=0.2)
# family -> (transformers config class, fields beyond COMMON)
FAMILIES: dict[str, tuple[str, dict]] = {
    "llama": ("LlamaConfig", dict(rope_theta=500000.0)),
    "mistral-nemo": ("MistralConfig", dict(head_dim=32, sliding_window=None)),  # head_dim != hidden / heads
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", dict(head_dim=64, tie_word_embeddings=True)),
    "gemma2": ("Gemma2Config", dict(head_dim=64, query_pre_attn_scalar=64, sliding_window=8,
                                    attn_logit_softcapping=50.0, final_logit_softcapping=30.0)),
    # Six layers: Gemma 3's pattern (five sliding, one global), which the converter does not write.
    "gemma3": ("Gemma3TextConfig", dict(head_dim=64, query_pre_attn_scalar=64, sliding_window=8,
                                        num_hidden_layers=6)),
    "phi3": ("Phi3Config", dict(pad_token_id=0)),
    "phi4-mini": ("Phi3Config", dict(pad_token_id=0, partial_rotary_factor=0.75)),
    "granite": ("GraniteConfig", dict(embedding_multiplier=12.0, residual_multiplier=0.22,
                                      attention_multiplier=0.0078125, logits_scaling=8.0)),
}
SPM_VOCAB = 4000


def make_folder(family: str, folder: Path, vocab_size: int) -> Path:
    import torch
    import transformers

    from engine.formats.default_model import resolve_model

    class_name, fields = FAMILIES[family]
    config = getattr(transformers, class_name)(
        **{**COMMON, **fields, "vocab_size": vocab_size}, bos_token_id=1, eos_token_id=2,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer = resolve_model("default")
    shutil.copy(tokenizer / "tokenizer.json", folder / "tokenizer.json")
    settings = json.loads((tokenizer / "tokenizer_config.json").read_text(encoding="utf-8"))
    settings["tokenizer_class"] = "GPT2Tokenizer"  # Phi-3's converter reads a BPE vocabulary only under this name
    (folder / "tokenizer_config.json").write_text(json.dumps(settings), encoding="utf-8")
    if family == "gemma2":
        _train_sentencepiece(folder / "tokenizer.model")
    return folder


def _train_sentencepiece(path: Path) -> None:
    import sentencepiece

    text = Path(__file__).with_name("data") / "public_domain.txt"
    sentencepiece.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(path.with_suffix("")), vocab_size=SPM_VOCAB, model_type="bpe",
        byte_fallback=True, bos_id=1, eos_id=2, pad_id=0, unk_id=3, minloglevel=2,
    )


def transformers_greedy(folder: Path, ids: list[int]) -> list[int]:
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False,
                             min_new_tokens=NEW_TOKENS, pad_token_id=0)
    return out[0, len(ids):].tolist()


def tandem_greedy(model: Path, ids: list[int]) -> list[int]:
    from engine import Engine

    with Engine(str(model), device="cpu", dtype="float32") as engine:
        [output] = engine.generate_outputs([ids], max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    return list(output.token_ids)


def cli_runs(gguf: Path) -> str:
    """`python -m engine generate --model FILE.gguf` as a user runs it: its reply, or why it failed."""
    done = subprocess.run(
        [sys.executable, "-m", "engine", "generate", "--model", str(gguf), "--prompt", PROMPT,
         "--max-tokens", str(NEW_TOKENS), "--temperature", "0", "--json"],
        capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1],
    )
    if done.returncode != 0:
        return f"FAILED ({done.returncode}): {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ''}"
    return "ok: " + repr(json.loads(done.stdout.splitlines()[-1])["text"][:40])


def agreement(a: list[int], b: list[int]) -> str:
    same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return "all" if same == len(a) == len(b) else f"first {same}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--types", default="q8_0,Q4_K_M",
                        help="GGUF types: the converter's q8_0/f16, or llama-quantize types made from f16")
    parser.add_argument("--out", default=None, help="working folder (default: the bench cache)")
    args = parser.parse_args()

    from tokenizers import Tokenizer

    from bench.common import machine_line
    from engine.formats.default_model import resolve_model

    out = Path(args.out) if args.out else cache_root() / "family-ggufs"
    tokenizer = Tokenizer.from_file(str(resolve_model("default") / "tokenizer.json"))
    ids = tokenizer.encode(PROMPT).ids
    print(machine_line())
    print(f"prompt ids: {len(ids)}; {NEW_TOKENS} greedy tokens")
    print("| family | folder = transformers | GGUF | CLI generate | tokens equal to the folder's |")
    print("|---|---|---|---|---|")
    for family in args.families.split(","):
        folder = out / family
        try:
            if not (folder / "config.json").exists():
                make_folder(family, folder, tokenizer.get_vocab_size())
        except ImportError as missing:
            print(f"| {family} | skipped: {missing} | | | |")
            continue
        reference = transformers_greedy(folder, ids)
        folder_ids = tandem_greedy(folder, ids)
        folder_ok = "yes" if folder_ids == reference else f"NO ({agreement(folder_ids, reference)})"
        for qtype in args.types.split(","):
            gguf = out / f"{family}-{qtype}.gguf"
            try:
                if not gguf.exists():
                    if qtype.lower() in ("q8_0", "f16", "f32", "bf16"):
                        convert_hf_to_gguf(folder, gguf, qtype.lower())
                    else:
                        f16 = out / f"{family}-f16.gguf"
                        if not f16.exists():
                            convert_hf_to_gguf(folder, f16, "f16")
                        quantize_gguf(f16, gguf, qtype)
            except Unavailable as why:
                print(f"| {family} | {folder_ok} | {qtype}: not made: {str(why).strip().splitlines()[-1]} | | |")
                continue
            try:
                gguf_ids = tandem_greedy(gguf, ids)
            except EngineError as why:
                print(f"| {family} | {folder_ok} | {qtype} | refused: {why} | |", flush=True)
                continue
            print(f"| {family} | {folder_ok} | {qtype} | {cli_runs(gguf)} | {agreement(gguf_ids, folder_ids)} |",
                  flush=True)


if __name__ == "__main__":
    main()
