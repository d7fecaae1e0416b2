"""Every build of the quantized CPU kernels computes the same bits.

engine/kernels/native/quant_matmul.c defines one order of arithmetic per
output element; the portable C and each SIMD build (AVX2, AVX-VNNI,
AVX-512 VNNI) must follow it exactly, so that which machine a reply was
computed on, like which batch it was computed in, never changes it. Every
variant is compiled here; the ones this CPU can run are compared with the
portable build bit for bit, on shapes on both sides of each tile size (4
rows of x, 2 octets of 8 output columns, blocks of 4 octets) and of the
last partial octet. The raw GGUF formats (q4_k ... q5_1) are also checked
against a float64 reference of the same arithmetic.
"""

from __future__ import annotations

import torch
import pytest

from engine.kernels import native
from engine.model.quant import (
    FORMATS,
    RAW_BLOCK_FORMATS,
    PackedQuantizedTensor,
    QuantizedTensor,
    activation_block,
    pack_weight,
    quantize,
    random_raw_weight,
    take_rows,
)

pytestmark = pytest.mark.skipif(not native.available(), reason="no C compiler for the native kernels")

# What this CPU runs, best first; "portable" is always among them.
RUNNABLE = native.cpu_variants(native.cpu_features())


@pytest.fixture(scope="module")
def builds() -> dict[str, object]:
    return {variant: native.load_variant(variant) for variant in RUNNABLE}


@pytest.mark.parametrize("variant", sorted(native.VARIANT_FLAGS))
def test_every_variant_compiles(variant: str) -> None:
    # The installer bundle ships all of them (packaging/tandem.spec), so
    # each must build even where this CPU cannot run it.
    path = native._find_or_build(variant)
    assert path.stat().st_size > 0


def test_the_cpu_runs_its_best_variant() -> None:
    assert native.loaded_variant() == RUNNABLE[0]
    assert native.cpu_variants({"avx2", "fma", "f16c"}) == ["avx2", "portable"]
    vnni = {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"}
    assert native.cpu_variants(vnni) == ["avx512vnni", "avx2", "portable"]
    assert native.cpu_variants(set()) == ["portable"]


def test_a_forced_variant_that_does_not_exist_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TANDEM_KERNEL_VARIANT", "avx9000")
    with pytest.raises(native.NativeKernelError, match="avx9000"):
        native.cpu_variants()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    ("rows", "cols", "inputs"),
    [(1, 8, 32), (3, 52, 96), (4, 37, 64), (5, 16, 128), (9, 70, 256), (33, 136, 96), (130, 40, 64)],
)
def test_every_variant_gives_the_portable_bits(builds: dict, fmt: str, rows: int, cols: int, inputs: int) -> None:
    gen = torch.Generator().manual_seed(rows * 1000 + cols)
    weight = quantize(torch.randn(cols, inputs, generator=gen), fmt)
    packed = pack_weight(weight)
    x = torch.randn(rows, inputs, generator=gen)
    x[0, 1] = 30.0  # an outlier: a coarse int8 step in its group
    if rows > 1:
        # Tiny inputs: their groups' fp16 scales are subnormal, or 0 (the
        # portable build's fp16 rounding against F16C's).
        x[-1] *= 1e-4
        x[-1, :32] *= 1e-4
    bias = torch.randn(cols, generator=gen)
    outs = {
        variant: native.quant_matmul(fmt, x, packed.data, packed.scales, packed.mins, bias, rows=cols, lib=lib)
        for variant, lib in builds.items()
    }
    for variant, out in outs.items():
        assert torch.equal(out, outs["portable"]), variant


# Rows of x, output columns and inputs on both sides of the tiles (4 rows,
# octets of 8 columns, blocks of 4 octets) and of a K-quant super-block.
RAW_SHAPES = [(1, 8, 256), (3, 52, 512), (4, 37, 256), (5, 16, 768), (9, 70, 256), (33, 136, 512)]


