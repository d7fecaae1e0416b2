"""Streaming detokenization: generated token ids in, text deltas that are safe to show out.

Two things make this more than `decode(ids)[len(shown):]` per token:

* One character can span several tokens (byte-level BPE, SentencePiece byte
  fallback), and some decoders give a token's text only in context (SentencePiece
  drops the space of the first token it decodes). So each step decodes a short
  window: a few tokens already shown, as context, plus the tokens not yet shown,
  and shows the new text once it no longer ends in an incomplete character
  (U+FFFD). The window then restarts at the tokens just shown, so a step costs
  O(window), not O(reply). This is the prefix_offset/read_offset scheme of
  vLLM and Hugging Face TGI.
* Stop strings can span tokens, so text that might be the start of one is held
  back until the next tokens decide.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice

from engine.model.tokenizer import Tokenizer

# How many trailing prompt tokens give the first generated token its context.
_PROMPT_CONTEXT_TOKENS = 5
# What decoders put in place of bytes that are not (yet) a whole UTF-8 character.
_REPLACEMENT_CHARACTER = "\ufffd"


class IncrementalDetokenizer:
    """Turns one sequence's generated tokens into text, one token at a time.

    The text it emits, joined with `finish()`, is `tokenizer.decode(generated ids)`
    cut before the first stop string. With `prompt_ids`, it is the text that
    continues the prompt: for SentencePiece-style tokenizers that keeps the space
    in front of the first word, which decoding the reply on its own drops.

    One exception, for invalid UTF-8 only: tokenizers' SentencePiece byte-fallback
    decoder turns a whole run of byte tokens into U+FFFD when any byte in it is
    invalid, so where a model emits a valid character and then a stray byte, the
    stream has already shown the character that a full decode replaces.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_ids: Sequence[int] = (),
        stop_strings: Sequence[str] = (),
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._stop_strings = tuple(stop for stop in stop_strings if stop)
        self._longest_stop = max(map(len, self._stop_strings), default=0)

        context = islice((i for i in reversed(prompt_ids) if not self._skipped(i)), _PROMPT_CONTEXT_TOKENS)
        # _window[:_read] has been decoded before (as prompt or as shown text); the rest has not been shown yet.
        self._window: list[int] = list(context)[::-1]
        self._read = len(self._window)
        self._shown_window_text = self._decode(self._window)
        # Decoded text not yet emitted because it may be the beginning of a stop string.
        self._held = ""
        self._emitted: list[str] = []

        self.stopped: bool = False
        self.stop_reason: str | None = None

    @property
    def text(self) -> str:
        """All text emitted so far."""
        return "".join(self._emitted)

    def add(self, token_id: int) -> str:
        """Take the next generated token; return the text that can be shown now (often "")."""
        if self.stopped or self._skipped(token_id):
            return ""
        self._window.append(token_id)
        return self._release(self._read_window(final=False), final=False)

    def finish(self) -> str:
        """At the end of generation: return all text still held back."""
        if self.stopped:
            return ""
        return self._release(self._read_window(final=True), final=True)

    def _skipped(self, token_id: int) -> bool:
        # decode() drops skipped special tokens before decoding, so leaving them out of the window changes nothing.
        return self._skip_special_tokens and self._tokenizer.is_special(token_id)

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special_tokens)

    def _read_window(self, final: bool) -> str:
        """The new text of the window's unread tokens, or "" while it may still end mid-character."""
        if self._read == len(self._window):
            return ""
        window_text = self._decode(self._window)
        if not final and window_text.endswith(_REPLACEMENT_CHARACTER):
            return ""
        new_text = window_text[len(self._shown_window_text) :]
        self._window = self._window[self._read :]
        self._read = len(self._window)
        self._shown_window_text = self._decode(self._window)
        return new_text

    def _release(self, new_text: str, final: bool) -> str:
        """Emit new text, cut at a stop string, holding back a possible stop-string start unless final."""
        text = self._held + new_text
        self._held = ""
        if self._stop_strings:
            matches = [(start, stop) for stop in self._stop_strings if (start := text.find(stop)) >= 0]
            if matches:
                start, self.stop_reason = min(matches, key=lambda match: match[0])
                self.stopped = True
                text = text[:start]
            elif not final:
                held = self._stop_prefix_length(text)
                text, self._held = text[: len(text) - held], text[len(text) - held :]
        if text:
            self._emitted.append(text)
        return text

    def _stop_prefix_length(self, text: str) -> int:
        """Length of the longest end of `text` that a stop string begins with."""
        for length in range(min(len(text), self._longest_stop - 1), 0, -1):
            tail = text[-length:]
            if any(stop.startswith(tail) for stop in self._stop_strings):
                return length
        return 0
