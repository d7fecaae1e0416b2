"""Read a GGUF file: its header, metadata and tensor table, and views of its
tensors' data.

GGUF files come from strangers, so every count and length is checked against
the bytes really in the file before anything is allocated or looped over: a
damaged file raises GGUFFormatError (a ModelLoadError) in a fraction of a
second, whatever counts it claims. Counts within the file's size are bounded
too, in total over the whole header (`MAX_METADATA_KEYS`, `MAX_TENSORS`,
`MAX_METADATA_VALUES`, `MAX_METADATA_BYTES`): a Python object per value costs
up to ten times its bytes in the file, so a file of a few hundred megabytes
of small values would otherwise take gigabytes and minutes. Long numeric
arrays (token scores and types) are not turned into Python objects at all:
they are read-only numpy views of the mapped file. The tensors' data is
mapped, not read: `GGUFFile.tensor_data` returns a numpy view (the layout
the gguf package's own reader gives), so a multi-gigabyte file costs
nothing until a tensor is converted.

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
from engine.formats.model_json import shown_value
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
# Totals over the whole header, each far above what a real model has
# (llama.cpp files have ~50 keys and ~300-1,000 tensors per 100 layers; the
# largest vocabularies, tokens plus merges, are ~400k strings of ~8 bytes;
# some files embed tokenizer.json, ~10 MB, as one string): what the reader
# may turn into Python objects, so a header costs at most a few hundred MB
# and a couple of seconds whatever the file holds.
MAX_METADATA_KEYS = 1 << 16
MAX_TENSORS = 1 << 16
# Strings, and numbers of arrays of at most SHORT_ARRAY items, over all keys
# (walked strings count whether kept or skipped: walking them is the cost).
MAX_METADATA_VALUES = 1 << 21
# Bytes of all strings: keys, values and tensor names.
MAX_METADATA_BYTES = 64 << 20

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
    # rounds to them), strings, arrays of strings and arrays of at most
    # SHORT_ARRAY numbers as lists, longer arrays of numbers as read-only
    # numpy views of the mapped file (which then stays mapped while the
    # header lives); arrays skipped by `long_arrays=False` are absent.
    # Read values through GGUFMetadata, which checks their types.
    metadata: dict[str, Any]
    tensors: dict[str, GGUFTensorInfo]  # in the file's order
    data_start: int
    # Where the last tensor's data ends; the file holds at least this much.
    data_end: int

    @property
    def architecture(self) -> str:
        value = self.metadata.get("general.architecture")
        return value if isinstance(value, str) else "unknown"

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
        # What is left of the header's budgets.
        self.values_left = MAX_METADATA_VALUES
        self.bytes_left = MAX_METADATA_BYTES

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
        self.spend_bytes(length, what)
        raw = bytes(self.buf[self.pos : self.pos + length])
        self.pos += length
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _Damaged(f"{what} is not valid UTF-8") from None

    def strings(self, count: int, what: str, keep: bool) -> list[str] | None:
        """`count` strings (None when not kept: they are only walked past).
        The hot loop of a vocabulary: 100k-400k strings, so kept lean."""
        self.spend_values(count, what)
        buf, pos, end = self.buf, self.pos, len(self.buf)
        unpack = _U64.unpack_from
        out: list[str] = []
        append = out.append
        spent = 0
        try:
            for _ in range(count):
                if pos + 8 > end:
                    raise _Damaged(f"{what} runs past the end of the file")
                (length,) = unpack(buf, pos)
                start = pos + 8
                pos = start + length
                if pos > end:
                    raise _Damaged(f"{what} runs past the end of the file")
                spent += length
                if spent > self.bytes_left:
                    self.spend_bytes(spent, what)  # raises
                if keep:
                    append(str(buf[start:pos], "utf-8"))
        except UnicodeDecodeError:
            raise _Damaged(f"{what} holds a string that is not valid UTF-8") from None
        self.bytes_left -= spent
        self.pos = pos
        return out if keep else None

    def count(self, what: str, min_item_bytes: int, fmt: str = "<Q") -> int:
        """A count of items that must all fit in the rest of the file."""
        number = self.take(fmt)
        if number * min_item_bytes > self.left:
            raise _Damaged(f"{what} claims {number} items, more than the file holds")
        return number

    def spend_values(self, count: int, what: str) -> None:
        if count > self.values_left:
            raise _TooBig(
                f"at {what}, its metadata holds more than {MAX_METADATA_VALUES:,} strings and numbers "
                "in all, more than any model has"
            )
        self.values_left -= count

    def spend_bytes(self, count: int, what: str) -> None:
        if count > self.bytes_left:
            raise _TooBig(
                f"at {what}, its metadata and tensor names hold more than {format_bytes(MAX_METADATA_BYTES)} "
                "of text in all, more than any model has"
            )
        self.bytes_left -= count


class _Damaged(Exception):
    """A structural problem found while parsing; turned into GGUFFormatError."""


class _TooBig(Exception):
    """A header within the file's size that holds more than any model; turned into GGUFFormatError."""


