"""The Llama-family decoder, run over a flattened batch of tokens.

Weights are plain tensors (no nn.Module tree): q/k/v and gate/up are fused
into one matrix each at load time, so a layer is four matmuls. Every token of
the step carries its own position; attention goes through the paged KV cache
(see engine.model.attention), so one forward serves any mix of sequences, prefill
chunks and decodes.

With `batch_invariant` set (the engine's deterministic mode) every weight
product runs on fixed row tiles (engine.model.linear) and attention takes its
batch-invariant path (engine.model.attention), so a token's hidden state does not
depend on what else the step holds. Everything else here already computes
each row on its own: embedding, RoPE and the elementwise ops trivially, and
RMSNorm reduces one row serially (a row of hidden_size is far below the size
at which ATen splits a reduction over threads).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.kernels import native
from engine.model.attention import AttentionMetadata, paged_attention
from engine.model.kv_cache import KVCache
from engine.model.config import ModelConfig, rope_inverse_frequencies
from engine.model.linear import Linear
from engine.runner.memory import activation_dtype
from engine.model.quant import ConcatLinear, QuantizedTensor, QuantLinear, take_rows

# Anything with __call__(x) and tiled(x, rows): engine.model.linear.Linear, or the
# weight-only quantized layers of engine.model.quant.
Product = Linear | QuantLinear | ConcatLinear

# Rows per weight-product tile in batch-invariant mode. 16 covers a typical
# decode batch in one tile (so B=16 pays nothing); a single sequence pays for
# 16 rows (see docs/benchmarks.md for the measured cost).
ROW_TILE = 16


@dataclass(slots=True)
class LayerWeights:
    input_norm: torch.Tensor
    qkv: Product  # [(Hq + 2*Hkv) * D, hidden]
    o: Product
    post_norm: torch.Tensor
    gate_up: Product  # [2 * intermediate, hidden]
    down: Product


class LlamaModel:
    def __init__(
        self,
        config: ModelConfig,
        embed: torch.Tensor | QuantizedTensor,
        layers: list[LayerWeights],
        norm: torch.Tensor,
        lm_head: Product,
        *,
        dtype: torch.dtype | None = None,
    ) -> None:
        self.config = config
        # A quantized embedding table (as llama.cpp keeps it) is dequantized
        # row by row at lookup.
        self.embed = embed
        self.layers = layers
        self.lm_head = lm_head
        self.device = norm.device
        # The dtype every product takes its input in: the weights' dtype, or
        # for quantized weights the kernels' input dtype (`dtype`).
        if dtype is None:
            if isinstance(embed, QuantizedTensor):
                raise ValueError("a quantized embedding needs the products' dtype")
            dtype = embed.dtype
        self.dtype = dtype
        # Everything between the matmuls (norms, RoPE, attention, the residual
        # stream) and the KV cache run in act_dtype. On the CPU that is fp32:
        # its elementwise and small batched kernels are much faster than
        # bf16's, which also convert back and forth inside; and fp32
        # activations are what llama.cpp keeps too.
        self.act_dtype = activation_dtype(self.device, self.dtype)
        for layer in layers:
            layer.input_norm = layer.input_norm.to(self.act_dtype).contiguous()
            layer.post_norm = layer.post_norm.to(self.act_dtype).contiguous()
        self.norm = norm.to(self.act_dtype)
        self.scale = config.head_dim**-0.5
        self._q_size = config.num_attention_heads * config.head_dim
        self._kv_size = config.num_key_value_heads * config.head_dim
        inv_freq = torch.tensor(rope_inverse_frequencies(config), dtype=torch.float32)
        self._inv_freq = inv_freq.to(self.device)
        self._rope_cache_len = 0
        self._cos = self._sin = torch.empty(0)
        self.batch_invariant = False
        # Whether steps may run the native CPU path (_forward_native): every
        # product quantized, on the CPU.
        self.native_forward = self.device.type == "cpu" and all(
            isinstance(p, QuantLinear)
            for layer in layers
            for p in (layer.qkv, layer.o, layer.gate_up, layer.down)
        )
        if self.native_forward and isinstance(lm_head, QuantLinear):
            # The kernels take float32 rows and round them to int8 groups
            # themselves: a bfloat16 cast on the way (of the final hidden
            # states, and of the logits on the way back) would only lose
            # precision, up to 1/8 of a logit at the default model's scale.
            self.dtype = torch.float32

    def _product(self, linear: Product, x: torch.Tensor) -> torch.Tensor:
        if self.batch_invariant:
            return linear.tiled(x, ROW_TILE)
        return linear(x)

    def new_kv_cache(self, num_pages: int, page_size: int) -> KVCache:
        c = self.config
        return KVCache(
            c.num_hidden_layers,
            num_pages,
            page_size,
            c.num_key_value_heads,
            c.head_dim,
            self.act_dtype,
            self.device,
        )

    def _rope_tables(self, max_position: int) -> tuple[torch.Tensor, torch.Tensor]:
        # Tables grow on demand to the longest position seen, so a model with a
        # 128k context does not pay for one up front.
        if max_position >= self._rope_cache_len:
            length = max(2 * self._rope_cache_len, max_position + 1, 256)
            pos = torch.arange(length, dtype=torch.float32, device=self.device)
            freqs = torch.outer(pos, self._inv_freq)
            emb = torch.cat((freqs, freqs), dim=-1)
            self._cos = emb.cos().to(self.act_dtype)
            self._sin = emb.sin().to(self.act_dtype)
            self._rope_cache_len = length
        return self._cos, self._sin

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        cache: KVCache,
        max_position: int,
    ) -> torch.Tensor:
        """Hidden states [T, hidden] after the final norm for every input token."""
        c = self.config
        cos_table, sin_table = self._rope_tables(max_position)
        cos = cos_table.index_select(0, positions).unsqueeze(1)
        sin = sin_table.index_select(0, positions).unsqueeze(1)
        half = c.head_dim // 2
        num_tokens = input_ids.shape[0]
        eps = c.rms_norm_eps
        norm_shape = (c.hidden_size,)

        if isinstance(meta, AttentionMetadata) and meta.native:
            return self._forward_native(input_ids, positions, meta, cache, cos_table, sin_table)
        act, weight = self.act_dtype, self.dtype
        if isinstance(self.embed, QuantizedTensor):
            x = take_rows(self.embed, input_ids, act)
        else:
            x = F.embedding(input_ids, self.embed).to(act)
        for index, layer in enumerate(self.layers):
            h = F.rms_norm(x, norm_shape, layer.input_norm, eps)
            qkv = self._product(layer.qkv, h.to(weight)).to(act)
            qk, v = qkv.split((self._q_size + self._kv_size, self._kv_size), dim=-1)
            # q and k heads rotate together: one set of elementwise ops, not two.
            qk = _rotate(qk.view(num_tokens, -1, c.head_dim), cos, sin, half)
            q, k = qk.split((c.num_attention_heads, c.num_key_value_heads), dim=1)
            v = v.view(num_tokens, c.num_key_value_heads, c.head_dim)
            attn = paged_attention(index, q, k, v, cache, meta, self.scale)
            x = x + self._product(layer.o, attn.to(weight))
            h = F.rms_norm(x, norm_shape, layer.post_norm, eps)
            gate_up = self._product(layer.gate_up, h.to(weight))
            gate, up = gate_up.chunk(2, dim=-1)
            x = x + self._product(layer.down, F.silu(gate) * up)
        return F.rms_norm(x, norm_shape, self.norm, eps)

    def _forward_native(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        cache: KVCache,
        cos_table: torch.Tensor,
        sin_table: torch.Tensor,
    ) -> torch.Tensor:
        """forward() with every product quantized, on the native CPU kernels:
        five calls per layer whatever the step holds (norm + q/k/v, RoPE +
        KV write, attention, o + residual, norm + gate/up, SwiGLU + down +
        residual) instead of ~45 torch ops, whose fixed costs are most of a
        one-sequence step.

        Every row is computed alone in one fixed order, in the products
        (QuantLinear) as in attention (paged_attention.c, the same code for a
        decode and for a prefill row): a sequence's tokens come out the same
        bits alone or beside others, in one prefill or in chunks, computed or
        read back from the prefix cache."""
        c = self.config
        if isinstance(self.embed, QuantizedTensor):
            x = take_rows(self.embed, input_ids)
        else:
            x = F.embedding(input_ids, self.embed).float()
        x = x.contiguous()
        tokens = x.shape[0]
        first = self.layers[0]
        qkv = x.new_empty(tokens, first.qkv.out_features)
        attn = x.new_empty(tokens, self._q_size)
        gate_up = x.new_empty(tokens, first.gate_up.out_features)
        eps = c.rms_norm_eps
        heads, kv_heads, head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        assert meta.page_table is not None and meta.row_table is not None
        for index, layer in enumerate(self.layers):
            k_layer, v_layer = cache.k[index], cache.v[index]
            layer.qkv.product_into(x, qkv, input_op="rms_norm", norm_weight=layer.input_norm, eps=eps)
            native.rope_write_kv(
                qkv, heads, kv_heads, head_dim, cos_table, sin_table, positions, k_layer, v_layer, meta.write_index
            )
            native.paged_attention(
                qkv, heads, kv_heads, head_dim, positions, meta.row_table, meta.page_table, k_layer, v_layer,
                cache.page_size, c.sliding_window, self.scale, attn,
            )
            layer.o.product_into(attn, x, accumulate=True)
            layer.gate_up.product_into(x, gate_up, input_op="rms_norm", norm_weight=layer.post_norm, eps=eps)
            layer.down.product_into(gate_up, x, input_op="swiglu", accumulate=True)
        return F.rms_norm(x, (c.hidden_size,), self.norm, eps)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, hidden] -> float32 logits [N, vocab]."""
        return self._product(self.lm_head, hidden.to(self.dtype)).float()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, half: int) -> torch.Tensor:
    # Hugging Face's "rotate half" RoPE layout (the GGUF importer undoes
    # llama.cpp's interleaved permutation so every checkpoint arrives this way).
    x1 = x[..., :half]
    x2 = x[..., half:]
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos + rotated * sin
