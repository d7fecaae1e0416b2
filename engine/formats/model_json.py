"""Reading the JSON files of a model folder (config.json, tokenizer_config.json,
generation_config.json, special_tokens_map.json, chat_template.json, the
safetensors index and the safetensors header) with bounds.

They come from strangers, and Python's json module raises more than
JSONDecodeError on hostile input: a ValueError for an integer beyond the
interpreter's digit limit, a RecursionError for deep nesting, and it returns
strings with unpaired UTF-16 surrogates that fail later, deep in tokenizers.
So every such file is read here, once: at most `MAX_JSON_BYTES` (a FIFO or a
device is never read: `read_model_file`, which also reads a folder's chat
template file), UTF-8, a JSON object at the top, nested at most
`MAX_JSON_DEPTH` deep (other code re-serializes configs, which must not hit
the recursion limit), with every problem raised as ModelJSONError, a
ValueError whose message completes a sentence after the file's name ("holds
an integer of more than 4300 digits"). Callers wrap it in their own
engine.errors class, which names the file and says what to do.
`shown_value` is how any reader of model files quotes a value in a message.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any

from engine.progress import format_bytes

# Far above any model's JSON file (config.json: a few KB; tokenizer_config.json
# of a vocabulary with thousands of added tokens: ~1 MB; an index of a
# thousand shards' tensors: ~100 KB), low enough that json's objects stay in
# the hundreds of megabytes.
MAX_JSON_BYTES = 16 << 20
# Model configs nest 3-4 deep.
MAX_JSON_DEPTH = 64

# A \u escape of a UTF-16 surrogate: only then can json.loads return a string
# with an unpaired one, so only then is the parsed value checked for them.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class ModelJSONError(ValueError):
    """Why a model's JSON file cannot be used; the message follows the file's name."""


def read_json_object(path: Path, *, max_bytes: int | None = None) -> dict[str, Any]:
    """The JSON object in the regular file `path` of at most `max_bytes`
    (MAX_JSON_BYTES). Raises ModelJSONError for anything else
    (FileNotFoundError for a missing file, so optional files can be told
    apart)."""
    return parse_json_object(read_model_file(path, max_bytes=max_bytes))


def read_model_file(path: Path, *, max_bytes: int | None = None) -> bytes:
    """The bytes of the regular file `path`, at most `max_bytes`
    (MAX_JSON_BYTES; a link to one is followed). Raises FileNotFoundError when nothing is there,
    ModelJSONError for a FIFO, a device or a folder (never opened for
    long: O_NONBLOCK), a bigger file, or one that cannot be read."""
    max_bytes = MAX_JSON_BYTES if max_bytes is None else max_bytes
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise ModelJSONError(f"cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
    chunks: list[bytes] = []
    total = 0
    try:
        info = os.fstat(fd)  # what was opened, not what a name pointed at a moment before
        if not stat.S_ISREG(info.st_mode):
            raise ModelJSONError("is not a regular file")
        if info.st_size > max_bytes:
            raise ModelJSONError(
                f"is {format_bytes(info.st_size)}, more than a model's file of its kind can be "
                f"({format_bytes(max_bytes)})"
            )
        # A kernel file (/proc/kmsg) says 0 bytes and may wait forever for more.
        while info.st_size and total <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as exc:
        raise ModelJSONError(f"cannot be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if total > max_bytes:  # it grew while it was read
        raise ModelJSONError(f"is more than a model's file of its kind can be ({format_bytes(max_bytes)})")
    return b"".join(chunks)


def parse_json_object(data: bytes) -> dict[str, Any]:
    """The JSON object in `data`; ModelJSONError for anything else."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ModelJSONError("is not UTF-8 text") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelJSONError(f"is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise ModelJSONError(f"nests arrays or objects more than {MAX_JSON_DEPTH} deep") from None
    except ValueError:  # the only other one json raises: an integer past the digit limit
        raise ModelJSONError(
            f"holds an integer of more than {sys.get_int_max_str_digits()} digits, which no model file has"
        ) from None
    if not isinstance(value, dict):
        raise ModelJSONError(f"holds a JSON {_json_type(value)}, not an object")
    _check_depth(value, text)
    if _SURROGATE_ESCAPE.search(data):
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ModelJSONError("holds an unpaired UTF-16 surrogate (\\ud800-\\udfff), which is not text") from None
    return value


def _check_depth(value: dict[str, Any], text: str) -> None:
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return  # too few brackets to nest that deep
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        container, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ModelJSONError(f"nests arrays or objects more than {MAX_JSON_DEPTH} deep")
        items = container.values() if isinstance(container, dict) else container
        stack.extend((item, depth + 1) for item in items if isinstance(item, (dict, list)))


def shown_value(value: Any) -> str:
    """A value read from a model file, for an error message: its repr, cut
    short without building the whole of it (a file may hold megabytes or
    millions of items where one number was expected)."""
    if isinstance(value, str):
        return repr(value) if len(value) <= 60 else f"{value[:40]!r}... ({len(value):,} characters)"
    if isinstance(value, dict) and len(value) > 4:
        return f"an object of {len(value):,} keys"
    if isinstance(value, (list, tuple)) or getattr(value, "ndim", 0) >= 1:  # numpy arrays too
        if len(value) > 4:
            return f"an array of {len(value):,} items"
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:60]}..."


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return "number"
