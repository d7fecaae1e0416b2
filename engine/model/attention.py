"""Attention over a paged KV cache for a flattened batch of many sequences.

K and V are each one tensor [num_layers, num_pages * kv_heads, page_size,
head_dim]: row `page * kv_heads + h` of a layer holds head h of one page.
That head-major page layout means a gather of rows comes out already shaped
[sequence, head, keys, head_dim], ready for batched matmuls with no
transposing copies (the layout vLLM's paged kernels use for the same reason).

A step's tokens are laid out decode tokens first (one per running sequence),
then the prefill chunks of other sequences, each contiguous. The runner
builds every index once per step; all layers share them.

Batch-invariant mode (`AttentionMetadata.batch_invariant`, the engine's
deterministic mode) takes one path for every query, decode or prefill: the
queries of a KV head are laid out as rows (token, group member), cut into
tiles of QUERY_TILE rows (zero-padded), and each tile does
    scores = tile @ keys^T; scores *= scale; scores += bias; softmax
    out = sum over key blocks j, in order, of probs[:, block j] @ values[block j]
against its sequence's keys read back from the pages, padded to whole
KEY_BLOCKs, the ones a row may not see masked with -inf. Every product has a
fixed shape, so the kernel and its reduction order never depend on the batch
(measured with the CPU's bmm: 1, 2-3 and 4+ rows give other bits, and so does
a reduction over 272 keys against the same one padded to 512). A masked key
gets a weight of exactly zero, so a row's extra blocks add exact zeros. The
score products reduce over head_dim only, and softmax reduces a row in one
thread in one vectorized order, so neither depends on the padding (both
checked through the whole model by tests/engine/test_deterministic.py). A
prefill token, a decode token and a recomputed token attend identically.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from engine.runner.cuda_attention import KernelAttentionMetadata, kernel_paged_attention

if TYPE_CHECKING:
    from engine.model.kv_cache import KVCache

# Query rows per attention product in batch-invariant mode: a decode's GQA
# group (3 for SmolLM2) padded to 16, a prefill chunk's rows in 16s.
QUERY_TILE = 16
# Keys per block of the probs @ values reduction in batch-invariant mode.
KEY_BLOCK = 128
# Bound on the keys copied per batched product when a long prefill chunk's
# tiles share their sequence's keys (elements: 32 MiB of fp32).
_TILE_KEY_ELEMENTS = 8 << 20


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
    # Batch-invariant mode only: [tiles * QUERY_TILE, keys padded to whole
    # KEY_BLOCKs], 0 where the query row (token, group member) may see the
    # key, else -inf; key_rows then always holds the chunk's whole pages.
    tile_bias: torch.Tensor | None = None


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
    # In batch-invariant mode: QUERY_TILE rows instead of group (padding rows
    # see every key; their results are dropped), keys padded to whole KEY_BLOCKs.
    decode_bias: torch.Tensor | None
    prefills: list[PrefillChunk]
    batch_invariant: bool = False
    # The step runs on the native CPU path (DecoderModel._forward_native),
    # where every token attends through engine/kernels/native/paged_attention.c:
    # page_table [sequences, max_pages] holds each chunk's page ids (padded
    # with 0) and row_table [tokens] the line of each token's sequence.
    native: bool = False
    page_table: torch.Tensor | None = None
    row_table: torch.Tensor | None = None
    # For a model whose layers differ in window (Gemma 2 and 3): the masks of
    # the sliding layers (the same tokens, rows and write indices); this
    # metadata's own masks are the global layers'.
    sliding: AttentionMetadata | None = None

def paged_attention(
    layer: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache: KVCache,
    meta: AttentionMetadata,
    scale: float,
    softcap: float | None = None,
) -> torch.Tensor:
    """q: [T, Hq, D]; k, v: [T, Hkv, D] for this step's tokens. Returns [T, Hq*D].

    softcap: scores become softcap * tanh(scores / softcap) before the mask
    and softmax (Gemma 2)."""
    if isinstance(meta, KernelAttentionMetadata):
        # CUDA with triton: kernels read K/V through the page tables in place
        # (engine/runner/cuda_attention.py, built by engine/runner/cuda.py).
        return kernel_paged_attention(layer, q, k, v, cache, meta, scale, softcap)
    num_tokens, num_heads, head_dim = q.shape
    k_layer = cache.k[layer]
    v_layer = cache.v[layer]
    k_layer.view(-1, head_dim).index_copy_(0, meta.write_index, k.reshape(-1, head_dim))
    v_layer.view(-1, head_dim).index_copy_(0, meta.write_index, v.reshape(-1, head_dim))

    if meta.batch_invariant:
        return _batch_invariant_attention(q, k.shape[1], k_layer, v_layer, meta, scale, softcap)
    # The common steps hold only decodes, or one prefill: no output buffer to fill.
    if meta.num_decode == num_tokens:
        return _decode_attention(q, k_layer, v_layer, meta, scale, softcap)
    if not meta.num_decode and len(meta.prefills) == 1:
        return prefill_attention(q, k, v, k_layer, v_layer, meta.prefills[0], scale, softcap)
    out = torch.empty((num_tokens, num_heads * head_dim), dtype=q.dtype, device=q.device)
    if meta.num_decode:
        out[: meta.num_decode] = _decode_attention(
            q[: meta.num_decode], k_layer, v_layer, meta, scale, softcap
        )
    for chunk in meta.prefills:
        rows = slice(chunk.token_start, chunk.token_start + chunk.num_tokens)
        out[rows] = prefill_attention(q[rows], k[rows], v[rows], k_layer, v_layer, chunk, scale, softcap)
    return out


def _capped(scores: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """Scores through the soft-cap, in place."""
    if softcap is None:
        return scores
    return scores.div_(softcap).tanh_().mul_(softcap)


def _decode_attention(
    q: torch.Tensor,
    k_layer: torch.Tensor,
    v_layer: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    softcap: float | None = None,
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
    if softcap is None:
        scores = torch.baddbmm(meta.decode_bias, queries, keys.transpose(1, 2), alpha=scale)
    else:
        scores = _capped(torch.bmm(queries, keys.transpose(1, 2)).mul_(scale), softcap).add_(meta.decode_bias)
    probs = torch.softmax(scores, dim=-1)
    return torch.bmm(probs, values).view(batch, num_heads * head_dim)


def prefill_attention(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_layer: torch.Tensor,
    v_layer: torch.Tensor,
    chunk: PrefillChunk,
    scale: float,
    softcap: float | None = None,
) -> torch.Tensor:
    num_tokens, num_heads, head_dim = q.shape
    if chunk.key_rows is None:
        keys, values = k_new.transpose(0, 1), v_new.transpose(0, 1)
    else:
        num_kv = k_new.shape[1]
        keys = k_layer.index_select(0, chunk.key_rows).view(num_kv, -1, head_dim)
        values = v_layer.index_select(0, chunk.key_rows).view(num_kv, -1, head_dim)
        keys, values = keys[:, : chunk.num_keys], values[:, : chunk.num_keys]
    if softcap is not None:
        return _capped_prefill(q, keys, values, chunk, scale, softcap)
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


def _capped_prefill(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, chunk: PrefillChunk, scale: float, softcap: float
) -> torch.Tensor:
    """A prefill chunk's attention with soft-capped scores, which SDPA
    cannot apply: the scores as one product per KV head's query group."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv, num_keys = keys.shape[0], keys.shape[1]
    group = num_heads // num_kv
    # [kv, group * tokens, D]: query head kv * group + g.
    queries = q.transpose(0, 1).reshape(num_kv, group * num_tokens, head_dim)
    scores = _capped(torch.bmm(queries, keys.transpose(1, 2)).mul_(scale), softcap)
    scores = scores.view(num_kv, group, num_tokens, num_keys)
    if chunk.mask is None:
        allowed = torch.ones(num_tokens, num_keys, dtype=torch.bool, device=q.device).tril(num_keys - num_tokens)
    else:
        allowed = chunk.mask
    scores.masked_fill_(~allowed, float("-inf"))
    probs = torch.softmax(scores.view(num_kv, group * num_tokens, num_keys), dim=-1)
    out = torch.bmm(probs, values).view(num_heads, num_tokens, head_dim)
    return out.transpose(0, 1).reshape(num_tokens, num_heads * head_dim)


