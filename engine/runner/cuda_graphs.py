"""CUDA graphs for the decode step.

A decode step of a small model on a GPU is mostly kernel-launch overhead:
~10 launches per layer, each a few microseconds of CPU time, for a few
microseconds of GPU work. Capturing the whole forward once per batch size
and replaying it costs one launch per step.

The captured forward reads its inputs from static buffers (token ids,
positions, KV slots, sequence lengths, page tables) that each step fills in
one host-to-device copy. A step of n decodes replays the graph of the
smallest captured size >= n; the padding rows have length 0 and slot -1, so
they read nothing and write nothing, and their outputs are ignored. Steps
with prefill tokens, or more decodes than the largest captured size, run
eagerly.

Capture happens once, at start-up, largest size first (the smaller graphs
then reuse the largest's memory pool), within a time and memory budget:
a size that would exceed it is skipped and its steps pad up to a larger
captured size, or run eagerly. The pool's size is logged and kept in
`DecodeGraphs.pool_bytes`.

The bookkeeping (which sizes, which size a step replays, the host-side
packing of the inputs, the budget) is plain Python, tested without a GPU in
tests/engine/test_cuda_graphs.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)

# Rungs dense where batches usually are (a few panes), coarser above: padding
# 33 decodes to 40 wastes less than the eager launches it saves.
GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256)

# Rows of the static input vector (see pack_decode_inputs).
IDS, POSITIONS, SLOTS, SEQ_LENS = range(4)


def batch_size_ladder(max_batch: int, rungs: Sequence[int] = GRAPH_BATCH_SIZES) -> tuple[int, ...]:
    """The batch sizes to capture for at most `max_batch` concurrent decodes:
    every rung below it and `max_batch` itself, ascending."""
    if max_batch < 1:
        raise ValueError("max_batch must be at least 1")
    sizes = sorted({r for r in rungs if 0 < r < max_batch} | {max_batch})
    return tuple(sizes)


def padded_batch_size(num_decodes: int, captured: Sequence[int]) -> int | None:
    """The captured size a step of `num_decodes` decodes replays, or None when
    none is large enough (the step runs eagerly). `captured` is ascending."""
    if num_decodes < 1:
        return None
    for size in captured:
        if size >= num_decodes:
            return size
    return None


def replay_size(num_decodes: int, num_prefill_tokens: int, captured: Sequence[int]) -> int | None:
    """The graph a step replays, or None for an eager step: graphs hold the
    decode-only forward, so any prefill token makes the step eager."""
    if num_prefill_tokens:
        return None
    return padded_batch_size(num_decodes, captured)


def pack_decode_inputs(
    ids: Sequence[int],
    positions: Sequence[int],
    slots: Sequence[int],
    seq_lens: Sequence[int],
    page_tables: Sequence[Sequence[int]],
    padded: int,
) -> tuple[list[int], int]:
    """One flat int32 list for a replay's single host-to-device copy:
    [4, padded] (ids, positions, slots, lengths) then the page tables
    [padded, width], width being the longest table. Padding rows have id 0,
    position 0, slot -1 (no KV write), length 0 (no keys read) and an empty
    table. Returns (values, width)."""
    n = len(ids)
    if not (len(positions) == len(slots) == len(seq_lens) == len(page_tables) == n):
        raise ValueError("every per-sequence input needs one entry per decode")
    if padded < n:
        raise ValueError(f"cannot pad {n} decodes down to {padded}")
    pad = padded - n
    width = max((len(t) for t in page_tables), default=0) or 1
    values: list[int] = []
    values.extend(ids)
    values.extend([0] * pad)
    values.extend(positions)
    values.extend([0] * pad)
    values.extend(slots)
    values.extend([-1] * pad)
    values.extend(seq_lens)
    values.extend([0] * pad)
    for table in page_tables:
        values.extend(table)
        values.extend([0] * (width - len(table)))
    values.extend([0] * (pad * width))
    return values, width


@dataclass(slots=True)
class CaptureBudget:
    """Bounds on start-up capture: wall time, and bytes of the graphs' memory pool."""

    max_seconds: float = 30.0
    max_bytes: int = 1 << 30

    def allows_next(self, elapsed_s: float, pool_bytes: int, last_capture_bytes: int) -> bool:
        """Whether to capture another size after spending `elapsed_s` and
        `pool_bytes`, the last capture having grown the pool by
        `last_capture_bytes` (smaller sizes grow it by at most as much)."""
        return elapsed_s < self.max_seconds and pool_bytes + last_capture_bytes <= self.max_bytes


