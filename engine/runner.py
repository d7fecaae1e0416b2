"""Turns a scheduled step into tensors, runs the model once, samples."""

from __future__ import annotations

import torch

from engine.attention import AttentionMetadata, KVCache, PrefillChunk
from engine.model import LlamaModel
from engine.sampling import sample
from engine.scheduler import ScheduledChunk, ScheduleResult


class ModelRunner:
    def __init__(self, model: LlamaModel, cache: KVCache) -> None:
        self.model = model
        self.cache = cache
        self.page_size = cache.page_size
        self.device = model.device
        self.window = model.config.sliding_window
        self._offsets = torch.arange(self.page_size, device=self.device)

    def execute(self, step: ScheduleResult) -> list[int]:
        """Run one forward; return one sampled token per sampling chunk, in
        the order of `[c for c in step.chunks if c.samples]`."""
        hidden, sample_rows, samplers = self.forward(step)
        if not sample_rows:
            return []
        rows = torch.tensor(sample_rows, dtype=torch.long, device=self.device)
        logits = self.model.logits(hidden.index_select(0, rows))
        return sample(logits, samplers)

    def forward(self, step: ScheduleResult) -> tuple[torch.Tensor, list[int], list]:
        """Hidden states of every token of the step, the rows that sample, and
        their samplers."""
        chunks = step.chunks
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        ps = self.page_size
        sample_rows: list[int] = []
        samplers = []
        for chunk in chunks:
            seq = chunk.seq
            end = chunk.start + chunk.num_tokens
            ids.extend(seq.token_ids[chunk.start : end])
            pages = seq.pages
            for pos in range(chunk.start, end):
                positions.append(pos)
                slots.append(pages[pos // ps] * ps + pos % ps)
            if chunk.samples:
                sample_rows.append(len(ids) - 1)
                samplers.append(seq.sampler)

        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            num_decode=len(step.decodes),
            decode_page_table=None,
            decode_bias=None,
            prefills=[],
        )
        if step.decodes:
            meta.decode_page_table, meta.decode_bias = self._decode_keys(step.decodes)
        token_start = len(step.decodes)
        for chunk in step.prefills:
            meta.prefills.append(self._prefill_chunk(chunk, token_start))
            token_start += chunk.num_tokens

        hidden = self.model.forward(
            torch.tensor(ids, dtype=torch.long, device=dev),
            torch.tensor(positions, dtype=torch.long, device=dev),
            meta,
            self.cache,
            max(positions),
        )
        return hidden, sample_rows, samplers

    def _key_slots(self, pages: list[int], num_keys: int) -> torch.Tensor:
        table = torch.tensor(pages[: -(-num_keys // self.page_size)], device=self.device)
        return (table[:, None] * self.page_size + self._offsets).reshape(-1)[:num_keys]

    def _decode_keys(self, decodes: list[ScheduledChunk]) -> tuple[torch.Tensor, torch.Tensor]:
        ps = self.page_size
        lengths = [c.start + 1 for c in decodes]
        max_len = max(lengths)
        max_pages = -(-max_len // ps)
        # Padding points at page 0: valid memory whose scores are masked.
        rows = []
        for chunk, length in zip(decodes, lengths):
            used = chunk.seq.pages[: -(-length // ps)]
            rows.append(used + [0] * (max_pages - len(used)))
        table = torch.tensor(rows, dtype=torch.long, device=self.device)
        key_pos = torch.arange(max_pages * ps, device=self.device)
        lens = torch.tensor(lengths, device=self.device)[:, None]
        allowed = key_pos < lens
        if self.window is not None:
            allowed &= key_pos > lens - 1 - self.window
        bias = torch.zeros(allowed.shape, dtype=torch.float32, device=self.device)
        bias.masked_fill_(~allowed, float("-inf"))
        return table, bias[:, None, None, :]

    def _prefill_chunk(self, chunk: ScheduledChunk, token_start: int) -> PrefillChunk:
        start, num = chunk.start, chunk.num_tokens
        num_keys = start + num
        if start == 0 and self.window is None:
            return PrefillChunk(token_start, num, key_slots=None, mask=None)
        key_slots = self._key_slots(chunk.seq.pages, num_keys) if start else None
        query_pos = torch.arange(start, num_keys, device=self.device)[:, None]
        key_pos = torch.arange(num_keys, device=self.device)[None, :]
        mask = key_pos <= query_pos
        if self.window is not None:
            mask &= key_pos > query_pos - self.window
        return PrefillChunk(token_start, num, key_slots=key_slots, mask=mask)
