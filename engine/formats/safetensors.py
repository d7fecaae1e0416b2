"""The safetensors format: which files of a folder hold the weights, their
headers (names, dtypes, shapes) without the weights, the tensors themselves,
and streaming a file out.

Only safetensors are read: pickle checkpoints (.bin/.pt) can run arbitrary
code when loaded, so a folder that has nothing else is refused
(PickleCheckpointError). The loader (engine/formats/loader.py) and the app's
folder checks (app/models/checks.py) both call `weight_files` and
`read_headers`, so a folder the check accepts is one the loader reads.

A file comes from a stranger: its header's length, every tensor's offsets
and the file's size are checked against each other before anything is
allocated (a file is 8 bytes of header length, the JSON header, then the
tensors' bytes, which the offsets must cover exactly). The header is bounded
by what a model can have (MAX_HEADER_BYTES, MAX_TENSORS_PER_FILE, counted
before it is parsed) and read by the bounded JSON reader
(engine/formats/model_json.py), as is the index, whose shard names must be
plain file names in the folder: an index names no other file to read.
No error message shows a file's bytes.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from engine.errors import CorruptSafetensorsError, NoWeightsError, PickleCheckpointError
from engine.formats.model_json import ModelJSONError, parse_json_object, read_json_object, shown_value
from engine.progress import format_bytes

if TYPE_CHECKING:
    import numpy as np
    import torch

INDEX_NAME = "model.safetensors.index.json"
PICKLE_PATTERNS = ("*.bin", "*.pt", "*.pth", "*.ckpt")
# A file's tensors: far above a model's (a GGUF import of 1,024 layers
# writes ~25,000, a checkpoint shard a few hundred), low enough that the
# header's Python objects stay small.
MAX_TENSORS_PER_FILE = 1 << 16
# A header entry is ~100-200 bytes (name, dtype, shape, offsets); this
# leaves room for __metadata__. (The safetensors library allows 100 MB,
# which as Python objects took 1.3 GB and a minute.)
MAX_HEADER_BYTES = 16 << 20
# Shards an index may name (the largest checkpoints have ~200).
MAX_SHARDS = 1 << 12
# The most dimensions a tensor may have.
MAX_TENSOR_DIMS = 8
# Bytes of one element of each safetensors dtype.
DTYPE_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2,
    "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8,
}
# The dtypes read into torch tensors (the ones checkpoints hold), by torch's
# names: torch (and numpy) are imported by the functions that move tensors
# only, so that checking a folder's headers (app/models/checks.py, imported
# while the window is built) does not wait seconds for them.
TORCH_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8",
    "U8": "uint8", "BOOL": "bool",
}
# Float dtypes a model's weights may be stored in, by their torch names.
FLOAT_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}

# (name, safetensors dtype, shape) of one tensor to write.
TensorEntry = tuple[str, str, tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class TensorHeader:
    name: str
    dtype: str  # safetensors' name: "F32", "BF16", "U8", ...
    shape: tuple[int, ...]
    offset: int  # where its bytes start in the file
    nbytes: int


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint folder: the shards named by
    model.safetensors.index.json, else every *.safetensors file.

    Raises CorruptSafetensorsError for a bad index or a missing shard,
    PickleCheckpointError for a folder with pickle checkpoints only,
    NoWeightsError for a folder without weights.
    """
    index = folder / INDEX_NAME
    if index.is_file():
        files = [folder / name for name in _shard_names(index)]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CorruptSafetensorsError(
                f"{folder} is incomplete: the shard(s) {', '.join(missing[:3])}"
                f"{f' and {len(missing) - 3} more' if len(missing) > 3 else ''} named in {index.name} "
                "are missing. Download them too."
            )
        return files
    files = sorted(folder.glob("*.safetensors"))
    if files:
        return files
    pickles = sorted(p.name for pattern in PICKLE_PATTERNS for p in folder.glob(pattern))
    if pickles:
        raise PickleCheckpointError(
            f"{folder} only has pickle checkpoints ({', '.join(pickles)}). Tandem does not load "
            "them because opening them can run arbitrary code. Download the model's .safetensors "
            "files instead, or use a GGUF file of it."
        )
    raise NoWeightsError(
        f"{folder} has no weights: a model folder needs model.safetensors (or the *.safetensors "
        "shards of model.safetensors.index.json) next to its config.json."
    )


