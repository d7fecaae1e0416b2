"""Each step's allowed tokens for the constrained requests of a batch.

The engine thread starts a step's masks (`TokenMaskWorker.start`) just before
the model's forward and collects them (`PendingMasks.result`) once the logits
exist: llguidance computes them on its own threads without the GIL, so they
cost the step little beyond the forward. A mask is one bit per token
(llguidance's layout: 32 tokens per int32 word, lowest bit first, which
read as bytes on a little-endian machine is numpy's "little" bit order),
unpacked to a bool row per request on the logits' device; the sampler
applies it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from engine.model.sampler import TokenMask

# llguidance spreads a batch's masks over its own pool; a few threads are
# enough (a JSON mask takes 0.01-0.3 ms), and the model's forward, which
# runs at the same time, keeps most of the cores.
_MASK_THREADS = 2


class PendingMasks:
    """A step's masks while they are computed: `result()` waits for them."""

    __slots__ = ("rows", "words", "_vocab_size", "_device", "_done", "_error")

    def __init__(self, rows: list[int], words: torch.Tensor, vocab_size: int, device: torch.device) -> None:
        self.rows = rows
        self.words = words  # [rows, words per mask] int32, filled by the worker
        self._vocab_size = vocab_size
        self._device = device
        self._done = threading.Event()
        self._error: BaseException | None = None

    def set_done(self, error: BaseException | None = None) -> None:
        self._error = error
        self._done.set()

    def result(self) -> TokenMask:
        """The step's masks as TokenMask.banned, a bool [rows, vocab] on the logits' device."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        # Inverting the words first gives the banned tokens in the one pass that
        # unpacks them (numpy's unpackbits: ~60 us for 16 rows of a 49k vocabulary,
        # where torch's shifts take 20 times as long).
        banned = np.unpackbits((~self.words.numpy()).view(np.uint8), axis=1, bitorder="little")
        banned = torch.from_numpy(banned[:, : self._vocab_size]).view(torch.bool)
        return TokenMask(self.rows, banned.to(self._device, non_blocking=True))


class TokenMaskWorker:
    """Computes steps' masks on a daemon thread beside the engine thread.

    `mask_tokens` is the number of tokens a mask covers (the grammar
    tokenizer's vocabulary); `vocab_size` the logits' width.
    """

    def __init__(self, mask_tokens: int, vocab_size: int, device: torch.device) -> None:
        import llguidance

        self._executor = llguidance.LLExecutor(num_threads=_MASK_THREADS)
        self._words_per_mask = (mask_tokens + 31) // 32
        self._vocab_size = vocab_size
        self._device = device
        self._jobs: queue.SimpleQueue[tuple[list[tuple[Any, int]], PendingMasks] | None] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="tandem-token-masks", daemon=True).start()

    def start(self, matchers: Sequence[tuple[int, Any]]) -> PendingMasks:
        """Begin the masks of `matchers`: (sampling row, LLMatcher) pairs."""
        rows = [row for row, _ in matchers]
        words = torch.empty((len(rows), self._words_per_mask), dtype=torch.int32)
        pending = PendingMasks(rows, words, self._vocab_size, self._device)
        self._jobs.put(([(matcher, i) for i, (_, matcher) in enumerate(matchers)], pending))
        return pending

    def close(self) -> None:
        self._jobs.put(None)

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            targets, pending = job
            try:
                self._executor.unsafe_compute_mask_ptr(
                    targets, pending.words.data_ptr(), self._words_per_mask * 4, len(targets)
                )
            except BaseException as exc:  # raised on the engine thread by result()
                pending.set_done(exc)
            else:
                pending.set_done()