class StaticDecodeBatch:
    """The decode forward over static input buffers, as a graph captures it.

    `forward(ids, positions, meta, max_position) -> hidden` is the eager
    forward; `make_meta(size, slots, block_table, seq_lens)` builds attention
    metadata that reads the static buffers. `run(size)` runs the forward on
    the first `size` rows; it works on any device (tests run it on the CPU),
    and DecodeGraphs captures exactly it.
    """

    def __init__(
        self,
        forward,
        make_meta,
        max_size: int,
        page_table_width: int,
        max_position: int,
        device: torch.device,
    ) -> None:
        self._forward = forward
        self._make_meta = make_meta
        self.max_position = max_position
        self.device = device
        self.inputs = torch.zeros((4, max_size), dtype=torch.int32, device=device)
        self.tables = torch.zeros((max_size, page_table_width), dtype=torch.int32, device=device)
        self.clear()

    def clear(self) -> None:
        """Every row padding: slot -1, length 0, so a run touches no page."""
        self.inputs.zero_()
        self.inputs[SLOTS].fill_(-1)

    def load(self, packed: torch.Tensor, size: int, width: int) -> None:
        """Copy `packed` (int32 on the device, from pack_decode_inputs for
        `size` rows and `width` table columns) into the buffers."""
        head = 4 * size
        self.inputs[:, :size].copy_(packed[:head].view(4, size))
        self.tables[:size, :width].copy_(packed[head : head + size * width].view(size, width))

    def run(self, size: int) -> torch.Tensor:
        meta = self._make_meta(
            size, self.inputs[SLOTS, :size], self.tables[:size], self.inputs[SEQ_LENS, :size]
        )
        return self._forward(
            self.inputs[IDS, :size], self.inputs[POSITIONS, :size], meta, self.max_position
        )


class DecodeGraphs:
    """Captured decode forwards over a StaticDecodeBatch, one per batch size. CUDA only."""

    def __init__(
        self, batch: StaticDecodeBatch, sizes: Sequence[int], budget: CaptureBudget | None = None
    ) -> None:
        if batch.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        self.batch = batch
        self.device = batch.device
        self.budget = budget or CaptureBudget()
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.sizes: tuple[int, ...] = ()
        self.pool_bytes = 0
        self.capture_seconds = 0.0
        self._capture(sorted(sizes, reverse=True))

    def _capture(self, sizes: list[int]) -> None:
        # The static buffers hold only padding during warm-ups and captures,
        # so they touch no page of the KV cache.
        self.batch.clear()
        pool = torch.cuda.graph_pool_handle()
        start = time.perf_counter()
        torch.cuda.synchronize(self.device)
        before = torch.cuda.memory_reserved(self.device)
        last_growth = 0
        for size in sizes:
            if self._graphs:
                used = torch.cuda.memory_reserved(self.device) - before
                if not self.budget.allows_next(time.perf_counter() - start, used, last_growth):
                    log.info("CUDA graphs: budget reached, batch sizes up to %d not captured", size)
                    break
            reserved = torch.cuda.memory_reserved(self.device)
            # Eager warm-up on a side stream compiles every Triton kernel for
            # this size and lets cuBLAS pick its workspaces before capture, as
            # PyTorch's CUDA-graph notes ask.
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                self.batch.run(size)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = self.batch.run(size)
            self._graphs[size] = (graph, out)
            last_growth = torch.cuda.memory_reserved(self.device) - reserved
        torch.cuda.synchronize(self.device)
        self.sizes = tuple(sorted(self._graphs))
        self.pool_bytes = torch.cuda.memory_reserved(self.device) - before
        self.capture_seconds = time.perf_counter() - start
        log.info(
            "CUDA graphs: captured decode batch sizes %s in %.2f s, %.1f MiB",
            list(self.sizes), self.capture_seconds, self.pool_bytes / 2**20,
        )

    def replay(self, packed: torch.Tensor, size: int, width: int) -> torch.Tensor:
        """Load the inputs and replay the graph of `size`; returns its static
        output [size, hidden], valid until the next replay."""
        graph, out = self._graphs[size]
        self.batch.load(packed, size, width)
        graph.replay()
        return out