def _shard_names(index: Path) -> list[str]:
    """The distinct shard names of an index, sorted; each a plain name of a
    file in the index's folder (no path, no "..", no backslash, no NUL), so
    the index cannot send the reader to any other file."""

    def refuse(problem: str) -> CorruptSafetensorsError:
        return CorruptSafetensorsError(f"{index} is not a valid safetensors index ({problem}). Download it again.")

    try:
        weight_map = read_json_object(index).get("weight_map")
    except (ModelJSONError, FileNotFoundError) as exc:
        raise refuse(f"it {exc}" if isinstance(exc, ModelJSONError) else "it is gone") from None
    if not isinstance(weight_map, dict):
        raise refuse("it has no weight_map object")
    names = set(weight_map.values())
    if len(names) > MAX_SHARDS:
        raise refuse(f"it names more than {MAX_SHARDS:,} shards")
    for name in names:
        if not isinstance(name, str):
            raise refuse(f"a shard's name is {shown_value(name)}, not a file name")
        if not _is_plain_name(name):
            raise refuse(f"the shard {shown_value(name)} is not a file of the model's folder")
    return sorted(names)


def _is_plain_name(name: str) -> bool:
    """A file name with no folder part on any system."""
    return (
        bool(name)
        and name not in (".", "..")
        and not any(sep in name for sep in ("/", "\\", "\0"))
        and ":" not in name  # a Windows drive ("C:x") or stream
        and Path(name).name == name
    )


def read_header(path: Path) -> list[TensorHeader]:
    """The tensors of one file, in the order of their bytes. Raises
    CorruptSafetensorsError unless the header is valid and its offsets cover
    the rest of the file exactly (a truncated or padded file is refused)."""
    try:
        with open(path, "rb", buffering=0) as handle:
            return _parse_header(handle, os.fstat(handle.fileno()).st_size)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise _unreadable(path, exc) from exc


def read_headers(
    files: Iterable[Path], keep: Callable[[str], bool] | None = None
) -> dict[str, TensorHeader]:
    """The tensors of several files (shards) by name, those `keep` accepts
    only. A name stored twice is refused: which copy would count is a guess."""
    headers: dict[str, TensorHeader] = {}
    for path in files:
        for tensor in read_header(path):
            if keep is not None and not keep(tensor.name):
                continue
            if tensor.name in headers:
                raise CorruptSafetensorsError(
                    f"{path.parent}: the weight {shown_value(tensor.name)} is stored twice (again in {path.name}). "
                    "Download the model's .safetensors files again."
                )
            headers[tensor.name] = tensor
    return headers


