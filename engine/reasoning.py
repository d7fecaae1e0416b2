"""Reasoning apart from the answer: the `<think> … </think>` block of a reply.

Reasoning models (Qwen3, QwQ, the DeepSeek-R1 distills) think aloud between
`<think>` and `</think>`, then answer. The reply keeps its raw text; this
module says which part of it is which, for a reply as it streams
(`ReasoningParser`, fed text deltas) and for a whole one (`split`):

- a tag may arrive split across deltas at any character;
- the R1 distills' templates end the prompt with `<think>\\n`, so their reply
  starts inside the block and only `</think>` appears (`starts_in_reasoning`,
  which `prompt_opens_reasoning` tells from the prompt's text);
- a reply that never closes its block (stopped, or out of tokens) is all
  reasoning, marked unfinished;
- text before `<think>` is answer;
- a reply without tags is all answer, exactly as written.

The whitespace around the block is formatting: the reasoning is stripped, and
the answer after `</think>` starts at its first visible character. No torch
and no other engine module here: the app imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

THINK_START = "<think>"
THINK_END = "</think>"

# The template variable Qwen3's template reads to leave thinking out of a reply.
THINKING_SWITCH = "enable_thinking"

_BEFORE, _REASONING, _ANSWER = "before", "reasoning", "answer"


def _partial_tag(text: str, tag: str) -> int:
    """How many characters at the end of `text` could start `tag` (0 when none)."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0


class ReasoningParser:
    """Splits a streaming reply into reasoning and answer, delta by delta.

    `feed(delta)` returns the (reasoning, answer) text that delta completes;
    text that may still turn out to be part of a tag, or whitespace at the
    edge of the block, is held back until the next delta or `finish()`.
    The concatenation of every returned piece is what `split` gives for the
    whole text (with the same `starts_in_reasoning`).
    """

    def __init__(self, *, starts_in_reasoning: bool = False) -> None:
        self._state = _REASONING if starts_in_reasoning else _BEFORE
        self._held = ""
        self._started = False  # whether the current part has shown a visible character
        # Whether the reply has a think block, and whether it has closed.
        self.has_reasoning = starts_in_reasoning
        self.reasoning_finished = False

    @property
    def in_reasoning(self) -> bool:
        """Whether the text fed so far ends inside the think block."""
        return self._state == _REASONING

    def feed(self, delta: str) -> tuple[str, str]:
        text = self._held + delta
        self._held = ""
        reasoning: list[str] = []
        answer: list[str] = []
        while text:
            if self._state == _BEFORE:
                start = text.find(THINK_START)
                if start >= 0:
                    before = text[:start]
                    if self._started or before.strip():
                        answer.append(before)
                    self._enter(_REASONING)
                    text = text[start + len(THINK_START):]
                    continue
                keep = _partial_tag(text, THINK_START)
                shown = text[: len(text) - keep]
                if not self._started and not shown.strip():
                    self._held = text  # leading whitespace: formatting if a think block follows
                    break
                answer.append(shown)
                self._started = True
                self._held = text[len(shown):]
                break
            if self._state == _REASONING:
                if not self._started:
                    text = text.lstrip()
                    if not text:
                        break
                end = text.find(THINK_END)
                if end >= 0:
                    reasoning.append(text[:end].rstrip())
                    self.reasoning_finished = True
                    self._enter(_ANSWER)
                    text = text[end + len(THINK_END):]
                    continue
                keep = _partial_tag(text, THINK_END)
                body = text[: len(text) - keep]
                visible = body.rstrip()
                reasoning.append(visible)
                self._started = self._started or bool(visible)
                self._held = text[len(visible):]  # trailing whitespace and a possible partial tag
                break
            # The answer after the block: everything as written, from its first visible character.
            if not self._started:
                text = text.lstrip()
                if not text:
                    break
                self._started = True
            answer.append(text)
            break
        return "".join(reasoning), "".join(answer)

    def finish(self) -> tuple[str, str]:
        """The text still held back, once the reply has ended."""
        held, self._held = self._held, ""
        if self._state == _BEFORE:
            return "", held  # a reply without a think block is all answer, exactly as written
        if self._state == _REASONING:
            return (held.rstrip() if self._started else held.strip()), ""
        return "", ""

    def _enter(self, state: str) -> None:
        self._state = state
        self._started = False
        if state == _REASONING:
            self.has_reasoning = True


