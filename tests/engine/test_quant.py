"""Block-quantized weights: formats, the quantized product, and loading
GGUF-imported folders with their weights kept quantized."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from types import SimpleNamespace

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from safetensors.torch import save_file

from engine.formats import loader
from engine.errors import ModelLoadError
from engine.formats.gguf.importer import import_gguf
from engine.model.linear import Linear
from engine.formats.loader import load_model, quantized_copy, quantized_formats, read_weights
from engine.model.quant import (
    FORMATS,
    GROUP_SIZE,
    RAW_BLOCK_FORMATS,
    QuantizedTensor,
    QuantLinear,
    error_bound,
    pack_weight,
    product_error_bound,
    quantize,
    quantized_nbytes,
    random_raw_weight,
    take_rows,
    ConcatLinear, cpu_kernel_available,
)
from engine.runner.cpu import ModelRunner
from engine.core.scheduler import ScheduledChunk, ScheduleResult
from tests.engine.test_gguf_import import TinyModel, write_gguf



def _weight(rows: int = 96, cols: int = 128, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=gen)
    w[0, :GROUP_SIZE] = 0  # an all-zero group: scale 0 must not divide by zero
    w[1, 5] = 40.0  # an outlier stretches its group's scale
    return w


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantize_error_is_within_the_format_bound(fmt: str) -> None:
    w = _weight()
    q = quantize(w, fmt)
    assert q.shape == tuple(w.shape)
    err = (q.dequantize() - w).abs().amax(-1)
    assert (err <= error_bound(q)).all()
    assert q.dequantize()[0, :GROUP_SIZE].eq(0).all()


@pytest.mark.parametrize("fmt", FORMATS)
# Row counts on both sides of the kernel's register tile (4 rows) and of a
# long prefill chunk.
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 16, 127, 300])
def test_quantized_product_is_within_the_format_bound(fmt: str, rows: int) -> None:
    w = _weight()
    q = quantize(w, fmt)
    bias = torch.randn(w.shape[0])
    x = torch.randn(rows, w.shape[1], generator=torch.Generator().manual_seed(1))
    x[0, 3] = 25.0  # an input outlier coarsens its group's int8 step
    got = QuantLinear(q, bias)(x)
    # Against the original float weight: the weights' rounding plus, on the
    # kernel's path, the inputs' rounding to int8 groups.
    err = (got - (x @ w.T + bias)).abs()
    assert (err <= product_error_bound(x, q)).all()
    # Against the weight as stored: only the inputs' rounding remains.
    exact = (got - (x @ q.dequantize().T + bias)).abs()
    assert (exact <= product_error_bound(x, q, exact_weights=True)).all()


def test_the_kernel_rounds_inputs_like_llama_cpp() -> None:
    # A one-hot input is level 127 of its int8 group, whose scale the
    # product uses in fp16 as ggml's block_q8_0 keeps it: fp16(1/127), not
    # 1/127. The product then reads the weight's levels back: -127..127 of
    # q8_0 must survive, each times that input.
    levels = torch.tensor([-127, -128 + 1, -16, -1, 0, 1, 15, 16, 127], dtype=torch.int8)
    data = levels.repeat(64)[: 2 * 128].view(2, 128)
    q = QuantizedTensor("q8_0", data, torch.full((2, 4), 0.5, dtype=torch.float16))
    layer = QuantLinear(q)
    one = 127 * float(torch.tensor(1 / 127).half())
    assert one != 1.0
    for rows in torch.eye(128).split(8):  # the kernel's path
        torch.testing.assert_close(layer(rows), (rows * one) @ q.dequantize().T, atol=1e-6, rtol=1e-6)


def test_rows_that_are_not_a_multiple_of_the_kernel_block_are_computed() -> None:
    q = quantize(_weight(rows=37), "q4_1")
    x = torch.randn(3, 128)
    got = QuantLinear(q)(x)
    assert got.shape == (3, 37)
    assert ((got - x @ q.dequantize().T).abs() <= product_error_bound(x, q, exact_weights=True)).all()


def _kept_weight(fmt: str, rows: int = 96, cols: int = 256, seed: int = 0) -> QuantizedTensor:
    """A weight in any kept format: quantized floats, or random raw GGUF blocks."""
    if fmt in RAW_BLOCK_FORMATS:
        return random_raw_weight(fmt, rows, cols, torch.Generator().manual_seed(seed))
    return quantize(_weight(rows, cols, seed), fmt)


@pytest.mark.parametrize("fmt", FORMATS + tuple(RAW_BLOCK_FORMATS))
def test_tiled_product_does_not_depend_on_the_batch(fmt: str) -> None:
    layer = QuantLinear(_kept_weight(fmt))
    x = torch.randn(21, 256, generator=torch.Generator().manual_seed(2))
    together = layer.tiled(x, 16)
    chunks = torch.cat([layer(x[:5]), layer(x[5:12]), layer(x[12:])])
    assert torch.equal(chunks, together)
    for i in (0, 7, 20):
        assert torch.equal(layer.tiled(x[i : i + 1], 16)[0], together[i])


def test_embedding_rows_are_the_dequantized_rows() -> None:
    for fmt in FORMATS + tuple(RAW_BLOCK_FORMATS):
        q = _kept_weight(fmt)
        ids = torch.tensor([[3, 0], [95, 3]])
        torch.testing.assert_close(take_rows(q, ids), q.dequantize()[ids], atol=0, rtol=0)
        torch.testing.assert_close(q.take_rows(ids), q.dequantize()[ids], atol=0, rtol=0)
        torch.testing.assert_close(take_rows(pack_weight(q), ids), q.dequantize()[ids], atol=0, rtol=0)


GGML_TYPES = {"q4_k": Q.Q4_K, "q5_k": Q.Q5_K, "q6_k": Q.Q6_K, "q5_0": Q.Q5_0, "q5_1": Q.Q5_1}


def _blocks_with_every_scale(fmt: str, rng: np.random.Generator) -> np.ndarray:
    """Random `fmt` blocks (uint8 [n, block bytes]) whose scales take every
    value at every position: q4_K / q5_K's eight 6-bit scales and mins
    (packed across the 12 bytes: the first four and last four sit on
    either side of the packing boundary), q6_K's sixteen int8 scales. The
    fp16 d (and dmin, m) are any finite bit pattern (subnormals, zeros and
    negatives included); every other byte is random."""
    _, block_bytes = RAW_BLOCK_FORMATS[fmt]
    count = {"q4_k": 64, "q5_k": 64, "q6_k": 256}.get(fmt, 64)
    blocks = rng.integers(0, 256, (count, block_bytes), dtype=np.uint8)
    index = np.arange(count)[:, None]
    if fmt in ("q4_k", "q5_k"):
        sc = (index + 5 * np.arange(8)) % 64
        mn = (63 - index + 7 * np.arange(8)) % 64
        packed = np.empty((count, 12), dtype=np.int64)
        packed[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
        packed[:, 4:8] = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
        packed[:, 8:12] = (sc[:, 4:] & 15) | ((mn[:, 4:] & 15) << 4)
        blocks[:, 4:16] = packed
    if fmt == "q6_k":
        blocks[:, 192:208] = ((index + 37 * np.arange(16)) % 256).astype(np.uint8)
    halves = {"q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208,), "q5_0": (0,), "q5_1": (0, 2)}[fmt]
    for offset in halves:
        bits = rng.integers(0, 1 << 16, count, dtype=np.uint16)
        bits[(bits & 0x7C00) == 0x7C00] ^= 0x4000  # no infinities or NaNs
        bits[:4] = [0x0000, 0x8000, 0x0001, 0x83FF]  # zeros and subnormals
        blocks[:, offset : offset + 2] = bits.view(np.uint8).reshape(-1, 2)
    return blocks


@pytest.mark.parametrize("fmt", list(RAW_BLOCK_FORMATS))
def test_raw_blocks_dequantize_as_gguf_py_does(fmt: str) -> None:
    weights, block_bytes = RAW_BLOCK_FORMATS[fmt]
    blocks = _blocks_with_every_scale(fmt, np.random.default_rng(len(fmt) + block_bytes))
    rows = 8  # several blocks a row: the boundaries between blocks too
    data = blocks.reshape(rows, -1)
    want = torch.from_numpy(gguf.quants.dequantize(data, GGML_TYPES[fmt]))
    q = QuantizedTensor(fmt, torch.from_numpy(data))
    ids = torch.arange(rows)
    for got in (q.dequantize(), take_rows(q, ids), take_rows(pack_weight(q), ids)):
        assert got.dtype == torch.float32 and got.shape == want.shape
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))


@pytest.mark.parametrize("fmt", list(RAW_BLOCK_FORMATS))
def test_raw_blocks_are_kept_at_their_file_size(fmt: str) -> None:
    weights, block_bytes = RAW_BLOCK_FORMATS[fmt]
    q = _kept_weight(fmt, rows=13, cols=512)
    assert q.shape == (13, 512)
    assert q.nbytes == quantized_nbytes(fmt, 13 * 512) == 13 * 512 // weights * block_bytes
    # Packed for the kernel: the same bytes (plus the last octet's padding rows).
    assert pack_weight(q).nbytes == 16 * 512 // weights * block_bytes


def test_inconsistent_quantized_tensor_is_refused() -> None:
    with pytest.raises(ValueError, match="scales"):
        QuantizedTensor("q4_0", torch.zeros(4, 32, dtype=torch.uint8), torch.zeros(4, 3, dtype=torch.float16))
    with pytest.raises(ValueError, match="mins"):
        QuantizedTensor("q4_1", torch.zeros(4, 16, dtype=torch.uint8), torch.zeros(4, 1, dtype=torch.float16))
    with pytest.raises(ValueError, match="whole 144-byte blocks"):
        QuantizedTensor("q4_k", torch.zeros(4, 145, dtype=torch.uint8))
    with pytest.raises(ValueError, match="inside its blocks"):
        QuantizedTensor("q6_k", torch.zeros(4, 210, dtype=torch.uint8), torch.zeros(4, 8, dtype=torch.float16))


# --------------------------------------------------------------------------
# GGUF files through the importer and the loader


def _logits(model, ids: list[int]) -> torch.Tensor:
    runner = ModelRunner(model, model.new_kv_cache(8, 4))
    seq = SimpleNamespace(token_ids=ids, pages=list(range(8)), sampler=None)
    chunk = ScheduledChunk(seq, 0, len(ids))  # type: ignore[arg-type]
    hidden, _, _ = runner.forward(ScheduleResult(decodes=[], prefills=[chunk]))
    return model.logits(hidden)


def assert_same_model(kernel: torch.Tensor, reference: torch.Tensor, *, cosine_bound: float = 0.999) -> None:
    """Logits of the quantized kernels against the same weights run in float.
    The kernels round every product's inputs to int8 groups (a relative
    error of ~0.2% per input), so they agree closely but not exactly; a
    wrong layout, scale or offset anywhere gives unrelated logits."""
    cosine = torch.nn.functional.cosine_similarity(kernel, reference, dim=-1)
    assert cosine.min() > cosine_bound, cosine
    assert (kernel - reference).abs().max() <= 0.05 * reference.abs().max()


# Q6_K is left to the product tests (tests/engine/test_quant_kernels.py):
# random Q6_K blocks (int8 scales up to 127) make weights ~10x those of a real
# file, a model whose attention flips on rounding noise.
@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q5_0], ids=lambda q: q.name)
def test_gguf_weights_run_quantized(tmp_path: Path, qtype: Q) -> None:
    k_quant = qtype == Q.Q4_K
    hidden = 256 if k_quant else 64  # K-quants need rows of 256
    tiny = TinyModel(hidden=hidden, ffn=hidden, tied=qtype != Q.Q4_0)
    write_gguf(tmp_path / "m.gguf", tiny, qtype=qtype)
    folder = import_gguf(tmp_path / "m.gguf", tmp_path / "out")
    assert quantized_formats(folder)
    dequantized = load_model(folder, "cpu", "float32", quantized="dequantize")
    kept = load_model(folder, "cpu", "float32")  # "auto": the kernels, where they build
    assert isinstance(dequantized.layers[0].qkv, Linear)
    assert isinstance(kept.layers[0].qkv, QuantLinear)
    assert isinstance(kept.lm_head, QuantLinear)
    assert isinstance(kept.embed, QuantizedTensor)
    rng = random.Random(0)
    ids = [rng.randrange(tiny.hidden) for _ in range(9)]
    # The same weights, exactly represented: only the inputs' rounding and
    # summation order differ. K-quant products round inputs per 256 (as
    # llama.cpp's q8_K), coarser than per 32.
    assert_same_model(_logits(kept, ids), _logits(dequantized, ids), cosine_bound=0.998 if k_quant else 0.999)


def test_unknown_quantized_compute_is_refused(tmp_path: Path) -> None:
    write_gguf(tmp_path / "m.gguf", TinyModel(), qtype=Q.Q8_0)
    folder = import_gguf(tmp_path / "m.gguf", tmp_path / "out")
    with pytest.raises(ModelLoadError, match="quantized compute"):
        load_model(folder, "cpu", "float32", quantized="fastest")


def test_folder_of_an_unknown_quantization_version_is_refused(tmp_path: Path) -> None:
    write_gguf(tmp_path / "m.gguf", TinyModel(), qtype=Q.Q4_1)
    folder = import_gguf(tmp_path / "m.gguf", tmp_path / "out")
    config = json.loads((folder / "config.json").read_text())
    config["quantization"]["version"] = 99
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="import the GGUF file again"):
        load_model(folder, "cpu", "float32")


def test_old_dequantized_import_still_loads(tmp_path: Path) -> None:
    # Importer version 1 wrote every tensor as float32 and no quantization section.
    write_gguf(tmp_path / "m.gguf", TinyModel(), qtype=Q.Q4_1)
    folder = import_gguf(tmp_path / "m.gguf", tmp_path / "out")
    kept = load_model(folder, "cpu", "float32", quantized="kernel")
    save_file({name: t.contiguous() for name, t in read_weights(folder).items()}, str(folder / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    del config["quantization"]
    (folder / "config.json").write_text(json.dumps(config))
    old = load_model(folder, "cpu", "float32", quantized="kernel")
    assert isinstance(old.layers[0].qkv, Linear)
    ids = [5, 9, 2, 33]
    assert_same_model(_logits(kept, ids), _logits(old, ids))


# --------------------------------------------------------------------------
# Quantizing a float checkpoint at load (--quantize)


@pytest.mark.parametrize(("mode", "fmt"), [("int8", "q8_0"), ("int4", "q4_1")])
def test_quantize_a_float_checkpoint(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, fmt: str
) -> None:
    monkeypatch.setenv("TANDEM_DATA_DIR", str(tmp_path))
    model = load_model(tiny_model_dir, "cpu", "float32", quantize=mode)
    assert isinstance(model.layers[0].gate_up, QuantLinear)
    assert model.layers[0].gate_up.format == fmt
    assert isinstance(model.embed, QuantizedTensor) and model.embed.format == "q8_0"
    (copy,) = [p for p in (tmp_path / "models").iterdir() if not p.name.startswith(".")]
    assert copy.name.startswith(f"{tiny_model_dir.name}-{mode}-")
    assert (copy / "tokenizer.json").is_file()
    original, quantized = read_weights(tiny_model_dir), read_weights(copy)
    formats = quantized_formats(copy)
    assert set(quantized) == set(original)
    for name, weight in original.items():
        if name in formats:
            bound = error_bound(quantize(weight, formats[name]))
            assert ((quantized[name] - weight).abs().amax(-1) <= bound).all(), name
        else:
            assert weight.ndim == 1 and torch.equal(quantized[name], weight), name
    ids = [3, 17, 5, 99]
    reference = load_model(copy, "cpu", "float32", quantized="dequantize")
    assert_same_model(_logits(model, ids), _logits(reference, ids))


def test_quantized_copy_is_cached_until_the_source_changes(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "src"
    source.mkdir()
    for entry in tiny_model_dir.iterdir():
        if entry.is_file():
            (source / entry.name).write_bytes(entry.read_bytes())
    first = quantized_copy(source, "int4", cache_dir=tmp_path / "cache")
    written = (first / "model.safetensors").stat().st_mtime_ns

    def no_quantizing(*args: object, **kwargs: object) -> None:
        raise AssertionError("quantized again")

    monkeypatch.setattr(loader, "quantize_weight", no_quantizing)
    assert quantized_copy(source, "int4", cache_dir=tmp_path / "cache") == first
    assert (first / "model.safetensors").stat().st_mtime_ns == written
    monkeypatch.undo()
    weights = source / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    assert quantized_copy(source, "int4", cache_dir=tmp_path / "cache") == first
    assert (first / "model.safetensors").stat().st_mtime_ns != written


def test_unknown_quantize_mode_is_refused(tiny_model_dir: Path) -> None:
    with pytest.raises(ModelLoadError, match="int8, int4"):
        load_model(tiny_model_dir, "cpu", "float32", quantize="int3")


@pytest.mark.skipif(not cpu_kernel_available(), reason="the native kernel does not run here")
@pytest.mark.parametrize("rows", [1, 5])
def test_a_mixed_format_concat_writes_each_part_as_its_own_product(rows: int) -> None:
    # Q4_K_M's fused q/k/v: parts in different formats, widths that are and are not whole octets of 8.
    g = torch.Generator().manual_seed(3)
    parts = [QuantLinear(random_raw_weight("q5_0", 20, 512, g)), QuantLinear(random_raw_weight("q4_k", 16, 512, g)),
             QuantLinear(quantize(torch.randn(12, 512, generator=g), "q8_0"))]
    concat = ConcatLinear(parts)
    x = torch.randn(rows, 512, generator=g)
    norm = torch.rand(512, generator=g) + 0.5
    out = torch.full((rows, concat.out_features), float("nan"))
    concat.product_into(x, out, input_op="rms_norm", norm_weight=norm, eps=1e-5)
    alone = []
    for part in parts:
        piece = torch.empty(rows, part.out_features)
        part.product_into(x, piece, input_op="rms_norm", norm_weight=norm, eps=1e-5)
        alone.append(piece)
    assert torch.equal(out, torch.cat(alone, dim=1))
