"""A Q4_K_M-style GGUF file imported as it is: its Q4_K, Q5_K, Q6_K, Q5_0
and Q5_1 blocks land in the folder byte for byte, and the folder loads and
generates as the model those blocks hold.

The file is a tiny Llama written with gguf.GGUFWriter, its tensors mixed by
type as llama-quantize mixes a Q4_K_M file (Q4_K for most matrices, Q6_K for
the value and down projections and the embedding, Q5_0 where a row is not
whole K-quant blocks) plus Q5_K and Q5_1 so that every kept type is there.
gguf-py cannot quantize to K-quants, so their blocks are random with sane
scales (tests/engine/test_gguf_import.py `encode_tensor`). The real files
made by llama.cpp's own llama-quantize are bench/kquant_check.py's.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from safetensors import safe_open

from engine import Engine, SamplingParams
from engine.core.scheduler import ScheduledChunk, ScheduleResult
from engine.formats.gguf.importer import import_gguf
from engine.formats.loader import dequantized_copy, load_model, quantized_formats
from engine.model.quant import ConcatLinear, QuantLinear, cpu_kernel_available
from engine.model.quant_formats import PACK_ROWS, RAW_BLOCK_FORMATS
from engine.runner.cpu import ModelRunner
from tests.engine.random_llama import FakeSequence
from tests.engine.test_gguf_import import TinyModel, gguf_name, read_json, write_gguf

# K-quant rows must be whole 256-weight blocks: hidden and ffn of 256.
MODEL = TinyModel(hidden=256, heads=4, kv_heads=2, ffn=256, layers=2)
MIX = {
    "token_embd.weight": Q.Q6_K,
    "blk.0.attn_v.weight": Q.Q6_K,
    "blk.0.ffn_down.weight": Q.Q6_K,
    "blk.1.attn_q.weight": Q.Q5_0,
    "blk.1.attn_k.weight": Q.Q5_1,
    "blk.1.attn_v.weight": Q.Q5_K,
    "blk.1.ffn_up.weight": Q.Q5_K,
}
KEPT = {Q.Q4_K: "q4_k", Q.Q5_K: "q5_k", Q.Q6_K: "q6_k", Q.Q5_0: "q5_0", Q.Q5_1: "q5_1"}


@pytest.fixture(scope="module")
def kquant_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The file and its import (made once: several tests read them)."""
    root = tmp_path_factory.mktemp("kquant")
    write_gguf(root / "m.gguf", MODEL, qtype=Q.Q4_K, qtypes=MIX)
    return root / "m.gguf", import_gguf(root / "m.gguf", root / "m")


def engine_logits(folder: Path, ids: list[int], quantized: str = "auto") -> torch.Tensor:
    """The logits of every position of `ids`, prefilled in one chunk."""
    model = load_model(folder, "cpu", "float32", quantized=quantized)
    runner = ModelRunner(model, model.new_kv_cache(4, 4))
    chunk = ScheduledChunk(FakeSequence(ids, [2, 0, 3, 1]), 0, len(ids))  # type: ignore[arg-type]
    hidden, _, _ = runner.forward(ScheduleResult(decodes=[], prefills=[chunk]))
    return model.logits(hidden)


def unpermuted(blocks: np.ndarray, name: str) -> np.ndarray:
    """A q/k matrix's rows back in Hugging Face order (whole rows of blocks
    move: convert_hf_to_gguf.py permuted the rows, never within one)."""
    heads = {"attn_q": MODEL.heads, "attn_k": MODEL.kv_heads}.get(name.split(".")[-2])
    if heads is None:
        return blocks
    half = blocks.shape[0] // heads // 2
    return blocks.reshape(heads, half, 2, -1).swapaxes(1, 2).reshape(blocks.shape)


def test_kept_blocks_are_the_files_bytes(kquant_file: tuple[Path, Path]) -> None:
    source, folder = kquant_file
    formats = quantized_formats(folder)
    section = read_json(folder / "config.json")["quantization"]
    assert section["requantized"] == {}  # nothing rounded twice
    file_tensors = {t.name: t for t in gguf.GGUFReader(source).tensors}
    matrices = {name for name in formats}
    assert {gguf_name(name) for name in matrices} == {n for n, t in file_tensors.items() if len(t.shape) == 2}
    quantized_bytes = 0
    with safe_open(folder / "model.safetensors", "numpy") as stored:
        for name, fmt in formats.items():
            tensor = file_tensors[gguf_name(name)]
            assert fmt == KEPT[tensor.tensor_type], name
            assert set(k for k in stored.keys() if k.startswith(name + ".")) == {name + ".qdata"}
            blocks = stored.get_tensor(name + ".qdata")
            assert blocks.dtype == np.uint8
            np.testing.assert_array_equal(blocks, unpermuted(np.asarray(tensor.data), tensor.name), err_msg=name)
            quantized_bytes += int(tensor.n_bytes)
    # The weights take what the file's blocks take, plus the float32 norms.
    norms = sum(int(t.n_bytes) for t in file_tensors.values() if len(t.shape) == 1)
    weights = (folder / "model.safetensors").stat().st_size
    assert quantized_bytes + norms <= weights <= quantized_bytes + norms + 16_384  # + the header