def _raw_product_case(fmt: str, rows: int, cols: int, inputs: int) -> tuple[QuantizedTensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(rows * 1000 + cols + inputs)
    weight = random_raw_weight(fmt, cols, inputs, gen)
    x = torch.randn(rows, inputs, generator=gen)
    x[0, 1] = 30.0  # an outlier: a coarse int8 step in its block
    return weight, x


@pytest.mark.parametrize("fmt", list(RAW_BLOCK_FORMATS))
@pytest.mark.parametrize(("rows", "cols", "inputs"), RAW_SHAPES)
def test_raw_blocks_give_the_portable_bits(builds: dict, fmt: str, rows: int, cols: int, inputs: int) -> None:
    weight, x = _raw_product_case(fmt, rows, cols, inputs)
    packed = pack_weight(weight)
    bias = torch.randn(cols)
    outs = {
        variant: native.quant_matmul(fmt, x, packed.data, None, None, bias, rows=cols, lib=lib)
        for variant, lib in builds.items()
    }
    for variant, out in outs.items():
        assert torch.equal(out, outs["portable"]), variant
    # A row alone has the bits it has in the batch.
    alone = native.quant_matmul(fmt, x[-1:], packed.data, None, None, bias, rows=cols)
    assert torch.equal(alone[0], outs["portable"][-1])


def _rounded_inputs(x: torch.Tensor, block: int) -> torch.Tensor:
    """x as the kernel quantizes it, back in float64: per 32, scale max|x| /
    127 (q8_0); per 256, scale 1 / (127 / max|x|) (q8_K); levels rounded
    half to even."""
    blocks = x.reshape(x.shape[0], -1, block)
    amax = blocks.abs().amax(-1, keepdim=True)
    if block == 256:
        inverse = torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))
        scale = torch.where(amax > 0, 1 / inverse, torch.zeros_like(amax))
    else:
        scale = amax / 127
        inverse = torch.where(scale > 0, 1 / scale, torch.zeros_like(scale))
        scale = scale.half().float()  # ggml's block_q8_0.d: the levels from fp32, the products in fp16
    levels = torch.round(blocks * inverse).clamp(-127, 127)
    return (levels.double() * scale.double()).reshape(x.shape)


@pytest.mark.parametrize("fmt", list(RAW_BLOCK_FORMATS))
@pytest.mark.parametrize(("rows", "cols", "inputs"), RAW_SHAPES[1:4])
def test_raw_block_products_are_the_exact_arithmetic(fmt: str, rows: int, cols: int, inputs: int) -> None:
    """Against float64: the int8-rounded inputs times the exact weights (a
    scale times a level, minus a min for q4_k / q5_k, each exact in float64).
    The kernel's integer sums are exact, so only its float chain rounds:
    about two float32 roundings per block, each relative to the sum of the
    magnitudes of the terms (a K-quant's scale part and min part apart, as
    they can cancel)."""
    weight, x = _raw_product_case(fmt, rows, cols, inputs)
    got = native.quant_matmul(fmt, x, pack_weight(weight).data, None, None, None, rows=cols).double()
    rounded = _rounded_inputs(x, activation_block(fmt))
    want = rounded @ weight.dequantize(torch.float64).T
    parts = [weight.data.clone(), weight.data.clone()]
    if fmt in ("q4_k", "q5_k", "q5_1"):  # the scale part (min zeroed) and the min part (scale zeroed)
        blocks = [p.view(-1, RAW_BLOCK_FORMATS[fmt][1]) for p in parts]
        blocks[0][:, 2:4] = 0
        blocks[1][:, 0:2] = 0
        magnitude = sum(QuantizedTensor(fmt, p).dequantize(torch.float64).abs() for p in parts)
    else:
        magnitude = weight.dequantize(torch.float64).abs()
    blocks_per_row = inputs // activation_block(fmt) if fmt.endswith("_k") else inputs // 32
    bound = (2 * blocks_per_row + 4) * 2.0**-24 * (rounded.abs() @ magnitude.T)
    assert ((got - want).abs() <= bound).all()
    # A wrong level, scale or sign anywhere would be off by far more.
    assert (got - want).abs().max() < 1e-4 * want.abs().max()


@pytest.mark.parametrize("fmt", FORMATS + ("q4_k", "q6_k", "q5_1"))
@pytest.mark.parametrize("input_op", ["rms_norm", "swiglu", "geglu"])
def test_fused_inputs_and_accumulation_give_the_portable_bits(builds: dict, fmt: str, input_op: str) -> None:
    gen = torch.Generator().manual_seed(7)
    inputs = 256 if fmt in RAW_BLOCK_FORMATS else 128
    if fmt in RAW_BLOCK_FORMATS:
        weight = pack_weight(random_raw_weight(fmt, 44, inputs, gen))
    else:
        weight = pack_weight(quantize(torch.randn(44, inputs, generator=gen), fmt))
    width = inputs if input_op == "rms_norm" else 2 * inputs
    x = torch.randn(6, width, generator=gen)
    norm = 1 + 0.1 * torch.randn(inputs, generator=gen)
    residual = torch.randn(6, 44, generator=gen)
    outs = {}
    for variant, lib in builds.items():
        out = residual.clone()
        native.quant_matmul_into(
            fmt, x, weight.data, weight.scales, weight.mins, None, out,
            input_op=input_op, norm_weight=norm if input_op == "rms_norm" else None, eps=1e-5,
            accumulate=True, lib=lib,
        )
        outs[variant] = out
    for variant, out in outs.items():
        assert torch.equal(out, outs["portable"]), variant
    assert not torch.equal(outs["portable"], residual)


