"""Paged attention through the Triton kernels, behind engine.model.attention's interface.

`engine.model.attention.paged_attention` hands a layer here when the step's metadata
is a `KernelAttentionMetadata` (built by engine.runner.cuda on CUDA). The
step's flat batch is the same as the CPU path's: decode tokens first, then the
prefill chunks, each contiguous. Instead of gather indices and masks, the
kernels get page tables and lengths and read K/V in place.

This module imports triton only when a layer runs, so the CPU path never pays
for it (or needs it installed).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class KernelAttentionMetadata:
    # [T] int32 slot (page * page_size + offset) each token's K/V goes to; -1 for padding.
    slots: torch.Tensor
    num_decode: int  # the first num_decode tokens are single-token decodes
    # [num_decode, >= pages of the longest] int32 page ids of every decoding sequence.
    decode_block_table: torch.Tensor | None
    decode_seq_lens: torch.Tensor | None  # [num_decode] int32 keys, the new token's included
    num_splits: int  # decode split-KV factor (engine.kernels.triton.attention.num_kv_splits)
    # One entry per prefill chunk, in flat-batch order.
    prefill_block_table: torch.Tensor | None  # [chunks, >= pages] int32
    prefill_query_start: torch.Tensor | None  # [chunks] int32 first row in the flat batch
    prefill_query_len: torch.Tensor | None  # [chunks] int32 new tokens
    prefill_context_len: torch.Tensor | None  # [chunks] int32 tokens before the chunk
    max_prefill_len: int
    window: int  # sliding window in tokens, 0 for none
    num_kv_heads: int
    # The sliding layers' metadata where layers differ in window (Gemma 2
    # and 3): the same tensors, another window.
    sliding: KernelAttentionMetadata | None = None


def kernel_paged_attention(
    layer: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache,  # engine.model.kv_cache.KVCache
    meta: KernelAttentionMetadata,
    scale: float,
    softcap: float | None = None,
) -> torch.Tensor:
    """q: [T, Hq, D]; k, v: [T, Hkv, D]. Returns [T, Hq*D], like engine.model.attention."""
    from engine.kernels.triton import attention as kernels

    num_tokens, num_heads, head_dim = q.shape
    k_layer = cache.k[layer]
    v_layer = cache.v[layer]
    kernels.write_kv(k, v, k_layer, v_layer, meta.slots, meta.num_kv_heads)
    out = torch.empty((num_tokens, num_heads * head_dim), dtype=q.dtype, device=q.device)
    if meta.num_decode:
        assert meta.decode_block_table is not None and meta.decode_seq_lens is not None
        kernels.decode_attention(
            q[: meta.num_decode], k_layer, v_layer,
            meta.decode_block_table, meta.decode_seq_lens, scale,
            num_kv_heads=meta.num_kv_heads, window=meta.window,
            num_splits=meta.num_splits, softcap=softcap, out=out,
        )
    if meta.prefill_block_table is not None:
        assert meta.prefill_query_start is not None
        assert meta.prefill_query_len is not None and meta.prefill_context_len is not None
        kernels.prefill_attention(
            q, k_layer, v_layer, meta.prefill_block_table,
            meta.prefill_query_start, meta.prefill_query_len, meta.prefill_context_len,
            meta.max_prefill_len, scale,
            num_kv_heads=meta.num_kv_heads, window=meta.window, softcap=softcap, out=out,
        )
    return out
