"""The decoder of every family Tandem runs, over a flattened batch of tokens.

One block with switches, read from the config by each family's module
(engine/model/families): the Llama block (RMSNorm, RoPE, grouped-query
attention, SwiGLU), plus q/k head norms (Qwen3, Gemma 3), GeGLU, norms on
the branch outputs (Gemma), embedding, residual and logit scales (Gemma,
Granite), attention and logit soft-caps (Gemma 2), and layers that attend
over a sliding window with their own RoPE base beside global ones (Gemma 2
and 3). Norms with an offset (Gemma's `1 + w`) arrive with it added by the
loader, so every norm here multiplies by its weight.

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
from engine.kernels.native import forward
from engine.kernels.native.forward import LayerProgram
from engine.model.attention import AttentionMetadata, paged_attention
from engine.model.config import ModelConfig, rope_attention_factor, rope_inverse_frequencies
from engine.model.kv_cache import KVCache
from engine.model.linear import Linear
from engine.model.quant import ConcatLinear, QuantizedTensor, QuantLinear, take_rows
from engine.runner.memory import activation_dtype, kv_cache_dtype

# Anything with __call__(x) and tiled(x, rows): engine.model.linear.Linear, or the
# weight-only quantized layers of engine.model.quant.
Product = Linear | QuantLinear | ConcatLinear

# Rows per weight-product tile in batch-invariant mode. 16 covers a typical
# decode batch in one tile (so B=16 pays nothing); a single sequence pays for
# 16 rows (see docs/benchmarks.md for the measured cost).
ROW_TILE = 16

# The native path's input operation of the down product, by activation.
_GATED_INPUT = {"silu": "swiglu", "gelu_tanh": "geglu"}

_NORMS = ("input_norm", "post_norm", "q_norm", "k_norm", "attn_out_norm", "ffn_out_norm")


@dataclass(slots=True)
class LayerWeights:
    input_norm: torch.Tensor
    qkv: Product  # [(Hq + 2*Hkv) * D, hidden]
    o: Product
    post_norm: torch.Tensor  # before the feed-forward network
    gate_up: Product  # [2 * intermediate, hidden]
    down: Product
    q_norm: torch.Tensor | None = None  # [D], over each query head before RoPE
    k_norm: torch.Tensor | None = None
    attn_out_norm: torch.Tensor | None = None  # on the attention output, before the residual
    ffn_out_norm: torch.Tensor | None = None  # on the feed-forward output, before the residual


class DecoderModel:
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
            for name in _NORMS:
                weight = getattr(layer, name)
                if weight is not None:
                    setattr(layer, name, weight.to(self.act_dtype).contiguous())
        self.norm = norm.to(self.act_dtype)
        self.scale = config.query_scale
        self._q_size = config.num_attention_heads * config.head_dim
        self._kv_size = config.num_key_value_heads * config.head_dim
        self.layer_windows = [config.layer_window(i) for i in range(config.num_hidden_layers)]
        # One rotation table per distinct set of frequencies (Gemma 3's
        # sliding layers have their own base): layer -> index into _rope.
        rotations: list[tuple[list[float], float]] = []
        self._layer_rope: list[int] = []
        for index in range(config.num_hidden_layers):
            rotation = (rope_inverse_frequencies(config, index), rope_attention_factor(config, index))
            if rotation not in rotations:
                rotations.append(rotation)
            self._layer_rope.append(rotations.index(rotation))
        self._rope = [
            RopeTable(torch.tensor(inv, dtype=torch.float32, device=self.device), factor) for inv, factor in rotations
        ]
        self.batch_invariant = False
        self._program: tuple[KVCache, LayerProgram] | None = None  # _layer_program's, for one cache
        # Whether steps may run the native CPU path (_forward_native): every
        # product quantized, on the CPU (a fused q/k/v or gate/up may mix formats).
        self.native_forward = self.device.type == "cpu" and all(
            isinstance(layer.o, QuantLinear) and isinstance(layer.down, QuantLinear)
            and all(isinstance(p, QuantLinear) or (isinstance(p, ConcatLinear) and p.runs_natively)
                    for p in (layer.qkv, layer.gate_up))
            for layer in layers
        )
        if self.native_forward and isinstance(lm_head, QuantLinear):
            # The kernels take float32 rows and round them to int8 groups
            # themselves: a bfloat16 cast on the way (of the final hidden
            # states, and of the logits on the way back) would only lose
            # precision, up to 1/8 of a logit at the default model's scale.
            self.dtype = torch.float32

    @property
    def kv_dtype(self) -> torch.dtype:
        """What a KV cache for this model holds: fp16 for the native path, whose attention reads it
        (paged_attention.c), else the activations' dtype (engine.runner.memory.kv_cache_dtype)."""
        return kv_cache_dtype(self.device, self.dtype, self.native_forward)

    def _layer_program(self, cache: KVCache) -> LayerProgram:
        """The native calls of every layer (_forward_native), written once per KV cache: six a
        layer, whatever the family (norm + q/k/v; q/k head norms + (partial) RoPE + KV write;
        attention over the layer's window, soft-capped; o + output norm + scale + residual;
        norm + gate/up; SwiGLU or GeGLU + down + output norm + scale + residual), a fused
        product of mixed formats one call per part into its own columns."""
        if self._program is not None and self._program[0] is cache:
            return self._program[1]
        c = self.config
        eps, residual_scale = c.rms_norm_eps, c.residual_scale
        heads, kv_heads, head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        gated = native.INPUT_OPS[_GATED_INPUT[c.activation]]
        rms_norm = native.INPUT_OPS["rms_norm"]
        program = LayerProgram()

        def product(linear: Product, source: int, target: int, **options: object) -> None:
            column = 0
            for part in linear.parts if isinstance(linear, ConcatLinear) else [linear]:
                program.product(part.bound(), source, target, column=column, **options)
                column += part.out_features

        for index, layer in enumerate(self.layers):
            k_layer, v_layer = cache.k[index], cache.v[index]
            product(layer.qkv, forward.X, forward.QKV, input_op=rms_norm, norm_weight=layer.input_norm, eps=eps)
            program.rope(heads, kv_heads, head_dim, self._layer_rope[index], k_layer, v_layer,
                         q_norm=layer.q_norm, k_norm=layer.k_norm, eps=eps, rotary_dim=c.rotary_dim)
            program.attention(heads, kv_heads, head_dim, cache.page_size, self.layer_windows[index], self.scale,
                              k_layer, v_layer, c.attn_softcap)
            product(layer.o, forward.ATTN, forward.X, accumulate=True, out_norm=layer.attn_out_norm,
                    out_scale=residual_scale, eps=eps)
            product(layer.gate_up, forward.X, forward.GATE_UP, input_op=rms_norm, norm_weight=layer.post_norm,
                    eps=eps)
            product(layer.down, forward.GATE_UP, forward.X, input_op=gated, accumulate=True,
                    out_norm=layer.ffn_out_norm, out_scale=residual_scale, eps=eps)
        self._program = (cache, program)
        return program

    def _product(self, linear: Product, x: torch.Tensor) -> torch.Tensor:
        if self.batch_invariant:
            return linear.tiled(x, ROW_TILE)
        return linear(x)

    def new_kv_cache(self, num_pages: int, page_size: int, dtype: torch.dtype | None = None) -> KVCache:
        """A zeroed cache in `dtype` (default kv_dtype; the native path also reads float32)."""
        c = self.config
        return KVCache(
            c.num_hidden_layers,
            num_pages,
            page_size,
            c.num_key_value_heads,
            c.head_dim,
            dtype or self.kv_dtype,
            self.device,
        )

    def _rope_tables(self, max_position: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(cos, sin) of every distinct rotation, through max_position."""
        return [table.through(max_position, self.act_dtype) for table in self._rope]

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
        tables = self._rope_tables(max_position)
        if isinstance(meta, AttentionMetadata) and meta.native:
            return self._forward_native(input_ids, positions, meta, cache, tables)
        rotations = [
            (cos.index_select(0, positions).unsqueeze(1), sin.index_select(0, positions).unsqueeze(1))
            for cos, sin in tables
        ]
        rotary = c.rotary_dim
        num_tokens = input_ids.shape[0]
        eps = c.rms_norm_eps
        norm_shape, head_shape = (c.hidden_size,), (c.head_dim,)
        heads, kv_heads = c.num_attention_heads, c.num_key_value_heads
        act, weight = self.act_dtype, self.dtype
        activation = F.silu if c.activation == "silu" else _gelu_tanh
        if isinstance(self.embed, QuantizedTensor):
            x = take_rows(self.embed, input_ids, act)
        else:
            x = F.embedding(input_ids, self.embed).to(act)
        if c.embedding_scale != 1.0:
            x = x * c.embedding_scale
        for index, layer in enumerate(self.layers):
            h = F.rms_norm(x, norm_shape, layer.input_norm, eps)
            qkv = self._product(layer.qkv, h.to(weight)).to(act)
            qk, v = qkv.split((self._q_size + self._kv_size, self._kv_size), dim=-1)
            qk = qk.view(num_tokens, -1, c.head_dim)
            if layer.q_norm is not None and layer.k_norm is not None:
                q, k = qk.split((heads, kv_heads), dim=1)
                q = F.rms_norm(q, head_shape, layer.q_norm, eps)
                k = F.rms_norm(k, head_shape, layer.k_norm, eps)
                qk = torch.cat((q, k), dim=1)
            # q and k heads rotate together: one set of elementwise ops, not two.
            cos, sin = rotations[self._layer_rope[index]]
            qk = _rotate(qk, cos, sin, rotary)
            q, k = qk.split((heads, kv_heads), dim=1)
            v = v.view(num_tokens, kv_heads, c.head_dim)
            layer_meta = meta.sliding if self.layer_windows[index] is not None and meta.sliding is not None else meta
            attn = paged_attention(index, q, k, v, cache, layer_meta, self.scale, c.attn_softcap)
            x = self._join(x, self._product(layer.o, attn.to(weight)), layer.attn_out_norm)
            h = F.rms_norm(x, norm_shape, layer.post_norm, eps)
            gate, up = self._product(layer.gate_up, h.to(weight)).chunk(2, dim=-1)
            x = self._join(x, self._product(layer.down, activation(gate) * up), layer.ffn_out_norm)
        return F.rms_norm(x, norm_shape, self.norm, eps)

    def _join(self, x: torch.Tensor, branch: torch.Tensor, out_norm: torch.Tensor | None) -> torch.Tensor:
        """The residual stream after a branch (attention or feed-forward) joins it."""
        c = self.config
        branch = branch.to(self.act_dtype)
        if out_norm is not None:
            branch = F.rms_norm(branch, (c.hidden_size,), out_norm, c.rms_norm_eps)
        if c.residual_scale != 1.0:
            branch = branch * c.residual_scale
        return x + branch

    def _forward_native(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        cache: KVCache,
        tables: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """forward() with every product quantized, on the native CPU kernels:
        six calls per layer whatever the step holds and whatever the family
        (norm + q/k/v; q/k head norms + (partial) RoPE + KV write; attention
        over the layer's window, soft-capped; o + output norm + scale +
        residual; norm + gate/up; SwiGLU or GeGLU + down + output norm +
        scale + residual) instead of ~45 torch ops, whose fixed costs are
        most of a one-sequence step; and every layer's calls in one call
        from Python (_layer_program, engine/kernels/native/forward.c).

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
        if c.embedding_scale != 1.0:
            x = x * c.embedding_scale
        x = x.contiguous()
        tokens = x.shape[0]
        first = self.layers[0]
        qkv = x.new_empty(tokens, first.qkv.out_features)
        attn = x.new_empty(tokens, self._q_size)
        gate_up = x.new_empty(tokens, first.gate_up.out_features)
        eps = c.rms_norm_eps
        assert meta.page_table is not None and meta.row_table is not None
        self._layer_program(cache).run(
            (x, qkv, attn, gate_up), positions, meta.row_table, meta.page_table, meta.write_index, tables,
            torch.get_num_threads(),
        )
        return F.rms_norm(x, (c.hidden_size,), self.norm, eps)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, hidden] -> float32 logits [N, vocab]."""
        c = self.config
        logits = self._product(self.lm_head, hidden.to(self.dtype)).float()
        if c.logit_scale != 1.0:
            logits.mul_(c.logit_scale)
        if c.final_softcap is not None:
            logits = torch.tanh(logits / c.final_softcap).mul_(c.final_softcap)
        return logits


class RopeTable:
    """cos and sin of one set of rotation frequencies by position (times the
    scaling's attention factor), grown on demand to the longest position
    seen, so a model with a 128k context does not pay for a table up front."""

    def __init__(self, inv_freq: torch.Tensor, attention_factor: float = 1.0) -> None:
        self.inv_freq = inv_freq
        self.attention_factor = attention_factor
        self.length = 0
        self.cos = self.sin = torch.empty(0)

    def through(self, max_position: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if max_position >= self.length:
            length = max(2 * self.length, max_position + 1, 256)
            pos = torch.arange(length, dtype=torch.float32, device=self.inv_freq.device)
            freqs = torch.outer(pos, self.inv_freq)
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = emb.cos(), emb.sin()
            if self.attention_factor != 1.0:
                cos, sin = cos * self.attention_factor, sin * self.attention_factor
            self.cos, self.sin = cos.to(dtype), sin.to(dtype)
            self.length = length
        return self.cos, self.sin


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    """RoPE on the leading rotary_dim dimensions of each head (all of them
    but for partial rotary, as Phi-4-mini has it); the rest pass through.

    Hugging Face's "rotate half" layout (the GGUF importer undoes llama.cpp's
    interleaved permutation so every checkpoint arrives this way)."""
    if rotary_dim != x.shape[-1]:
        return torch.cat((_rotate(x[..., :rotary_dim], cos, sin, rotary_dim), x[..., rotary_dim:]), dim=-1)
    half = rotary_dim // 2
    x1 = x[..., :half]
    x2 = x[..., half:]
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos + rotated * sin