def read_tensors(
    files: Iterable[Path], keep: Callable[[str], bool] | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of the files (those `keep` accepts; the others are not
    read), each read into memory of its own.

    Read, not mapped: safetensors' tensors are views of the file's mapping,
    which then stays mapped while any of them lives, and every page read
    through it counts as resident. The weights stacked at load (q/k/v,
    gate/up) are copies, so their parts' pages would stay resident beside
    them: measured on a 1.1B Q4_0 model, 555 MiB of the 591 MiB file
    mapped on top of 385 MiB of stacked copies.
    """
    import torch

    for path in files:
        try:
            with open(path, "rb", buffering=0) as handle:
                for tensor in _parse_header(handle, os.fstat(handle.fileno()).st_size):
                    if keep is not None and not keep(tensor.name):
                        continue
                    dtype_name = TORCH_DTYPES.get(tensor.dtype)
                    if dtype_name is None:
                        raise ValueError(f"tensor {shown_value(tensor.name)} has the unsupported dtype {tensor.dtype!r}")
                    buffer = torch.empty(tensor.nbytes, dtype=torch.uint8)
                    handle.seek(tensor.offset)
                    _read_into(handle, memoryview(buffer.numpy()))
                    yield tensor.name, buffer.view(getattr(torch, dtype_name)).reshape(tensor.shape)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise _unreadable(path, exc) from exc


def count_tensors(files: Iterable[Path], keep: Callable[[str], bool] | None = None) -> int:
    """How many tensors the files hold (those `keep` accepts; reads only their headers)."""
    return sum(1 for path in files for t in read_header(path) if keep is None or keep(t.name))


def entry_nbytes(entry: TensorEntry) -> int:
    _, dtype, shape = entry
    return DTYPE_SIZES[dtype] * math.prod(shape)


def write_streamed(
    path: Path,
    layout: Sequence[TensorEntry],
    groups: Iterable[tuple[Sequence[TensorEntry], Sequence[np.ndarray]]],
    written: Callable[[int], None] | None = None,
) -> None:
    """Write a safetensors file whose tensors are made one group at a time.

    The header needs only `layout` (every tensor's name, dtype and shape),
    so it is written first; `groups` then yields each group's entries (in
    layout order) with their arrays, so at most one group is in memory.
    `written(bytes_so_far)` is called after each group (it may raise to stop).
    """
    import numpy as np

    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for entry in layout:
        name, dtype, shape = entry
        size = entry_nbytes(entry)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data section starts 8-byte aligned
    with path.open("wb") as file:
        file.write(struct.pack("<Q", len(encoded)))
        file.write(encoded)
        done = 0
        for entries, arrays in groups:
            for (name, dtype, shape), array in zip(entries, arrays, strict=True):
                array = np.ascontiguousarray(array, dtype=_NUMPY_DTYPES[dtype])
                assert array.shape == shape, (name, array.shape, shape)
                file.write(memoryview(array.reshape(-1)).cast("B"))
                done += array.nbytes
            if written is not None:
                written(done)
        file.flush()
        os.fsync(file.fileno())


_NUMPY_DTYPES = {"F32": "<f4", "F16": "<f2", "I8": "i1", "U8": "u1"}


def _parse_header(handle: BinaryIO, size: int) -> list[TensorHeader]:
    # The messages never show the file's bytes (the header length is some);
    # a ValueError here becomes CorruptSafetensorsError.
    if size < 8:
        raise ValueError(f"a file of {size} bytes has no header")
    header_len = int.from_bytes(_read_exactly(handle, 8), "little")
    if header_len > size - 8:
        raise ValueError("its header's length is more than the file holds")
    if header_len > MAX_HEADER_BYTES:
        raise ValueError(f"its header is more than {format_bytes(MAX_HEADER_BYTES)}, more than a model's")
    data = _read_exactly(handle, header_len)
    too_many = f"its header holds more than {MAX_TENSORS_PER_FILE:,} tensors, more than a model's"
    # Each tensor's entry is an object, so the braces bound the entries
    # (beside the header's own and __metadata__'s) before json turns them
    # into Python objects.
    if data.count(b"{") > MAX_TENSORS_PER_FILE + 2:
        raise ValueError(too_many)
    try:
        raw = parse_json_object(data)
    except ModelJSONError as exc:
        raise ValueError(f"its header {exc}") from None
    if len(raw) - ("__metadata__" in raw) > MAX_TENSORS_PER_FILE:
        raise ValueError(too_many)
    start = 8 + header_len
    tensors: list[TensorHeader] = []
    for name, entry in raw.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict):
            raise ValueError(f"tensor {shown_value(name)} is described by {shown_value(entry)}, not an object")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
            raise ValueError(f"tensor {shown_value(name)} has the unknown dtype {shown_value(dtype)}")
        if not isinstance(shape, list) or len(shape) > MAX_TENSOR_DIMS or not all(map(_is_count, shape)):
            raise ValueError(f"tensor {shown_value(name)} has a bad shape")
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_is_count, offsets)):
            raise ValueError(f"tensor {shown_value(name)} has bad offsets")
        begin, end = offsets
        nbytes = math.prod(shape) * DTYPE_SIZES[dtype]
        if end - begin != nbytes:
            raise ValueError(f"tensor {shown_value(name)}: offsets {begin}..{end} do not hold {shape} {dtype}")
        tensors.append(TensorHeader(name, dtype, tuple(shape), start + begin, nbytes))
    tensors.sort(key=lambda t: t.offset)
    covered = start
    for tensor in tensors:
        if tensor.offset != covered:
            raise ValueError(f"tensor {shown_value(tensor.name)} overlaps another or leaves a gap before it")
        covered += tensor.nbytes
    if covered != size:
        raise ValueError(f"the tensors end at byte {covered} of a file of {size}")
    return tensors


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _unreadable(path: Path, exc: Exception) -> CorruptSafetensorsError:
    return CorruptSafetensorsError(
        f"{path} is not a readable safetensors file ({exc}). It is probably truncated or "
        "damaged; download it again."
    )


def _read_exactly(handle: BinaryIO, count: int) -> bytes:
    data = handle.read(count)
    if len(data) != count:
        raise ValueError("the file ends early")
    return data


def _read_into(handle: BinaryIO, view: memoryview) -> None:
    done = 0
    while done < len(view):
        got = handle.readinto(view[done:])
        if not got:
            raise ValueError("the file ends early")
        done += got
