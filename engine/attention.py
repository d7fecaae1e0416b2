"""Attention over a paged KV cache for a flattened batch of many sequences.

The KV cache is one tensor per K and V of shape
[num_layers, num_pages * page_size, kv_heads, head_dim]: a "slot" is one
token position of one page (slot = page * page_size + offset). A step's
tokens are laid out decode tokens first (one per running sequence), then the
prefill chunks of other sequences, each contiguous. Every token carries the
slot its K/V is written to; every sequence carries the slots of all keys it
may attend to (its page table expanded to token granularity), built once per
step by the runner and shared by every layer.
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
    # Slots of every key the chunk attends to: the sequence's earlier tokens
    # and the chunk itself, in position order. None when the chunk starts at
    # position 0, so its keys are exactly the ones computed in this step.
    key_slots: torch.Tensor | None
    # [num_tokens, num_keys] True where attention is allowed, or None when the
    # plain causal mask applies.
    mask: torch.Tensor | None


@dataclass(slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] slot each token's K/V is written to
    num_decode: int  # the first num_decode tokens are single-token decodes
    # [num_decode, max_pages]: page table of each decoding sequence, padded.
    # Keys are gathered a whole page at a time (one contiguous copy per
    # page, not per token); the bias masks the padding and the unused tail.
    decode_page_table: torch.Tensor | None
    decode_bias: torch.Tensor | None  # [num_decode, 1, 1, max_pages * page_size], 0 or -inf
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
        shape = (num_layers, num_pages * page_size, num_kv_heads, head_dim)
        self.num_pages = num_pages
        self.page_size = page_size
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @staticmethod
    def bytes_per_page(
        num_layers: int, page_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        element = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * page_size * num_kv_heads * head_dim * element


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
    k_layer = cache.k[layer]
    v_layer = cache.v[layer]
    k_layer.index_copy_(0, meta.slot_mapping, k)
    v_layer.index_copy_(0, meta.slot_mapping, v)

    num_tokens, num_heads, head_dim = q.shape
    num_kv = k.shape[1]
    out = torch.empty((num_tokens, num_heads * head_dim), dtype=q.dtype, device=q.device)
    if meta.num_decode:
        out[: meta.num_decode] = _decode_attention(
            q[: meta.num_decode], k_layer, v_layer, meta, num_kv, cache.page_size, scale
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
    num_kv: int,
    page_size: int,
    scale: float,
) -> torch.Tensor:
    # One query per sequence: a padded batched matmul over the gathered keys.
    # On the CPU this beats the generic SDPA kernel, whose per-call overhead
    # dominates at q_len 1; grouped query heads share their K/V via the view.
    assert meta.decode_page_table is not None and meta.decode_bias is not None
    batch = meta.decode_page_table.shape[0]
    num_heads, head_dim = q.shape[1], q.shape[2]
    group = num_heads // num_kv
    max_keys = meta.decode_bias.shape[-1]
    flat = meta.decode_page_table.reshape(-1)
    paged_shape = (-1, page_size, num_kv, head_dim)
    keys = k_layer.view(paged_shape).index_select(0, flat).view(batch, max_keys, num_kv, head_dim)
    values = v_layer.view(paged_shape).index_select(0, flat).view(batch, max_keys, num_kv, head_dim)
    qg = q.view(batch, num_kv, group, head_dim)
    scores = torch.matmul(qg, keys.permute(0, 2, 3, 1)).float()  # [B, Hkv, G, L]
    scores.mul_(scale).add_(meta.decode_bias)
    probs = torch.softmax(scores, dim=-1).to(q.dtype)
    ctx = torch.matmul(probs, values.transpose(1, 2))  # [B, Hkv, G, D]
    return ctx.reshape(batch, num_heads * head_dim)


def _prefill_attention(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_layer: torch.Tensor,
    v_layer: torch.Tensor,
    chunk: PrefillChunk,
    scale: float,
) -> torch.Tensor:
    if chunk.key_slots is None:
        keys, values = k_new, v_new
    else:
        keys = k_layer.index_select(0, chunk.key_slots)
        values = v_layer.index_select(0, chunk.key_slots)
    num_tokens, num_heads, head_dim = q.shape
    attn = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0),
        keys.transpose(0, 1).unsqueeze(0),
        values.transpose(0, 1).unsqueeze(0),
        attn_mask=None if chunk.mask is None else chunk.mask.unsqueeze(0).unsqueeze(0),
        is_causal=chunk.mask is None,
        scale=scale,
        enable_gqa=True,
    )  # [1, Hq, T, D]
    return attn.squeeze(0).transpose(0, 1).reshape(num_tokens, num_heads * head_dim)
