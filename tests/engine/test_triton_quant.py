"""The Triton quantized matmul against x @ dequantize().T, on the CPU, in Triton's interpreter.

As in test_triton_kernels.py: TRITON_INTERPRET=1 must be set before triton is
first imported. When triton (or engine.kernels.triton.quant) was imported earlier in
this process without it, the in-process tests skip and one test runs this
module in a fresh interpreter process instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_previous_interpret = os.environ.get("TRITON_INTERPRET")
os.environ["TRITON_INTERPRET"] = "1"

import gguf  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

triton = pytest.importorskip(
    "triton",
    reason="triton is not installed (pip install -e '.[test]'): the CUDA kernels cannot be checked",
)
import triton.language as tl  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from engine.kernels.triton import quant as triton_quant  # noqa: E402
from engine.model.quant import FORMATS, QuantizedTensor, quantize  # noqa: E402
from engine.model.quant_formats import RAW_BLOCK_FORMATS  # noqa: E402
from engine.kernels.triton.quant import TritonQuantLinear, triton_quant_available  # noqa: E402

if _previous_interpret is None:
    del os.environ["TRITON_INTERPRET"]
else:
    os.environ["TRITON_INTERPRET"] = _previous_interpret

INTERPRETED = isinstance(tl.standard.max, InterpretedFunction) and triton_quant._INTERPRETED
in_process = pytest.mark.skipif(
    not INTERPRETED,
    reason="triton was imported before interpreter mode could be set; "
    "test_quant_kernel_in_a_fresh_interpreter runs these in a child process",
)


@pytest.fixture(autouse=True)
def _interpreter_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # Triton imports parts of itself lazily at the first launch, and those
    # check the variable again.
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def test_quant_kernel_in_a_fresh_interpreter() -> None:
    if INTERPRETED:
        pytest.skip("the kernel runs in this process (the other tests of this module)")
    env = dict(os.environ, TRITON_INTERPRET="1")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__,
         "-k", "not test_quant_kernel_in_a_fresh_interpreter"],
        cwd=Path(__file__).resolve().parents[2], env=env,
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    summary = result.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary, summary


def make_layer(fmt: str, out_features: int, in_features: int, bias: bool, seed: int,
               bias_dtype: torch.dtype = torch.float32):
    gen = torch.Generator().manual_seed(seed)
    weight = quantize(torch.randn(out_features, in_features, generator=gen), fmt)
    b = torch.randn(out_features, generator=gen).to(bias_dtype) if bias else None
    return TritonQuantLinear(weight, b), weight, b


def reference(x: torch.Tensor, weight, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 x @ W.T (+ bias), and |x| @ |W|.T: the scale of the summation error."""
    w = weight.dequantize()
    want = x.float() @ w.T
    if bias is not None:
        want = want + bias.float()
    return want, x.float().abs() @ w.abs().T


# N a multiple of no N block (16, 32 or 64); K shorter than a K step (32 to
# 256 by path), ending within one, and spanning several.
SHAPES = [(40, 64), (70, 96), (24, 256)]


@in_process
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("rows", [1, 3, 17])
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_fp32_matches_dequantized_product(fmt: str, shape: tuple[int, int], rows: int, bias: bool) -> None:
    out_features, in_features = shape
    layer, weight, b = make_layer(fmt, out_features, in_features, bias, seed=rows * 7 + in_features)
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(rows))
    got = layer(x)
    want, magnitude = reference(x, weight, b)
    assert got.dtype == torch.float32 and got.shape == (rows, out_features)
    # fp32 products and sums on both sides: only the summation order differs.
    error = (got - want).abs()
    assert (error <= 1e-5 * magnitude + 1e-6).all(), f"max error {error.max().item():.3g}"


@in_process
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("rows", [2, 17])
def test_16bit_inputs_round_once(fmt: str, dtype: torch.dtype, rows: int) -> None:
    layer, weight, b = make_layer(fmt, 40, 96, bias=True, seed=3, bias_dtype=dtype)
    x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(5)).to(dtype)
    got = layer(x)
    want, magnitude = reference(x, weight, b)
    assert got.dtype == dtype and got.shape == (rows, 40)
    # The fp32 result rounded once to x's dtype: within one unit in the last place.
    ulp = torch.finfo(dtype).eps * want.abs()
    error = (got.float() - want).abs()
    assert (error <= ulp + 1e-5 * magnitude + 1e-6).all(), f"max error {error.max().item():.3g}"


@in_process
def test_several_row_blocks_and_leading_dims() -> None:
    # 70 rows: two 64-row blocks, the second mostly masked; input [2, 35, K].
    layer, weight, b = make_layer("q4_1", 24, 64, bias=True, seed=11)
    x = torch.randn(2, 35, 64, generator=torch.Generator().manual_seed(12))
    got = layer(x)
    assert got.shape == (2, 35, 24)
    want, magnitude = reference(x.reshape(70, 64), weight, b)
    error = (got.reshape(70, 24) - want).abs()
    assert (error <= 1e-5 * magnitude + 1e-6).all(), f"max error {error.max().item():.3g}"


