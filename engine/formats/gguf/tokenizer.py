"""The tokenizer of a GGUF file, rebuilt as a Hugging Face `tokenizers` one.

The vocabulary, merges and token types come from the metadata; the
pre-tokenizer is the one llama.cpp uses for the file's `tokenizer.ggml.pre`,
because the ids must be the ones the model was trained with. A
pre-tokenizer name missing from `BYTE_LEVEL_STYLES` is refused rather than
guessed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gguf import TokenType
from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)

from engine.errors import TokenizerError, UnsupportedModelError
from engine.formats.gguf.reader import GGUFMetadata
from engine.formats.model_json import shown_value
from engine.model.tokenizer import check_token_texts

# The GPT-2 split regex, applied after each digit has been split off on its
# own: llama.cpp's "smollm"/"starcoder" pre-tokenizers, and what the original
# tokenizer.json of those models does.
def _individual_digits_then_gpt2() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )


def _gpt2() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False)


def _split_then_bytes(pattern: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Mistral Nemo's (tokenizer.json's regex, which llama.cpp's "tekken" uses):
# words split before capitals, digits one by one.
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True, slots=True)
class _ByteLevelStyle:
    # A factory, so that no two tokenizers share one mutable pre-tokenizer.
    pre_tokenizer: Callable[[], pre_tokenizers.PreTokenizer]
    # llama.cpp takes a whole pre-token from the vocabulary before merging
    # (HF: BPE ignore_merges) for the Llama 3 family.
    ignore_merges: bool = False
    nfc: bool = False
    add_bos_default: bool = False


_LLAMA3_STYLE = _ByteLevelStyle(
    lambda: _split_then_bytes(_LLAMA3_SPLIT), ignore_merges=True, add_bos_default=True
)
# Qwen2's own tokenizer normalizes to NFC before splitting.
_QWEN2_STYLE = _ByteLevelStyle(lambda: _split_then_bytes(_QWEN2_SPLIT), nfc=True)
# llama.cpp (src/llama-vocab.cpp, "tekken"): whole words from the vocabulary, BOS added.
_TEKKEN_STYLE = _ByteLevelStyle(
    lambda: _split_then_bytes(_TEKKEN_SPLIT), ignore_merges=True, add_bos_default=True
)

# Keyed by tokenizer.ggml.pre. A name missing here is refused rather than
# guessed: a wrong split silently gives the model ids it never saw.
BYTE_LEVEL_STYLES = {
    "gpt2": _ByteLevelStyle(_gpt2),
    "smollm": _ByteLevelStyle(_individual_digits_then_gpt2),
    "starcoder": _ByteLevelStyle(_individual_digits_then_gpt2),
    "llama3": _LLAMA3_STYLE,
    "llama-v3": _LLAMA3_STYLE,
    "llama-bpe": _LLAMA3_STYLE,
    "qwen2": _QWEN2_STYLE,
    "deepseek-r1-qwen": _QWEN2_STYLE,
    "tekken": _TEKKEN_STYLE,
}


def build_tokenizer(meta: GGUFMetadata) -> tuple[Tokenizer, dict[str, Any]]:
    kind = meta.optional_string("tokenizer.ggml.model")
    tokens = meta.strings("tokenizer.ggml.tokens")
    if kind is None or not tokens:
        raise TokenizerError(f"{meta.source.name} has no tokenizer in its metadata; Tandem cannot use it.")
    token_types: list[int] = meta.integers("tokenizer.ggml.token_type") or [TokenType.NORMAL] * len(tokens)
    if len(token_types) != len(tokens):
        raise TokenizerError(
            f"{meta.source.name}: the tokenizer has {len(tokens)} tokens but {len(token_types)} token types."
        )
    if kind == "gpt2":
        special_types = {TokenType.CONTROL}
    elif kind == "llama":
        special_types = {TokenType.CONTROL, TokenType.UNKNOWN}
    else:
        raise UnsupportedModelError(
            f"{meta.source.name} uses the tokenizer model {shown_value(kind)}; Tandem supports 'gpt2' (byte-level BPE) "
            "and 'llama' (SentencePiece BPE)."
        )
    specials = [token for token, token_type in zip(tokens, token_types) if token_type in special_types and token]
    # The loaded tokenizer's own limits (engine.model.tokenizer), checked before anything is built.
    check_token_texts(tokens, specials, f"{meta.source.name} (tokenizer.ggml.tokens)")
    # First occurrence wins for duplicated strings, as in llama.cpp's lookup.
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        vocab.setdefault(token, index)

    if kind == "gpt2":
        tokenizer, add_bos_default = _byte_level_tokenizer(meta, vocab)
    else:
        tokenizer = _sentencepiece_tokenizer(meta, tokens, token_types, vocab)
        add_bos_default = True

    # Special and user-defined tokens are matched whole in the text, never
    # split; only special ones are dropped when decoding with skip_special_tokens.
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in specials])
    tokenizer.add_tokens(
        [
            AddedToken(token, special=False, normalized=False)
            for token, token_type in zip(tokens, token_types)
            if token_type == TokenType.USER_DEFINED and token
        ]
    )

    def special(key: str) -> tuple[str, int] | None:
        token_id = meta.optional_integer(f"tokenizer.ggml.{key}")
        if token_id is None or not 0 <= token_id < len(tokens):
            return None
        return tokens[token_id], token_id

    bos, eos = special("bos_token_id"), special("eos_token_id")
    add_bos = meta.flag("tokenizer.ggml.add_bos_token", add_bos_default)
    add_eos = meta.flag("tokenizer.ggml.add_eos_token", False)
    added = [token for token, wanted in ((bos, add_bos), (eos, add_eos)) if wanted]
    if None in added:
        raise TokenizerError(f"{meta.source.name} asks to add a BOS/EOS token it does not define.")
    if added:
        template = ([bos[0]] if add_bos else []) + ["$A"] + ([eos[0]] if add_eos else [])
        tokenizer.post_processor = processors.TemplateProcessing(
            single=template, special_tokens=list(dict(added).items())
        )

    def text(token: tuple[str, int] | None) -> str | None:
        return None if token is None else token[0]

    tokenizer_config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "bos_token": text(bos),
        "eos_token": text(eos),
        "unk_token": text(special("unknown_token_id")),
        "pad_token": text(special("padding_token_id")),
        "clean_up_tokenization_spaces": False,
    }
    chat_template = meta.optional_string("tokenizer.chat_template")
    if chat_template is not None:
        tokenizer_config["chat_template"] = chat_template
    return tokenizer, tokenizer_config


def _byte_level_tokenizer(meta: GGUFMetadata, vocab: dict[str, int]) -> tuple[Tokenizer, bool]:
    pre = meta.string("tokenizer.ggml.pre", "default")
    style = BYTE_LEVEL_STYLES.get(pre)
    if style is None:
        raise UnsupportedModelError(
            f"{meta.source.name} uses the byte-level pre-tokenizer {shown_value(pre)}, which Tandem does not know; "
            f"known: {', '.join(sorted(BYTE_LEVEL_STYLES))}."
        )
    merges = _parse_merges(meta, vocab)
    tokenizer = Tokenizer(models.BPE(vocab, merges, ignore_merges=style.ignore_merges))
    if style.nfc:
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = style.pre_tokenizer()
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer, style.add_bos_default


def _parse_merges(meta: GGUFMetadata, vocab: dict[str, int]) -> list[tuple[str, str]]:
    """The merges as pairs, each of tokens of the vocabulary whose joining is
    one too (tokenizers' BPE refuses anything else, with a bare Exception)."""
    merges = []
    for number, merge in enumerate(meta.strings("tokenizer.ggml.merges") or ()):
        left, sep, right = merge.partition(" ")
        if not sep or not left or not right:
            raise TokenizerError(f"{meta.source.name} has a malformed BPE merge: {shown_value(merge)}.")
        unknown = next((token for token in (left, right, left + right) if token not in vocab), None)
        if unknown is not None:
            raise TokenizerError(
                f"{meta.source.name}: tokenizer.ggml.merges number {number} ({shown_value(merge)}) names "
                f"{shown_value(unknown)}, which is not in tokenizer.ggml.tokens; the tokenizer is corrupt."
            )
        merges.append((left, right))
    return merges


def _sentencepiece_tokenizer(
    meta: GGUFMetadata, tokens: list[str], token_types: list[int], vocab: dict[str, int]
) -> Tokenizer:
    """SentencePiece BPE (Llama 2, Mistral) as an HF BPE with byte fallback.

    Like llama.cpp (and HF's legacy Llama tokenizer), a space is prepended to
    every stretch of text, including the one right after a special token.
    """
    merges = _parse_merges(meta, vocab)
    if not merges:
        scores = meta.reals("tokenizer.ggml.scores")
        if scores is None or len(scores) != len(tokens):
            raise TokenizerError(
                f"{meta.source.name} has a SentencePiece vocabulary without scores or merges."
            )
        merges = _merges_from_scores(tokens, token_types, scores, vocab)
    unk_id = meta.optional_integer("tokenizer.ggml.unknown_token_id")
    if unk_id is not None and not 0 <= unk_id < len(tokens):
        raise TokenizerError(
            f"{meta.source.name}: tokenizer.ggml.unknown_token_id is {unk_id}, but the vocabulary has "
            f"{len(tokens)} tokens; the tokenizer is corrupt."
        )
    unk = tokens[unk_id] if unk_id is not None else None
    tokenizer = Tokenizer(models.BPE(vocab, merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    add_space_prefix = meta.flag("tokenizer.ggml.add_space_prefix", True)
    replace_spaces = normalizers.Replace(" ", "\u2581")
    if add_space_prefix:
        tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), replace_spaces])
    else:
        tokenizer.normalizer = replace_spaces
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    tokenizer.decoder = decoders.Sequence(steps)
    return tokenizer


def _merges_from_scores(
    tokens: list[str], token_types: list[int], scores: list[float], vocab: dict[str, int]
) -> list[tuple[str, str]]:
    """The merge ranks SentencePiece BPE implies: a higher-scored piece merges first.

    Only normal pieces are merge results; SentencePiece never builds control,
    byte or unknown pieces from text.
    """
    ranked: list[tuple[float, int, str, str]] = []
    for index, (piece, token_type) in enumerate(zip(tokens, token_types)):
        if token_type != TokenType.NORMAL or vocab[piece] != index:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                ranked.append((-scores[index], index, left, right))
    ranked.sort()
    return [(left, right) for _, _, left, right in ranked]