@dataclass(slots=True, frozen=True)
class ReplyParts:
    """A whole reply: its reasoning ("" when none), its answer, whether it has a
    think block and whether that block closed (True when there is none)."""

    reasoning: str
    answer: str
    has_reasoning: bool
    reasoning_finished: bool


def split_reply(text: str, *, starts_in_reasoning: bool | None = None) -> ReplyParts:
    """The parts of a whole reply. `starts_in_reasoning=None` decides from the
    text: a `</think>` with no `<think>` before it closes a block the prompt
    opened (the R1 distills' replies as stored)."""
    if starts_in_reasoning is None:
        end = text.find(THINK_END)
        start = text.find(THINK_START)
        starts_in_reasoning = end >= 0 and not 0 <= start < end
    parser = ReasoningParser(starts_in_reasoning=starts_in_reasoning)
    reasoning, answer = parser.feed(text)
    more_reasoning, more_answer = parser.finish()
    return ReplyParts(reasoning + more_reasoning, answer + more_answer, parser.has_reasoning,
                      parser.reasoning_finished or not parser.has_reasoning)


def split(text: str) -> tuple[str, str]:
    """(reasoning, answer) of a whole reply; ("", text) for one without reasoning."""
    parts = split_reply(text)
    return parts.reasoning, parts.answer


def answer_of(text: str) -> str:
    """What a reply answers, its reasoning left out: what compare, copy and the arena act on."""
    return split_reply(text).answer


# -- the prompt side --------------------------------------------------------------


def prompt_opens_reasoning(prompt_text: str) -> bool:
    """Whether a prompt leaves the reply inside a think block (it ends with `<think>`,
    as the R1 distills' generation prompt does)."""
    return prompt_text.rstrip().endswith(THINK_START)


class PromptTokenizer(Protocol):
    """What `reply_start` needs of a tokenizer (engine.model.tokenizer.Tokenizer is one)."""

    chat_template_source: str | None

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


def reply_start(tokenizer: PromptTokenizer, prompt_ids: Sequence[int]) -> bool | None:
    """How a reply to `prompt_ids` starts: None when the model does not reason
    (its chat template has no think block; vLLM is told per model, Tandem reads
    the template), else whether it starts inside the block (the prompt's last
    few tokens open it)."""
    if not template_reasons(tokenizer.chat_template_source):
        return None
    return prompt_opens_reasoning(tokenizer.decode(prompt_ids[-8:], skip_special_tokens=False))


def template_reasons(template: str | None) -> bool:
    """Whether a chat template is a reasoning model's: it writes or reads think blocks."""
    return bool(template) and (THINK_START in template or THINK_END in template)


def template_has_thinking_switch(template: str | None) -> bool:
    """Whether a chat template reads the `enable_thinking` variable (Qwen3's)."""
    return bool(template) and THINKING_SWITCH in template


_PROBE_REASONING = "Tandem probe reasoning"
_PROBE_ANSWER = "Tandem probe answer"


def template_drops_reasoning(render: Callable[[Sequence[Mapping[str, str]]], str]) -> bool:
    """Whether a chat template leaves an earlier reply's reasoning out of the
    prompt by itself (Qwen3's and the R1 distills' do), tried on a probe
    conversation through `render(messages)`."""
    probe = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": f"{THINK_START}\n{_PROBE_REASONING}\n{THINK_END}\n\n{_PROBE_ANSWER}"},
        {"role": "user", "content": "Hi"},
    ]
    rendered = render(probe)
    return _PROBE_ANSWER in rendered and _PROBE_REASONING not in rendered