@in_process
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("tile_rows", [2, 16])  # the decode path and the tl.dot path
def test_tiled_rows_do_not_depend_on_the_batch(fmt: str, tile_rows: int) -> None:
    layer, _, _ = make_layer(fmt, 40, 96, bias=True, seed=21)
    x = torch.randn(19, 96, generator=torch.Generator().manual_seed(22))
    alone = layer.tiled(x[4:5], tile_rows)
    # Row 4 of x at different places in batches of different sizes.
    for start, stop in ((0, 7), (3, 6), (0, 19)):
        rows = layer.tiled(x[start:stop], tile_rows)
        assert rows.shape == (stop - start, 40)
        assert torch.equal(rows[4 - start], alone[0])


@in_process
def test_layer_keeps_the_one_weight_it_is_given() -> None:
    assert triton_quant_available("cpu")  # interpreter mode runs on any device
    layer, weight, _ = make_layer("q4_0", 40, 64, bias=False, seed=31)
    assert (layer.out_features, layer.in_features) == (40, 64)
    assert layer.weight.data.data_ptr() == weight.data.data_ptr()
    assert layer.weight.scales.data_ptr() == weight.scales.data_ptr()
    assert layer.nbytes == weight.nbytes == 40 * 32 + 40 * 2 * 2


# --------------------------------------------------------------------------
# Raw GGUF blocks (q4_k, q5_k, q6_k, q5_0, q5_1), against gguf-py's dequantize

GGUF_TYPES = {"q4_k": gguf.GGMLQuantizationType.Q4_K, "q5_k": gguf.GGMLQuantizationType.Q5_K,
              "q6_k": gguf.GGMLQuantizationType.Q6_K, "q5_0": gguf.GGMLQuantizationType.Q5_0,
              "q5_1": gguf.GGMLQuantizationType.Q5_1}
# Where each block keeps its float16 d (and dmin or m): random bytes there could be NaN.
FP16_OFFSETS = {"q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208,), "q5_0": (0,), "q5_1": (0, 2)}


def random_blocks(fmt: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """[rows, cols / block * block_bytes] random blocks: every level, high
    bit and 6-bit scale/min pattern occurs, with finite float16 scales of
    both signs."""
    rng = np.random.default_rng(seed)
    block, block_bytes = RAW_BLOCK_FORMATS[fmt]
    blocks = rng.integers(0, 256, (rows * cols // block, block_bytes), dtype=np.uint8)
    for offset in FP16_OFFSETS[fmt]:
        scales = rng.uniform(-1e-2, 1e-2, len(blocks)).astype(np.float16)
        blocks[:, offset : offset + 2] = scales.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def raw_reference(x: torch.Tensor, data: np.ndarray, fmt: str, bias: torch.Tensor | None):
    w = torch.from_numpy(gguf.quants.dequantize(data, GGUF_TYPES[fmt]))
    want = x.float() @ w.T + (0 if bias is None else bias.float())
    return want, x.float().abs() @ w.abs().T


# K: one K-quant super-block, or Q5 blocks ending inside a K step; N ends inside an N tile.
RAW_SHAPES = {"q4_k": (20, 256), "q5_k": (20, 256), "q6_k": (20, 256), "q5_0": (20, 96), "q5_1": (20, 96)}


@in_process
@pytest.mark.parametrize("fmt", list(RAW_BLOCK_FORMATS))
@pytest.mark.parametrize("rows", [1, 5])  # the decode path and the tl.dot path
def test_raw_blocks_match_gguf_dequantized_product(fmt: str, rows: int) -> None:
    out_features, in_features = RAW_SHAPES[fmt]
    data = random_blocks(fmt, out_features, in_features, seed=rows)
    bias = torch.randn(out_features, generator=torch.Generator().manual_seed(2))
    layer = TritonQuantLinear(QuantizedTensor(fmt, torch.from_numpy(data)), bias)
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(rows))
    got = layer(x)
    want, magnitude = raw_reference(x, data, fmt, bias)
    assert got.dtype == torch.float32 and got.shape == (rows, out_features)
    error = (got - want).abs()
    assert (error <= 1e-5 * magnitude + 1e-6).all(), f"max error {error.max().item():.3g}"


@in_process
@pytest.mark.parametrize("fmt", ["q4_k", "q6_k"])
def test_raw_blocks_with_16bit_inputs_round_once(fmt: str) -> None:
    data = random_blocks(fmt, 20, 512, seed=7)
    layer = TritonQuantLinear(QuantizedTensor(fmt, torch.from_numpy(data)))
    x = torch.randn(9, 512, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    got = layer(x)
    want, magnitude = raw_reference(x, data, fmt, None)
    assert got.dtype == torch.bfloat16
    error = (got.float() - want).abs()
    assert (error <= torch.finfo(torch.bfloat16).eps * want.abs() + 1e-5 * magnitude + 1e-6).all()


@in_process
def test_raw_block_rows_do_not_depend_on_the_batch() -> None:
    layer = TritonQuantLinear(QuantizedTensor("q4_k", torch.from_numpy(random_blocks("q4_k", 20, 256, seed=9))))
    x = torch.randn(7, 256, generator=torch.Generator().manual_seed(10))
    alone = layer.tiled(x[4:5], 2)
    for start, stop in ((0, 7), (3, 6)):
        assert torch.equal(layer.tiled(x[start:stop], 2)[4 - start], alone[0])
