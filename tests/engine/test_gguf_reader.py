"""The GGUF reader on files gguf.GGUFWriter writes, and on hostile ones whose
counts and lengths lie: refused at once, before anything big is allocated."""

from __future__ import annotations

import struct
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from engine.errors import GGUFFormatError, ModelLoadError, UnsupportedModelError
from engine.formats.default_model import default_gguf_path
from engine.formats.gguf.reader import SHORT_ARRAY, open_gguf, read_gguf_header
from engine.formats.gguf.tables import hf_tensor_name, is_quantizable, kept_format, stored_format
from engine.model.families import family_named
from tests.engine.test_gguf_import import write_gguf


def _header(tensor_count: int, kv_count: int, version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, tensor_count, kv_count)


def _string(text: str, length: int | None = None) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data) if length is None else length) + data


def test_reads_what_the_gguf_package_reads(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    write_gguf(path, qtype=Q.Q4_1)
    theirs = gguf.GGUFReader(path)
    ours = open_gguf(path)
    header = ours.header
    assert header.architecture == "llama" and header.arch_value("context_length") == 256
    assert header.metadata["tokenizer.ggml.tokens"] == theirs.fields["tokenizer.ggml.tokens"].contents()
    assert header.metadata["llama.attention.layer_norm_rms_epsilon"] == 1e-6  # float32, as written
    assert list(header.tensors) == [t.name for t in theirs.tensors]
    for tensor in theirs.tensors:
        info = header.tensors[tensor.name]
        assert (info.type, info.dims, info.offset, info.nbytes) == (
            tensor.tensor_type, tuple(tensor.shape.tolist()), tensor.data_offset, tensor.n_bytes,
        )
        np.testing.assert_array_equal(ours.tensor_data(info), tensor.data)
    assert header.data_end == path.stat().st_size


def test_a_summary_skips_long_arrays() -> None:
    path = default_gguf_path()  # a real 49k-token vocabulary
    full = read_gguf_header(path)
    short = read_gguf_header(path, long_arrays=False)
    assert len(full.metadata["tokenizer.ggml.tokens"]) > SHORT_ARRAY
    assert "tokenizer.ggml.tokens" not in short.metadata and "tokenizer.ggml.merges" not in short.metadata
    assert short.metadata["tokenizer.ggml.bos_token_id"] == full.metadata["tokenizer.ggml.bos_token_id"]
    assert short.tensors == full.tensors and short.data_end == full.data_end


@pytest.mark.parametrize(
    "body",
    [
        _header(1 << 62, 0),  # tensors
        _header(0, 1 << 62),  # metadata entries
        _header(0, 1) + _string("key", 1 << 62),  # a string's length
        _header(0, 1) + _string("tokens") + struct.pack("<IIQ", 9, 8, 1 << 60),  # an array of strings
        _header(0, 1) + _string("scores") + struct.pack("<IIQ", 9, 6, 1 << 60),  # an array of floats
        _header(0, 1) + _string("nested") + struct.pack("<IIQ", 9, 9, 1 << 58),  # an array of arrays
        _header(1, 0) + _string("t") + struct.pack("<I", 1 << 31),  # dimensions
        _header(0, 1) + _string("odd") + struct.pack("<I", 77),  # an unknown value type
    ],
    ids=["tensors", "metadata", "string", "strings", "floats", "arrays", "dims", "type"],
)
def test_counts_and_lengths_that_lie_are_refused_at_once(tmp_path: Path, body: bytes) -> None:
    path = tmp_path / "liar.gguf"
    path.write_bytes(body + bytes(4096))
    started = time.perf_counter()
    with pytest.raises(GGUFFormatError, match="ends too early or is damaged.*Download it again"):
        read_gguf_header(path)
    assert time.perf_counter() - started < 1.0


def test_a_file_shorter_than_its_tensors_is_truncated(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    write_gguf(path)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(GGUFFormatError, match="is truncated: its header describes .* but the file has"):
        read_gguf_header(path)


def test_data_offsets_past_the_end_and_duplicate_tensors_are_refused(tmp_path: Path) -> None:
    info = _string("t") + struct.pack("<IQIQ", 1, 32, int(Q.F32), 1 << 40)
    path = tmp_path / "far.gguf"
    path.write_bytes(_header(1, 0) + info + bytes(64))
    with pytest.raises(GGUFFormatError, match="truncated"):
        read_gguf_header(path)
    twice = _string("t") + struct.pack("<IQIQ", 1, 8, int(Q.F32), 0)
    path.write_bytes(_header(2, 0) + twice + twice + bytes(128))
    with pytest.raises(GGUFFormatError, match="holds the tensor 't' twice"):
        read_gguf_header(path)


def test_not_gguf_big_endian_old_and_unknown_types(tmp_path: Path) -> None:
    path = tmp_path / "x.gguf"
    path.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(GGUFFormatError, match="not a GGUF file"):
        read_gguf_header(path)
    path.write_bytes(b"GGUF" + (3).to_bytes(4, "big") + bytes(64))
    with pytest.raises(UnsupportedModelError, match="big-endian"):
        read_gguf_header(path)
    path.write_bytes(_header(0, 0, version=1))
    with pytest.raises(UnsupportedModelError, match="version 1"):
        read_gguf_header(path)
    path.write_bytes(_header(1, 0) + _string("t") + struct.pack("<IQIQ", 1, 32, 999, 0) + bytes(256))
    with pytest.raises(UnsupportedModelError, match="type number 999"):
        read_gguf_header(path)
    with pytest.raises(ModelLoadError, match="not found"):
        read_gguf_header(tmp_path / "missing.gguf")


def test_the_tables_say_what_an_import_keeps() -> None:
    assert kept_format(Q.Q4_0) == "q4_0" and kept_format(Q.Q8_0) == "q8_0"
    assert kept_format(Q.Q4_K) == "q4_k" and kept_format(Q.Q6_K) == "q6_k" and kept_format(Q.Q5_0) == "q5_0"
    assert kept_format(Q.Q3_K) == "q4_1" and kept_format(Q.IQ4_XS) == "q4_1"  # requantized
    assert kept_format(Q.F16) is None and kept_format(Q.BF16) is None
    llama, gemma3 = family_named("llama"), family_named("gemma3")
    assert hf_tensor_name("blk.3.attn_q.weight", llama) == "model.layers.3.self_attn.q_proj.weight"
    assert hf_tensor_name("output.weight", llama) == "lm_head.weight"
    assert hf_tensor_name("blk.0.ffn_gate_exps.weight", llama) is None
    # The same GGUF kind is another module in another family; q/k norms only where the family has them.
    assert hf_tensor_name("blk.1.ffn_norm.weight", llama) == "model.layers.1.post_attention_layernorm.weight"
    assert hf_tensor_name("blk.1.ffn_norm.weight", gemma3) == "model.layers.1.pre_feedforward_layernorm.weight"
    assert hf_tensor_name("blk.1.attn_q_norm.weight", gemma3) == "model.layers.1.self_attn.q_norm.weight"
    assert hf_tensor_name("blk.1.attn_q_norm.weight", llama) is None
    assert is_quantizable("token_embd.weight") and not is_quantizable("blk.0.attn_norm.weight")
    assert not is_quantizable("blk.0.attn_q.bias")
    assert stored_format("blk.0.ffn_up.weight", Q.Q4_1, (64, 128)) == "q4_1"
    assert stored_format("blk.0.ffn_up.weight", Q.Q4_1, (48, 128)) is None  # rows not whole groups
    assert stored_format("output_norm.weight", Q.Q8_0, (64,)) is None
