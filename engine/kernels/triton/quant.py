"""Weight-only quantized matrix products on CUDA: Triton kernels that read
engine.model.quant's block-quantized weights as they are stored and
dequantize them in registers, so no float copy of any weight exists. One
kernel serves the grouped formats (q8_0, q4_0, q4_1: levels and scales
apart), another the formats kept as the GGUF file's blocks (q4_k, q5_k,
q6_k, q5_0, q5_1; see "Raw blocks" below).

One kernel serves the three formats (a constexpr picks the unpacking) and
computes y[M, N] = x[M, K] @ W^T (+ bias), accumulating in fp32. Each program
owns a [BLOCK_M, BLOCK_N] tile of y and walks K in steps of BLOCK_K (whole
32-input groups, so a group's scale, and the K mask, hold for a whole group).

4-bit bytes are not re-interleaved into input order: byte j of a group holds
inputs j (low nibble) and j + 16 (high nibble), so the kernel loads x twice,
at the low-nibble inputs and at the high-nibble ones, and takes two products
of half the width. The weight stays in the layout the folder stores (each
program reads BLOCK_K / 2 consecutive bytes of each of its rows), so the
weight held is the QuantizedTensor itself: nothing is repacked.

Two ways to multiply, chosen on the host from M:
- decode (M <= SMALL_M_MAX): broadcast-multiply and sum in fp32, with a
  narrow N tile (many programs for one row) and a long K step. Every operand
  is fp32, so the result is x @ dequantize().T up to summation order.
- prefill (larger M): tl.dot on [BLOCK_M, BLOCK_K] x [BLOCK_K, BLOCK_N]
  tiles. 16-bit inputs take the dequantized weight in x's dtype (as
  `F.linear(x, w.dequantize(x.dtype))` would), with fp32 accumulation; fp32
  inputs use true fp32 products (no TF32).

Scales (and mins) are loaded once per (row, group) and broadcast over the
group, the weight tile being read as [BLOCK_N, groups, elements per group].

No autotuning: the block sizes are a fixed function of M and x's dtype, so
a product of a given shape always runs the same program (what `tiled` relies
on for batch invariance). They were chosen so that ptxas (sm_90, Triton 3.9)
reports no register spills for any format and dtype, not timed on a GPU.

Raw blocks: a q4_k / q5_k / q6_k / q5_0 / q5_1 row is its GGUF blocks
byte for byte (ggml's block_q4_K etc.; 256 weights a block for the
K-quants, 32 for Q5). The kernel walks K in steps of K_STEP weights and
derives, for each weight of the step, the bytes that hold its level, its
high bits and its sub-block's scale (and min) from its position in its
block: gathers that a step's neighbouring weights share, so each byte
comes from memory once and from cache after. The arithmetic is gguf-py's
dequantize (d * scale, then times the level, minus dmin * min), and the
products the same two paths as above.

`TRITON_INTERPRET=1` (set before triton is first imported) runs the kernels on
the CPU: tests/engine/test_triton_quant.py.
"""

from __future__ import annotations

import torch

from engine.model.linear import tiled_product
from engine.model.quant import GROUP_SIZE, QuantizedTensor
from engine.model.quant_formats import RAW_BLOCK_FORMATS

try:
    import triton
    import triton.language as tl
except Exception:  # not installed, or a build that does not load here
    triton = None

# Rows up to this count take the broadcast-and-sum path (decode steps).
SMALL_M_MAX = 4
_FORMAT_CODES = {"q8_0": 0, "q4_0": 1, "q4_1": 2}
_RAW_FORMAT_CODES = {"q4_k": 0, "q5_k": 1, "q6_k": 2, "q5_0": 3, "q5_1": 4}

