"""A 1B-class model kept quantized resides in about the size of its GGUF file.

A random-weight Llama configuration of TinyLlama-1.1B's shape (the size
desktop users run) is written as a Q4_0 GGUF file (~0.6 GB, in tmp_path),
imported, and loaded in a fresh interpreter with the CPU kernels; one
prefill and one decode step must run and give finite logits.

The bound is on what the model adds to the interpreter's resident memory,
measured after torch and the engine are imported: the runtime alone (about
230 MiB here, most of it torch's own import) is the same for any model.

Slow (a minute or more to write, import and load): selected with -m slow.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from engine.formats.gguf.importer import import_gguf
from engine.model.quant import quantize
from tests.engine.test_gguf_import import byte_level_vocab, gguf_name
from tests.engine.test_memory_footprint import RSS, needs_proc, run_json

pytestmark = [pytest.mark.slow, needs_proc]

# TinyLlama-1.1B's shape.
HIDDEN, LAYERS, HEADS, KV_HEADS, FFN, VOCAB = 2048, 22, 32, 4, 5632, 32000


def _shapes() -> dict[str, tuple[int, ...]]:
    head_dim = HIDDEN // HEADS
    q, kv = HEADS * head_dim, KV_HEADS * head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (VOCAB, HIDDEN),
        "model.norm.weight": (HIDDEN,),
        "lm_head.weight": (VOCAB, HIDDEN),
    }
    for i in range(LAYERS):
        layer = {
            "input_layernorm.weight": (HIDDEN,),
            "post_attention_layernorm.weight": (HIDDEN,),
            "self_attn.q_proj.weight": (q, HIDDEN),
            "self_attn.k_proj.weight": (kv, HIDDEN),
            "self_attn.v_proj.weight": (kv, HIDDEN),
            "self_attn.o_proj.weight": (HIDDEN, q),
            "mlp.gate_proj.weight": (FFN, HIDDEN),
            "mlp.up_proj.weight": (FFN, HIDDEN),
            "mlp.down_proj.weight": (HIDDEN, FFN),
        }
        shapes |= {f"model.layers.{i}.{name}": shape for name, shape in layer.items()}
    return shapes


def _q4_0_blocks(rows: int, cols: int, gen: torch.Generator) -> np.ndarray:
    """Random N(0, 0.02) weights as GGUF Q4_0 blocks: uint8 [rows, cols / 32 * 18]
    (each block its float16 scale, then 16 bytes of nibbles)."""
    weight = quantize(torch.randn(rows, cols, generator=gen) * 0.02, "q4_0")
    scales = weight.scales.numpy().view(np.uint8).reshape(rows, -1, 2)
    nibbles = weight.data.numpy().reshape(rows, -1, 16)
    return np.concatenate((scales, nibbles), axis=-1).reshape(rows, -1)


def write_q4_0_gguf(path: Path) -> None:
    """Matrices as Q4_0, norms as F32 (as llama.cpp writes them), streamed to
    the file one tensor at a time so the test holds none of them for long."""
    vocab = byte_level_vocab()
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_uint32("llama.block_count", LAYERS)
    writer.add_uint32("llama.context_length", 2048)
    writer.add_uint32("llama.embedding_length", HIDDEN)
    writer.add_uint32("llama.feed_forward_length", FFN)
    writer.add_uint32("llama.attention.head_count", HEADS)
    writer.add_uint32("llama.attention.head_count_kv", KV_HEADS)
    writer.add_float32("llama.rope.freq_base", 10000.0)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_tokenizer_model(vocab.model)
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    writer.add_token_merges(vocab.merges)
    writer.add_uint32("tokenizer.ggml.bos_token_id", vocab.bos)
    writer.add_uint32("tokenizer.ggml.eos_token_id", vocab.eos)
    writer.add_chat_template("{{ messages[0]['content'] }}")
    shapes = _shapes()
    block_size, type_size = gguf.GGML_QUANT_SIZES[Q.Q4_0]
    for name, shape in shapes.items():
        if len(shape) == 1:
            writer.add_tensor_info(gguf_name(name), shape, np.dtype(np.float32), 4 * shape[0])
        else:
            rows, cols = shape
            byte_shape = (rows, cols // block_size * type_size)
            writer.add_tensor_info(
                gguf_name(name), byte_shape, np.dtype(np.uint8), rows * byte_shape[1], raw_dtype=Q.Q4_0
            )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    gen = torch.Generator().manual_seed(0)
    for shape in shapes.values():
        if len(shape) == 1:
            writer.write_tensor_data(np.ones(shape, dtype=np.float32))
        else:
            writer.write_tensor_data(_q4_0_blocks(*shape, gen))
    writer.close()


LOAD_AND_STEP = RSS + """
import json, sys
from types import SimpleNamespace
import torch
from engine.formats.loader import load_model
from engine.runner.cpu import ModelRunner
from engine.core.scheduler import ScheduledChunk, ScheduleResult
torch.set_num_threads(2)
before = rss_mib()
model = load_model(sys.argv[1], "cpu", quantized="kernel")
loaded = rss_mib()
runner = ModelRunner(model, model.new_kv_cache(4, 16))
seq = SimpleNamespace(token_ids=[1, 72, 101, 108], pages=[0, 1, 2, 3], sampler=None)
hidden, _, _ = runner.forward(ScheduleResult(prefills=[ScheduledChunk(seq, 0, 4)]))
seq.token_ids.append(111)
hidden, _, _ = runner.forward(ScheduleResult(decodes=[ScheduledChunk(seq, 4, 1)]))
logits = model.logits(hidden)
stepped = rss_mib()
peak = 0
with open("/proc/self/status") as status:
    for line in status:
        if line.startswith("VmHWM:"):
            peak = int(line.split()[1]) / 1024
print(json.dumps({
    "before": before, "loaded": loaded, "stepped": stepped, "peak": peak,
    "finite": bool(torch.isfinite(logits).all()), "logits_shape": list(logits.shape),
    "kinds": sorted({type(p).__name__ for layer in model.layers for p in (layer.qkv, layer.gate_up)}),
}))
"""


def test_a_1b_q4_0_model_resides_in_1_3x_its_file_size(tmp_path: Path) -> None:
    path = tmp_path / "tiny-llama-1b.Q4_0.gguf"
    write_q4_0_gguf(path)
    folder = import_gguf(path, tmp_path / "imported")
    file_mib = path.stat().st_size / 2**20
    path.unlink()  # only the folder is read from here on; half the disk
    result = run_json(LOAD_AND_STEP, str(folder), timeout=900)
    print(f"GGUF {file_mib:.0f} MiB; resident MiB: {result}")
    assert result["finite"] and result["logits_shape"] == [1, VOCAB]
    assert result["kinds"] == ["QuantLinear"]
    model_mib = result["stepped"] - result["before"]
    assert model_mib <= 1.3 * file_mib, (file_mib, result)