@pytest.mark.parametrize("out_norm", [False, True])
def test_scaled_and_normalised_outputs_give_the_portable_bits(builds: dict, out_norm: bool) -> None:
    # A branch joining the residual stream: Gemma's output norm, Granite's
    # scale (44 columns: a last partial octet).
    gen = torch.Generator().manual_seed(8)
    weight = pack_weight(quantize(torch.randn(44, 128, generator=gen), "q4_0"))
    x = torch.randn(6, 128, generator=gen)
    norm = 1 + 0.1 * torch.randn(44, generator=gen) if out_norm else None
    residual = torch.randn(6, 44, generator=gen)
    outs = {}
    for variant, lib in builds.items():
        out = residual.clone()
        native.quant_matmul_into("q4_0", x, weight.data, weight.scales, None, None, out, accumulate=True,
                                 out_norm=norm, out_scale=0.25, eps=1e-6, lib=lib)
        outs[variant] = out
    for variant, out in outs.items():
        assert torch.equal(out, outs["portable"]), variant


def test_attention_with_head_norms_windows_and_soft_caps_gives_the_portable_bits(builds: dict) -> None:
    """paged_attention.c's steps as Gemma 3 and Gemma 2 use them: q/k head
    norms before RoPE, a window of 5 keys over pages of 4, soft-capped scores."""
    gen = torch.Generator().manual_seed(9)
    heads, kv_heads, dim, page = 4, 2, 16, 4
    tokens = 12
    positions = torch.arange(tokens)
    pages = torch.tensor([[3, 0, 5]])
    write_rows = torch.tensor([
        (pages[0, p // page] * kv_heads + h) * page + p % page for p in range(tokens) for h in range(kv_heads)
    ])
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=gen)
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    angles = torch.outer(torch.arange(tokens).float(), inv).repeat(1, 2)
    q_norm, k_norm = 1 + 0.2 * torch.randn(dim, generator=gen), 1 + 0.2 * torch.randn(dim, generator=gen)
    outs = {}
    for variant, lib in builds.items():
        rows = qkv.clone()
        k_layer = torch.zeros(6 * kv_heads, page, dim)
        v_layer = torch.zeros(6 * kv_heads, page, dim)
        native.rope_write_kv(rows, heads, kv_heads, dim, angles.cos(), angles.sin(), positions, k_layer, v_layer,
                             write_rows, q_norm=q_norm, k_norm=k_norm, eps=1e-6, lib=lib)
        out = torch.empty(tokens, heads * dim)
        native.paged_attention(rows, heads, kv_heads, dim, positions, torch.zeros(tokens, dtype=torch.long), pages,
                               k_layer, v_layer, page, 5, 0.25, out, softcap=0.5, lib=lib)
        outs[variant] = (rows, out)
    for variant, (rows, out) in outs.items():
        assert torch.equal(rows, outs["portable"][0]) and torch.equal(out, outs["portable"][1]), variant


def test_packing_keeps_every_weight_bit() -> None:
    gen = torch.Generator().manual_seed(1)
    for fmt in FORMATS + tuple(RAW_BLOCK_FORMATS):
        for rows in (1, 8, 13, 64):
            if fmt in RAW_BLOCK_FORMATS:
                weight = random_raw_weight(fmt, rows, 512, gen)
            else:
                weight = quantize(torch.randn(rows, 96, generator=gen), fmt)
            packed = pack_weight(weight)
            assert packed.shape == weight.shape
            back = packed.unpacked()
            assert torch.equal(back.data, weight.data)
            for part in ("scales", "mins"):
                mine, theirs = getattr(back, part), getattr(weight, part)
                assert (mine is None) == (theirs is None)
                assert mine is None or torch.equal(mine, theirs)
            ids = torch.tensor([0, rows - 1])
            assert torch.equal(take_rows(packed, ids), weight.dequantize()[ids])


def test_a_packed_weight_with_a_wrong_shape_is_refused() -> None:
    packed = pack_weight(quantize(torch.randn(16, 64), "q4_1"))
    with pytest.raises(ValueError, match="octets"):
        PackedQuantizedTensor("q4_1", packed.data, packed.scales, packed.mins, rows=17)
    with pytest.raises(ValueError, match="scales"):
        PackedQuantizedTensor("q4_1", packed.data, packed.scales[:, :1], packed.mins, rows=16)
