"""Every build of the quantized CPU kernels computes the same bits.

engine/kernels/native/quant_matmul.c defines one order of arithmetic per
output element; the portable C and each SIMD build (AVX2, AVX-VNNI,
AVX-512 VNNI) must follow it exactly, so that which machine a reply was
computed on, like which batch it was computed in, never changes it. Every
variant is compiled here; the ones this CPU can run are compared with the
portable build bit for bit, on shapes on both sides of each tile size (4
rows of x, 2 octets of 8 output columns, blocks of 4 octets), of the
last partial octet and of the octet size from which tiles of 2 or 3 rows
take two octets. The raw GGUF formats (q4_k ... q5_1) are also checked
against a float64 reference of the same arithmetic.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
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
from tests.engine import ggml_math

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
    [(1, 8, 32), (3, 52, 96), (4, 37, 64), (5, 16, 128), (9, 70, 256), (33, 136, 96), (130, 40, 64),
     # Under 4 rows the AVX2 tiles take two octets only where an octet's
     # groups are 8 KB or more (TWO_STREAMS_BYTES): q4_0 / q4_1 from 2048
     # inputs, q8_0 from 1024; one side and the other.
     (2, 44, 2048), (3, 40, 1984),
     # q8_0's AVX2 tile of 4 rows takes octets in pairs: 44 columns end on
     # a pair whose second octet is partial (a block of 2 octets after one of 4).
     (6, 44, 64)],
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
    # A row alone (the SIMD builds' one-row tiles, compiled per format) has
    # the bits it has in the batch.
    alone = native.quant_matmul(fmt, x[-1:], packed.data, packed.scales, packed.mins, bias, rows=cols)
    assert torch.equal(alone[0], outs["portable"][-1])


# Rows of x, output columns and inputs on both sides of the tiles (4 rows,
# octets of 8 columns, blocks of 4 octets), of a K-quant super-block, and of
# the 5-bit levels kept for later passes (from 8 rows: two whole passes).
RAW_SHAPES = [(1, 8, 256), (3, 52, 512), (4, 37, 256), (5, 16, 768), (8, 44, 256), (9, 70, 256), (33, 136, 512)]


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


def _input_levels(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x's blocks as the kernel quantizes them (ggml-cpu's quantize_row_q8_0
    per 32, q8_K per 256): levels x * (127 / max|x|) rounded half to even,
    and the block's fp32 scale, max|x| / 127 (q8_0) or 1 / (127 / max|x|)
    (q8_K). 127 / max is a true float32 division: torch's `127 / tensor`
    is 127 * (1 / tensor), an ulp off for a quarter of all values."""
    blocks = x.reshape(x.shape[0], -1, block)
    amax = blocks.abs().amax(-1, keepdim=True)
    inverse = torch.where(amax > 0, amax.new_tensor(127.0) / amax, torch.zeros_like(amax))
    if block == 256:
        scale = torch.where(amax > 0, 1 / inverse, torch.zeros_like(amax))
    else:
        scale = amax / 127
    return torch.round(blocks * inverse).clamp(-127, 127), scale


def _rounded_inputs(x: torch.Tensor, block: int) -> torch.Tensor:
    """x as the kernel quantizes it, back in float64 (a q8_0 block's scale in
    fp16, ggml's block_q8_0.d: the levels from fp32, the products in fp16)."""
    levels, scale = _input_levels(x, block)
    if block != 256:
        scale = scale.half().float()
    return (levels.double() * scale.double()).reshape(x.shape)


