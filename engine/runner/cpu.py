"""Turns a scheduled step into tensors, runs the model once, samples.

`deterministic=True` runs the model batch-invariantly (fixed row tiles for
every product, one attention path for every query: engine.model.linear,
engine.model.attention): a request's tokens then do not depend on the batch it
shares, on how its prompt was chunked, or on which of its pages came from
the prefix cache. A model whose every product is quantized keeps the native
CPU forward in that mode: it computes each row alone in one fixed order
already, and the torch path's batched GEMMs give no such promise on every
CPU (oneDNN and MKL pick their blocking by shape and thread count).
"""

from __future__ import annotations

import time

import torch

from engine.model.attention import KEY_BLOCK, QUERY_TILE, AttentionMetadata, PrefillChunk
from engine.model.kv_cache import KVCache
from engine.runner.threads import ThreadPolicy
from engine.model.decoder import DecoderModel
from engine.model.sampler import sample
from engine.structured.token_masks import PendingMasks
from engine.core.scheduler import ScheduledChunk, ScheduleResult



class ModelRunner:
    def __init__(
        self,
        model: DecoderModel,
        cache: KVCache,
        *,
        deterministic: bool = False,
        threads: ThreadPolicy | None = None,
    ) -> None:
        self.model = model
        self.threads = threads
        self.deterministic = deterministic
        model.batch_invariant = deterministic
        self.cache = cache
        self.page_size = cache.page_size
        self.device = model.device
        config = model.config
        windows = {config.layer_window(i) for i in range(config.num_hidden_layers)}
        # The window of the global layers (of every layer, when they agree),
        # and of the sliding ones when layers differ (Gemma 2 and 3): a step
        # then builds a second set of masks (AttentionMetadata.sliding).
        self.window = next(iter(windows)) if len(windows) == 1 else None
        self.sliding_window = config.sliding_window if len(windows) > 1 else None
        self.act_dtype = model.act_dtype
        self.num_kv = model.config.num_key_value_heads
        self.group = model.config.num_queries_per_kv
        self._head_offsets = torch.arange(self.num_kv, device=self.device)

    def execute(self, step: ScheduleResult, masks: PendingMasks | None = None) -> list[int]:
        """Run one forward; return one sampled token per sampling chunk, in
        the order of `[c for c in step.chunks if c.samples]`. `masks`, computed
        while the forward runs, restrict the constrained requests' rows."""
        if self.cache.commit_on_use:
            self.cache.commit(highest_page_written(step, self.page_size) + 1)
        if self.threads is None:
            return self._execute(step, masks)
        num_tokens = sum(c.num_tokens for c in step.chunks)
        self.threads.before_step(num_tokens)
        started = time.perf_counter()
        tokens = self._execute(step, masks)
        self.threads.after_step(num_tokens, time.perf_counter() - started)
        return tokens

    def _execute(self, step: ScheduleResult, masks: PendingMasks | None) -> list[int]:
        hidden, sample_rows, samplers = self.forward(step)
        if not sample_rows:
            return []
        rows = torch.tensor(sample_rows, dtype=torch.long, device=self.device)
        # The logits are computed outside any CUDA graph, so the masks apply to graph replays too.
        logits = self.model.logits(hidden.index_select(0, rows))
        return sample(logits, samplers, masks.result() if masks is not None else None)

    def forward(self, step: ScheduleResult) -> tuple[torch.Tensor, list[int], list]:
        """Hidden states of every token of the step, the rows that sample, and
        their samplers."""
        ps = self.page_size
        row_stride = self.num_kv * ps  # rows of one page, all heads
        ids, positions, slots, sample_rows, samplers = flatten_step(step, ps)
        write_base = [slot // ps * row_stride + slot % ps for slot in slots]

        dev = self.device
        base = torch.tensor(write_base, dtype=torch.long, device=dev)
        meta = AttentionMetadata(
            write_index=(base[:, None] + self._head_offsets * ps).reshape(-1),
            num_decode=len(step.decodes),
            decode_rows=None,
            decode_bias=None,
            prefills=[],
            batch_invariant=self.deterministic,
        )
        meta.native = self.model.native_forward
        if meta.native:
            meta.page_table, meta.row_table = self._page_tables(step)
        else:
            self._add_masks(meta, step, self.window)
            if self.sliding_window is not None:
                meta.sliding = AttentionMetadata(
                    write_index=meta.write_index, num_decode=meta.num_decode, decode_rows=None,
                    decode_bias=None, prefills=[], batch_invariant=self.deterministic,
                )
                self._add_masks(meta.sliding, step, self.sliding_window)

        hidden = self.model.forward(
            torch.tensor(ids, dtype=torch.long, device=dev),
            torch.tensor(positions, dtype=torch.long, device=dev),
            meta,
            self.cache,
            max(positions),
        )
        return hidden, sample_rows, samplers

    def _add_masks(self, meta: AttentionMetadata, step: ScheduleResult, window: int | None) -> None:
        """The step's key rows and masks for layers that attend over `window`."""
        if step.decodes:
            meta.decode_rows, meta.decode_bias = self._decode_keys(step.decodes, window)
        token_start = len(step.decodes)
        for chunk in step.prefills:
            meta.prefills.append(self._prefill_chunk(chunk, token_start, window))
            token_start += chunk.num_tokens

    def _page_rows(self, table: torch.Tensor) -> torch.Tensor:
        """[..., pages] page ids -> [..., kv_heads, pages] cache rows."""
        return table.unsqueeze(-2) * self.num_kv + self._head_offsets[:, None]

    def _page_tables(self, step: ScheduleResult) -> tuple[torch.Tensor, torch.Tensor]:
        """For the native path: [chunks, max_pages] page ids of each chunk's
        sequence through its last token (padded with 0), and [tokens] the
        line of each token's chunk."""
        ps = self.page_size
        used = [c.seq.pages[: (c.start + c.num_tokens - 1) // ps + 1] for c in step.chunks]
        width = max(len(pages) for pages in used)
        table = torch.tensor([pages + [0] * (width - len(pages)) for pages in used], dtype=torch.long)
        counts = torch.tensor([c.num_tokens for c in step.chunks], dtype=torch.long)
        return table, torch.repeat_interleave(torch.arange(len(used)), counts)

    def _decode_keys(self, decodes: list[ScheduledChunk], window: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        ps = self.page_size
        lengths = [c.start + 1 for c in decodes]
        max_pages = -(-max(lengths) // ps)
        # Padding points at page 0: valid memory whose scores are masked.
        table = []
        for chunk, length in zip(decodes, lengths):
            used = chunk.seq.pages[: -(-length // ps)]
            table.append(used + [0] * (max_pages - len(used)))
        rows = self._page_rows(torch.tensor(table, dtype=torch.long, device=self.device))
        num_keys = max_pages * ps
        if self.deterministic:
            num_keys = _whole_blocks(num_keys)
        key_pos = torch.arange(num_keys, device=self.device)
        lens = torch.tensor(lengths, device=self.device)[:, None]
        allowed = key_pos < lens
        if window is not None:
            allowed &= key_pos > lens - 1 - window
        bias = torch.zeros(allowed.shape, dtype=self.act_dtype, device=self.device)
        bias.masked_fill_(~allowed, float("-inf"))
        batch, num_keys = bias.shape
        # Batch-invariant attention pads each group of queries to a full tile.
        query_rows = QUERY_TILE if self.deterministic else self.group
        bias = bias[:, None, None, :].expand(batch, self.num_kv, query_rows, num_keys)
        return rows.reshape(-1), bias.reshape(batch * self.num_kv, query_rows, num_keys)

    def _prefill_chunk(self, chunk: ScheduledChunk, token_start: int, window: int | None) -> PrefillChunk:
        start, num = chunk.start, chunk.num_tokens
        num_keys = start + num
        if self.deterministic:
            return self._tiled_prefill_chunk(chunk, token_start, window)
        if start == 0 and window is None:
            return PrefillChunk(token_start, num, num_keys, key_rows=None, mask=None)
        key_rows = None
        if start:
            pages = chunk.seq.pages[: -(-num_keys // self.page_size)]
            table = torch.tensor(pages, dtype=torch.long, device=self.device)
            key_rows = self._page_rows(table).reshape(-1)
        query_pos = torch.arange(start, num_keys, device=self.device)[:, None]
        key_pos = torch.arange(num_keys, device=self.device)[None, :]
        mask = key_pos <= query_pos
        if window is not None:
            mask &= key_pos > query_pos - window
        return PrefillChunk(token_start, num, num_keys, key_rows=key_rows, mask=mask)

    def _tiled_prefill_chunk(self, chunk: ScheduledChunk, token_start: int, window: int | None) -> PrefillChunk:
        """A prefill chunk for batch-invariant attention: all of its pages, and
        a mask over rows (token, group member) padded to whole tiles."""
        start, num = chunk.start, chunk.num_tokens
        num_keys = start + num
        pages = chunk.seq.pages[: -(-num_keys // self.page_size)]
        table = torch.tensor(pages, dtype=torch.long, device=self.device)
        key_rows = self._page_rows(table).reshape(-1)
        rows = num * self.group
        padded = -(-rows // QUERY_TILE) * QUERY_TILE
        query_pos = start + torch.arange(rows, device=self.device)[:, None] // self.group
        key_pos = torch.arange(_whole_blocks(num_keys), device=self.device)[None, :]
        allowed = key_pos <= query_pos
        if window is not None:
            allowed &= key_pos > query_pos - window
        bias = torch.zeros((padded, key_pos.shape[1]), dtype=self.act_dtype, device=self.device)
        bias[:rows].masked_fill_(~allowed, float("-inf"))
        return PrefillChunk(
            token_start, num, num_keys, key_rows=key_rows, mask=None, tile_bias=bias
        )


def flatten_step(
    step: ScheduleResult, page_size: int
) -> tuple[list[int], list[int], list[int], list[int], list]:
    """A step's tokens in batch order: their ids, positions and KV slots
    (page * page_size + offset), the rows that sample, and their samplers."""
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    sample_rows: list[int] = []
    samplers = []
    for chunk in step.chunks:
        seq = chunk.seq
        end = chunk.start + chunk.num_tokens
        ids.extend(seq.token_ids[chunk.start : end])
        pages = seq.pages
        for pos in range(chunk.start, end):
            positions.append(pos)
            slots.append(pages[pos // page_size] * page_size + pos % page_size)
        if chunk.samples:
            sample_rows.append(len(ids) - 1)
            samplers.append(seq.sampler)
    return ids, positions, slots, sample_rows, samplers


def highest_page_written(step: ScheduleResult, page_size: int) -> int:
    """The highest page id a step writes K/V to (-1 for an empty step).

    Every page a step reads was written by it or by an earlier step, or is
    page 0 (the padding of shorter decodes), so committing through this page
    before the step makes all that it reads safe (engine.model.kv_cache.KVCache).
    """
    highest = -1
    for chunk in step.chunks:
        if chunk.num_tokens:
            # A sequence's pages are in no particular order once freed and
            # evicted pages are reused: look at every page the chunk writes.
            first = chunk.start // page_size
            last = (chunk.start + chunk.num_tokens - 1) // page_size
            highest = max(highest, *chunk.seq.pages[first : last + 1])
    return highest


def _whole_blocks(num_keys: int) -> int:
    return -(-num_keys // KEY_BLOCK) * KEY_BLOCK