if triton is not None:

    @triton.jit
    def _accumulate(acc, x, w, USE_DOT: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
        # x [BLOCK_M, P] and w [BLOCK_N, P], both fp32.
        if USE_DOT:
            acc += tl.dot(x.to(DOT_DTYPE), tl.trans(w.to(DOT_DTYPE)), input_precision=PRECISION)
        else:
            acc += tl.sum(x[:, None, :] * w[None, :, :], axis=2)
        return acc

    @triton.jit
    def _quant_matmul_kernel(
        x_ptr, data_ptr, scales_ptr, mins_ptr, bias_ptr, out_ptr,
        M, N, K, stride_xm, stride_om,
        FORMAT: tl.constexpr, HAS_BIAS: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        PART: tl.constexpr, PART_PER_GROUP: tl.constexpr,
        USE_DOT: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
    ):
        # PART: stored elements (int8 values or nibble bytes) per row per K step;
        # PART_PER_GROUP: of them, how many one 32-input group holds (32 or 16).
        GROUPS: tl.constexpr = PART // PART_PER_GROUP
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < M
        col_ok = cols < N
        wide_cols = cols.to(tl.int64)
        groups = K // 32
        part = tl.arange(0, PART)
        # Input index (within the K step) of each stored element; for 4-bit
        # bytes that of the low nibble, the high nibble's being 16 further.
        first_input = (part // PART_PER_GROUP) * 32 + part % PART_PER_GROUP
        # The weight tile is read as [BLOCK_N, GROUPS, PART_PER_GROUP], so one
        # scale per (row, group) is loaded and broadcast, not one per element.
        step_group = tl.arange(0, GROUPS)
        in_group = tl.arange(0, PART_PER_GROUP)
        x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_xm
        data_rows = (data_ptr + wide_cols[:, None, None] * (groups * PART_PER_GROUP)
                     + (step_group[None, :, None] * PART_PER_GROUP + in_group[None, None, :]))
        scale_rows = wide_cols[:, None] * groups + step_group[None, :]

        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            # K is whole groups and so is the step: masks are per group.
            group_ok = k0 + step_group * 32 < K
            x_mask = row_ok[:, None] & (k0 + first_input < K)[None, :]
            scale_mask = col_ok[:, None] & group_ok[None, :]
            d = tl.load(scales_ptr + scale_rows + k0 // 32, mask=scale_mask, other=0.0).to(tl.float32)[:, :, None]
            stored = tl.load(data_rows + k0 // 32 * PART_PER_GROUP, mask=scale_mask[:, :, None], other=0)
            x_low = tl.load(x_rows + (k0 + first_input)[None, :], mask=x_mask, other=0.0).to(tl.float32)
            if FORMAT == 0:
                w = tl.reshape(stored.to(tl.float32) * d, (BLOCK_N, PART))
                acc = _accumulate(acc, x_low, w, USE_DOT, DOT_DTYPE, PRECISION)
            else:
                x_high = tl.load(x_rows + (k0 + 16 + first_input)[None, :], mask=x_mask, other=0.0).to(tl.float32)
                low = (stored & 0xF).to(tl.float32)
                high = (stored >> 4).to(tl.float32)
                if FORMAT == 1:
                    w_low = (low - 8.0) * d
                    w_high = (high - 8.0) * d
                else:
                    m = tl.load(mins_ptr + scale_rows + k0 // 32, mask=scale_mask, other=0.0).to(tl.float32)[:, :, None]
                    w_low = low * d + m
                    w_high = high * d + m
                acc = _accumulate(acc, x_low, tl.reshape(w_low, (BLOCK_N, PART)), USE_DOT, DOT_DTYPE, PRECISION)
                acc = _accumulate(acc, x_high, tl.reshape(w_high, (BLOCK_N, PART)), USE_DOT, DOT_DTYPE, PRECISION)

        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        out = out_ptr + rows.to(tl.int64)[:, None] * stride_om + cols[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])

    @triton.jit
    def _fp16_at(ptr, mask):
        # A little-endian float16 from two bytes (a block's d, dmin or m).
        low = tl.load(ptr, mask=mask, other=0).to(tl.uint16)
        high = tl.load(ptr + 1, mask=mask, other=0).to(tl.uint16)
        return (low | (high << 8)).to(tl.float16, bitcast=True).to(tl.float32)

    @triton.jit
    def _byte_at(ptr, mask):
        return tl.load(ptr, mask=mask, other=0).to(tl.int32)

    @triton.jit
    def _raw_block_weights(block, i, mask, FORMAT: tl.constexpr):
        """The weights at positions `i` [K_STEP] of the blocks starting at
        `block` [BLOCK_N, K_STEP], as gguf-py's dequantize_blocks computes them."""
        if FORMAT <= 1:
            # q4_k / q5_k: d, dmin, 12 bytes of 6-bit scales and mins for 8
            # sub-blocks of 32 (ggml's get_scale_min_k4), [q5_k: 32 bytes of
            # fifth bits,] then 4-bit levels, two sub-blocks per 32 bytes.
            sub = i // 32
            d = _fp16_at(block, mask)
            dmin = _fp16_at(block + 2, mask)
            first = _byte_at(block + 4 + sub, mask)
            second = _byte_at(block + 8 + sub, mask)
            before = _byte_at(block + 4 + tl.where(sub >= 4, sub - 4, sub), mask)
            low_half = sub < 4
            scale = tl.where(low_half, first & 63, (second & 0xF) | ((before >> 2) & 0x30))
            minimum = tl.where(low_half, second & 63, (second >> 4) | ((first >> 2) & 0x30))
            levels_at = 16 if FORMAT == 0 else 48
            level = (_byte_at(block + levels_at + (i // 64) * 32 + i % 32, mask) >> ((sub % 2) * 4)) & 0xF
            if FORMAT == 1:
                level = level | (((_byte_at(block + 16 + i % 32, mask) >> sub) & 1) << 4)
            return (d * scale.to(tl.float32)) * level.to(tl.float32) - dmin * minimum.to(tl.float32)
        elif FORMAT == 2:
            # q6_k: 128 bytes of low nibbles, 64 of 2-bit high parts, 16 int8
            # scales (one per 16 weights), then d.
            half = i // 128
            quarter = (i % 128) // 32
            lane = i % 32
            low = (_byte_at(block + 64 * half + 32 * (quarter % 2) + lane, mask) >> (4 * (quarter // 2))) & 0xF
            high = (_byte_at(block + 128 + 32 * half + lane, mask) >> (2 * quarter)) & 3
            scale = tl.load(block + 192 + i // 16, mask=mask, other=0).to(tl.int8, bitcast=True).to(tl.float32)
            d = _fp16_at(block + 208, mask)
            return (d * scale) * ((low | (high << 4)) - 32).to(tl.float32)
        else:
            # q5_0 / q5_1: d [, m], the 32 fifth bits as a little-endian
            # uint32, then 16 bytes: input j low nibble, input j + 16 high.
            bits_at = 2 if FORMAT == 3 else 4
            low = (_byte_at(block + bits_at + 4 + i % 16, mask) >> ((i // 16) * 4)) & 0xF
            high = (_byte_at(block + bits_at + i // 8, mask) >> (i % 8)) & 1
            level = low | (high << 4)
            d = _fp16_at(block, mask)
            if FORMAT == 3:
                return d * (level - 16).to(tl.float32)
            return d * level.to(tl.float32) + _fp16_at(block + 2, mask)

    @triton.jit
    def _raw_block_matmul_kernel(
        x_ptr, data_ptr, bias_ptr, out_ptr,
        M, N, K, stride_xm, stride_om,
        FORMAT: tl.constexpr, BLOCK: tl.constexpr, BLOCK_BYTES: tl.constexpr, HAS_BIAS: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, K_STEP: tl.constexpr,
        USE_DOT: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
    ):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < M
        col_ok = cols < N
        row_bytes = (K // BLOCK) * BLOCK_BYTES
        data_rows = data_ptr + cols.to(tl.int64)[:, None] * row_bytes
        x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_xm
        step = tl.arange(0, K_STEP)

        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, K_STEP):
            k = k0 + step
            k_ok = k < K
            block = data_rows + ((k // BLOCK) * BLOCK_BYTES)[None, :]
            w = _raw_block_weights(block, k % BLOCK, col_ok[:, None] & k_ok[None, :], FORMAT)
            x = tl.load(x_rows + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
            acc = _accumulate(acc, x, w, USE_DOT, DOT_DTYPE, PRECISION)

        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        out = out_ptr + rows.to(tl.int64)[:, None] * stride_om + cols[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])

    # Decided when the kernel was decorated, which is what counts: the
    # environment variable may change afterwards.
    _INTERPRETED = not isinstance(_quant_matmul_kernel, triton.runtime.JITFunction)
    _TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}
else:
    _INTERPRETED = False


def triton_quant_available(device: torch.device | str) -> bool:
    """Whether TritonQuantLinear runs on `device`: triton imports, and the
    device is CUDA or triton runs in interpreter mode (TRITON_INTERPRET=1
    set before its first import)."""
    if triton is None:
        return False
    return _INTERPRETED or torch.device(device).type == "cuda"


def _launch_config(rows: int, dtype: torch.dtype) -> dict:
    if rows <= SMALL_M_MAX:
        block_m = triton.next_power_of_2(rows)
        # The [BLOCK_M, BLOCK_N, BLOCK_K] product lives in registers: keep it at 4096.
        return {"BLOCK_M": block_m, "BLOCK_N": 16, "BLOCK_K": 256 // block_m, "USE_DOT": False,
                "DOT_DTYPE": tl.float32, "PRECISION": "ieee", "num_warps": 4}
    if dtype == torch.float32:
        # True fp32 products are FMA loops with every operand in registers:
        # larger tiles spill (ptxas, sm_90).
        return {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "USE_DOT": True,
                "DOT_DTYPE": tl.float32, "PRECISION": "ieee", "num_warps": 4}
    # Triton 3.9's interpreter multiplies bf16 dot operands as their raw bits:
    # there the products are taken in fp32.
    dot_dtype = tl.float32 if _INTERPRETED else _TL_DTYPES[dtype]
    return {"BLOCK_M": min(64, max(16, triton.next_power_of_2(rows))), "BLOCK_N": 64, "BLOCK_K": 64,
            "USE_DOT": True, "DOT_DTYPE": dot_dtype, "PRECISION": "tf32", "num_warps": 8}


def _raw_block_product(
    x: torch.Tensor, data: torch.Tensor, fmt: str, bias: torch.Tensor | None, out: torch.Tensor, config: dict
) -> None:
    """out = x @ W.T (+ bias) for W a [N, K / block * block_bytes] matrix of
    `fmt`'s raw blocks; x [M, K] and out [M, N] dense in their rows."""
    block, block_bytes = RAW_BLOCK_FORMATS[fmt]
    rows, in_features = x.shape
    config = {name: value for name, value in config.items() if name != "BLOCK_K"} | {"K_STEP": config["BLOCK_K"]}
    grid = (triton.cdiv(rows, config["BLOCK_M"]), triton.cdiv(out.shape[1], config["BLOCK_N"]))
    _raw_block_matmul_kernel[grid](
        x, data, out if bias is None else bias, out,
        rows, out.shape[1], in_features, x.stride(0), out.stride(0),
        FORMAT=_RAW_FORMAT_CODES[fmt], BLOCK=block, BLOCK_BYTES=block_bytes, HAS_BIAS=bias is not None,
        **config,
    )


class TritonQuantLinear:
    """y = x @ W.T + bias with W block-quantized (engine.model.quant formats), on
    CUDA (or the CPU under TRITON_INTERPRET). x: float16, bfloat16 or float32
    [..., K]; y has x's dtype. The weight's tensors must be on x's device."""

    __slots__ = ("bias", "format", "in_features", "out_features", "weight")

    def __init__(self, weight: QuantizedTensor, bias: torch.Tensor | None = None) -> None:
        device = weight.data.device
        if not triton_quant_available(device):
            raise ValueError(f"TritonQuantLinear needs triton and a CUDA device (or TRITON_INTERPRET=1), not {device}")
        self.format = weight.format
        self.out_features, self.in_features = weight.shape
        # The kernel indexes rows densely; already-dense tensors are kept as they are.
        if weight.format in RAW_BLOCK_FORMATS:
            self.weight = weight if weight.data.is_contiguous() else QuantizedTensor(
                weight.format, weight.data.contiguous(), None
            )
        else:
            self.weight = QuantizedTensor(
                weight.format,
                weight.data.contiguous(),
                weight.scales.contiguous(),
                None if weight.mins is None else weight.mins.contiguous(),
            )
        self.bias = None if bias is None else bias.contiguous()

    @property
    def nbytes(self) -> int:
        return self.weight.nbytes

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"input has {x.shape[-1]} features, the weight takes {self.in_features}")
        if x.dtype not in _TL_DTYPES:
            raise ValueError(f"TritonQuantLinear takes float16, bfloat16 or float32 inputs, not {x.dtype}")
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        rows = x2.shape[0]
        out = x2.new_empty(rows, self.out_features)
        if rows == 0:
            return out.view(*lead, self.out_features)
        config = _launch_config(rows, x.dtype)
        if self.format in RAW_BLOCK_FORMATS:
            _raw_block_product(x2, self.weight.data, self.format, self.bias, out, config)
            return out.view(*lead, self.out_features)
        part_per_group = GROUP_SIZE if self.format == "q8_0" else GROUP_SIZE // 2
        part = config["BLOCK_K"] * part_per_group // GROUP_SIZE
        grid = (triton.cdiv(rows, config["BLOCK_M"]), triton.cdiv(self.out_features, config["BLOCK_N"]))
        w = self.weight
        # Absent mins / bias: any tensor will do, the constexprs keep it unread.
        _quant_matmul_kernel[grid](
            x2, w.data, w.scales, w.scales if w.mins is None else w.mins,
            out if self.bias is None else self.bias, out,
            rows, self.out_features, self.in_features, x2.stride(0), out.stride(0),
            FORMAT=_FORMAT_CODES[self.format], HAS_BIAS=self.bias is not None,
            PART=part, PART_PER_GROUP=part_per_group, **config,
        )
        return out.view(*lead, self.out_features)

    def tiled(self, x: torch.Tensor, rows: int) -> torch.Tensor:
        """As engine.model.linear.Linear.tiled: fixed-shape row tiles, so each row's
        result does not depend on the batch it arrives in. x: [M, K]."""
        return tiled_product(self, x, rows)