def _batch_invariant_attention(
    q: torch.Tensor,
    num_kv: int,
    k_layer: torch.Tensor,
    v_layer: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    softcap: float | None = None,
) -> torch.Tensor:
    num_tokens, num_heads, head_dim = q.shape
    out = torch.empty((num_tokens, num_heads * head_dim), dtype=q.dtype, device=q.device)
    if meta.num_decode:
        assert meta.decode_rows is not None and meta.decode_bias is not None
        batch_heads, tile, max_keys = meta.decode_bias.shape
        group = num_heads // num_kv
        keys = _padded_keys(k_layer, meta.decode_rows, batch_heads, max_keys)
        values = _padded_keys(v_layer, meta.decode_rows, batch_heads, max_keys)
        queries = q[: meta.num_decode].reshape(batch_heads, group, head_dim)
        queries = F.pad(queries, (0, 0, 0, tile - group))
        attn = _tile_attention(queries, keys, values, meta.decode_bias, scale, softcap)
        out[: meta.num_decode] = attn[:, :group].reshape(meta.num_decode, num_heads * head_dim)
    for chunk in meta.prefills:
        rows = slice(chunk.token_start, chunk.token_start + chunk.num_tokens)
        out[rows] = _tiled_prefill_attention(q[rows], num_kv, k_layer, v_layer, chunk, scale, softcap)
    return out


