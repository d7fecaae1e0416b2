"""The model runner of the CUDA path: Triton attention kernels and CUDA graphs.

Same interface as engine.runner.cpu.ModelRunner (`execute(step)`, `forward(step)`);
what differs is the attention metadata. Instead of gather indices and masks
it hands the kernels page tables and lengths (engine.runner.cuda_attention), all
uploaded in one host-to-device copy per step. Decode-only steps replay a
captured CUDA graph when one fits (engine.runner.cuda_graphs).

The runner also works on the CPU under TRITON_INTERPRET=1 (without graphs):
that is how tests/engine/test_triton_kernels.py checks it against the CPU
path without a GPU.
"""

from __future__ import annotations

import dataclasses

import logging
import os

import torch

from engine.model.kv_cache import KVCache
from engine.runner.cuda_graphs import (
    CaptureBudget,
    DecodeGraphs,
    StaticDecodeBatch,
    batch_size_ladder,
    pack_decode_inputs,
    replay_size,
)
from engine.runner.cuda_attention import KernelAttentionMetadata
from engine.model.decoder import DecoderModel
from engine.runner.cpu import ModelRunner, flatten_step
from engine.core.scheduler import ScheduleResult

log = logging.getLogger(__name__)


def triton_available() -> bool:
    """Whether triton imports here. The kernels then run on CUDA devices (or,
    with TRITON_INTERPRET=1 set before triton's first import, on the CPU)."""
    try:
        import triton  # noqa: F401
    except Exception:  # not installed, or a build that does not load (e.g. Windows)
        return False
    return True


def cuda_graphs_enabled() -> bool:
    """TANDEM_CUDA_GRAPHS=0 turns graphs off (to compare, or to debug a kernel)."""
    value = os.environ.get("TANDEM_CUDA_GRAPHS", "1").strip().lower()
    return value not in ("0", "false", "no", "off")


def make_cuda_runner(
    model: DecoderModel, cache: KVCache, max_running: int, *, deterministic: bool = False, **options
) -> ModelRunner:
    """The runner for a CUDA model: Triton kernels and CUDA graphs where triton
    is installed, else the shared PyTorch path (gathers pages, but correct).
    `options` go to ModelRunner as they are."""
    if deterministic:
        # Batch invariance is the PyTorch path's tiled attention; the kernels'
        # split-KV and per-step graphs would make results depend on the batch.
        return ModelRunner(model, cache, deterministic=True, **options)
    if not triton_available():
        log.warning(
            "triton is not installed: CUDA attention falls back to the slower PyTorch path "
            "(pip install triton)"
        )
        return ModelRunner(model, cache, **options)
    return KernelModelRunner(
        model, cache, graph_max_batch=max_running if cuda_graphs_enabled() else 0, **options
    )


