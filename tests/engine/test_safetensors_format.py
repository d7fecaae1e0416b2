"""engine.formats.safetensors: the weight files of a folder, their headers
(checked against the file's real size), the tensors, and streaming one out."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.errors import CorruptSafetensorsError, NoWeightsError, PickleCheckpointError
from engine.formats.safetensors import (
    count_tensors,
    read_header,
    read_headers,
    read_tensors,
    weight_files,
    write_streamed,
)


def _raw_file(path: Path, header: dict, data: bytes) -> Path:
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data)
    return path


def test_weight_files_are_the_index_shards_or_every_safetensors_file(tmp_path: Path) -> None:
    save_file({"a": torch.zeros(2)}, str(tmp_path / "b.safetensors"))
    save_file({"b": torch.zeros(2)}, str(tmp_path / "a.safetensors"))
    assert [p.name for p in weight_files(tmp_path)] == ["a.safetensors", "b.safetensors"]
    index = {"weight_map": {"a": "b.safetensors", "b": "b.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert [p.name for p in weight_files(tmp_path)] == ["b.safetensors"]
    index["weight_map"]["c"] = "missing.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CorruptSafetensorsError, match="missing.safetensors.*are missing. Download them too"):
        weight_files(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text("[1, 2")
    with pytest.raises(CorruptSafetensorsError, match="not a valid safetensors index"):
        weight_files(tmp_path)


def test_pickles_are_refused_unread_and_an_empty_folder_has_no_weights(tmp_path: Path) -> None:
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04 would run code")
    with pytest.raises(PickleCheckpointError, match=r"only has pickle checkpoints \(pytorch_model.bin\)"):
        weight_files(tmp_path)
    (tmp_path / "pytorch_model.bin").unlink()
    with pytest.raises(NoWeightsError, match="has no weights: a model folder needs model.safetensors"):
        weight_files(tmp_path)


def test_headers_and_tensors_match_what_safetensors_wrote(tmp_path: Path) -> None:
    tensors = {"model.x": torch.arange(6, dtype=torch.float32).reshape(2, 3), "model.y": torch.ones(4, dtype=torch.bfloat16)}
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path))
    headers = {t.name: (t.dtype, t.shape, t.nbytes) for t in read_header(path)}
    assert headers == {"model.x": ("F32", (2, 3), 24), "model.y": ("BF16", (4,), 8)}
    read = dict(read_tensors([path]))
    assert read.keys() == tensors.keys() and all(torch.equal(read[k], tensors[k]) for k in tensors)
    assert count_tensors([path, path]) == 4


@pytest.mark.parametrize(
    ("header", "data", "words"),
    [
        ({"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, bytes(8), "end at byte"),  # truncated
        ({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, bytes(16), "end at byte"),  # padded
        ({"t": {"dtype": "F32", "shape": [1 << 40], "data_offsets": [0, 4]}}, bytes(4), "do not hold"),
        (
            {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
             "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}},
            bytes(12), "overlaps",
        ),
        ({"t": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 1]}}, bytes(1), "unknown dtype"),
        ({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}}, b"", "bad shape"),
    ],
    ids=["truncated", "padded", "huge-shape", "overlap", "dtype", "negative"],
)
def test_headers_that_do_not_match_the_file_are_refused(tmp_path: Path, header: dict, data: bytes, words: str) -> None:
    path = _raw_file(tmp_path / "bad.safetensors", header, data)
    with pytest.raises(CorruptSafetensorsError, match=f"not a readable safetensors file.*{words}.*download it again"):
        read_header(path)


def test_a_header_length_past_the_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "liar.safetensors"
    path.write_bytes(struct.pack("<Q", 1 << 50) + b"{}")
    with pytest.raises(CorruptSafetensorsError, match="header's length is more than the file holds") as caught:
        read_header(path)
    assert str(1 << 50) not in str(caught.value)  # the file's bytes are never shown


def test_a_weight_in_two_shards_is_refused_and_others_can_be_skipped(tmp_path: Path) -> None:
    save_file({"model.w": torch.zeros(2), "extra": torch.zeros(1)}, str(tmp_path / "a.safetensors"))
    save_file({"model.w": torch.ones(2)}, str(tmp_path / "b.safetensors"))
    files = [tmp_path / "a.safetensors", tmp_path / "b.safetensors"]
    with pytest.raises(CorruptSafetensorsError, match="'model.w' is stored twice"):
        read_headers(files)
    assert list(read_headers(files[:1], keep=lambda name: name.startswith("model."))) == ["model.w"]


def test_a_streamed_file_is_a_valid_safetensors_file(tmp_path: Path) -> None:
    first = [("model.a", "F32", (2, 2)), ("model.a.scales", "F16", (2,))]
    second = [("model.b", "U8", (3,))]
    arrays = [[np.eye(2, dtype=np.float32), np.ones(2, np.float16)], [np.arange(3, dtype=np.uint8)]]
    progress: list[int] = []
    write_streamed(tmp_path / "s.safetensors", first + second, zip([first, second], arrays), progress.append)
    assert progress == [20, 23]
    loaded = load_file(tmp_path / "s.safetensors")
    assert torch.equal(loaded["model.a"], torch.eye(2)) and loaded["model.b"].tolist() == [0, 1, 2]
