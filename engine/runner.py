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
        self.act_dtype = model.act_dtype
        self.num_kv = model.config.num_key_value_heads
        self.group = model.config.num_queries_per_kv
        self._head_offsets = torch.arange(self.num_kv, device=self.device)

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
        ids: list[int] = []
        positions: list[int] = []
        write_base: list[int] = []
        ps = self.page_size
        row_stride = self.num_kv * ps  # rows of one page, all heads
        sample_rows: list[int] = []
        samplers = []
        for chunk in step.chunks:
            seq = chunk.seq
            end = chunk.start + chunk.num_tokens
            ids.extend(seq.token_ids[chunk.start : end])
            pages = seq.pages
            for pos in range(chunk.start, end):
                positions.append(pos)
                write_base.append(pages[pos // ps] * row_stride + pos % ps)
            if chunk.samples:
                sample_rows.append(len(ids) - 1)
                samplers.append(seq.sampler)

        dev = self.device
        base = torch.tensor(write_base, dtype=torch.long, device=dev)
        meta = AttentionMetadata(
            write_index=(base[:, None] + self._head_offsets * ps).reshape(-1),
            num_decode=len(step.decodes),
            decode_rows=None,
            decode_bias=None,
            prefills=[],
        )
        if step.decodes:
            meta.decode_rows, meta.decode_bias = self._decode_keys(step.decodes)
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

    def _page_rows(self, table: torch.Tensor) -> torch.Tensor:
        """[..., pages] page ids -> [..., kv_heads, pages] cache rows."""
        return table.unsqueeze(-2) * self.num_kv + self._head_offsets[:, None]

    def _decode_keys(self, decodes: list[ScheduledChunk]) -> tuple[torch.Tensor, torch.Tensor]:
        ps = self.page_size
        lengths = [c.start + 1 for c in decodes]
        max_pages = -(-max(lengths) // ps)
        # Padding points at page 0: valid memory whose scores are masked.
        table = []
        for chunk, length in zip(decodes, lengths):
            used = chunk.seq.pages[: -(-length // ps)]
            table.append(used + [0] * (max_pages - len(used)))
        rows = self._page_rows(torch.tensor(table, dtype=torch.long, device=self.device))
        key_pos = torch.arange(max_pages * ps, device=self.device)
        lens = torch.tensor(lengths, device=self.device)[:, None]
        allowed = key_pos < lens
        if self.window is not None:
            allowed &= key_pos > lens - 1 - self.window
        bias = torch.zeros(allowed.shape, dtype=self.act_dtype, device=self.device)
        bias.masked_fill_(~allowed, float("-inf"))
        batch, num_keys = bias.shape
        bias = bias[:, None, None, :].expand(batch, self.num_kv, self.group, num_keys)
        return rows.reshape(-1), bias.reshape(batch * self.num_kv, self.group, num_keys)

    def _prefill_chunk(self, chunk: ScheduledChunk, token_start: int) -> PrefillChunk:
        start, num = chunk.start, chunk.num_tokens
        num_keys = start + num
        if start == 0 and self.window is None:
            return PrefillChunk(token_start, num, num_keys, key_rows=None, mask=None)
        key_rows = None
        if start:
            pages = chunk.seq.pages[: -(-num_keys // self.page_size)]
            table = torch.tensor(pages, dtype=torch.long, device=self.device)
            key_rows = self._page_rows(table).reshape(-1)
        query_pos = torch.arange(start, num_keys, device=self.device)[:, None]
        key_pos = torch.arange(num_keys, device=self.device)[None, :]
        mask = key_pos <= query_pos
        if self.window is not None:
            mask &= key_pos > query_pos - self.window
        return PrefillChunk(token_start, num, num_keys, key_rows=key_rows, mask=mask)