def _scaled_sums(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per block of 32: what a q4_1 / q5_1 weight's min multiplies in the
    kernel, fp16(fp32 scale * level sum) (ggml's block_q8_1.s), and what it
    multiplies in `_rounded_inputs(x, 32) @ w`, fp16(scale) * level sum."""
    levels, scale = _input_levels(x, 32)
    sums = levels.sum(-1, keepdim=True)
    return (scale * sums).half().double().squeeze(-1), (scale.half().double() * sums.double()).squeeze(-1)


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
    if fmt == "q5_1":  # each block's min times the block's fp16 scaled sum
        kernel_sums, rounded_sums = _scaled_sums(x)
        mins = weight.data.view(-1, RAW_BLOCK_FORMATS[fmt][1])[:, 2:4].contiguous().view(torch.float16)
        want = want + (kernel_sums - rounded_sums) @ mins.view(cols, -1).double().T
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


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("window", [5, None])
@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim"),
    # GQA groups of 1 to 5 query heads; the AVX2 value sums take 4 rows x
    # 16 dimensions or 2 x 32 at a time, then 16, then one by one.
    [(4, 2, 16), (4, 2, 48), (6, 2, 40), (3, 3, 16), (8, 2, 16), (10, 2, 24)],
)
def test_attention_with_head_norms_windows_and_soft_caps_gives_the_portable_bits(
    builds: dict, kv_dtype: torch.dtype, window: int | None, heads: int, kv_heads: int, dim: int
) -> None:
    """paged_attention.c's steps as Gemma 3 and Gemma 2 use them: q/k head
    norms before RoPE, a window of 5 keys (or all 12: blocks of 8 keys and
    a tail) over pages of 4, soft-capped scores; the cache in float32 or fp16."""
    gen = torch.Generator().manual_seed(9)
    page = 4
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
        k_layer = torch.zeros(6 * kv_heads, page, dim, dtype=kv_dtype)
        v_layer = torch.zeros(6 * kv_heads, page, dim, dtype=kv_dtype)
        native.rope_write_kv(rows, heads, kv_heads, dim, angles.cos(), angles.sin(), positions, k_layer, v_layer,
                             write_rows, q_norm=q_norm, k_norm=k_norm, eps=1e-6, lib=lib)
        out = torch.empty(tokens, heads * dim)
        native.paged_attention(rows, heads, kv_heads, dim, positions, torch.zeros(tokens, dtype=torch.long), pages,
                               k_layer, v_layer, page, window, 0.25, out, softcap=0.5, lib=lib)
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


# The rounding of a product's inputs, pinned to ggml-cpu's (quantize_row_q8_0
# / q8_1 / q8_K): level = x * (127 / max|x|) in float32, rounded half to
# even. Inputs on exact ties tell the rule apart from its near neighbours:
# 1 / (max / 127) (an ulp off 127 / max for some max) and half away from
# zero (C's roundf). After the first RMSNorm of a q8_0 embedding table
# hundreds of a prefill's inputs sit on such ties, and a rule an ulp apart
# moved the default model's Q4_K_M perplexity 1.5% from llama.cpp's.


def _levels(x: np.ndarray, rule: str) -> np.ndarray:
    """float32 blocks x [..., n] to levels by `rule`, in numpy's IEEE float32."""
    amax = np.abs(x).max(-1, keepdims=True)
    if rule == "127/max, half-even":
        return np.rint(x * (np.float32(127) / amax))
    if rule == "1/(max/127), half-even":
        return np.rint(x * (np.float32(1) / (amax / np.float32(127))))
    scaled = x * (np.float32(127) / amax)  # "127/max, half away from zero"
    return np.sign(scaled) * np.floor(np.abs(scaled) + np.float32(0.5))


RULES = ("127/max, half-even", "1/(max/127), half-even", "127/max, half away from zero")


def _tie_block(n: int, seed: int) -> np.ndarray:
    """n float32 inputs, the first the block's max: the rest are exact ties
    of x * fl(127 / max) that 1 / (max / 127) rounds the other way, and
    ties of +-(k + 1/2) at max 127 (where 127 / max is 1)."""
    f = np.float32
    rng = np.random.default_rng(seed)
    while True:
        amax = f(rng.uniform(0.5, 4.0))
        inverse = f(127) / amax
        other = f(1) / (amax / f(127))
        ties = []
        for k in range(1, 126):
            x = f((k + 0.5) / float(inverse))
            for candidate in (x, np.nextafter(x, f(0)), np.nextafter(x, f(amax))):
                if candidate * inverse == f(k + 0.5) and np.rint(candidate * other) != np.rint(candidate * inverse):
                    ties.append(candidate)
                    break
        if len(ties) >= 8:
            break
    block = np.resize(np.array(ties, dtype=np.float32), n)
    block[::2] *= -1
    block[0] = amax
    return block


def _tie_rows(rows: int, block: int) -> np.ndarray:
    """Rows of two blocks each: tie blocks, one of them with max 127."""
    x = np.stack([np.concatenate([_tie_block(block, 2 * r), _tie_block(block, 2 * r + 1)]) for r in range(rows)])
    halves = np.arange(block, dtype=np.float32) % 127 + np.float32(0.5)  # +-(k + 1/2) ...
    x[0, :block] = np.where(np.arange(block) % 2 == 0, halves, -halves)
    x[0, 0] = np.float32(127)  # ... at max 127: x * (127 / max) is x itself
    for rule in RULES[1:]:  # the ties tell every other rule apart
        assert (_levels(x.reshape(rows, 2, block), rule) != _levels(x.reshape(rows, 2, block), RULES[0])).any(), rule
    return x


def _identity_q4_k(n: int) -> QuantizedTensor:
    """q4_k blocks of an n x n identity: d 1, dmin 0, every sub-block scale
    1 and min 0, level 1 at the diagonal, so output j is the kernel's
    rounded input j (its q8_K scale times its level)."""
    blocks = torch.zeros(n, n // 256, 144, dtype=torch.uint8)
    blocks[:, :, 0:2] = torch.tensor([1.0], dtype=torch.float16).view(torch.uint8)
    blocks[:, :, 4:8] = 1  # sub-blocks 0-3: scale 1, min 0 (bytes 8-11)
    blocks[:, :, 12:16] = 1  # sub-blocks 4-7: scale 1 (low nibbles), min 0
    for j in range(n):
        pair, within = divmod(j % 256, 64)
        blocks[j, j // 256, 16 + 32 * pair + within % 32] = 1 if within < 32 else 0x10
    return QuantizedTensor("q4_k", blocks.view(n, -1))


def test_q8_0_inputs_round_as_ggml_on_ties(builds: dict) -> None:
    """quantize_row (q8_0 / q5_0 / q4_* / q5_1 products): through an
    identity weight, output j is input j's level times its block's fp16
    scale, exactly."""
    x = _tie_rows(5, 32)
    blocks = x.reshape(5, 2, 32)
    scale = torch.from_numpy(np.abs(blocks).max(-1, keepdims=True) / np.float32(127)).half().double()
    weight = QuantizedTensor("q8_0", torch.eye(64, dtype=torch.int8), torch.ones(64, 2, dtype=torch.float16))
    packed = pack_weight(weight)
    want = {rule: (torch.from_numpy(_levels(blocks, rule)).double() * scale).view(5, 64) for rule in RULES}
    for variant, lib in builds.items():
        got = native.quant_matmul("q8_0", torch.from_numpy(x), packed.data, packed.scales, None, None, rows=64, lib=lib)
        assert torch.equal(got.double(), want[RULES[0]]), variant
        assert not any(torch.equal(got.double(), want[rule]) for rule in RULES[1:])


def test_q8_k_inputs_round_as_ggml_on_ties(builds: dict) -> None:
    """quantize_row_super (the K-quant products): output j of an identity
    q4_k weight is input j's level times its super-block's scale
    1 / (127 / max), rounded once to float32."""
    x = _tie_rows(3, 256)
    blocks = x.reshape(3, 2, 256)
    scale = np.float32(1) / (np.float32(127) / np.abs(blocks).max(-1, keepdims=True))
    weight = _identity_q4_k(512)
    assert torch.equal(weight.dequantize(), torch.eye(512))
    packed = pack_weight(weight)
    want = {rule: torch.from_numpy((_levels(blocks, rule) * scale).reshape(3, 512)) for rule in RULES}
    for variant, lib in builds.items():
        got = native.quant_matmul("q4_k", torch.from_numpy(x), packed.data, None, None, None, rows=512, lib=lib)
        assert torch.equal(got, want[RULES[0]]), variant
        assert not any(torch.equal(got, want[rule]) for rule in RULES[1:])


def test_q4_1_mins_take_ggml_q8_1_scaled_sums(builds: dict) -> None:
    """A q4_1 / q5_1 block's min multiplies fp16(fp32 scale * level sum), as
    block_q8_1.s holds it, not fp16(scale) * level sum: with every weight
    scale 0 and min 1, each output is the row's two scaled sums added."""
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(6, 64, generator=gen)
    x[:, 5] = 3.0  # the sums are far from 0, where fp16 rounding shows
    weight = QuantizedTensor("q4_1", torch.zeros(16, 32, dtype=torch.uint8), torch.zeros(16, 2, dtype=torch.float16),
                             torch.ones(16, 2, dtype=torch.float16))
    packed = pack_weight(weight)
    kernel_sums, rounded_sums = _scaled_sums(x)
    want = (kernel_sums[:, 0].float() + kernel_sums[:, 1].float())[:, None].expand(6, 16)
    other = (rounded_sums[:, 0].float() + rounded_sums[:, 1].float())[:, None].expand(6, 16)
    assert not torch.equal(want, other)
    for variant, lib in builds.items():
        got = native.quant_matmul("q4_1", x, packed.data, packed.scales, packed.mins, None, rows=16, lib=lib)
        assert torch.equal(got, want), variant


def test_fma32_rounds_once() -> None:
    """The tests' float32 fused multiply-add against exact rational arithmetic,
    on random triples and on sums that land on a float32 tie in float64."""
    gen = np.random.default_rng(3)
    a = gen.standard_normal(3000).astype(np.float32)
    b = gen.standard_normal(3000).astype(np.float32)
    c = (gen.standard_normal(3000) * 10.0 ** gen.integers(-8, 8, 3000)).astype(np.float32)
    # c = -(a * b rounded to float32) + half an ulp of it: exact sums a hair off a tie
    c[:1000] = -(a[:1000] * b[:1000]).astype(np.float32)
    got = ggml_math.fma32(a, b, c)
    for i in range(3000):
        exact = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
        assert got[i] == np.float32(_round_to_float32(exact)), i


def _round_to_float32(value: Fraction) -> float:
    """value rounded to the nearest float32 (ties to even), as a Python float."""
    low = float(np.float32(float(value)))  # within an ulp of the answer
    candidates = {np.float32(low), np.nextafter(np.float32(low), np.float32(np.inf)),
                  np.nextafter(np.float32(low), np.float32(-np.inf))}
    best = min(candidates, key=lambda f: (abs(Fraction(float(f)) - value), int(np.float32(f).view(np.uint32)) & 1))
    return float(best)


def _every_build_gates_to_the_bit(builds: dict, op: str, gate: torch.Tensor, up: torch.Tensor,
                                  want: np.ndarray) -> None:
    """Each build's fused gated input (`op`) equals `want` bit for bit, at 61
    inputs (a tail of 5 past the 8-lane loop) and 56 (none)."""
    for variant, lib in builds.items():
        for width in (61, 56):
            got = native.prepare_rows(op, torch.cat([gate[:, :width], up[:, :width]], 1), lib=lib)
            assert np.array_equal(got.numpy().view(np.uint32), want[:, :width].view(np.uint32)), (variant, width)


def test_swiglu_is_ggml_silu_to_the_bit(builds: dict) -> None:
    """The fused SwiGLU computes e^ as ggml_v_expf (ggml-cpu's AVX2 SiLU),
    every build to the bit, at widths with and without a tail of under 8
    inputs, on gates over the whole range: both far branches (|n| > 126,
    > 192: gates beyond about 87 and 133), 0 and -0, overflow to inf."""
    gen = torch.Generator().manual_seed(12)
    gate = torch.cat([
        torch.randn(2, 61, generator=gen) * 4,
        torch.linspace(-200, 200, 122).view(2, 61),
        torch.tensor([[0.0, -0.0, 1e-30, -1e-30, 87.0, -87.0, 88.5, -88.5, 103.9, -104.5, 133.0, -133.5, 150.0]
                      + [1.0] * 48] * 2),
    ])
    up = torch.randn(gate.shape, generator=gen)
    want = ggml_math.swiglu(gate.numpy(), up.numpy())
    _every_build_gates_to_the_bit(builds, "swiglu", gate, up, want)
    # ggml's exp is within two ulp of e^x where the result is a normal float
    x = np.linspace(-87, 88, 200001).astype(np.float32)
    ulps = np.abs(ggml_math.exp_ggml(x).astype(np.float64) - np.exp(x.astype(np.float64))) / np.spacing(
        np.exp(x.astype(np.float64)).astype(np.float32)).astype(np.float64)
    assert ulps.max() <= 2.0


def test_rms_norm_input_sums_squares_in_order(builds: dict) -> None:
    """The fused RMSNorm: float32 squares summed in double in input order,
    1 / sqrtf(mean + eps), then x * inv * weight, every build to the bit."""
    gen = torch.Generator().manual_seed(13)
    x = torch.randn(5, 587, generator=gen) * torch.logspace(-3, 3, 587)
    weight = 1 + 0.1 * torch.randn(587, generator=gen)
    xs = x.numpy()
    squares = np.cumsum((xs * xs).astype(np.float64), axis=1)[:, -1:]  # cumsum: in order
    inv = np.float32(1) / np.sqrt((squares / 587).astype(np.float32) + np.float32(1e-5)).astype(np.float32)
    want = (xs * inv * weight.numpy()).astype(np.float32)
    for variant, lib in builds.items():
        got = native.prepare_rows("rms_norm", x, norm_weight=weight, eps=1e-5, lib=lib)
        assert np.array_equal(got.numpy().view(np.uint32), want.view(np.uint32)), variant


@pytest.mark.parametrize("rows, n", [(1, 5), (3, 8), (2, 61), (16, 49152), (1, 49153)])
def test_argmax_rows_answers_as_torch(builds: dict, rows: int, n: int) -> None:
    """Greedy decoding's native argmax: torch.argmax(dim=1)'s answer (first
    index of the largest value, the first NaN where there is one), on rows
    under one vector, with a tail, and over the threads' threshold."""
    gen = torch.Generator().manual_seed(14)
    logits = torch.randn(rows, n, generator=gen)
    cases = [logits]
    tied = logits.clone()
    tied[:, n // 2] = tied[:, -1] = tied[:, 0] = 100.0  # ties: the first index wins
    cases.append(tied)
    flat = torch.full((rows, n), -torch.inf)  # every value -inf: index 0
    cases.append(flat)
    with_nan = logits.clone()
    with_nan[:, -1] = torch.nan
    with_nan[0, n // 3] = torch.nan
    with_nan[-1, n - 1 - n // 4] = torch.inf
    cases.append(with_nan)
    late = logits.clone()
    late[:, -1] = torch.inf  # the largest in the tail past the last vector
    cases.append(late)
    wide = torch.randn(rows, n + 3, generator=gen)[:, :n]  # rows at a stride
    cases.append(wide)
    for case in cases:
        want = case.argmax(dim=1)
        for variant, lib in builds.items():
            assert torch.equal(native.argmax_rows(case, lib=lib), want), variant


def test_geglu_is_gelu_tanh_through_ggml_exp(builds: dict) -> None:
    """The fused GeGLU (Gemma): gelu_tanh(x) = x / (1 + e^(-2u)), e^ as in
    the SwiGLU, every build to the bit, tails included, and within a few
    float32 roundings of it in float64 (the same function as 0.5 x (1 +
    tanh(u)), which float64 rounds to 0 far below zero)."""
    gen = torch.Generator().manual_seed(15)
    gate = torch.cat([torch.randn(2, 61, generator=gen) * 3, torch.linspace(-60, 60, 122).view(2, 61)])
    up = torch.randn(gate.shape, generator=gen)
    want = ggml_math.geglu(gate.numpy(), up.numpy())
    _every_build_gates_to_the_bit(builds, "geglu", gate, up, want)
    x, u = gate.double().numpy(), up.double().numpy()
    inner = 0.7978845608028654 * (x + 0.044715 * x**3)
    with np.errstate(over="ignore"):
        exact = x / (1 + np.exp(-2 * inner)) * u
    # float32's rounding of u, times |2u|, carries into e^(-2u) below zero
    assert np.all(np.abs(want - exact) <= (8 + 4 * np.abs(inner)) * 2.0**-23 * np.abs(exact) + 1e-37)
    assert np.allclose(want, 0.5 * x * (1 + np.tanh(0.7978845608028654 * (x + 0.044715 * x**3))) * u, atol=1e-6)
