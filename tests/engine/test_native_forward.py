"""The native CPU path of quantized models (engine/kernels/native, DecoderModel._forward_native):
each kernel against a plain torch reference, the whole path against the
generic one, and the same path in deterministic mode."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from engine.kernels import native
from engine.formats.loader import load_model
from engine.model.quant import FORMATS, pack_weight, product_error_bound, quantize
from engine.runner.cpu import ModelRunner
from engine.core.scheduler import ScheduledChunk, ScheduleResult

pytestmark = pytest.mark.skipif(not native.available(), reason="no C compiler to build the native kernels")


def _rope_tables(length: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    freqs = torch.outer(torch.arange(length).float(), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


KV_DTYPES = [torch.float32, torch.float16]


# A window of 3 keys over pages of 4 starts mid-page; a soft-cap of 0.5
# (Gemma 2's is 50, for its larger scores) changes every weight. The cache
# in float32 or fp16 (the native path's own: its keys and values read back
# exactly, the arithmetic in float32).
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize(("window", "softcap"), [(None, None), (3, None), (3, 0.5)])
def test_paged_attention_matches_a_plain_softmax_over_the_pages(
    window: int | None, softcap: float | None, kv_dtype: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, dim, page = 6, 2, 16, 4
    k_layer = torch.randn(10 * kv_heads, page, dim, generator=gen).to(kv_dtype)
    v_layer = torch.randn(10 * kv_heads, page, dim, generator=gen).to(kv_dtype)
    # Two decodes and a prefill chunk of three rows (positions 2..4) of a
    # third sequence; rows point at their sequence's line of the table.
    positions = torch.tensor([5, 9, 2, 3, 4])
    row_table = torch.tensor([0, 1, 2, 2, 2])
    table = torch.tensor([[3, 1, 0], [7, 2, 4], [6, 8, 0]])  # padded with page 0
    qkv = torch.randn(5, (heads + 2 * kv_heads) * dim, generator=gen)
    out = torch.empty(5, heads * dim)
    native.paged_attention(
        qkv, heads, kv_heads, dim, positions, row_table, table, k_layer, v_layer, page, window, dim**-0.5, out,
        softcap=softcap,
    )
    for t, pos in enumerate(positions.tolist()):
        pages = table[row_table[t]]
        first = 0 if window is None else max(0, pos + 1 - window)
        q = qkv[t, : heads * dim].view(heads, dim)
        for hq in range(heads):
            h = hq // (heads // kv_heads)
            rows = [(pages[j // page] * kv_heads + h, j % page) for j in range(first, pos + 1)]
            keys = torch.stack([k_layer[r, s] for r, s in rows]).float()
            values = torch.stack([v_layer[r, s] for r, s in rows]).float()
            scores = keys @ q[hq] * dim**-0.5
            if softcap is not None:
                scores = softcap * torch.tanh(scores / softcap)
            expected = torch.softmax(scores, dim=-1) @ values
            torch.testing.assert_close(out[t, hq * dim : (hq + 1) * dim], expected, atol=1e-5, rtol=1e-5)


# GQA groups of 3 and 8 query heads (the values are read for up to 4 rows
# at a time), head sizes with and without a tail past whole vectors.
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (8, 1, 40), (4, 2, 36)])
def test_a_token_attends_with_the_same_bits_in_any_step(
    heads: int, kv_heads: int, dim: int, kv_dtype: torch.dtype
) -> None:
    # The same query row alone (a decode), inside a prefill chunk, with other
    # sequences around it and from every build: one order of arithmetic.
    gen = torch.Generator().manual_seed(4)
    page = 16
    k_layer = torch.randn(40 * kv_heads, page, dim, generator=gen).to(kv_dtype)
    v_layer = torch.randn(40 * kv_heads, page, dim, generator=gen).to(kv_dtype)
    table = torch.tensor([[5, 2, 30, 11, 7], [9, 1, 3, 0, 0]])
    qkv = torch.randn(70, (heads + 2 * kv_heads) * dim, generator=gen)
    positions = torch.cat((torch.arange(10, 77), torch.tensor([20, 21, 40])))
    row_table = torch.tensor([0] * 67 + [1, 1, 1])
    together = torch.empty(70, heads * dim)
    native.paged_attention(qkv, heads, kv_heads, dim, positions, row_table, table, k_layer, v_layer, page, None,
                           0.125, together)
    reference = torch.empty_like(together)
    for t, pos in enumerate(positions.tolist()):
        pages = table[row_table[t]]
        q = qkv[t, : heads * dim].view(heads, dim)
        for hq in range(heads):
            h = hq // (heads // kv_heads)
            rows = [(pages[j // page] * kv_heads + h, j % page) for j in range(pos + 1)]
            keys = torch.stack([k_layer[r, s] for r, s in rows]).float()
            values = torch.stack([v_layer[r, s] for r, s in rows]).float()
            reference[t, hq * dim : (hq + 1) * dim] = torch.softmax(keys @ q[hq] * 0.125, -1) @ values
    torch.testing.assert_close(together, reference, atol=1e-5, rtol=1e-5)
    for t in (0, 33, 66, 68):
        alone = torch.empty(1, heads * dim)
        native.paged_attention(qkv[t : t + 1], heads, kv_heads, dim, positions[t : t + 1],
                               torch.zeros(1, dtype=torch.long), table[row_table[t] : row_table[t] + 1],
                               k_layer, v_layer, page, None, 0.125, alone)
        assert torch.equal(alone[0], together[t]), t
    for variant in native.cpu_variants(native.cpu_features()):
        other = torch.empty(70, heads * dim)
        native.paged_attention(qkv, heads, kv_heads, dim, positions, row_table, table, k_layer, v_layer, page,
                               None, 0.125, other, lib=native.load_variant(variant))
        assert torch.equal(other, together), variant


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize(("head_norms", "rotary"), [(False, 8), (True, 8), (False, 4)])
def test_prefill_rows_are_rotated_and_written_to_their_cache_rows(
    head_norms: bool, rotary: int, kv_dtype: torch.dtype
) -> None:
    """With head norms (Qwen3, Gemma 3), each q and k head is RMS-normalised
    times its weight before the rotation; with partial rotary (Phi-4-mini)
    only the first `rotary` dimensions of a head rotate; v is written as it
    is (in an fp16 cache, rounded to fp16 as torch rounds)."""
    gen = torch.Generator().manual_seed(1)
    heads, kv_heads, dim, page = 4, 2, 8, 4
    k_layer = torch.zeros(6 * kv_heads * page, dim, dtype=kv_dtype)
    v_layer = torch.zeros(6 * kv_heads * page, dim, dtype=kv_dtype)
    positions = torch.tensor([0, 1, 2, 7])
    write_rows = torch.tensor([[r * page + h * page + o for h in range(kv_heads)] for r, o in
                               [(0, 0), (0, 1), (0, 2), (2 * kv_heads, 3)]]).reshape(-1)
    qkv = torch.randn(4, (heads + 2 * kv_heads) * dim, generator=gen)
    before = qkv.clone()
    cos, sin = _rope_tables(8, rotary)
    q_norm = 1 + 0.3 * torch.randn(dim, generator=gen) if head_norms else None
    k_norm = 1 + 0.3 * torch.randn(dim, generator=gen) if head_norms else None
    native.rope_write_kv(qkv, heads, kv_heads, dim, cos, sin, positions, k_layer, v_layer, write_rows,
                         q_norm=q_norm, k_norm=k_norm, eps=1e-6, rotary_dim=rotary)
    for t, pos in enumerate(positions.tolist()):
        q, k = before[t, : (heads + kv_heads) * dim].view(-1, dim).split((heads, kv_heads))
        if head_norms:
            q, k = F.rms_norm(q, (dim,), q_norm, 1e-6), F.rms_norm(k, (dim,), k_norm, 1e-6)
        heads_in = torch.cat((q, k))
        rotated = torch.cat((_rotate(heads_in[:, :rotary], cos[pos], sin[pos]), heads_in[:, rotary:]), dim=-1)
        torch.testing.assert_close(qkv[t, : (heads + kv_heads) * dim].view(-1, dim), rotated)
        for h in range(kv_heads):
            row = int(write_rows[t * kv_heads + h])
            assert torch.equal(k_layer[row], qkv[t, (heads + h) * dim :][:dim].to(kv_dtype))
            torch.testing.assert_close(k_layer[row].float(), rotated[heads + h], atol=1e-3, rtol=1e-3)
            assert torch.equal(v_layer[row], before[t, (heads + kv_heads + h) * dim :][:dim].to(kv_dtype))


def test_rows_rotate_to_the_same_bits_alone_as_in_a_threaded_step() -> None:
    # 64 rows of 6 heads of 64 values: past the size from which the rows
    # are shared among threads; one row alone stays on one.
    gen = torch.Generator().manual_seed(2)
    heads, kv_heads, dim, rows = 4, 2, 64, 64
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * dim, generator=gen)
    cos, sin = _rope_tables(dim, dim)
    norm = 1 + 0.3 * torch.randn(dim, generator=gen)
    positions = torch.arange(rows) % 8
    write_rows = torch.arange(rows * kv_heads)
    together = qkv.clone()
    k_layer = torch.zeros(rows * kv_heads, dim, dtype=torch.float16)
    v_layer = torch.zeros_like(k_layer)
    native.rope_write_kv(together, heads, kv_heads, dim, cos, sin, positions, k_layer, v_layer, write_rows,
                         q_norm=norm, k_norm=norm, eps=1e-6, rotary_dim=dim)
    for t in (0, 31, 63):
        alone = qkv[t : t + 1].clone()
        k_alone = torch.zeros(kv_heads, dim, dtype=torch.float16)
        v_alone = torch.zeros_like(k_alone)
        native.rope_write_kv(alone, heads, kv_heads, dim, cos, sin, positions[t : t + 1], k_alone, v_alone,
                             torch.arange(kv_heads), q_norm=norm, k_norm=norm, eps=1e-6, rotary_dim=dim)
        assert torch.equal(alone[0], together[t])
        assert torch.equal(k_alone, k_layer[t * kv_heads : (t + 1) * kv_heads])
        assert torch.equal(v_alone, v_layer[t * kv_heads : (t + 1) * kv_heads])


def test_an_fp16_cache_rounds_every_value_as_torch_does_in_every_build() -> None:
    """float32 -> fp16 on the way into the cache, rounded to nearest even:
    ties both ways, subnormal halves, values past the largest half (inf),
    infinities, zeros of both signs, and the boundaries between them, from
    the portable C (bit arithmetic) and the F16C builds alike."""
    f16 = torch.finfo(torch.float16)
    special = torch.tensor([
        0.0, -0.0, 1.0, -1.0, 65504.0, 65519.0, 65520.0, 1e6, -1e6, float("inf"), float("-inf"),
        f16.tiny, f16.tiny / 2, f16.tiny / 1024, f16.tiny / 2048, f16.tiny / 4096, 3 * f16.tiny / 2048,
        1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-11 + 2**-20, -(1 + 2**-11), 2**-25, 2**-25 * 1.5, 2**-26,
    ], dtype=torch.float32)
    gen = torch.Generator().manual_seed(3)
    values = torch.cat((special, torch.randn(200, generator=gen) * 10.0 ** torch.randint(-8, 5, (200,),
                                                                                      generator=gen)))
    dim = 8
    values = torch.cat((values, torch.zeros(-len(values) % dim)))
    rows = len(values) // dim
    qkv = torch.zeros(rows, 3 * dim)  # one q head, one k head, one v head: v passes through unrotated
    qkv[:, 2 * dim :] = values.view(rows, dim)
    cos, sin = _rope_tables(1, dim)
    for variant in native.cpu_variants(native.cpu_features()):
        k_layer = torch.zeros(rows, dim, dtype=torch.float16)
        v_layer = torch.zeros(rows, dim, dtype=torch.float16)
        native.rope_write_kv(qkv.clone(), 1, 1, dim, cos, sin, torch.zeros(rows, dtype=torch.long), k_layer,
                             v_layer, torch.arange(rows), lib=native.load_variant(variant))
        assert torch.equal(v_layer.view(torch.int16), values.view(rows, dim).half().view(torch.int16)), variant


def test_a_cache_of_another_dtype_is_refused() -> None:
    qkv = torch.zeros(1, 3 * 8)
    cos, sin = _rope_tables(1, 8)
    for k_dtype, v_dtype in [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float32)]:
        with pytest.raises(ValueError, match="float32 or float16"):
            native.rope_write_kv(qkv, 1, 1, 8, cos, sin, torch.zeros(1, dtype=torch.long),
                                 torch.zeros(1, 8, dtype=k_dtype), torch.zeros(1, 8, dtype=v_dtype),
                                 torch.zeros(1, dtype=torch.long))


@pytest.mark.parametrize("fmt", FORMATS)
def test_fused_input_operations_and_accumulation(fmt: str) -> None:
    gen = torch.Generator().manual_seed(2)
    weight = quantize(torch.randn(40, 128, generator=gen), fmt)
    x = torch.randn(6, 128, generator=gen)
    norm = 1 + 0.1 * torch.randn(128, generator=gen)
    packed = pack_weight(weight)
    out = torch.empty(6, 40)
    native.quant_matmul_into(fmt, x, packed.data, packed.scales, packed.mins, None, out,
                             input_op="rms_norm", norm_weight=norm, eps=1e-5)
    normed = F.rms_norm(x, (128,), norm, 1e-5)
    bound = product_error_bound(normed, weight, exact_weights=True) + 1e-4
    assert ((out - normed @ weight.dequantize().T).abs() <= bound).all()

    pair = torch.randn(6, 256, generator=gen)
    residual = torch.randn(6, 40, generator=gen)
    before = residual.clone()
    native.quant_matmul_into(fmt, pair, packed.data, packed.scales, packed.mins, None, residual,
                             input_op="swiglu", accumulate=True)
    gated = F.silu(pair[:, :128]) * pair[:, 128:]
    bound = product_error_bound(gated, weight, exact_weights=True) + 1e-4
    assert ((residual - before - gated @ weight.dequantize().T).abs() <= bound).all()

    # Gemma's feed-forward: GeGLU in, the output RMS-normalised, and
    # Granite's residual scale (here both at once).
    out_norm = 1 + 0.1 * torch.randn(40, generator=gen)
    residual = before.clone()
    native.quant_matmul_into(fmt, pair, packed.data, packed.scales, packed.mins, None, residual,
                             input_op="geglu", accumulate=True, out_norm=out_norm, out_scale=0.5, eps=1e-6)
    gated = F.gelu(pair[:, :128], approximate="tanh") * pair[:, 128:]
    product = native.quant_matmul_into(fmt, gated, packed.data, packed.scales, packed.mins, None, torch.empty(6, 40))
    assert ((product - gated @ weight.dequantize().T).abs() <= product_error_bound(gated, weight, exact_weights=True)
            + 1e-4).all()
    expected = before + 0.5 * F.rms_norm(product, (40,), out_norm, 1e-6)
    torch.testing.assert_close(residual, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_row_of_a_product_is_the_same_bits_alone(fmt: str) -> None:
    gen = torch.Generator().manual_seed(3)
    weight = quantize(torch.randn(70, 256, generator=gen), fmt)
    packed = pack_weight(weight)
    # 139 rows: many register tiles of four rows, and a last tile of three.
    x = torch.randn(139, 256, generator=gen)
    together = native.quant_matmul(fmt, x, packed.data, packed.scales, packed.mins, None, rows=70)
    for i in (0, 1, 5, 64, 136, 138):
        alone = native.quant_matmul(fmt, x[i : i + 1], packed.data, packed.scales, packed.mins, None, rows=70)
        assert torch.equal(alone[0], together[i]), i


# --------------------------------------------------------------------------
# The whole path


@pytest.fixture(scope="module")
def quantized_tiny(tiny_model_dir: Path):
    return load_model(tiny_model_dir, "cpu", "float32", quantize="int4")


def _mixed_step_logits(model, native_path: bool, deterministic: bool = False) -> torch.Tensor:
    """Logits of one step holding a decode and a prefill chunk that continues a cached prompt."""
    model.native_forward = native_path
    try:
        # float32 on both paths: the comparison is of the code, the fp16 cache has tests of its own.
        runner = ModelRunner(model, model.new_kv_cache(16, 4, torch.float32), deterministic=deterministic)
        first = SimpleNamespace(token_ids=list(range(3, 14)), pages=[4, 1, 9], sampler=None)
        second = SimpleNamespace(token_ids=list(range(20, 33)), pages=[2, 7, 5, 11], sampler=None)
        runner.forward(ScheduleResult(decodes=[], prefills=[ScheduledChunk(first, 0, 10), ScheduledChunk(second, 0, 6)]))
        step = ScheduleResult(decodes=[ScheduledChunk(first, 10, 1)], prefills=[ScheduledChunk(second, 6, 7)])
        hidden, _, _ = runner.forward(step)
        return model.logits(hidden)
    finally:
        model.native_forward = True
        model.batch_invariant = False


def test_native_path_computes_what_the_generic_path_computes(quantized_tiny) -> None:
    assert quantized_tiny.native_forward
    fast = _mixed_step_logits(quantized_tiny, native_path=True)
    generic = _mixed_step_logits(quantized_tiny, native_path=False)
    # Both round inputs to int8 groups, from norms and activations computed
    # in different code: equal up to a rounding flip here and there.
    cosine = F.cosine_similarity(fast, generic, dim=-1)
    assert cosine.min() > 0.999, cosine
    assert (fast - generic).abs().max() <= 0.05 * generic.abs().max()


def test_deterministic_mode_keeps_the_native_path(quantized_tiny) -> None:
    """--deterministic promises batch invariance; the native path keeps it by
    construction, while the torch path's GEMMs do not on every CPU. So a
    quantized model gives the same bits in both modes (end to end on the
    default model: tests/engine/test_deterministic.py)."""
    default = _mixed_step_logits(quantized_tiny, native_path=True)
    deterministic = _mixed_step_logits(quantized_tiny, native_path=True, deterministic=True)
    assert torch.equal(deterministic, default)


def test_a_layer_program_makes_the_calls_a_product_makes_and_names_a_failing_record() -> None:
    # One record into the middle columns of a buffer, one accumulated into another: the same
    # bits as the per-call product with the same arguments.
    from engine.kernels.native.forward import ATTN, GATE_UP, QKV, X, LayerProgram
    from engine.model.quant import QuantLinear

    g = torch.Generator().manual_seed(5)
    first = QuantLinear(quantize(torch.randn(32, 64, generator=g), "q8_0"))
    second = QuantLinear(quantize(torch.randn(64, 64, generator=g), "q4_0"))
    norm = torch.rand(64, generator=g) + 0.5
    x = torch.randn(3, 64, generator=g)
    qkv = torch.zeros(3, 64)
    program = LayerProgram()
    program.product(first.bound(), X, QKV, column=16, input_op=native.INPUT_OPS["rms_norm"], norm_weight=norm, eps=1e-6)
    program.product(second.bound(), QKV, GATE_UP, accumulate=True)
    gate_up = torch.randn(3, 64, generator=g)
    expected_gate_up = gate_up.clone()
    buffers = (x.clone(), qkv, torch.empty(3, 8), gate_up)
    tables = torch.zeros(1, dtype=torch.int64)
    program.run(buffers, tables, tables, torch.zeros(1, 1, dtype=torch.int64), tables, [], 1)

    expected_qkv = torch.zeros(3, 64)
    first.product_into(x, expected_qkv[:, 16:48], input_op="rms_norm", norm_weight=norm, eps=1e-6)
    second.product_into(expected_qkv, expected_gate_up, accumulate=True)
    assert torch.equal(qkv, expected_qkv)
    assert torch.equal(gate_up, expected_gate_up)

    broken = LayerProgram()
    broken.product(first.bound(), X, QKV)
    broken.product(second.bound(), ATTN, 7)  # no such buffer
    with pytest.raises(native.NativeKernelError, match="tandem_forward_layers failed with status 2001"):
        broken.run(buffers, tables, tables, torch.zeros(1, 1, dtype=torch.int64), tables, [], 1)