def test_kquant_folder_computes_as_its_blocks_dequantized(kquant_file: tuple[Path, Path], tmp_path: Path) -> None:
    _, folder = kquant_file
    float_copy = dequantized_copy(folder, tmp_path / "float")
    ids = [5, 60, 61, 62, 7, 99, 100, 3]
    # Dequantized at load: the very weights the float copy holds, the same arithmetic.
    assert torch.equal(engine_logits(folder, ids, quantized="dequantize"), engine_logits(float_copy, ids))
    if not cpu_kernel_available():
        pytest.skip("no native CPU kernel here: the quantized path is the dequantized one")
    model = load_model(folder, "cpu", "float32")
    assert isinstance(model.layers[0].down, QuantLinear) and model.layers[0].down.format == "q6_k"
    # Layer 0's v is q6_k beside q4_k q and k (as Q4_K_M mixes them): still the native path, its parts
    # side by side with the bits each format's fused product gives.
    qkv = model.layers[0].qkv
    assert isinstance(qkv, ConcatLinear) and model.native_forward
    x = torch.randn(3, MODEL.hidden, generator=torch.Generator().manual_seed(4))
    fused = torch.empty(3, qkv.out_features)
    qkv.product_into(x, fused)
    assert torch.equal(fused, torch.cat([part(x) for part in qkv.parts], dim=-1))
    # On the kernels (int8 activations, rounded again at every product of
    # this model's outsized random weights) the logits stay near the float
    # ones: a block read wrong would move them by their whole size.
    kernel, reference = engine_logits(folder, ids), engine_logits(float_copy, ids)
    assert (kernel - reference).abs().max() <= 0.1 * reference.abs().max()
    assert torch.equal(kernel[-1].argmax(), reference[-1].argmax())


def test_kquant_folder_generates(kquant_file: tuple[Path, Path]) -> None:
    _, folder = kquant_file
    engine = Engine(str(folder), device="cpu", dtype="float32")
    try:
        out = engine.generate_outputs(["hello world"], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
        assert len(out[0].token_ids) == 6
        assert "q4_k" in engine.stats().weights and "q6_k" in engine.stats().weights
    finally:
        engine.close()


def test_memory_estimate_counts_the_kept_blocks(kquant_file: tuple[Path, Path], tmp_path: Path) -> None:
    """The app's estimate of the folder (its stored formats' bytes, by the
    engine's own rules) is what the loaded engine holds, on the kernels and
    dequantized; but for the zero rows that pad the kernels' packed
    embedding to whole octets of rows, which the estimate leaves out (270
    rows here, a multiple of 8 in real vocabularies)."""
    from app.models.registry import ModelRegistry
    from tests.app.test_model_registry import _loaded_bytes

    _, folder = kquant_file
    registry = ModelRegistry(tmp_path / "models.json")
    entry = registry.add_folder(folder)
    modes = ("auto", "dequantize") if cpu_kernel_available() else ("dequantize",)
    for quantized in modes:
        estimate = registry.estimate_memory(entry.id, "cpu", "float32", 1, quantized=quantized)
        engine = Engine(str(folder), device="cpu", dtype="float32", kv_cache_bytes=1 << 20, threads=1,
                        quantized=quantized)
        try:
            vocab = engine.model.config.vocab_size
            padding = (-vocab % PACK_ROWS) * RAW_BLOCK_FORMATS["q6_k"][1] * MODEL.hidden // 256
            expected = _loaded_bytes(engine) - (padding if quantized == "auto" else 0)
            assert (estimate.weights_bytes, estimate.weights) == (expected, engine.stats().weights)
        finally:
            engine.close()


def test_details_show_the_kept_formats_by_kind(kquant_file: tuple[Path, Path], tmp_path: Path) -> None:
    from app.models.checks import describe_model_folder

    _, folder = kquant_file
    label = describe_model_folder(folder).storage_label("from a GGUF file")
    assert label.startswith("q4_k + q5_0 + q5_1 + q5_k + q6_k blocks (from a GGUF file): ")
    by_kind = dict(part.rsplit(" ", 1)[::-1] for part in label.split(": ", 1)[1].split("; "))
    assert by_kind == {
        "q6_k": "embedding", "q4_k+q5_0": "q_proj", "q4_k+q5_1": "k_proj", "q5_k+q6_k": "v_proj",
        "q4_k": "o_proj, gate_proj", "q4_k+q6_k": "down_proj", "q4_k+q5_k": "up_proj",
    }
    # A type still requantized says what that costs.
    write_gguf(tmp_path / "q3.gguf", MODEL, qtype=Q.Q3_K)
    label = describe_model_folder(import_gguf(tmp_path / "q3.gguf", tmp_path / "q3")).storage_label()
    assert label == "q4_1 blocks (Q3_K (3.44 bits per weight) requantized to q4_1 (5.0 bits): 45% more bytes, rounded twice)"
