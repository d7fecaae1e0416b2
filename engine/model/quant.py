"""Block-quantized weights: the formats a model folder may keep, and the
weight-only quantized linear layer that runs them.

Formats (all groups of GROUP_SIZE = 32 consecutive inputs of one output row,
the block size of llama.cpp's Q4_0 / Q4_1 / Q8_0, so a GGUF block maps to one
group with no requantization):

- "q8_0": int8 q in [-127, 127], one scale d per group; w = d * q.
- "q4_0": 4-bit q in [0, 15], one scale d per group;     w = d * (q - 8).
- "q4_1": 4-bit q in [0, 15], scale d and min m;         w = d * q + m.

Storage (`QuantizedTensor`, and the safetensors of an imported folder): for
a weight [N, K], `data` is int8 [N, K] (q8_0) or uint8 [N, K/2] (4-bit) in
GGML's nibble order: byte j of a group's 16 holds input j in its low nibble
and input j + 16 in its high one, so a GGUF block's bytes are copied as
they are. `scales` (and `mins`) are float16 [N, K/32], as GGUF stores them.

Compute (`QuantLinear`): the native kernel (engine/kernels/native/quant_matmul.c)
quantizes each input row to int8 groups of 32 (as llama.cpp does; of 256
for the K-quants, llama.cpp's q8_K: activation_block), so every block's dot
product is an integer one, and sums the blocks in one fixed order: a row's
result has the same bits whatever else is in the step and whichever
instruction set runs it. It reads the weight in a "packed"
layout (`PackedQuantizedTensor`, made once at load) where a vector lane is
an output column: the GEMM-shaped tiles that make a batch of rows cost
little more than one (bench/quant_kernels.py).

Raw GGUF blocks (RAW_BLOCK_FORMATS: "q4_k", "q5_k", "q6_k", "q5_0",
"q5_1"; a Q4_K_M file is Q4_K and Q6_K blocks) are kept byte for byte:
`data` is uint8 [N, blocks * block bytes], each row's blocks in file order
(ggml's block_q4_K etc.), `scales` and `mins` are None (they live inside
the blocks). dequantize() computes what gguf-py's gguf.quants.dequantize
computes, bit for bit. The packed layout keeps the same bytes, each field of
a block (d, dmin, the packed scales, the levels) interleaved across the 8
rows of an octet in 4-byte pieces (_RAW_FIELDS; quant_matmul.c's header).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from engine.kernels import native
from engine.model.quant_formats import (  # noqa: F401 - the formats' facts, re-exported
    BLOCK_BYTES,
    FOLDER_FORMAT_VERSION,
    FORMATS,
    GROUP_SIZE,
    KEPT_FORMATS,
    PACK_ROWS,
    QUANTIZE_FORMATS,
    QUANTIZED_TABLE_FORMAT,
    RAW_BLOCK_FORMATS,
    block_shape,
    quantized_nbytes,
)

log = logging.getLogger(__name__)


@dataclass(slots=True)
class QuantizedTensor:
    """A [rows, cols] weight in one of KEPT_FORMATS (see the module docstring)."""

    format: str
    data: torch.Tensor
    scales: torch.Tensor | None = None
    mins: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.format not in KEPT_FORMATS:
            raise ValueError(f"unknown quantized format {self.format!r}; known: {', '.join(KEPT_FORMATS)}")
        if self.format in RAW_BLOCK_FORMATS:
            block_bytes = RAW_BLOCK_FORMATS[self.format][1]
            if self.data.dtype != torch.uint8 or self.data.ndim != 2 or self.data.shape[1] % block_bytes:
                raise ValueError(
                    f"{self.format} weight: data must be uint8 rows of whole {block_bytes}-byte blocks, "
                    f"got {self.data.dtype} {tuple(self.data.shape)}"
                )
            if self.scales is not None or self.mins is not None:
                raise ValueError(f"{self.format} weight: scales and mins live inside its blocks")
            return
        rows = self.data.shape[0]
        cols = self.cols
        if self.scales is None or cols % GROUP_SIZE or tuple(self.scales.shape) != (rows, cols // GROUP_SIZE):
            raise ValueError(
                f"{self.format} weight with data {tuple(self.data.shape)} needs scales "
                f"[{rows}, {cols // GROUP_SIZE}], got {None if self.scales is None else tuple(self.scales.shape)}"
            )
        if (self.format == "q4_1") != (self.mins is not None):
            raise ValueError(f"{self.format} weight: mins are {'missing' if self.mins is None else 'unexpected'}")
        if self.mins is not None and self.mins.shape != self.scales.shape:
            raise ValueError(
                f"q4_1 weight: mins {tuple(self.mins.shape)} differ from scales {tuple(self.scales.shape)}"
            )

    @property
    def cols(self) -> int:
        if self.format in RAW_BLOCK_FORMATS:
            weights, block_bytes = RAW_BLOCK_FORMATS[self.format]
            return self.data.shape[1] // block_bytes * weights
        return self.data.shape[1] * (1 if self.format == "q8_0" else 2)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.data.shape[0], self.cols)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in (self.data, self.scales, self.mins) if t is not None)

    def levels(self) -> torch.Tensor:
        """The integer q of every weight, int32 [rows, cols] (q4: 0..15)."""
        if self.format in RAW_BLOCK_FORMATS:
            raise ValueError(f"{self.format} weights have no single level per weight; dequantize them")
        if self.format == "q8_0":
            return self.data.to(torch.int32)
        rows = self.data.shape[0]
        packed = self.data.view(rows, -1, GROUP_SIZE // 2).to(torch.int32)
        return torch.cat((packed & 0xF, packed >> 4), dim=-1).view(rows, -1)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        rows, cols = self.shape
        if self.format in RAW_BLOCK_FORMATS:
            # float64: the exact weights; else gguf-py's float32 bits.
            compute = torch.float64 if dtype == torch.float64 else torch.float32
            return _dequantize_blocks(self.format, self.data, compute).view(rows, cols).to(dtype)
        assert self.scales is not None
        q = self.levels().view(rows, -1, GROUP_SIZE).float()
        d = self.scales.float().unsqueeze(-1)
        if self.format == "q8_0":
            w = q * d
        elif self.format == "q4_0":
            w = (q - 8) * d
        else:
            assert self.mins is not None
            w = q * d + self.mins.float().unsqueeze(-1)
        return w.view(rows, cols).to(dtype)

    def _map(self, op) -> QuantizedTensor:  # noqa: ANN001 - a tensor -> tensor function
        """The same weight with `op` applied to each stored part."""
        parts = (self.data, self.scales, self.mins)
        return QuantizedTensor(self.format, *(None if t is None else op(t) for t in parts))

    def take_rows(self, index: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Dequantized rows `index` (an embedding lookup), [*index.shape, cols]."""
        flat = index.reshape(-1)
        return self._map(lambda t: t.index_select(0, flat)).dequantize(dtype).view(*index.shape, self.cols)

    def permute_rows(self, order: torch.Tensor) -> QuantizedTensor:
        return self._map(lambda t: t[order].contiguous())

    def to(self, device: torch.device) -> QuantizedTensor:
        return self._map(lambda t: t.to(device))

    @staticmethod
    def cat(parts: list[QuantizedTensor]) -> QuantizedTensor:
        """Stack weights of one format along the output rows (fused q/k/v)."""
        formats = {p.format for p in parts}
        if len(formats) != 1:
            raise ValueError(f"cannot stack weights of formats {sorted(formats)}")

        def stacked(field: str) -> torch.Tensor | None:
            tensors = [getattr(p, field) for p in parts]
            return None if tensors[0] is None else torch.cat(tensors)

        data = stacked("data")
        assert data is not None
        return QuantizedTensor(parts[0].format, data, stacked("scales"), stacked("mins"))


