"""Read a GGUF file: its header, metadata and tensor table, and views of its
tensors' data.

GGUF files come from strangers, so every count and length is checked against
the bytes really in the file before anything is allocated or looped over: a
damaged file raises GGUFFormatError (a ModelLoadError) in a fraction of a
second, whatever counts it claims. The tensors' data is mapped, not read:
`GGUFFile.tensor_data` returns a numpy view (the layout the gguf package's
own reader gives), so a multi-gigabyte file costs nothing until a tensor is
converted.

Layout (little-endian; https://github.com/ggml-org/ggml/blob/master/docs/gguf.md):
magic "GGUF", u32 version, u64 tensor count, u64 metadata count; the
metadata (string key, u32 type, value); the tensor infos (string name, u32
dimension count, u64 dims innermost first, u32 type, u64 offset); then, at
the next multiple of `general.alignment` (32), the tensors' data.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import quant_shape_to_byte_shape

from engine.errors import GGUFFormatError, ModelLoadError, UnsupportedModelError
from engine.progress import format_bytes

MAGIC = b"GGUF"
# ggml's GGML_MAX_DIMS: no tensor has more dimensions.
MAX_DIMS = 4
DEFAULT_ALIGNMENT = 32
# Arrays longer than this are skipped by `read_gguf_header(long_arrays=False)`:
# the vocabulary's tokens and merges, which a summary does not need.
SHORT_ARRAY = 1024
# The most items a metadata array may have: a vocabulary's tokens, scores or
# merges (the largest vocabularies have ~260k tokens). A count within the
# file's size could still ask for a Python list dozens of times the file.
MAX_ARRAY_ITEMS = 1 << 22
# GGUF nests arrays one level at most (none of llama.cpp's keys do); a deeper
# nesting is a way to exhaust the stack, not a model.
MAX_ARRAY_DEPTH = 2

_STRING, _ARRAY = 8, 9
_FLOAT32 = 6
# GGUF scalar value type -> (struct format, numpy dtype).
_SCALARS: dict[int, tuple[str, str]] = {
    0: ("<B", "<u1"), 1: ("<b", "<i1"), 2: ("<H", "<u2"), 3: ("<h", "<i2"), 4: ("<I", "<u4"),
    5: ("<i", "<i4"), 6: ("<f", "<f4"), 7: ("<?", "?"), 10: ("<Q", "<u8"), 11: ("<q", "<i8"),
    12: ("<d", "<f8"),
}
# The fewest bytes a value of each type takes: a count times this must fit
# in what is left of the file.
_MIN_VALUE_BYTES = {kind: struct.calcsize(fmt) for kind, (fmt, _) in _SCALARS.items()} | {
    _STRING: 8,  # its length
    _ARRAY: 12,  # its item type and count
}
# name length, dimension count, type, offset (and at least one dim).
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8
# key length, value type, and the smallest value.
_MIN_METADATA_BYTES = 8 + 4 + 1
# Element types the gguf package's reader views as typed arrays; every other
# (block-quantized, BF16) type is viewed as its raw bytes, one row per row.
_TYPED = {
    GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


@dataclass(frozen=True, slots=True)
class GGUFTensorInfo:
    """One entry of the tensor table; `offset` is absolute in the file."""

    name: str
    type: GGMLQuantizationType
    dims: tuple[int, ...]  # innermost first, as GGUF stores them
    offset: int
    nbytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        """Row-major, as numpy and Hugging Face write it."""
        return tuple(reversed(self.dims))

    @property
    def n_elements(self) -> int:
        count = 1
        for dim in self.dims:
            count *= dim
        return count


@dataclass(frozen=True, slots=True)
class GGUFHeader:
    """Everything but the tensors' data."""

    path: Path
    version: int
    # Scalars as Python values (float32 ones as the shortest decimal that
    # rounds to them), strings, and arrays as lists; arrays skipped by
    # `long_arrays=False` are absent.
    metadata: dict[str, Any]
    tensors: dict[str, GGUFTensorInfo]  # in the file's order
    data_start: int
    # Where the last tensor's data ends; the file holds at least this much.
    data_end: int

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "unknown"))

    def arch_value(self, key: str, default: Any = None) -> Any:
        """`<architecture>.<key>` of the metadata ("llama.context_length")."""
        return self.metadata.get(f"{self.architecture}.{key}", default)


class GGUFFile:
    """An open GGUF file: its header and mapped views of its tensors."""

    def __init__(self, header: GGUFHeader, data: np.memmap) -> None:
        self.header = header
        self._data = data

    def tensor_data(self, tensor: GGUFTensorInfo) -> np.ndarray:
        """The tensor's bytes as the gguf package's reader views them: typed
        [*shape] for float and integer types, uint8 [rows, bytes of a row]
        for block-quantized ones. A read-only view of the mapped file."""
        item_type = _TYPED.get(tensor.type)
        if item_type is not None:
            view = np.frombuffer(self._data, dtype=item_type, count=tensor.n_elements, offset=tensor.offset)
            return view.reshape(tensor.shape)
        view = np.frombuffer(self._data, dtype=np.uint8, count=tensor.nbytes, offset=tensor.offset)
        return view.reshape(quant_shape_to_byte_shape(tensor.shape, tensor.type))