def _tiled_prefill_attention(
    q: torch.Tensor,
    num_kv: int,
    k_layer: torch.Tensor,
    v_layer: torch.Tensor,
    chunk: PrefillChunk,
    scale: float,
    softcap: float | None = None,
) -> torch.Tensor:
    assert chunk.key_rows is not None and chunk.tile_bias is not None
    num_tokens, num_heads, head_dim = q.shape
    padded_rows, num_keys = chunk.tile_bias.shape
    group = num_heads // num_kv
    keys = _padded_keys(k_layer, chunk.key_rows, num_kv, num_keys)
    values = _padded_keys(v_layer, chunk.key_rows, num_kv, num_keys)
    # [kv, token * group, D]: row (token, g) of head kv is query head kv * group + g.
    rows = q.view(num_tokens, num_kv, group, head_dim).transpose(0, 1)
    rows = rows.reshape(num_kv, num_tokens * group, head_dim)
    rows = F.pad(rows, (0, 0, 0, padded_rows - num_tokens * group))
    tiles = padded_rows // QUERY_TILE
    rows = rows.view(num_kv, tiles, QUERY_TILE, head_dim)
    bias = chunk.tile_bias.view(tiles, QUERY_TILE, num_keys)
    out = torch.empty_like(rows)
    # The tiles of a chunk share its sequence's keys, which a batched product
    # over (head, tile) needs repeated per tile: take as many tiles at a time
    # as the copy budget allows.
    step = max(1, _TILE_KEY_ELEMENTS // (num_kv * num_keys * head_dim))
    for first in range(0, tiles, step):
        n = min(step, tiles - first)
        shape = (num_kv, n, num_keys, head_dim)
        out[:, first : first + n] = _tile_attention(
            rows[:, first : first + n].reshape(num_kv * n, QUERY_TILE, head_dim),
            keys.unsqueeze(1).expand(shape).reshape(num_kv * n, num_keys, head_dim),
            values.unsqueeze(1).expand(shape).reshape(num_kv * n, num_keys, head_dim),
            bias[first : first + n]
            .unsqueeze(0)
            .expand(num_kv, n, QUERY_TILE, num_keys)
            .reshape(num_kv * n, QUERY_TILE, num_keys),
            scale,
            softcap,
        ).view(num_kv, n, QUERY_TILE, head_dim)
    out = out.view(num_kv, padded_rows, head_dim)[:, : num_tokens * group]
    out = out.reshape(num_kv, num_tokens, group, head_dim).transpose(0, 1)
    return out.reshape(num_tokens, num_heads * head_dim)


def _tile_attention(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    bias: torch.Tensor,
    scale: float,
    softcap: float | None = None,
) -> torch.Tensor:
    """[N, QUERY_TILE, D] queries against [N, keys, D]: the one sequence of
    ops every query goes through in batch-invariant mode."""
    scores = torch.bmm(queries, keys.transpose(1, 2))
    _capped(scores.mul_(scale), softcap).add_(bias)
    probs = torch.softmax(scores, dim=-1)
    # Contiguous blocks: the same shape and the same strides in every call.
    out = torch.bmm(probs[:, :, :KEY_BLOCK].contiguous(), values[:, :KEY_BLOCK])
    for start in range(KEY_BLOCK, keys.shape[1], KEY_BLOCK):
        block = slice(start, start + KEY_BLOCK)
        out += torch.bmm(probs[:, :, block].contiguous(), values[:, block])
    return out


def _padded_keys(
    layer: torch.Tensor, rows: torch.Tensor, batch: int, num_keys: int
) -> torch.Tensor:
    """[batch, num_keys, D] gathered from the page rows, zero-padded at the
    end up to num_keys (a whole number of KEY_BLOCKs)."""
    head_dim = layer.shape[-1]
    gathered = layer.index_select(0, rows).view(batch, -1, head_dim)
    return F.pad(gathered, (0, 0, 0, num_keys - gathered.shape[1]))