# The fields of each raw block, (offset, bytes), in file order: what the
# packed layout interleaves across an octet's rows (quant_matmul.c's header
# and RAW_FIELDS there say the same).
_RAW_FIELDS = {
    "q4_k": ((0, 2), (2, 2), (4, 12), (16, 128)),  # d, dmin, 6-bit scales and mins, 4-bit levels
    "q5_k": ((0, 2), (2, 2), (4, 12), (16, 32), (48, 128)),  # ... the fifth bits, then the 4-bit levels
    "q6_k": ((0, 128), (128, 64), (192, 16), (208, 2)),  # low 4 bits, high 2 bits, int8 scales, d
    "q5_0": ((0, 2), (2, 4), (6, 16)),  # d, the fifth bits, 4-bit levels
    "q5_1": ((0, 2), (2, 2), (4, 4), (8, 16)),  # d, m, the fifth bits, 4-bit levels
}


def _f16(blocks: torch.Tensor, offset: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The float16 at byte `offset` of every block, as `dtype` [n, 1]."""
    return blocks[:, offset : offset + 2].contiguous().view(torch.float16).to(dtype)


def _nibbles(qs: torch.Tensor, span: int) -> torch.Tensor:
    """[n, bytes] -> [n, bytes * 2 / span, span] 4-bit levels: each run of
    `span` bytes gives its low nibbles, then its high ones (ggml's order)."""
    runs = qs.reshape(qs.shape[0], -1, 1, span)
    return torch.cat((runs & 0xF, runs >> 4), dim=2).reshape(qs.shape[0], -1, span)


def _bits(qh: torch.Tensor) -> torch.Tensor:
    """[n, bytes] little-endian bit fields -> [n, bytes * 8] of 0/1, bit j of byte j // 8 first."""
    shifts = torch.arange(8, dtype=torch.int32)
    return ((qh.unsqueeze(-1) >> shifts) & 1).reshape(qh.shape[0], -1)


def _dequantize_blocks(fmt: str, data: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Raw GGUF blocks -> [blocks, weights], with gguf-py's float operations
    in gguf-py's order: in float32 the same bits as gguf-py, in float64 the
    exact values (every product of a scale and a level fits)."""
    weights, block_bytes = RAW_BLOCK_FORMATS[fmt]
    blocks = data.reshape(-1, block_bytes)
    n = blocks.shape[0]
    raw = blocks.to(torch.int32)
    if fmt in ("q4_k", "q5_k"):
        d, dmin = _f16(blocks, 0, dtype), _f16(blocks, 2, dtype)
        packed = raw[:, 4:16].view(n, 3, 4)
        low, high, extra = packed[:, 0], packed[:, 1], packed[:, 2]
        sc = torch.cat((low & 0x3F, (extra & 0x0F) | ((low >> 2) & 0x30)), dim=1)
        mn = torch.cat((high & 0x3F, (extra >> 4) | ((high >> 2) & 0x30)), dim=1)
        scale = (d * sc.to(dtype)).unsqueeze(-1)
        offset = (dmin * mn.to(dtype)).unsqueeze(-1)
        q = _nibbles(raw[:, -128:], 32)
        if fmt == "q5_k":
            q = q | (_bits(raw[:, 16:48]).view(n, 32, 8).transpose(1, 2) << 4)
        return (scale * q.to(dtype) - offset).reshape(n, weights)
    if fmt == "q6_k":
        low = _nibbles(raw[:, :128], 64).view(n, 2, 2, 64).reshape(n, 8, 32)
        shifts = torch.tensor([0, 2, 4, 6], dtype=torch.int32).view(1, 1, 4, 1)
        high = ((raw[:, 128:192].view(n, 2, 1, 32) >> shifts) & 3).reshape(n, 8, 32)
        q = ((low | (high << 4)) - 32).view(n, 16, 16).to(dtype)
        scale = (_f16(blocks, 208, dtype) * blocks[:, 192:208].view(torch.int8).to(dtype)).unsqueeze(-1)
        return (scale * q).reshape(n, weights)
    # q5_0 / q5_1: qh bit j is the fifth bit of weight j.
    head = 2 if fmt == "q5_0" else 4
    q = _nibbles(raw[:, head + 4 :], 16).reshape(n, 32) | (_bits(raw[:, head : head + 4]) << 4)
    d = _f16(blocks, 0, dtype)
    if fmt == "q5_0":
        return d * (q - 16).to(dtype)
    return d * q.to(dtype) + _f16(blocks, 2, dtype)


@dataclass(slots=True)
class PackedQuantizedTensor(QuantizedTensor):
    """A QuantizedTensor in the kernels' packed layout (quant_matmul.c's
    header): `data` [octets, groups, 8 * bytes of a row's group] with the
    4-byte pieces of 8 output rows interleaved, `scales` (and `mins`)
    [octets, groups, 8]; for the raw formats `data` [octets, blocks, 8 *
    block bytes] (_raw_fields) and no scales. `rows` is the true row
    count (the last octet is padded with zero rows). Made by pack_weight();
    unpacked() gives the plain layout back, bit for bit."""

    rows: int = 0

    def __post_init__(self) -> None:
        if self.format not in KEPT_FORMATS:
            raise ValueError(f"unknown quantized format {self.format!r}; known: {', '.join(KEPT_FORMATS)}")
        octets, groups, width = self.data.shape
        if self.format in RAW_BLOCK_FORMATS:
            if width != _packed_width(self.format) or self.scales is not None or self.mins is not None:
                raise ValueError(f"packed {self.format} weight with data {tuple(self.data.shape)} is not whole blocks")
        elif width != _packed_width(self.format) or self.scales is None or (
            tuple(self.scales.shape) != (octets, groups, PACK_ROWS)
        ):
            raise ValueError(
                f"packed {self.format} weight with data {tuple(self.data.shape)} has scales "
                f"{None if self.scales is None else tuple(self.scales.shape)}"
            )
        if not (octets - 1) * PACK_ROWS < self.rows <= octets * PACK_ROWS:
            raise ValueError(f"packed weight of {octets} octets cannot hold {self.rows} rows")
        if (self.format == "q4_1") != (self.mins is not None):
            raise ValueError(f"{self.format} weight: mins are {'missing' if self.mins is None else 'unexpected'}")

    @property
    def cols(self) -> int:
        return self.data.shape[1] * block_shape(self.format)[0]

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows, self.cols)

    def unpacked(self) -> QuantizedTensor:
        octets, groups, _ = self.data.shape
        if self.format in RAW_BLOCK_FORMATS:
            plain = torch.empty(octets, PACK_ROWS, groups, RAW_BLOCK_FORMATS[self.format][1], dtype=torch.uint8)
            packed = self.data
            if self.format in ("q5_0", "q5_1"):
                packed = packed.clone()
                qh = _fifth_bits_field(self.format, packed)
                qh.copy_(_reorder_fifth_bits(qh, back=True))
            for target, source in _raw_fields(self.format, plain, packed):
                target.copy_(source)
            return QuantizedTensor(self.format, plain.view(octets * PACK_ROWS, -1)[: self.rows].clone())
        pieces = 8 if self.format == "q8_0" else 4
        data = self.data.view(octets, groups, pieces, PACK_ROWS, 4).permute(0, 3, 1, 2, 4)
        data = data.reshape(octets * PACK_ROWS, -1)[: self.rows].contiguous()

        def per_row(t: torch.Tensor | None) -> torch.Tensor | None:
            if t is None:
                return None
            return t.permute(0, 2, 1).reshape(octets * PACK_ROWS, groups)[: self.rows].contiguous()

        return QuantizedTensor(self.format, data, per_row(self.scales), per_row(self.mins))

    def levels(self) -> torch.Tensor:
        return self.unpacked().levels()

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.unpacked().dequantize(dtype)

    def take_rows(self, index: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.unpacked().take_rows(index, dtype)

    def permute_rows(self, order: torch.Tensor) -> QuantizedTensor:
        return pack_weight(self.unpacked().permute_rows(order))

    def to(self, device: torch.device) -> QuantizedTensor:
        return self.unpacked().to(device)


def _packed_width(fmt: str) -> int:
    if fmt in RAW_BLOCK_FORMATS:
        return PACK_ROWS * RAW_BLOCK_FORMATS[fmt][1]
    return PACK_ROWS * (GROUP_SIZE if fmt == "q8_0" else GROUP_SIZE // 2)


def _raw_fields(fmt: str, side_by_side: torch.Tensor, packed: torch.Tensor):  # noqa: ANN202
    """Each field of the raw blocks as two views of the same bytes: in
    `side_by_side` [octets, 8, blocks, bytes] (rows of file-order blocks) and
    in `packed` [octets, blocks, 8 * bytes] (the kernels' layout), both
    [octets, blocks, pieces, 8, piece bytes]. In the packed block each field
    sits at 8 * its offset: a 2-byte field (fp16 d, dmin) as 8 rows x 2
    bytes, a wider one as pieces of 4 bytes, piece p holding bytes
    4p..4p+3 of each of the 8 rows (a 32-byte vector, a row per lane)."""
    octets, _, blocks, _ = side_by_side.shape
    for offset, width in _RAW_FIELDS[fmt]:
        piece = 2 if width == 2 else 4
        shape = (octets, blocks, width // piece, PACK_ROWS, piece)
        plain = side_by_side[..., offset : offset + width].unflatten(-1, (width // piece, piece))
        yield plain.permute(0, 2, 3, 1, 4), packed[..., PACK_ROWS * offset : PACK_ROWS * (offset + width)].view(shape)


def _reorder_fifth_bits(qh: torch.Tensor, *, back: bool = False) -> torch.Tensor:
    """q5_0 / q5_1's fifth bits [..., 4 bytes] as the kernels keep them
    (quant_matmul.c fifth_bit_order): file bit 4k + b (weight 4k + b) at
    bit 8b + k, file bit 16 + 4k + b at 8b + 4 + k. `back`: the inverse."""
    word = sum(qh[..., i].to(torch.int64) << (8 * i) for i in range(4))
    out = torch.zeros_like(word)
    for j in range(32):
        high, k, b = j // 16, (j % 16) // 4, j % 4
        source, target = j, 8 * b + 4 * high + k
        if back:
            source, target = target, source
        out |= ((word >> source) & 1) << target
    return torch.stack([(out >> (8 * i)) & 0xFF for i in range(4)], dim=-1).to(torch.uint8)


def _pack_raw(fmt: str, data: torch.Tensor, blocks: int) -> torch.Tensor:
    """Raw blocks [rows, blocks * bytes] -> the packed [octets, blocks, 8 * bytes],
    one strided copy per field (no copy of the whole beyond the result; q5_0 /
    q5_1's fifth bits are then reordered in place)."""
    rows = data.shape[0]
    block_bytes = RAW_BLOCK_FORMATS[fmt][1]
    octets, full = -(-rows // PACK_ROWS), rows // PACK_ROWS
    out = torch.empty(octets, blocks, PACK_ROWS * block_bytes, dtype=torch.uint8)
    parts = [(data[: full * PACK_ROWS], out[:full])]
    if full < octets:  # the last octet, padded with zero rows
        tail = data.new_zeros(PACK_ROWS, data.shape[1])
        tail[: rows - full * PACK_ROWS] = data[full * PACK_ROWS :]
        parts.append((tail, out[full:]))
    for plain, packed in parts:
        for source, target in _raw_fields(fmt, plain.view(-1, PACK_ROWS, blocks, block_bytes), packed):
            target.copy_(source)
    if fmt in ("q5_0", "q5_1"):
        qh = _fifth_bits_field(fmt, out)
        qh.copy_(_reorder_fifth_bits(qh))
    return out


def _fifth_bits_field(fmt: str, packed: torch.Tensor) -> torch.Tensor:
    """The packed q5_0 / q5_1 fifth bits, a view [octets, blocks, 8 rows, 4 bytes]."""
    offset = 8 * (2 if fmt == "q5_0" else 4)
    return packed[..., offset : offset + 32].unflatten(-1, (PACK_ROWS, 4))


def pack_weight(weight: QuantizedTensor) -> PackedQuantizedTensor:
    """`weight` in the kernels' packed layout (a new copy; see
    PackedQuantizedTensor)."""
    if isinstance(weight, PackedQuantizedTensor):
        return weight
    rows, cols = weight.shape
    groups = cols // block_shape(weight.format)[0]
    octets = -(-rows // PACK_ROWS)
    pad = octets * PACK_ROWS - rows

    def padded(t: torch.Tensor) -> torch.Tensor:
        return t if not pad else torch.cat((t, t.new_zeros(pad, *t.shape[1:])))

    if weight.format in RAW_BLOCK_FORMATS:
        return PackedQuantizedTensor(weight.format, _pack_raw(weight.format, weight.data, groups), rows=rows)
    pieces = 8 if weight.format == "q8_0" else 4
    data = padded(weight.data).view(octets, PACK_ROWS, groups, pieces, 4).permute(0, 2, 3, 1, 4)
    data = data.reshape(octets, groups, _packed_width(weight.format)).contiguous()

    def per_octet(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else padded(t).view(octets, PACK_ROWS, groups).permute(0, 2, 1).contiguous()

    scales = per_octet(weight.scales)
    assert scales is not None
    return PackedQuantizedTensor(weight.format, data, scales, per_octet(weight.mins), rows=rows)


# --------------------------------------------------------------------------
# Quantizing float weights (requantizing GGUF types we do not keep, and
# `--quantize` of float checkpoints). Same rounding as ggml's reference
# quantize_row_q8_0 / q4_0 / q4_1.


def quantize(weight: np.ndarray | torch.Tensor, fmt: str) -> QuantizedTensor:
    """Quantize a float [rows, cols] weight (cols a multiple of 32) to `fmt`."""
    w = torch.as_tensor(weight).float()
    if w.ndim != 2 or w.shape[1] % GROUP_SIZE:
        raise ValueError(f"cannot quantize a weight of shape {tuple(w.shape)} in groups of {GROUP_SIZE}")
    rows, cols = w.shape
    g = w.view(rows, -1, GROUP_SIZE)
    if fmt == "q8_0":
        d = g.abs().amax(-1) / 127
        inv = torch.where(d > 0, 1 / d, torch.zeros_like(d))
        q = torch.round(g * inv.unsqueeze(-1)).clamp(-127, 127).to(torch.int8)
        return QuantizedTensor(fmt, q.view(rows, cols), d.half())
    if fmt == "q4_0":
        # ggml: d = max / -8 where max is the value of largest magnitude (sign kept).
        index = g.abs().argmax(-1, keepdim=True)
        extreme = g.gather(-1, index).squeeze(-1)
        d = extreme / -8
        inv = torch.where(d != 0, 1 / d, torch.zeros_like(d))
        q = torch.clamp(torch.floor(g * inv.unsqueeze(-1) + 8.5), 0, 15).to(torch.uint8)
        return QuantizedTensor(fmt, _pack_nibbles(q, rows), d.half())
    if fmt == "q4_1":
        lo, hi = g.amin(-1), g.amax(-1)
        d = (hi - lo) / 15
        inv = torch.where(d > 0, 1 / d, torch.zeros_like(d))
        q = torch.clamp(torch.floor((g - lo.unsqueeze(-1)) * inv.unsqueeze(-1) + 0.5), 0, 15).to(torch.uint8)
        return QuantizedTensor(fmt, _pack_nibbles(q, rows), d.half(), lo.half())
    raise ValueError(f"unknown quantized format {fmt!r}; known: {', '.join(FORMATS)}")


def _pack_nibbles(q: torch.Tensor, rows: int) -> torch.Tensor:
    """[rows, groups, 32] values 0..15 -> GGML nibble order uint8 [rows, cols/2]."""
    half = GROUP_SIZE // 2
    return (q[..., :half] | (q[..., half:] << 4)).view(rows, -1)


def error_bound(q: QuantizedTensor) -> torch.Tensor:
    """Per-row bound on |w - dequantize(quantize(w, fmt))|: half a step
    (a whole step for q4_0, whose scale maps the largest magnitude to -8 so
    the other sign's extreme is clamped at 7), plus the float16 rounding of
    the scales (relative 2**-11, times the largest level) and mins."""
    if q.scales is None:
        raise ValueError(f"{q.format} weights are kept as a file holds them; there is no rounding of ours to bound")
    eps = 2.0**-11
    d = q.scales.float().abs()
    if q.format == "q8_0":
        bound = d * (0.5 + 127 * eps)
    elif q.format == "q4_0":
        bound = d * (1 + 8 * eps)
    else:
        assert q.mins is not None
        bound = d * (0.5 + 15 * eps) + q.mins.float().abs() * eps
    return bound.amax(-1)


def activation_block(fmt: str) -> int:
    """How many inputs share one int8 scale when the kernel quantizes a
    product's input for weights in `fmt`: 256 for the K-quants (llama.cpp's
    q8_K, one exact integer sum per super-block), else 32 (q8_0)."""
    return 256 if fmt in ("q4_k", "q5_k", "q6_k") else GROUP_SIZE


def random_raw_weight(fmt: str, rows: int, cols: int, generator: torch.Generator) -> QuantizedTensor:
    """A `fmt` weight of random blocks: every byte random, except the float16
    scales, small normal numbers (as real files hold) so that products stay
    finite. For checking kernels against dequantize()."""
    weights, block_bytes = RAW_BLOCK_FORMATS[fmt]
    blocks = torch.randint(0, 256, (rows * cols // weights, block_bytes), dtype=torch.uint8, generator=generator)
    halves = {"q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208,), "q5_0": (0,), "q5_1": (0, 2)}[fmt]
    for offset in halves:
        scale = (torch.rand(blocks.shape[0], generator=generator) * 2e-3 + 1e-4).half()
        blocks[:, offset : offset + 2] = scale.view(-1, 1).view(torch.uint8)
    return QuantizedTensor(fmt, blocks.view(rows, -1))


def product_error_bound(x: torch.Tensor, q: QuantizedTensor, *, exact_weights: bool = False) -> torch.Tensor:
    """Bound on |QuantLinear(q)(x) - x @ w.T| per output, [M, N], where w is
    the float weight q was quantized from (`exact_weights`: w is
    q.dequantize() itself). Two roundings add up: the weights' (each within
    error_bound(q) of w), and on the kernel's path the inputs' to int8 groups
    (each within half a step, max|x_block| / 254, of x; activation_block), times the weights
    they meet; plus float32 summation, far smaller."""
    x = x.float()
    rows, cols = x.shape
    block = activation_block(q.format)
    step = x.view(rows, -1, block).abs().amax(-1, keepdim=True) / 127
    input_error = (step / 2).expand(-1, -1, block).reshape(rows, cols) * (1 + 2.0**-20)
    bound = input_error @ q.dequantize().abs().T
    if not exact_weights:
        bound = bound + x.abs().sum(-1, keepdim=True) * error_bound(q)
    summation = 2.0**-20 * cols * (x.abs() @ q.dequantize().abs().T)
    return bound + summation + 1e-6


# --------------------------------------------------------------------------
# Running them


class QuantLinear:
    """y = x @ W.T + bias with W kept block-quantized: one copy, packed for
    the native kernel (engine/kernels/native/quant_matmul.c), which computes
    every product, from a one-row decode step to a long prefill chunk, with
    the same arithmetic per row. x: float32 or bfloat16 [M, K].
    """

    __slots__ = ("_bound", "bias", "format", "in_features", "out_features", "weight")

    def __init__(self, weight: QuantizedTensor, bias: torch.Tensor | None = None) -> None:
        if weight.data.device.type != "cpu":
            raise ValueError("QuantLinear runs on the CPU; dequantize the weight for other devices")
        self.format = weight.format
        self.out_features, self.in_features = weight.shape
        self.weight = pack_weight(weight)
        self.bias = None if bias is None else bias.float().contiguous()
        self._bound: native.BoundProduct | None = None  # bound at the first product

    @property
    def nbytes(self) -> int:
        return self.weight.nbytes

    def product_into(
        self,
        x: torch.Tensor,
        out: torch.Tensor,
        *,
        input_op: str | None = None,
        norm_weight: torch.Tensor | None = None,
        eps: float = 0.0,
        accumulate: bool = False,
        out_norm: torch.Tensor | None = None,
        out_scale: float = 1.0,
    ) -> None:
        """out (+)= out_scale * out_op(op(x) @ W.T + bias), float32 rows, in
        place: op is None, "rms_norm" (times norm_weight), "swiglu" or
        "geglu" (x holds gate then up); out_op an RMSNorm times out_norm
        where that is given (eps is both norms'); with `accumulate` the
        result is added to out (a residual stream). The steps of
        DecoderModel's native path are these calls."""
        if x.stride(1) != 1:
            x = x.contiguous()
        norm = None if norm_weight is None else norm_weight.data_ptr()
        after = None if out_norm is None else out_norm.data_ptr()
        self.bound()(
            x, out, torch.get_num_threads(), native.INPUT_OPS[input_op], norm, eps, accumulate, after, out_scale
        )

    def bound(self) -> native.BoundProduct:
        """The packed weight's native product, its arguments resolved once."""
        if self._bound is None:
            w = self.weight
            self._bound = native.BoundProduct(w.format, w.data, w.scales, w.mins, self.bias, self.out_features)
        return self._bound

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty(x.shape[0], self.out_features, dtype=torch.float32)
        self.product_into(x.float(), out)
        return out if x.dtype == torch.float32 else out.to(x.dtype)

    def tiled(self, x: torch.Tensor, rows: int) -> torch.Tensor:
        """As engine.model.linear.Linear.tiled: each row's result is
        independent of the batch, which the kernel already guarantees."""
        return self(x)


def take_rows(weight: QuantizedTensor, index: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Dequantized rows `index` (an embedding lookup), [*index.shape, cols]."""
    if isinstance(weight, PackedQuantizedTensor) and native.available():
        rows = native.quant_take_rows(
            weight.format, index, weight.data, weight.scales, weight.mins, weight.cols, packed=True
        )
        rows = rows if dtype == torch.float32 else rows.to(dtype)
        return rows.view(*index.shape, weight.cols)
    if weight.data.device.type == "cpu" and native.available():
        rows = native.quant_take_rows(weight.format, index, weight.data, weight.scales, weight.mins, weight.cols)
        rows = rows if dtype == torch.float32 else rows.to(dtype)
        return rows.view(*index.shape, weight.cols)
    return weight.take_rows(index, dtype)


class ConcatLinear:
    """Products with several weights side by side, outputs concatenated: a
    fused q/k/v (or gate/up) whose parts were stored in different formats."""

    __slots__ = ("out_features", "parts")

    def __init__(self, parts: list) -> None:
        self.parts = parts
        self.out_features = sum(p.out_features for p in parts)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p(x) for p in self.parts], dim=-1)

    def tiled(self, x: torch.Tensor, rows: int) -> torch.Tensor:
        return torch.cat([p.tiled(x, rows) for p in self.parts], dim=-1)

    @property
    def runs_natively(self) -> bool:
        return all(isinstance(p, QuantLinear) for p in self.parts)

    def product_into(
        self,
        x: torch.Tensor,
        out: torch.Tensor,
        *,
        input_op: str | None = None,
        norm_weight: torch.Tensor | None = None,
        eps: float = 0.0,
    ) -> None:
        """QuantLinear.product_into with each part's outputs in its own
        columns of `out` (llama.cpp's Q4_K_M keeps v, and some layers' down,
        at 6-8 bits beside 4-bit q and k). Every output element is its own
        part's, with the bits a fused product of that format gives. Only
        the input ops: a fused q/k/v or gate/up has no output ops. Each
        part writes its columns in place (the kernel takes the output's
        row stride): no buffer or copy per part."""
        start = 0
        for part in self.parts:
            width = part.out_features
            part.product_into(x, out[:, start : start + width], input_op=input_op, norm_weight=norm_weight, eps=eps)
            start += width


def cpu_kernel_available() -> bool:
    """Whether quantized weights can run as they are on this CPU: the native
    kernels are built (or buildable) and compute what this module expects
    (checked once, on a small weight of each format)."""
    global _kernel_works
    if _kernel_works is None:
        _kernel_works = _check_kernel()
    return _kernel_works


_kernel_works: bool | None = None


def cpu_kernel_expected() -> bool:
    """cpu_kernel_available()'s answer where it is known, else a prediction
    that builds and runs nothing (engine.kernels.native.likely_available): for
    estimates made on the GUI thread."""
    return _kernel_works if _kernel_works is not None else native.likely_available()


def _check_kernel() -> bool:
    if not native.available():
        return False
    gen = torch.Generator().manual_seed(0)
    for fmt in KEPT_FORMATS:
        if fmt in RAW_BLOCK_FORMATS:
            weight = random_raw_weight(fmt, 48, 256, gen)
        else:
            weight = quantize(torch.randn(48, 64, generator=gen), fmt)
        x = torch.randn(3, weight.cols, generator=gen)
        got = QuantLinear(weight)(x)
        want = x @ weight.dequantize().T
        # The kernel quantizes x to int8 blocks: relative error ~1/254 per input.
        if not torch.allclose(got, want, atol=0.05 * float(want.abs().max()), rtol=0):
            log.warning("the native %s kernel disagrees with its reference; quantized weights will be dequantized", fmt)
            return False
    return True


def fold_quantized_headers(
    headers: dict[str, tuple[tuple[int, ...], str]], formats: dict[str, str]
) -> dict[str, tuple[tuple[int, ...], str]]:
    """Safetensors headers (name -> (shape, dtype)) with each quantized
    weight's stored parts (.qdata, .scales, .mins) folded into its own name,
    shape [rows, cols] and its format as the dtype ("Q4_1"): what a folder
    check compares with the shapes config.json implies."""
    folded = dict(headers)
    for name, fmt in formats.items():
        parts = [folded.pop(name + suffix, None) for suffix in (".qdata", ".scales", ".mins")]
        if parts[0] is None:
            continue  # missing: the check reports the weight itself as missing
        rows, stored_cols = parts[0][0]
        if fmt in RAW_BLOCK_FORMATS:
            weights, block_bytes = RAW_BLOCK_FORMATS[fmt]
            cols = stored_cols // block_bytes * weights
        else:
            cols = stored_cols * (1 if fmt == "q8_0" else 2)
        folded[name] = ((rows, cols), fmt.upper())
    return folded