def open_gguf(path: str | Path, *, long_arrays: bool = True) -> GGUFFile:
    """Open a GGUF file; see `read_gguf_header` for what is checked."""
    path = Path(path)
    data = _map(path)
    return GGUFFile(_parse(memoryview(data), path, long_arrays), data)


def read_gguf_header(path: str | Path, *, long_arrays: bool = True) -> GGUFHeader:
    """The header of a GGUF file. `long_arrays=False` skips metadata arrays
    of more than SHORT_ARRAY items (the vocabulary), for a quick summary.

    Raises GGUFFormatError for a file that is not GGUF, is damaged or is
    shorter than its tensor table says (truncated), UnsupportedModelError for
    a big-endian or version 1 file or a tensor type the gguf package does not
    know, ModelLoadError when it cannot be read at all.
    """
    path = Path(path)
    return _parse(memoryview(_map(path)), path, long_arrays)


def _map(path: Path) -> np.memmap:
    try:
        with path.open("rb") as file:
            magic = file.read(len(MAGIC))
    except FileNotFoundError as exc:
        raise ModelLoadError(f"GGUF file not found: {path}") from exc
    except OSError as exc:
        raise ModelLoadError(f"Cannot read {path}: {exc.strerror or exc}.") from exc
    if magic != MAGIC:
        raise GGUFFormatError(
            f"{path} is not a GGUF file (it does not start with the GGUF signature). "
            "Choose a .gguf model file, or download it again if it should be one."
        )
    try:
        return np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"Cannot read {path}: {exc}.") from exc


class _Cursor:
    """Reads little-endian values from a buffer, never past its end."""

    def __init__(self, buf: memoryview, path: Path) -> None:
        self.buf = buf
        self.pos = 0
        self.path = path

    @property
    def left(self) -> int:
        return len(self.buf) - self.pos

    def need(self, count: int, what: str) -> None:
        if count < 0 or count > self.left:
            raise _Damaged(f"{what} runs past the end of the file")

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        self.need(size, "a value")
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += size
        return value

    def string(self, what: str) -> str:
        length = self.take("<Q")
        self.need(length, what)
        raw = bytes(self.buf[self.pos : self.pos + length])
        self.pos += length
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _Damaged(f"{what} is not valid UTF-8") from None

    def count(self, what: str, min_item_bytes: int, fmt: str = "<Q") -> int:
        """A count of items that must all fit in the rest of the file."""
        number = self.take(fmt)
        if number * min_item_bytes > self.left:
            raise _Damaged(f"{what} claims {number} items, more than the file holds")
        return number


class _Damaged(Exception):
    """A structural problem found while parsing; turned into GGUFFormatError."""


