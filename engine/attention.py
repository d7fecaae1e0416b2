"""Attention over a paged KV cache for a flattened batch of many sequences.

K and V are each one tensor [num_layers, num_pages * kv_heads, page_size,
head_dim]: row `page * kv_heads + h` of a layer holds head h of one page.
That head-major page layout means a gather of rows comes out already shaped
[sequence, head, keys, head_dim], ready for batched matmuls with no
transposing copies (the layout vLLM's paged kernels use for the same reason).

A step's tokens are laid out decode tokens first (one per running sequence),
then the prefill chunks of other sequences, each contiguous. The runner
builds every index once per step; all layers share them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(slots=True)
class PrefillChunk:
    """One sequence's run of new prompt tokens inside the step's flat batch."""

    token_start: int  # index of the chunk's first token in the flat batch
    num_tokens: int
    num_keys: int  # keys the chunk attends to: earlier tokens plus itself
    # [kv_heads * pages] rows holding those keys, or None when the chunk starts
    # at position 0, so its keys are exactly the ones computed in this step.
    key_rows: torch.Tensor | None
    # [num_tokens, num_keys] True where attention is allowed, or None when the
    # plain causal mask applies.
    mask: torch.Tensor | None


@dataclass(slots=True)
class AttentionMetadata:
    # [T * kv_heads] row (in a layer's [rows * page_size, head_dim] view) that
    # each new token's K/V head is written to.
    write_index: torch.Tensor
    num_decode: int  # the first num_decode tokens are single-token decodes
    # [num_decode * kv_heads * max_pages] page rows of every decoding sequence
    # (padded with row 0), ordered sequence, head, page.
    decode_rows: torch.Tensor | None
    # [num_decode * kv_heads, group, max_pages * page_size]: 0 where a key
    # exists, -inf for padding; added to the scores by the same matmul.
    decode_bias: torch.Tensor | None
    prefills: list[PrefillChunk]


class KVCache:
    """The device memory behind the page pool: K and V for every layer."""

    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (num_layers, num_pages * num_kv_heads, page_size, head_dim)
        self.num_pages = num_pages
        self.page_size = page_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)


def paged_attention(
    layer: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache: KVCache,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """q: [T, Hq, D]; k, v: [T, Hkv, D] for this step's tokens. Returns [T, Hq*D]."""
    num_tokens, num_heads, head_dim = q.shape
    k_layer = cache.k[layer]
    v_layer = cache.v[layer]
    k_layer.view(-1, head_dim).index_copy_(0, meta.write_index, k.reshape(-1, head_dim))
    v_layer.view(-1, head_dim).index_copy_(0, meta.write_index, v.reshape(-1, head_dim))

    # The common steps hold only decodes, or one prefill: no output buffer to fill.
    if meta.num_decode == num_tokens:
        return _decode_attention(q, k_layer, v_layer, meta, scale)
    if not meta.num_decode and len(meta.prefills) == 1:
        return _prefill_attention(q, k, v, k_layer, v_layer, meta.prefills[0], scale)
    out = torch.empty((num_tokens, num_heads * head_dim), dtype=q.dtype, device=q.device)
    if meta.num_decode:
        out[: meta.num_decode] = _decode_attention(
            q[: meta.num_decode], k_layer, v_layer, meta, scale
        )
    for chunk in meta.prefills:
        rows = slice(chunk.token_start, chunk.token_start + chunk.num_tokens)
        out[rows] = _prefill_attention(q[rows], k[rows], v[rows], k_layer, v_layer, chunk, scale)
    return out


def _decode_attention(
    q: torch.Tensor,
    k_layer: torch.Tensor,
    v_layer: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    # One query per sequence: padded batched matmuls over whole gathered
    # pages. On the CPU this beats the generic SDPA kernel, whose per-call
    # overhead dominates at q_len 1. Each KV head's query group is one
    # [group, D] x [D, keys] product, so GQA needs no repeated K/V.
    assert meta.decode_rows is not None and meta.decode_bias is not None
    batch, num_heads, head_dim = q.shape
    batch_heads, group, max_keys = meta.decode_bias.shape
    keys = k_layer.index_select(0, meta.decode_rows).view(batch_heads, max_keys, head_dim)
    values = v_layer.index_select(0, meta.decode_rows).view(batch_heads, max_keys, head_dim)
    queries = q.reshape(batch_heads, group, head_dim)
    scores = torch.baddbmm(meta.decode_bias, queries, keys.transpose(1, 2), alpha=scale)
    probs = torch.softmax(scores, dim=-1)
    return torch.bmm(probs, values).view(batch, num_heads * head_dim)


def _prefill_attention(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_layer: torch.Tensor,
    v_layer: torch.Tensor,
    chunk: PrefillChunk,
    scale: float,
) -> torch.Tensor:
    num_tokens, num_heads, head_dim = q.shape
    if chunk.key_rows is None:
        keys, values = k_new.transpose(0, 1), v_new.transpose(0, 1)
    else:
        num_kv = k_new.shape[1]
        keys = k_layer.index_select(0, chunk.key_rows).view(num_kv, -1, head_dim)
        values = v_layer.index_select(0, chunk.key_rows).view(num_kv, -1, head_dim)
        keys, values = keys[:, : chunk.num_keys], values[:, : chunk.num_keys]
    attn = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0),
        keys.unsqueeze(0),
        values.unsqueeze(0),
        attn_mask=None if chunk.mask is None else chunk.mask.unsqueeze(0).unsqueeze(0),
        is_causal=chunk.mask is None,
        scale=scale,
        enable_gqa=True,
    )  # [1, Hq, T, D]
    return attn.squeeze(0).transpose(0, 1).reshape(num_tokens, num_heads * head_dim)
