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
tensors' bytes, which the offsets must cover exactly).
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

if TYPE_CHECKING:
    import numpy as np
    import torch

INDEX_NAME = "model.safetensors.index.json"
PICKLE_PATTERNS = ("*.bin", "*.pt", "*.pth", "*.ckpt")
# The safetensors library refuses larger headers; so does this reader.
MAX_HEADER_BYTES = 100 << 20
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
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = {str(name) for name in weight_map.values()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptSafetensorsError(
                f"{index} is not a valid safetensors index ({exc}). Download it again."
            ) from exc
        files = sorted(folder / name for name in names)
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CorruptSafetensorsError(
                f"{folder} is incomplete: the shard(s) {', '.join(missing)} named in {index.name} "
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
                    f"{path.parent}: the weight '{tensor.name}' is stored twice (again in {path.name}). "
                    "Download the model's .safetensors files again."
                )
            headers[tensor.name] = tensor
    return headers


def read_tensors(files: Iterable[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of the files, each read into memory of its own.

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
                    dtype_name = TORCH_DTYPES.get(tensor.dtype)
                    if dtype_name is None:
                        raise ValueError(f"tensor {tensor.name!r} has the unsupported dtype {tensor.dtype!r}")
                    buffer = torch.empty(tensor.nbytes, dtype=torch.uint8)
                    handle.seek(tensor.offset)
                    _read_into(handle, memoryview(buffer.numpy()))
                    yield tensor.name, buffer.view(getattr(torch, dtype_name)).reshape(tensor.shape)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise _unreadable(path, exc) from exc


def count_tensors(files: Iterable[Path]) -> int:
    """How many tensors the files hold (reads only their headers)."""
    return sum(len(read_header(path)) for path in files)


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
    if size < 8:
        raise ValueError(f"a file of {size} bytes has no header")
    header_len = int.from_bytes(_read_exactly(handle, 8), "little")
    if header_len > min(size - 8, MAX_HEADER_BYTES):
        raise ValueError(f"a header of {header_len} bytes in a file of {size}")
    raw = json.loads(_read_exactly(handle, header_len))
    if not isinstance(raw, dict):
        raise ValueError("the header is not a JSON object")
    start = 8 + header_len
    tensors: list[TensorHeader] = []
    for name, entry in raw.items():
        if name == "__metadata__":
            continue
        dtype = entry["dtype"]
        if dtype not in DTYPE_SIZES:
            raise ValueError(f"tensor {name!r} has the unknown dtype {dtype!r}")
        shape = tuple(entry["shape"])
        begin, end = entry["data_offsets"]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (*shape, begin, end)):
            raise ValueError(f"tensor {name!r} has a bad shape or offsets")
        nbytes = math.prod(shape) * DTYPE_SIZES[dtype]
        if end - begin != nbytes:
            raise ValueError(f"tensor {name!r}: offsets {begin}..{end} do not hold {list(shape)} {dtype}")
        tensors.append(TensorHeader(name, dtype, shape, start + begin, nbytes))
    tensors.sort(key=lambda t: t.offset)
    covered = start
    for tensor in tensors:
        if tensor.offset != covered:
            raise ValueError(f"tensor {tensor.name!r} overlaps another or leaves a gap before it")
        covered += tensor.nbytes
    if covered != size:
        raise ValueError(f"the tensors end at byte {covered} of a file of {size}")
    return tensors


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