_U64 = struct.Struct("<Q")


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
        if tensor_count > MAX_TENSORS:
            raise _TooBig(f"it has {tensor_count:,} tensors, more than any model ({MAX_TENSORS:,})")
        if kv_count > MAX_METADATA_KEYS:
            raise _TooBig(f"it has {kv_count:,} metadata keys, more than any model ({MAX_METADATA_KEYS:,})")
        metadata: dict[str, Any] = {}
        for _ in range(kv_count):
            key = cursor.string("a metadata key")
            value = _read_value(cursor, cursor.take("<I"), key, long_arrays)
            if value is not _SKIPPED:
                metadata[key] = value
        infos = [_read_tensor_info(cursor) for _ in range(tensor_count)]
        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or isinstance(alignment, bool) or not 0 < alignment <= 1 << 20:
            raise _Damaged(f"general.alignment {shown_value(alignment)} is not a sensible alignment")
        data_start = -(-cursor.pos // alignment) * alignment
    except _Damaged as exc:
        raise GGUFFormatError(
            f"Cannot read {path}: it ends too early or is damaged ({exc}); the file is truncated "
            "or corrupt. Download it again."
        ) from None
    except _TooBig as exc:
        raise GGUFFormatError(f"{path.name} is refused: {exc}. It is not a model Tandem can read.") from None
    tensors: dict[str, GGUFTensorInfo] = {}
    data_end = data_start
    for name, dims, type_id, offset in infos:
        if name in tensors:
            raise GGUFFormatError(f"{path.name} holds the tensor {shown_value(name)} twice; the file is corrupt.")
        try:
            kind = GGMLQuantizationType(type_id)
        except ValueError:
            raise UnsupportedModelError(
                f"{path.name}: tensor {shown_value(name)} has the type number {type_id}, which the installed gguf "
                "package does not know; upgrading the gguf package may help."
            ) from None
        block_size, type_size = GGML_QUANT_SIZES[kind]
        if dims[0] % block_size:
            raise GGUFFormatError(
                f"{path.name}: tensor {shown_value(name)} has rows of {dims[0]} values, not whole {kind.name} blocks "
                f"of {block_size}; the file is corrupt."
            )
        if offset % alignment:
            raise GGUFFormatError(f"{path.name}: tensor {shown_value(name)}'s data is not aligned; the file is corrupt.")
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
    what = f"the metadata {shown_value(key)}"
    if kind == _STRING:
        return cursor.string(what)
    if kind != _ARRAY:
        raise _Damaged(f"{what} has the unknown type {kind}")
    if depth >= MAX_ARRAY_DEPTH:
        raise _Damaged(f"{what} nests arrays more than {MAX_ARRAY_DEPTH} deep")
    item_kind = cursor.take("<I")
    if item_kind not in _MIN_VALUE_BYTES:
        raise _Damaged(f"{what} is an array of the unknown type {item_kind}")
    count = cursor.count(what, _MIN_VALUE_BYTES[item_kind])
    if count > MAX_ARRAY_ITEMS:
        raise _Damaged(f"{what} claims {count} items, more than any model has ({MAX_ARRAY_ITEMS})")
    long = count > SHORT_ARRAY
    skip = depth == 0 and not long_arrays and long
    scalar = _SCALARS.get(item_kind)
    if scalar is not None:
        start = cursor.pos
        cursor.pos += count * _MIN_VALUE_BYTES[item_kind]
        if skip:
            return _SKIPPED
        view = np.frombuffer(cursor.buf, scalar[1], count, start)
        if long:
            return view  # read-only: the file is mapped read-only
        cursor.spend_values(count, what)
        return view.tolist()
    if item_kind == _STRING:
        items = cursor.strings(count, what, keep=not skip)
        return _SKIPPED if items is None else items
    cursor.spend_values(count, what)  # arrays of arrays
    items = [_read_value(cursor, item_kind, key, long_arrays, depth + 1) for _ in range(count)]
    return _SKIPPED if skip else items


def _read_tensor_info(cursor: _Cursor) -> tuple[str, tuple[int, ...], int, int]:
    name = cursor.string("a tensor name")
    n_dims = cursor.take("<I")
    if not 1 <= n_dims <= MAX_DIMS:
        raise _Damaged(f"tensor {shown_value(name)} has {n_dims} dimensions")
    cursor.need(8 * n_dims, f"tensor {shown_value(name)}'s dimensions")
    dims = tuple(cursor.take("<Q") for _ in range(n_dims))
    return name, dims, cursor.take("<I"), cursor.take("<Q")


class GGUFMetadata:
    """A header's metadata with the importer's errors: `require` names the
    file and the missing key, and the typed readers (`string`, `integer`,
    `real`, `strings`, `integers`, `reals`) name the key whose value is of
    the wrong type, so no value of a hostile file reaches code that assumes
    its type."""

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

    def string(self, key: str, default: str | None = None) -> str:
        """A string (`default` when absent; required without one)."""
        value = self.require(key) if default is None else self._values.get(key, default)
        if not isinstance(value, str):
            raise self._wrong_type(key, value, "a string")
        return value

    def optional_string(self, key: str) -> str | None:
        return None if self._values.get(key) is None else self.string(key)

    def integer(self, key: str, default: int | None = None) -> int:
        """A whole-number value (`default` when absent; required without one)."""
        value = self.require(key) if default is None else self._values.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._wrong_type(key, value, "a whole number")
        return value

    def optional_integer(self, key: str) -> int | None:
        return None if self._values.get(key) is None else self.integer(key)

    def real(self, key: str, default: float | None = None) -> float:
        """A finite number (`default` when absent; required without one)."""
        value = self.require(key) if default is None else self._values.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self._wrong_type(key, value, "a finite number")
        return float(value)

    def optional_real(self, key: str) -> float | None:
        return None if self._values.get(key) is None else self.real(key)

    def flag(self, key: str, default: bool) -> bool:
        """A boolean (`default` when absent)."""
        value = self._values.get(key, default)
        if not isinstance(value, bool):
            raise self._wrong_type(key, value, "true or false")
        return value

    def strings(self, key: str) -> list[str] | None:
        """An array of strings; None when absent."""
        value = self._values.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise self._wrong_type(key, value, "an array of strings")
        return value

    def integers(self, key: str) -> list[int] | None:
        """An array of whole numbers (of any integer type); None when absent."""
        value = self._values.get(key)
        if value is None:
            return None
        if isinstance(value, np.ndarray):
            if value.dtype.kind not in "iu":
                raise self._wrong_type(key, value, "an array of whole numbers")
            return value.tolist()
        if not isinstance(value, list) or not all(
            isinstance(item, int) and not isinstance(item, bool) for item in value
        ):
            raise self._wrong_type(key, value, "an array of whole numbers")
        return value

    def reals(self, key: str) -> list[float] | None:
        """An array of finite numbers; None when absent."""
        value = self._values.get(key)
        if value is None:
            return None
        if isinstance(value, list) and all(isinstance(item, (int, float)) and not isinstance(item, bool) for item in value):
            value = np.asarray(value, dtype=np.float64)
        if not isinstance(value, np.ndarray) or value.dtype.kind not in "iuf" or not np.isfinite(value).all():
            raise self._wrong_type(key, value, "an array of finite numbers")
        return value.tolist()

    def _wrong_type(self, key: str, value: Any, wanted: str) -> GGUFFormatError:
        return GGUFFormatError(
            f"{self.source.name}: the GGUF metadata {key!r} is {shown_value(value)}, not {wanted}; the file is corrupt."
        )