def _parse(buf: memoryview, path: Path, long_arrays: bool) -> GGUFHeader:
    cursor = _Cursor(buf, path)
    try:
        cursor.pos = len(MAGIC)
        version = cursor.take("<I")
        if version > 0xFFFF and struct.unpack("<I", struct.pack(">I", version))[0] <= 0xFFFF:
            raise UnsupportedModelError(f"{path.name} is a big-endian GGUF file, which Tandem cannot import.")
        if version < 2:
            raise UnsupportedModelError(
                f"{path.name} is a GGUF version {version} file; re-convert it with a current llama.cpp."
            )
        tensor_count = cursor.count("the tensor table", _MIN_TENSOR_INFO_BYTES)
        kv_count = cursor.count("the metadata", _MIN_METADATA_BYTES)
        metadata: dict[str, Any] = {}
        for _ in range(kv_count):
            key = cursor.string("a metadata key")
            value = _read_value(cursor, cursor.take("<I"), key, long_arrays)
            if value is not _SKIPPED:
                metadata[key] = value
        infos = [_read_tensor_info(cursor) for _ in range(tensor_count)]
        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or isinstance(alignment, bool) or not 0 < alignment <= 1 << 20:
            raise _Damaged(f"general.alignment {alignment!r} is not a sensible alignment")
        data_start = -(-cursor.pos // alignment) * alignment
    except _Damaged as exc:
        raise GGUFFormatError(
            f"Cannot read {path}: it ends too early or is damaged ({exc}); the file is truncated "
            "or corrupt. Download it again."
        ) from None
    tensors: dict[str, GGUFTensorInfo] = {}
    data_end = data_start
    for name, dims, type_id, offset in infos:
        if name in tensors:
            raise GGUFFormatError(f"{path.name} holds the tensor {name!r} twice; the file is corrupt.")
        try:
            kind = GGMLQuantizationType(type_id)
        except ValueError:
            raise UnsupportedModelError(
                f"{path.name}: tensor {name} has the type number {type_id}, which the installed gguf "
                "package does not know; upgrading the gguf package may help."
            ) from None
        block_size, type_size = GGML_QUANT_SIZES[kind]
        if dims[0] % block_size:
            raise GGUFFormatError(
                f"{path.name}: tensor {name} has rows of {dims[0]} values, not whole {kind.name} blocks "
                f"of {block_size}; the file is corrupt."
            )
        if offset % alignment:
            raise GGUFFormatError(f"{path.name}: tensor {name}'s data is not aligned; the file is corrupt.")
        elements = 1
        for dim in dims:
            elements *= dim
        info = GGUFTensorInfo(name, kind, dims, data_start + offset, elements // block_size * type_size)
        tensors[name] = info
        data_end = max(data_end, info.offset + info.nbytes)
    if data_end > len(buf):
        raise GGUFFormatError(
            f"{path.name} is truncated: its header describes {format_bytes(data_end)} but the file has "
            f"{format_bytes(len(buf))}: it is truncated or corrupt. Download it again."
        )
    return GGUFHeader(path, version, metadata, tensors, data_start, data_end)


_SKIPPED = object()


def _read_value(cursor: _Cursor, kind: int, key: str, long_arrays: bool, depth: int = 0) -> Any:
    scalar = _SCALARS.get(kind)
    if scalar is not None:
        value = cursor.take(scalar[0])
        if kind == _FLOAT32:
            # float32(1e-5) read as a double is 9.999999747378752e-06; the
            # shortest decimal that rounds to the same float32 is what the
            # original config said.
            value = float(str(np.float32(value)))
        return value
    if kind == _STRING:
        return cursor.string(f"the metadata {key!r}")
    if kind != _ARRAY:
        raise _Damaged(f"the metadata {key!r} has the unknown type {kind}")
    if depth >= MAX_ARRAY_DEPTH:
        raise _Damaged(f"the metadata {key!r} nests arrays more than {MAX_ARRAY_DEPTH} deep")
    item_kind = cursor.take("<I")
    if item_kind not in _MIN_VALUE_BYTES:
        raise _Damaged(f"the metadata {key!r} is an array of the unknown type {item_kind}")
    count = cursor.count(f"the metadata {key!r}", _MIN_VALUE_BYTES[item_kind])
    if count > MAX_ARRAY_ITEMS:
        raise _Damaged(f"the metadata {key!r} claims {count} items, more than any model has ({MAX_ARRAY_ITEMS})")
    skip = depth == 0 and not long_arrays and count > SHORT_ARRAY
    scalar = _SCALARS.get(item_kind)
    if scalar is not None:
        size = count * _MIN_VALUE_BYTES[item_kind]
        values = None if skip else np.frombuffer(cursor.buf, scalar[1], count, cursor.pos).tolist()
        cursor.pos += size
        return _SKIPPED if skip else values
    if skip and item_kind == _STRING:
        for _ in range(count):  # past the strings without decoding them
            length = cursor.take("<Q")
            cursor.need(length, f"the metadata {key!r}")
            cursor.pos += length
        return _SKIPPED
    items = [_read_value(cursor, item_kind, key, long_arrays, depth + 1) for _ in range(count)]
    return _SKIPPED if skip else items


def _read_tensor_info(cursor: _Cursor) -> tuple[str, tuple[int, ...], int, int]:
    name = cursor.string("a tensor name")
    n_dims = cursor.take("<I")
    if not 1 <= n_dims <= MAX_DIMS:
        raise _Damaged(f"tensor {name!r} has {n_dims} dimensions")
    cursor.need(8 * n_dims, f"tensor {name!r}'s dimensions")
    dims = tuple(cursor.take("<Q") for _ in range(n_dims))
    return name, dims, cursor.take("<I"), cursor.take("<Q")


class GGUFMetadata:
    """A header's metadata with the importer's errors: `require` names the
    file and the missing key."""

    def __init__(self, header: GGUFHeader) -> None:
        self._values = header.metadata
        self.source = header.path

    def get(self, key: str, default: Any = None) -> Any:
        return self._values.get(key, default)

    def require(self, key: str) -> Any:
        value = self._values.get(key)
        if value is None:
            raise ModelLoadError(
                f"{self.source.name} has no {key!r} in its GGUF metadata; the file is incomplete "
                "or was written by a converter Tandem does not know."
            )
        return value

    def integer(self, key: str, default: int | None = None) -> int:
        """A whole-number value (`default` when absent; required without one)."""
        value = self.require(key) if default is None else self._values.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._wrong_type(key, value, "a whole number")
        return value

    def real(self, key: str, default: float | None = None) -> float:
        """A finite number (`default` when absent; required without one)."""
        value = self.require(key) if default is None else self._values.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self._wrong_type(key, value, "a finite number")
        return float(value)

    def _wrong_type(self, key: str, value: Any, wanted: str) -> GGUFFormatError:
        shown = repr(value) if len(repr(value)) < 60 else type(value).__name__
        return GGUFFormatError(
            f"{self.source.name}: the GGUF metadata {key!r} is {shown}, not {wanted}; the file is corrupt."
        )