class KernelModelRunner(ModelRunner):
    """ModelRunner whose attention is the Triton kernels; on CUDA with
    `graph_max_batch` > 0, decode steps of up to that many sequences replay
    CUDA graphs captured here, at construction."""

    def __init__(
        self,
        model: DecoderModel,
        cache: KVCache,
        *,
        graph_max_batch: int = 0,
        num_sms: int | None = None,
        capture_budget: CaptureBudget | None = None,
        **options,
    ) -> None:
        super().__init__(model, cache, **options)
        config = model.config
        # The kernels take 0 for "none". Where layers differ in window (Gemma 2
        # and 3), kernel_window is the global layers' (0) and each step's
        # metadata carries the sliding layers' beside it.
        self.kernel_window = self.window or 0
        self.sliding_kernel_window = self.sliding_window or 0
        self.max_context = config.max_position_embeddings
        self.table_width = -(-self.max_context // self.page_size)
        if num_sms is None:
            num_sms = (
                torch.cuda.get_device_properties(self.device).multi_processor_count
                if self.device.type == "cuda" else 1
            )
        self.num_sms = num_sms
        self._pinned: torch.Tensor | None = None
        self._upload_done: torch.cuda.Event | None = None
        self.graphs: DecodeGraphs | None = None
        if graph_max_batch > 0 and self.device.type == "cuda":
            self._capture_graphs(graph_max_batch, capture_budget)

    # -- uploads -------------------------------------------------------------

    def _upload(self, values: list[int]) -> torch.Tensor:
        """One int32 copy to the device. On CUDA through a reused pinned buffer,
        so the copy is asynchronous and costs no allocation of pinned memory."""
        host = torch.tensor(values, dtype=torch.int32)
        if self.device.type != "cuda":
            return host
        if self._pinned is None or self._pinned.numel() < host.numel():
            if self._upload_done is not None:
                self._upload_done.synchronize()
            self._pinned = torch.empty(max(host.numel(), 1 << 16), dtype=torch.int32).pin_memory()
            self._upload_done = torch.cuda.Event()
        elif self._upload_done is not None:
            # The previous step's copy may still read the buffer (a step that
            # samples nothing never synchronizes).
            self._upload_done.synchronize()
        staging = self._pinned[: host.numel()]
        staging.copy_(host)
        device_values = staging.to(self.device, non_blocking=True)
        self._upload_done.record()
        return device_values

    # -- steps ---------------------------------------------------------------

    def forward(self, step: ScheduleResult) -> tuple[torch.Tensor, list[int], list]:
        ps = self.page_size
        ids, positions, slots, sample_rows, samplers = flatten_step(step, ps)

        num_decode = len(step.decodes)
        dec_lens = [c.start + 1 for c in step.decodes]
        dec_tables = [c.seq.pages[: -(-n // ps)] for c, n in zip(step.decodes, dec_lens)]
        if self.graphs is not None:
            size = replay_size(num_decode, len(ids) - num_decode, self.graphs.sizes)
            if size is not None:
                values, width = pack_decode_inputs(
                    ids, positions, slots, dec_lens, dec_tables, size
                )
                hidden = self.graphs.replay(self._upload(values), size, width)
                return hidden, sample_rows, samplers

        meta, input_ids, input_positions = self._eager_inputs(
            step, ids, positions, slots, dec_lens, dec_tables
        )
        hidden = self.model.forward(input_ids, input_positions, meta, self.cache, max(positions))
        return hidden, sample_rows, samplers

    def _eager_inputs(
        self,
        step: ScheduleResult,
        ids: list[int],
        positions: list[int],
        slots: list[int],
        dec_lens: list[int],
        dec_tables: list[list[int]],
    ) -> tuple[KernelAttentionMetadata, torch.Tensor, torch.Tensor]:
        ps = self.page_size
        num_tokens = len(ids)
        pre_start, pre_len, pre_ctx, pre_tables = [], [], [], []
        row = len(step.decodes)
        for chunk in step.prefills:
            pre_start.append(row)
            pre_len.append(chunk.num_tokens)
            pre_ctx.append(chunk.start)
            pre_tables.append(chunk.seq.pages[: -(-(chunk.start + chunk.num_tokens) // ps)])
            row += chunk.num_tokens
        dec_width = max((len(t) for t in dec_tables), default=0)
        pre_width = max((len(t) for t in pre_tables), default=0)
        values = ids + positions + slots + dec_lens + pre_start + pre_len + pre_ctx
        for table in dec_tables:
            values.extend(table)
            values.extend([0] * (dec_width - len(table)))
        for table in pre_tables:
            values.extend(table)
            values.extend([0] * (pre_width - len(table)))
        packed = self._upload(values)

        fields = {}
        offset = 0
        for name, length in (
            ("ids", num_tokens), ("positions", num_tokens), ("slots", num_tokens),
            ("dec_lens", len(dec_lens)), ("pre_start", len(pre_start)),
            ("pre_len", len(pre_len)), ("pre_ctx", len(pre_ctx)),
            ("dec_table", len(dec_tables) * dec_width), ("pre_table", len(pre_tables) * pre_width),
        ):
            fields[name] = packed[offset : offset + length]
            offset += length

        num_decode = len(step.decodes)
        meta = KernelAttentionMetadata(
            slots=fields["slots"],
            num_decode=num_decode,
            decode_block_table=(
                fields["dec_table"].view(num_decode, dec_width) if num_decode else None
            ),
            decode_seq_lens=fields["dec_lens"] if num_decode else None,
            num_splits=self._splits(num_decode, max(dec_lens, default=0)) if num_decode else 1,
            prefill_block_table=(
                fields["pre_table"].view(len(pre_tables), pre_width) if pre_tables else None
            ),
            prefill_query_start=fields["pre_start"] if pre_tables else None,
            prefill_query_len=fields["pre_len"] if pre_tables else None,
            prefill_context_len=fields["pre_ctx"] if pre_tables else None,
            max_prefill_len=max(pre_len, default=0),
            window=self.kernel_window,
            num_kv_heads=self.num_kv,
        )
        return self._with_sliding(meta), fields["ids"], fields["positions"]

    def _with_sliding(self, meta: KernelAttentionMetadata) -> KernelAttentionMetadata:
        """`meta` with the sliding layers' copy attached, where layers differ in window."""
        if self.sliding_kernel_window:
            meta.sliding = dataclasses.replace(meta, window=self.sliding_kernel_window, sliding=None)
        return meta

    def _splits(self, batch: int, max_keys: int) -> int:
        from engine.kernels.triton.attention import num_kv_splits

        if self.kernel_window:
            max_keys = min(max_keys, self.kernel_window)
        return num_kv_splits(batch, self.num_kv, max_keys, self.num_sms)

    # -- CUDA graphs ---------------------------------------------------------

    def static_decode_batch(self, max_size: int) -> StaticDecodeBatch:
        """Static input buffers and the decode forward over them, for graphs."""

        def make_meta(size: int, slots, block_table, seq_lens) -> KernelAttentionMetadata:
            # Splits are fixed per size, chosen for the longest context.
            return self._with_sliding(KernelAttentionMetadata(
                slots=slots, num_decode=size, decode_block_table=block_table,
                decode_seq_lens=seq_lens, num_splits=self._splits(size, self.max_context),
                prefill_block_table=None, prefill_query_start=None, prefill_query_len=None,
                prefill_context_len=None, max_prefill_len=0,
                window=self.kernel_window, num_kv_heads=self.num_kv,
            ))

        def forward(input_ids, input_positions, meta, max_position) -> torch.Tensor:
            return self.model.forward(input_ids, input_positions, meta, self.cache, max_position)

        # max_position: the RoPE tables grow to the model's whole context in
        # the first (eager) run, so no captured run ever needs them larger.
        return StaticDecodeBatch(
            forward, make_meta, max_size, self.table_width, self.max_context - 1, self.device
        )

    def _capture_graphs(self, max_batch: int, budget: CaptureBudget | None) -> None:
        try:
            ladder = batch_size_ladder(max_batch)
            self.graphs = DecodeGraphs(self.static_decode_batch(max(ladder)), ladder, budget)
        except Exception:  # a driver or kernel that cannot be captured: eager still works
            log.exception("CUDA graph capture failed; decoding without graphs")
            self.graphs = None
            torch.cuda.synchronize(self.device)
