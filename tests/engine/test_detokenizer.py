"""engine.core.detokenizer: whole characters only, same text as a full decode, stop strings cut."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.detokenizer import IncrementalDetokenizer
from engine.model.tokenizer import Tokenizer
from tests.engine.test_tokenizer import (
    CHATML_SPECIALS,
    train_byte_level_bpe,
    train_sentencepiece_bpe,
    write_model_folder,
)

REPLACEMENT = "\ufffd"


@pytest.fixture(scope="module")
def byte_level(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    backend = train_byte_level_bpe(CHATML_SPECIALS)
    return Tokenizer.from_folder(write_model_folder(tmp_path_factory.mktemp("byte_level"), backend))


@pytest.fixture(scope="module")
def sentencepiece(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    folder = write_model_folder(tmp_path_factory.mktemp("sentencepiece"), train_sentencepiece_bpe())
    return Tokenizer.from_folder(folder)


def stream(detokenizer: IncrementalDetokenizer, ids: Sequence[int]) -> list[str]:
    """Every delta: one per id, then finish()."""
    return [detokenizer.add(token_id) for token_id in ids] + [detokenizer.finish()]


def token_texts(tokenizer: Tokenizer, ids: Sequence[int]) -> list[str]:
    return [tokenizer.decode([token_id]) for token_id in ids]


# Pieces that byte-level BPE and SentencePiece byte fallback split into several tokens.
TRICKY_PIECES = [
    "😀", "👍🏽", "👨‍👩‍👧", "🇩🇪", "中文", "日本語", "한국어", "é", "e\u0301", "n\u0303\u0323", "ß", "Ж",
    "  ", "\n\n", "\t", " ", "   \n", "hello", "The quick", " world", "😀😃", "\u200b",
]  # fmt: skip
texts = st.lists(
    st.one_of(st.sampled_from(TRICKY_PIECES), st.text(st.characters(codec="utf-8"), max_size=6)), max_size=25
).map("".join)

HYPOTHESIS = settings(max_examples=150, deadline=None)


def assert_streams_like_full_decode(tokenizer: Tokenizer, ids: Sequence[int]) -> None:
    detokenizer = IncrementalDetokenizer(tokenizer)
    deltas = stream(detokenizer, ids)
    full = tokenizer.decode(ids)

    assert "".join(deltas) == full == detokenizer.text
    if REPLACEMENT not in full:
        assert not any(REPLACEMENT in delta for delta in deltas)
    assert not detokenizer.stopped


@HYPOTHESIS
@given(text=texts)
def test_byte_level_stream_equals_full_decode(byte_level: Tokenizer, text: str) -> None:
    assert_streams_like_full_decode(byte_level, byte_level.encode(text))


@HYPOTHESIS
@given(text=texts)
def test_sentencepiece_stream_equals_full_decode(sentencepiece: Tokenizer, text: str) -> None:
    assert_streams_like_full_decode(sentencepiece, sentencepiece.encode(text))


@HYPOTHESIS
@given(data=st.data(), skip=st.booleans())
def test_any_byte_level_id_sequence_streams_like_full_decode(
    byte_level: Tokenizer, data: st.DataObject, skip: bool
) -> None:
    # What a random-weight model emits: stray bytes, broken UTF-8, special tokens anywhere.
    ids = data.draw(st.lists(st.integers(min_value=0, max_value=byte_level.vocab_size - 1), max_size=40))
    detokenizer = IncrementalDetokenizer(byte_level, skip_special_tokens=skip)

    deltas = stream(detokenizer, ids)

    assert "".join(deltas) == byte_level.decode(ids, skip_special_tokens=skip)


@HYPOTHESIS
@given(text=texts)
def test_stream_after_a_prompt_continues_its_text(sentencepiece: Tokenizer, text: str) -> None:
    prompt = sentencepiece.encode("Hello there, the lazy dog.", add_special_tokens=True)
    ids = sentencepiece.encode(text)

    deltas = stream(IncrementalDetokenizer(sentencepiece, prompt), ids)

    assert "".join(deltas) == sentencepiece.decode(prompt + ids)[len(sentencepiece.decode(prompt)) :]


def test_four_byte_emoji_split_over_tokens_is_emitted_whole(byte_level: Tokenizer) -> None:
    ids = byte_level.encode("ok 🦀!")
    pieces = token_texts(byte_level, ids)
    crab = [i for i, piece in enumerate(pieces) if REPLACEMENT in piece]
    assert len(crab) >= 2, "the crab must span several tokens, none of them a whole character"

    deltas = stream(IncrementalDetokenizer(byte_level), ids)

    assert all(deltas[i] == "" for i in crab[:-1])
    assert deltas[crab[-1]].endswith("🦀")
    assert "".join(deltas) == "ok 🦀!"


def test_sentencepiece_word_mid_stream_keeps_its_space(sentencepiece: Tokenizer) -> None:
    prompt = sentencepiece.encode("The quick")
    ids = sentencepiece.encode(" brown fox")[1:]  # from after the "▁" the normalizer prepends
    assert sentencepiece.decode(ids).startswith("brown"), "decoded alone, the first space is dropped"

    deltas = stream(IncrementalDetokenizer(sentencepiece, prompt), ids)

    assert "".join(deltas) == " brown fox"


def test_trailing_incomplete_character_is_released_as_decode_gives_it(byte_level: Tokenizer) -> None:
    ids = byte_level.encode("abc 😀")[:-1]
    detokenizer = IncrementalDetokenizer(byte_level)

    held = [detokenizer.add(token_id) for token_id in ids]
    tail = detokenizer.finish()

    assert REPLACEMENT not in "".join(held)
    assert "".join(held) + tail == byte_level.decode(ids)
    assert tail.endswith(REPLACEMENT)


def test_special_tokens_are_skipped_or_kept(byte_level: Tokenizer) -> None:
    ids = byte_level.encode("Hello<|im_end|> world<|endoftext|>")
    assert sum(byte_level.is_special(i) for i in ids) == 2

    assert "".join(stream(IncrementalDetokenizer(byte_level), ids)) == "Hello world"
    kept = IncrementalDetokenizer(byte_level, skip_special_tokens=False)
    assert "".join(stream(kept, ids)) == "Hello<|im_end|> world<|endoftext|>"


def test_special_tokens_in_the_prompt_do_not_shift_the_text(byte_level: Tokenizer) -> None:
    prompt = byte_level.encode("<|im_start|>assistant\n")
    ids = byte_level.encode("Hi 中文")

    assert "".join(stream(IncrementalDetokenizer(byte_level, prompt), ids)) == "Hi 中文"


# --- stop strings ------------------------------------------------------------------------------


def run_with_stops(tokenizer: Tokenizer, text: str, stops: Sequence[str]) -> tuple[list[str], IncrementalDetokenizer]:
    detokenizer = IncrementalDetokenizer(tokenizer, stop_strings=stops)
    return stream(detokenizer, tokenizer.encode(text)), detokenizer


def test_stop_string_that_is_one_token(byte_level: Tokenizer) -> None:
    text = "The quick brown fox jumps"
    assert " brown" in token_texts(byte_level, byte_level.encode(text))

    deltas, detokenizer = run_with_stops(byte_level, text, [" brown"])

    assert "".join(deltas) == detokenizer.text == "The quick"
    assert detokenizer.stopped and detokenizer.stop_reason == " brown"


def test_stop_string_split_over_tokens(byte_level: Tokenizer) -> None:
    text = "The quick brown fox jumps"
    stop = "k brown f"
    assert not any(stop in piece for piece in token_texts(byte_level, byte_level.encode(text)))

    deltas, detokenizer = run_with_stops(byte_level, text, [stop])

    assert "".join(deltas) == "The quic"
    assert detokenizer.stop_reason == stop


def test_stop_string_inside_a_token_with_other_text(byte_level: Tokenizer) -> None:
    text = "Hello world, hello there!"
    assert " there" in token_texts(byte_level, byte_level.encode(text))

    deltas, detokenizer = run_with_stops(byte_level, text, ["her"])

    assert "".join(deltas) == "Hello world, hello t"
    assert detokenizer.stopped


def test_stop_string_split_inside_a_multibyte_character(byte_level: Tokenizer) -> None:
    deltas, detokenizer = run_with_stops(byte_level, "ok 🦀🦀 done", ["🦀🦀"])

    assert "".join(deltas) == "ok "
    assert detokenizer.stop_reason == "🦀🦀"


def test_first_of_several_stop_strings_wins(byte_level: Tokenizer) -> None:
    deltas, detokenizer = run_with_stops(byte_level, "The quick brown fox jumps", ["fox", "jumps", "quick"])

    assert "".join(deltas) == "The "
    assert detokenizer.stop_reason == "quick"


def test_stop_string_at_the_very_start(byte_level: Tokenizer) -> None:
    deltas, detokenizer = run_with_stops(byte_level, "The quick brown fox", ["The"])

    assert deltas == [""] * len(deltas)
    assert detokenizer.stopped and detokenizer.text == ""


def test_text_after_a_stop_is_never_emitted(byte_level: Tokenizer) -> None:
    detokenizer = IncrementalDetokenizer(byte_level, stop_strings=["fox"])
    deltas = stream(detokenizer, byte_level.encode("The quick brown fox jumps over"))

    assert "".join(deltas) == "The quick brown "
    assert detokenizer.add(byte_level.encode("more")[0]) == ""
    assert detokenizer.finish() == ""
    assert detokenizer.text == "The quick brown "


def test_possible_stop_start_is_held_then_released(byte_level: Tokenizer) -> None:
    ids = byte_level.encode("The quick brown fox")
    pieces = token_texts(byte_level, ids)
    assert pieces[1] == " quick"
    detokenizer = IncrementalDetokenizer(byte_level, stop_strings=[" quick red"])

    deltas = stream(detokenizer, ids)

    assert deltas[1] == "", "' quick' may begin the stop string"
    assert deltas[2] == " quick brown"
    assert "".join(deltas) == "The quick brown fox"
    assert not detokenizer.stopped and detokenizer.stop_reason is None


def test_possible_stop_start_at_the_end_is_released_by_finish(byte_level: Tokenizer) -> None:
    detokenizer = IncrementalDetokenizer(byte_level, stop_strings=["brown bear"])

    emitted = "".join(detokenizer.add(token_id) for token_id in byte_level.encode("The quick brown"))

    assert emitted == "The quick "
    assert detokenizer.finish() == "brown"
    assert detokenizer.text == "The quick brown" and not detokenizer.stopped


def test_stop_string_matches_across_a_skipped_special_token(byte_level: Tokenizer) -> None:
    deltas, detokenizer = run_with_stops(byte_level, "Hello<|im_end|> world again", ["Hello world"])

    assert "".join(deltas) == ""
    assert detokenizer.stopped


@HYPOTHESIS
@given(text=texts, stop=st.sampled_from(["😀", "\n\n", "e\u0301", " ", "中文", "Ж Ж"]))
def test_stream_with_stop_string_is_full_decode_cut_at_the_stop(byte_level: Tokenizer, text: str, stop: str) -> None:
    full = byte_level.decode(byte_level.encode(text))

    deltas, detokenizer = run_with_stops(byte_level, text, [stop])

    assert "".join(deltas) == full.partition(stop)[0]
    assert detokenizer.stopped == (stop in full)


def test_empty_stop_strings_are_ignored(byte_level: Tokenizer) -> None:
    deltas, detokenizer = run_with_stops(byte_level, "The quick", [""])

    assert "".join(deltas) == "The quick"
    assert not detokenizer.stopped
