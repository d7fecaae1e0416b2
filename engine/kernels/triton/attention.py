"""Triton kernels for attention over the paged KV cache: the CUDA path.

The cache layout is engine.model.attention's: one layer's K (or V) is
[num_pages * kv_heads, page_size, head_dim], row `page * kv_heads + h` holding
head h of one page. The kernels read keys and values through each sequence's
page table in place, so no step gathers a copy of any sequence's K/V.

- `write_kv`: one launch per layer stores the step's new K and V into their
  slots (page * page_size + offset); a negative slot is padding (a CUDA-graph
  batch padded to a captured size) and writes nothing.
- `decode_attention`: one query token per sequence, all sequences of the step
  in one launch whatever their lengths. One program serves one KV head of one
  sequence and all the query heads that share it (GQA), with an online
  softmax over blocks of keys. Long contexts split the keys over several
  programs (split-KV, "flash decoding") whose partial results a second small
  kernel merges by their log-sum-exp.
- `prefill_attention`: new prompt tokens of several sequences, each attending
  causally to its cached prefix and to itself; the step's own K/V are already
  in the pages (written by `write_kv` first), so prefix and new keys are one
  loop.

Sliding-window models pass `window` (0: none); a query at position p sees keys
in (p - window, p], as in engine.model.attention.

Scores and the softmax run in fp32; the products run in the cache's dtype
with fp32 accumulation, and fp32 caches use true fp32 products (no TF32), so a
fp32 engine on CUDA computes what the CPU path computes.

`TRITON_INTERPRET=1` runs every kernel on the CPU (tests/engine/test_triton_kernels.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# log2(e): the kernels use exp2, so the scale carries the change of base.
_LOG2E = 1.4426950408889634
LOG2E = tl.constexpr(_LOG2E)  # the same, readable inside the kernels


@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    NUM_KV: tl.constexpr, PAGE_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0)
    head = tl.program_id(1)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    dims = tl.arange(0, BLOCK_D)
    keep = dims < tl.where(slot >= 0, HEAD_DIM, 0)
    slot = tl.maximum(slot, 0)
    row = ((slot // PAGE_SIZE) * NUM_KV + head) * PAGE_SIZE + slot % PAGE_SIZE
    k = tl.load(k_ptr + token * stride_kt + head * stride_kh + dims, mask=keep)
    v = tl.load(v_ptr + token * stride_vt + head * stride_vh + dims, mask=keep)
    tl.store(k_cache_ptr + row * HEAD_DIM + dims, k, mask=keep)
    tl.store(v_cache_ptr + row * HEAD_DIM + dims, v, mask=keep)


@triton.jit
def _scaled_scores(scores, scale_log2, softcap, SOFTCAP: tl.constexpr):
    """Raw q.k scores -> the base-2 logits softmax takes: times the scale, or
    with SOFTCAP through softcap * tanh(scale * scores / softcap) first
    (Gemma 2). tanh(x) = 1 - 2 / (exp(2x) + 1): exact at both ends in fp32."""
    if SOFTCAP:
        x = scores * (scale_log2 / LOG2E) / softcap
        capped = softcap * (1.0 - 2.0 / (tl.exp2(x * (2.0 * LOG2E)) + 1.0))
        return capped * LOG2E
    return scores * scale_log2


# The page-table width changes from step to step: one compiled variant for all.
@triton.jit(do_not_specialize=["stride_table"])
def _decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, table_ptr, lens_ptr,
    out_ptr, part_out_ptr, part_lse_ptr,
    scale_log2, window, softcap,
    stride_qt, stride_qh, stride_ot, stride_table,
    NUM_KV: tl.constexpr, GROUP: tl.constexpr, BLOCK_H: tl.constexpr,
    PAGE_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
    DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr, SOFTCAP: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(lens_ptr + seq)
    lo = tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)
    # Each split takes a whole number of key blocks; trailing splits of a short
    # sequence are empty and only report "no keys" to the merge.
    per_split = tl.cdiv(tl.cdiv(seq_len - lo, NUM_SPLITS), BLOCK_N) * BLOCK_N
    split_lo = lo + split * per_split
    split_hi = tl.minimum(split_lo + per_split, seq_len)

    group = tl.arange(0, BLOCK_H)
    heads = kv_head * GROUP + group
    dims = tl.arange(0, BLOCK_D)
    head_ok = group < GROUP
    dim_ok = dims < HEAD_DIM
    q = tl.load(
        q_ptr + seq * stride_qt + heads[:, None] * stride_qh + dims[None, :],
        mask=head_ok[:, None] & dim_ok[None, :], other=0.0,
    ).to(DOT_DTYPE)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    offs = tl.arange(0, BLOCK_N)
    for start in range(split_lo, split_hi, BLOCK_N):
        key_pos = start + offs
        key_ok = key_pos < split_hi
        page = tl.load(
            table_ptr + seq * stride_table + key_pos // PAGE_SIZE, mask=key_ok, other=0
        )
        row = (page.to(tl.int64) * NUM_KV + kv_head) * PAGE_SIZE + key_pos % PAGE_SIZE
        kv_mask = key_ok[:, None] & dim_ok[None, :]
        offsets = row[:, None] * HEAD_DIM + dims[None, :]
        k = tl.load(k_cache_ptr + offsets, mask=kv_mask, other=0.0).to(DOT_DTYPE)
        v = tl.load(v_cache_ptr + offsets, mask=kv_mask, other=0.0).to(DOT_DTYPE)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        scores = _scaled_scores(scores, scale_log2, softcap, SOFTCAP)
        scores = tl.where(key_ok[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        # Every block holds at least one key, so m_new is finite: no -inf - -inf.
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v, input_precision=PRECISION)
        m_i = m_new

    # A sequence of length 0 (graph padding) or an empty split has l_i == 0.
    safe_l = tl.where(l_i > 0, l_i, 1.0)
    result = acc / safe_l[:, None]
    store_mask = head_ok[:, None] & dim_ok[None, :]
    if NUM_SPLITS == 1:
        tl.store(
            out_ptr + seq * stride_ot + heads[:, None] * HEAD_DIM + dims[None, :],
            result.to(out_ptr.dtype.element_ty), mask=store_mask,
        )
    else:
        # part_out: [seqs, q_heads, NUM_SPLITS, HEAD_DIM] fp32;
        # part_lse: [seqs, q_heads, NUM_SPLITS].
        q_heads = NUM_KV * GROUP
        part_row = (seq * q_heads + heads) * NUM_SPLITS + split
        tl.store(
            part_out_ptr + part_row[:, None] * HEAD_DIM + dims[None, :], result, mask=store_mask
        )
        lse = tl.where(l_i > 0, m_i + tl.log2(safe_l), float("-inf"))
        tl.store(part_lse_ptr + part_row, lse, mask=head_ok)


@triton.jit
def _merge_splits_kernel(
    part_out_ptr, part_lse_ptr, out_ptr, stride_ot,
    NUM_HEADS: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.arange(0, BLOCK_S)
    dims = tl.arange(0, BLOCK_D)
    split_ok = splits < NUM_SPLITS
    base = (seq * NUM_HEADS + head) * NUM_SPLITS
    lse = tl.load(part_lse_ptr + base + splits, mask=split_ok, other=float("-inf"))
    top = tl.max(lse, axis=0)
    top = tl.where(top == float("-inf"), 0.0, top)  # no keys at all: weights 0, output 0
    weight = tl.exp2(lse - top)
    total = tl.sum(weight, axis=0)
    parts = tl.load(
        part_out_ptr + (base + splits)[:, None] * HEAD_DIM + dims[None, :],
        mask=split_ok[:, None] & (dims < HEAD_DIM)[None, :], other=0.0,
    )
    merged = tl.sum(parts * weight[:, None], axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(
        out_ptr + seq * stride_ot + head * HEAD_DIM + dims,
        merged.to(out_ptr.dtype.element_ty), mask=dims < HEAD_DIM,
    )


# The page-table width changes from step to step: one compiled variant for all.
@triton.jit(do_not_specialize=["stride_table"])
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, table_ptr,
    query_start_ptr, query_len_ptr, context_len_ptr, out_ptr,
    scale_log2, window, softcap,
    stride_qt, stride_qh, stride_ot, stride_table,
    NUM_KV: tl.constexpr, GROUP: tl.constexpr,
    PAGE_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr, SOFTCAP: tl.constexpr,
):
    chunk = tl.program_id(0)
    block = tl.program_id(1)
    head = tl.program_id(2)
    query_len = tl.load(query_len_ptr + chunk)
    first = block * BLOCK_M
    if first >= query_len:  # the launch covers the longest chunk; shorter ones stop here
        return
    query_start = tl.load(query_start_ptr + chunk)
    context = tl.load(context_len_ptr + chunk)
    kv_head = head // GROUP

    rows = first + tl.arange(0, BLOCK_M)
    row_ok = rows < query_len
    query_pos = context + rows
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM
    q = tl.load(
        q_ptr + (query_start + rows)[:, None] * stride_qt + head * stride_qh + dims[None, :],
        mask=row_ok[:, None] & dim_ok[None, :], other=0.0,
    ).to(DOT_DTYPE)
    # Keys the block's queries can see: causal up to its last query, and from
    # its first query's window start.
    hi = tl.minimum(context + first + BLOCK_M, context + query_len)
    lo = tl.where(window > 0, tl.maximum(context + first - window + 1, 0), 0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    offs = tl.arange(0, BLOCK_N)
    for start in range(lo, hi, BLOCK_N):
        key_pos = start + offs
        key_ok = key_pos < hi
        page = tl.load(
            table_ptr + chunk * stride_table + key_pos // PAGE_SIZE, mask=key_ok, other=0
        )
        row = (page.to(tl.int64) * NUM_KV + kv_head) * PAGE_SIZE + key_pos % PAGE_SIZE
        kv_mask = key_ok[:, None] & dim_ok[None, :]
        offsets = row[:, None] * HEAD_DIM + dims[None, :]
        k = tl.load(k_cache_ptr + offsets, mask=kv_mask, other=0.0).to(DOT_DTYPE)
        v = tl.load(v_cache_ptr + offsets, mask=kv_mask, other=0.0).to(DOT_DTYPE)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        scores = _scaled_scores(scores, scale_log2, softcap, SOFTCAP)
        allowed = key_ok[None, :] & (key_pos[None, :] <= query_pos[:, None])
        allowed = allowed & ((window <= 0) | (key_pos[None, :] > query_pos[:, None] - window))
        scores = tl.where(allowed, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        # With a window, a row may see no key of this block yet: keep its
        # reference point finite so exp2 gives 0 rather than NaN.
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_ref)
        p = tl.exp2(scores - m_ref[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v, input_precision=PRECISION)
        m_i = m_new

    result = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(
        out_ptr + (query_start + rows)[:, None] * stride_ot + head * HEAD_DIM + dims[None, :],
        result.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :],
    )


# Decided when the kernels were decorated, which is what counts: the
# environment variable may change afterwards.
_INTERPRETED = not isinstance(_decode_kernel, triton.runtime.JITFunction)
_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def _dot_dtype(dtype: torch.dtype) -> tl.dtype:
    # Triton 3.9's interpreter multiplies bf16 operands as their raw uint16
    # bits, so under TRITON_INTERPRET the products are taken in fp32 (loads,
    # stores and the softmax still run in the cache's dtype). On a GPU the
    # products use the cache's dtype: tensor cores, fp32 accumulation.
    if _INTERPRETED:
        return tl.float32
    return _TL_DTYPES[dtype]


def _precision(dtype: torch.dtype) -> str:
    # TF32 would change fp32 results in the 4th digit; 16-bit inputs ignore this.
    return "ieee" if dtype == torch.float32 else "tf32"


def _block_d(head_dim: int) -> int:
    return max(16, triton.next_power_of_2(head_dim))


def _check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    if k_cache.dim() != 3 or k_cache.shape != v_cache.shape:
        raise ValueError("k_cache and v_cache must both be [pages * kv_heads, page_size, head_dim]")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("the KV cache layer must be contiguous")


def _rows_contiguous(x: torch.Tensor) -> torch.Tensor:
    # The kernels take token and head strides; the last dim must be dense.
    return x if x.stride(-1) == 1 else x.contiguous()


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    num_kv_heads: int,
) -> None:
    """Store k, v [T, kv_heads, D] at `slots` [T] (page * page_size + offset; < 0 skips)."""
    _check_cache(k_cache, v_cache)
    num_tokens = k.shape[0]
    if num_tokens == 0:
        return
    k, v = _rows_contiguous(k), _rows_contiguous(v)
    head_dim = k_cache.shape[-1]
    _write_kv_kernel[(num_tokens, num_kv_heads)](
        k, v, k_cache, v_cache, slots,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        NUM_KV=num_kv_heads, PAGE_SIZE=k_cache.shape[1],
        HEAD_DIM=head_dim, BLOCK_D=_block_d(head_dim),
    )


def num_kv_splits(
    batch: int, num_kv_heads: int, max_keys: int, num_sms: int, block_n: int = 64
) -> int:
    """How many programs share one sequence's keys in `decode_attention`.

    Enough programs to fill the GPU about twice over, never a split shorter
    than four key blocks (the merge would cost more than it saves), at most 16.
    A CUDA graph fixes this per captured batch size from the longest context
    it may see; shorter sequences then leave trailing splits empty, which cost
    one early exit each.
    """
    if batch < 1 or num_kv_heads < 1:
        raise ValueError("batch and num_kv_heads must be positive")
    programs = batch * num_kv_heads
    wanted = -(-2 * max(1, num_sms) // programs)
    longest = max(1, -(-max_keys // (4 * block_n)))
    return max(1, min(wanted, longest, 16))


def _decode_block_n(dtype: torch.dtype) -> int:
    return 32 if dtype == torch.float32 else 64


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    num_kv_heads: int,
    window: int = 0,
    num_splits: int = 1,
    softcap: float | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of one new token per sequence over its pages.

    q: [B, Hq, D]; k_cache, v_cache: one layer, [pages * Hkv, page_size, D];
    block_table: [B, >= max pages] int32 page ids; seq_lens: [B] int32 keys
    per sequence (its new token's included, already written; 0 for padding,
    whose output is zeros). Returns (or fills `out`, rows [:B]) [B, Hq * D].
    """
    _check_cache(k_cache, v_cache)
    batch, num_heads, head_dim = q.shape
    num_kv = num_kv_heads
    if out is None:
        out = torch.empty((batch, num_heads * head_dim), dtype=q.dtype, device=q.device)
    if batch == 0:
        return out
    q = _rows_contiguous(q)
    group = num_heads // num_kv
    block_d = _block_d(head_dim)
    if num_splits > 1:
        part_out = torch.empty(
            (batch, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device
        )
        part_lse = torch.empty((batch, num_heads, num_splits), dtype=torch.float32, device=q.device)
    else:
        part_out = part_lse = out  # unused by the kernel
    _decode_kernel[(batch, num_kv, num_splits)](
        q, k_cache, v_cache, block_table, seq_lens, out, part_out, part_lse,
        scale * _LOG2E, window, softcap or 1.0,
        q.stride(0), q.stride(1), out.stride(0), block_table.stride(0),
        NUM_KV=num_kv, GROUP=group, BLOCK_H=max(16, triton.next_power_of_2(group)),
        PAGE_SIZE=k_cache.shape[1], HEAD_DIM=head_dim, BLOCK_D=block_d,
        BLOCK_N=_decode_block_n(k_cache.dtype), NUM_SPLITS=num_splits,
        DOT_DTYPE=_dot_dtype(k_cache.dtype), PRECISION=_precision(k_cache.dtype),
        SOFTCAP=softcap is not None,
    )
    if num_splits > 1:
        _merge_splits_kernel[(batch, num_heads)](
            part_out, part_lse, out, out.stride(0),
            NUM_HEADS=num_heads, NUM_SPLITS=num_splits,
            BLOCK_S=triton.next_power_of_2(num_splits), HEAD_DIM=head_dim, BLOCK_D=block_d,
        )
    return out


def prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    query_start: torch.Tensor,
    query_len: torch.Tensor,
    context_len: torch.Tensor,
    max_query_len: int,
    scale: float,
    *,
    num_kv_heads: int,
    window: int = 0,
    softcap: float | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of prompt chunks over their cached prefix and themselves.

    q: [T, Hq, D] (the step's flat batch; only the chunks' rows are read);
    chunk i's queries are rows query_start[i] .. + query_len[i], at positions
    context_len[i] onwards, and its keys (context_len[i] + query_len[i] of
    them, the new ones already written) are in the pages of block_table[i].
    Fills those rows of `out` [T, Hq * D] and returns it.
    """
    _check_cache(k_cache, v_cache)
    num_tokens, num_heads, head_dim = q.shape
    if out is None:
        out = torch.empty((num_tokens, num_heads * head_dim), dtype=q.dtype, device=q.device)
    num_chunks = block_table.shape[0]
    if num_chunks == 0 or max_query_len == 0:
        return out
    q = _rows_contiguous(q)
    block = 32 if k_cache.dtype == torch.float32 else 64
    grid = (num_chunks, triton.cdiv(max_query_len, block), num_heads)
    _prefill_kernel[grid](
        q, k_cache, v_cache, block_table, query_start, query_len, context_len, out,
        scale * _LOG2E, window, softcap or 1.0,
        q.stride(0), q.stride(1), out.stride(0), block_table.stride(0),
        NUM_KV=num_kv_heads, GROUP=num_heads // num_kv_heads,
        PAGE_SIZE=k_cache.shape[1], HEAD_DIM=head_dim, BLOCK_D=_block_d(head_dim),
        BLOCK_M=block, BLOCK_N=block,
        DOT_DTYPE=_dot_dtype(k_cache.dtype), PRECISION=_precision(k_cache.dtype),
        SOFTCAP=softcap is not None,
    )
    return out
