"""Every layer of a native CPU forward step in one call (forward.c).

The model writes its layers once as a `LayerProgram`: a record per native
call (product, RoPE + KV write, attention) holding what lives as long as the
model (weights, norms, cache layers); `run` passes a step's own buffers and
tables. The per-call path's argument conversion in ctypes cost more than a
small model's work at one sequence (bench/throughput.py B=1).

The records name the step's buffers by index: X (the residual stream), QKV,
ATTN (attention output), GATE_UP.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence

import torch

from engine.kernels.native import BoundProduct, _check, kv_half, library

X, QKV, ATTN, GATE_UP = range(4)
BUFFERS = 4
ROPE_TABLES = 4
RECORD = 20
_PRODUCT, _ROPE, _ATTENTION = 1, 2, 3
STEP_WORDS = 2 + 2 * BUFFERS + 6 + 2 * ROPE_TABLES


def _address(tensor: torch.Tensor | None) -> int:
    return 0 if tensor is None else tensor.data_ptr()


def _float(value: float) -> int:
    """A float32's bits as a word (the value rounded to float32, as ctypes' c_float does)."""
    return struct.unpack("<i", struct.pack("<f", value))[0]


class LayerProgram:
    """The records of a step's native calls, in order; `run` makes them all."""

    def __init__(self) -> None:
        self._records: list[list[int]] = []
        self._keep: list[object] = []  # the tensors whose pointers the records hold
        self._program: torch.Tensor | None = None
        lib = library()
        if lib.tandem_forward_step_words() != STEP_WORDS or lib.tandem_forward_record_words() != RECORD:
            raise RuntimeError("forward.c and engine/kernels/native/forward.py disagree on their words")
        self._call = lib.tandem_forward_layers

    def _add(self, words: list[int], *keep: object) -> None:
        assert len(words) <= RECORD and self._program is None
        self._records.append(words + [0] * (RECORD - len(words)))
        self._keep.extend(keep)

    def product(
        self, bound: BoundProduct, source: int, target: int, *, column: int = 0, input_op: int = 0,
        norm_weight: torch.Tensor | None = None, eps: float = 0.0, accumulate: bool = False,
        out_norm: torch.Tensor | None = None, out_scale: float = 1.0,
    ) -> None:
        """target[:, column:column + N] (+)= out_scale * out_op(op(source) @ W.T), as BoundProduct.__call__."""
        fmt, n, k, data, scales, mins, bias = bound.words()
        self._add([_PRODUCT, fmt, n, k, data, scales, mins, bias, source, target, column, input_op,
                   _address(norm_weight), _float(eps), int(accumulate), _address(out_norm), _float(out_scale)],
                  bound, norm_weight, out_norm)

    def rope(
        self, heads: int, kv_heads: int, head_dim: int, table: int, k_layer: torch.Tensor, v_layer: torch.Tensor,
        *, q_norm: torch.Tensor | None, k_norm: torch.Tensor | None, eps: float, rotary_dim: int,
    ) -> None:
        """As native.rope_write_kv on the QKV buffer, with RoPE table `table` of the step's."""
        if not 0 <= table < ROPE_TABLES:
            raise ValueError(f"at most {ROPE_TABLES} distinct rotations")
        if (q_norm is None) != (k_norm is None):
            raise ValueError("q and k head norms come together")
        self._add([_ROPE, heads, kv_heads, head_dim, QKV, table, k_layer.data_ptr(), v_layer.data_ptr(),
                   _address(q_norm), _address(k_norm), _float(eps), rotary_dim, kv_half(k_layer, v_layer)],
                  k_layer, v_layer, q_norm, k_norm)

    def attention(
        self, heads: int, kv_heads: int, head_dim: int, page_size: int, window: int | None, scale: float,
        k_layer: torch.Tensor, v_layer: torch.Tensor, softcap: float | None,
    ) -> None:
        """As native.paged_attention from the QKV buffer into the ATTN buffer."""
        self._add([_ATTENTION, heads, kv_heads, head_dim, QKV, ATTN, page_size, window or 0, _float(scale),
                   k_layer.data_ptr(), v_layer.data_ptr(), _float(softcap or 0.0), kv_half(k_layer, v_layer)],
                  k_layer, v_layer)

    def run(
        self, buffers: Sequence[torch.Tensor], positions: torch.Tensor, row_table: torch.Tensor,
        page_table: torch.Tensor, write_rows: torch.Tensor, rope: Sequence[tuple[torch.Tensor, torch.Tensor]],
        threads: int,
    ) -> None:
        """Every record, on this step's buffers (X, QKV, ATTN, GATE_UP: float32 rows, unit column
        stride) and tables."""
        if self._program is None:
            self._program = torch.tensor(self._records, dtype=torch.int64).contiguous()
        assert len(buffers) == BUFFERS and len(rope) <= ROPE_TABLES
        cos = [table[0].data_ptr() for table in rope] + [0] * (ROPE_TABLES - len(rope))
        sin = [table[1].data_ptr() for table in rope] + [0] * (ROPE_TABLES - len(rope))
        step = (ctypes.c_int64 * STEP_WORDS)(
            buffers[X].shape[0], threads, *(b.data_ptr() for b in buffers), *(b.stride(0) for b in buffers),
            positions.data_ptr(), row_table.data_ptr(), page_table.data_ptr(), write_rows.data_ptr(),
            page_table.shape[0], page_table.shape[1], *cos, *sin,
        )
        _check(self._call(self._program.data_ptr(), self._program.shape[0], step), "tandem_forward_layers")
