"""Reasoning apart from the answer: the streaming parser against the whole-text split,
at every place a delta may end."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.reasoning import (
    ReasoningParser,
    answer_of,
    prompt_opens_reasoning,
    split,
    split_reply,
    template_has_thinking_switch,
    template_reasons,
)
from engine.model.tokenizer import Tokenizer
from tests.engine.test_tokenizer import train_byte_level_bpe

# (raw reply, starts inside the block, reasoning, answer, block closed)
CASES = [
    ("<think>\nThe user greets me.\n</think>\n\nHello!", False, "The user greets me.", "Hello!", True),
    ("The user greets me.\n</think>\n\nHello!", True, "The user greets me.", "Hello!", True),  # R1 distills
    ("<think>\nStill thinking about 2 + 2", False, "Still thinking about 2 + 2", "", False),
    ("Still thinking", True, "Still thinking", "", False),
    ("\n\n<think>why</think>Because.", False, "why", "Because.", True),
    ("Sure. <think>hidden</think> Done", False, "hidden", "Sure. Done", True),
    ("<think>\n\n</think>\n\nNo thinking needed.", False, "", "No thinking needed.", True),  # Qwen3, trivial
    ("A plain answer: < and </thin and <think.\n", False, "", "A plain answer: < and </thin and <think.\n", True),
    ("  leading and trailing  ", False, "", "  leading and trailing  ", True),
    ("<think>a <think> inside</think>x </think> <think> y", False, "a <think> inside", "x </think> <think> y", True),
    ("<think>ends on a partial </thi", False, "ends on a partial </thi", "", False),
    ("answer ends on a partial <thin", False, "", "answer ends on a partial <thin", True),
    ("", False, "", "", True),
]


def stream(text: str, cuts: list[int], starts_in_reasoning: bool) -> tuple[str, str, ReasoningParser]:
    parser = ReasoningParser(starts_in_reasoning=starts_in_reasoning)
    reasoning, answer = "", ""
    bounds = [0, *cuts, len(text)]
    for a, b in zip(bounds, bounds[1:]):
        r, s = parser.feed(text[a:b])
        reasoning, answer = reasoning + r, answer + s
    r, s = parser.finish()
    return reasoning + r, answer + s, parser


@pytest.mark.parametrize(("text", "inside", "reasoning", "answer", "closed"), CASES)
def test_the_whole_text_splits_into_reasoning_and_answer(text: str, inside: bool, reasoning: str, answer: str,
                                                         closed: bool) -> None:
    parts = split_reply(text, starts_in_reasoning=inside)
    assert (parts.reasoning, parts.answer, parts.reasoning_finished) == (reasoning, answer, closed)


@pytest.mark.parametrize(("text", "inside", "reasoning", "answer", "closed"), CASES)
def test_a_stream_cut_anywhere_gives_the_same_parts(text: str, inside: bool, reasoning: str, answer: str,
                                                    closed: bool) -> None:
    for cut in range(len(text) + 1):
        assert stream(text, [cut], inside)[:2] == (reasoning, answer), f"cut at {cut}"
    got_reasoning, got_answer, parser = stream(text, list(range(1, len(text))), inside)  # a character a delta
    assert (got_reasoning, got_answer, parser.reasoning_finished or not parser.has_reasoning) == (
        reasoning, answer, closed)


def test_every_pair_of_cuts_around_the_tags() -> None:
    text = "<think>ab</think>cd"
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1):
            assert stream(text, [i, j], False)[:2] == ("ab", "cd"), (i, j)


def test_nothing_of_a_tag_shows_before_it_is_complete() -> None:
    parser = ReasoningParser()
    assert parser.feed("<thi") == ("", "")
    assert parser.feed("nk>Let me see") == ("Let me see", "")
    assert parser.in_reasoning
    assert parser.feed(" more</th") == (" more", "")
    assert parser.feed("ink>\n\nIt is 4.") == ("", "It is 4.")
    assert not parser.in_reasoning and parser.reasoning_finished


def test_a_stored_reply_tells_by_itself_where_its_reasoning_ends() -> None:
    # As the R1 distills' replies are stored: the prompt held the opening tag.
    assert split("Two plus two is four.\n</think>\n\n4") == ("Two plus two is four.", "4")
    assert split("<think>x</think>y") == ("x", "y")
    assert split("No reasoning at all") == ("", "No reasoning at all")
    assert answer_of("<think>x</think>\n\nThe answer") == "The answer"


def test_the_prompt_and_template_rules() -> None:
    assert prompt_opens_reasoning("<｜User｜>Hi<｜Assistant｜><think>\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n")
    assert template_reasons("{{ '<think>' }}") and not template_reasons("{{ messages }}") and not template_reasons(None)
    assert template_has_thinking_switch("{% if enable_thinking is false %}") and not template_has_thinking_switch("x")


_PIECES = st.sampled_from(["<think>", "</think>", "<", "</", "<th", "</thi", "nk>", "k>", "a", "b c", " ", "\n"])


@settings(max_examples=100, deadline=None)
@given(pieces=st.lists(_PIECES, max_size=12), inside=st.booleans(), data=st.data())
def test_any_text_cut_anywhere_streams_as_it_splits(pieces: list[str], inside: bool, data: st.DataObject) -> None:
    text = "".join(pieces)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=6)))
    whole = split_reply(text, starts_in_reasoning=inside)
    reasoning, answer, parser = stream(text, cuts, inside)
    assert (reasoning, answer) == (whole.reasoning, whole.answer)
    assert parser.has_reasoning == whole.has_reasoning
    if not whole.has_reasoning:
        assert answer == text  # a reply without a block is untouched


# -- the published templates: what the next turn's prompt keeps, and the thinking switch --------

TEMPLATES = Path(__file__).parent / "data" / "templates"
QWEN3 = "Qwen-Qwen3-0.6B.jinja"
R1_QWEN = "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"
R1_LLAMA = "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja"
_SPECIALS = {
    QWEN3: {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    R1_QWEN: {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
    R1_LLAMA: {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
}


@functools.cache
def template_tokenizer(name: str | None) -> Tokenizer:
    """A small byte-level tokenizer with a published template (None: no template, ChatML's fallback)."""
    specials = _SPECIALS.get(name or "", {"eos_token": "<|im_end|>"})
    markers = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<｜User｜>", "<｜Assistant｜>", *specials.values()]
    backend = train_byte_level_bpe(list(dict.fromkeys(markers)), vocab_size=300)
    template = (TEMPLATES / name).read_text(encoding="utf-8") if name else None
    return Tokenizer(backend, chat_template=template, special_tokens=specials, add_bos_token=False)


def first_turn(tokenizer: Tokenizer) -> tuple[list[int], str, list[int]]:
    """The first turn's prompt ids, its reply as the conversation keeps its text
    (the opening tag a prompt wrote included) and its kept ids."""
    kwargs = {"enable_thinking": True} if template_has_thinking_switch(tokenizer.chat_template_source) else None
    prompt = tokenizer.encode_chat([{"role": "user", "content": "What is 2+2?"}], template_kwargs=kwargs)
    opened = prompt_opens_reasoning(tokenizer.decode(prompt, skip_special_tokens=False))
    generated = ("" if opened else "<think>\n") + "I add two and two.\n</think>\n\nIt is 4."
    text = ("<think>\n" if opened else "") + generated
    return prompt, text, prompt + tokenizer.encode(generated) + sorted(tokenizer.eos_token_ids)[:1]


@pytest.mark.parametrize("name", [QWEN3, R1_QWEN, R1_LLAMA])
def test_the_published_templates_leave_the_last_turns_reasoning_out_of_the_next_prompt(name: str) -> None:
    tokenizer = template_tokenizer(name)
    assert template_reasons(tokenizer.chat_template_source) and tokenizer.drops_reasoning
    _, reply, kept = first_turn(tokenizer)
    assert split(reply) == ("I add two and two.", "It is 4.")
    messages = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": reply},
                {"role": "user", "content": "And 3+3?"}]
    kwargs = {"enable_thinking": True} if name != R1_LLAMA else None
    prompt = tokenizer.decode(tokenizer.encode_next_turn(kept, messages, template_kwargs=kwargs),
                              skip_special_tokens=False)
    assert "It is 4." in prompt and "And 3+3?" in prompt
    assert "I add two and two" not in prompt
    # The R1 distills' generation prompt opens the next reply's think block; Qwen3's does not.
    assert prompt_opens_reasoning(prompt) == (name != QWEN3)


def test_qwen3s_switch_closes_the_think_block_in_the_prompt() -> None:
    tokenizer = template_tokenizer(QWEN3)
    assert template_has_thinking_switch(tokenizer.chat_template_source)
    question = [{"role": "user", "content": "What is 2+2?"}]
    on = tokenizer.render_chat(question, template_kwargs={"enable_thinking": True})
    off = tokenizer.render_chat(question, template_kwargs={"enable_thinking": False})
    assert on.endswith("<|im_start|>assistant\n")
    assert off == on + "<think>\n\n</think>\n\n"
    # The template's own variables cannot be replaced through the switch's door.
    assert tokenizer.render_chat(question, template_kwargs={"messages": []}) == on


def test_a_template_without_think_blocks_keeps_replies_as_written() -> None:
    tokenizer = template_tokenizer(None)
    assert not template_reasons(tokenizer.chat_template_source) and not tokenizer.drops_reasoning
