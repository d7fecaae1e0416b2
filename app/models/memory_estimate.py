"""How much memory a model will take once loaded, and whether that fits.

Before the window loads another model it asks three questions, answered here
without loading anything:

- `estimate_memory(shape, device, dtype, kv_cache_mb, page_size, stored=,
  quantize=, quantized=, max_context=)`: the bytes the engine will hold for
  the weights and the KV pool. Every rule is the engine's own, read through
  engine.inspect:
  engine/formats/loader.py `resolve_device` / `resolve_dtype` (what "auto"
  means) and `resolve_quantized_compute` (whether blocks run quantized),
  engine/formats/weight_memory.py (the weights' bytes as the loader holds
  them) and engine/runner/memory.py (the KV page's bytes, the default
  budget, the pool's cap and the CUDA reserve). tests/app/test_model_registry.py
  checks the estimate against really loaded engines.
- `available_memory(device)`: the bytes free on the device now.
- `check_fits(estimate, available, loaded)`: fits, or which idle models to
  unload so that it does.

All sizes are bytes.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from engine.errors import ModelLoadError
from engine import inspect
from engine.inspect import EMBEDDING_NAME, LM_HEAD_NAME, ModelShape, QuantizedWeights, weight_bytes
from engine.progress import format_bytes

if TYPE_CHECKING:
    import torch

# The window imports this module while it is built; the engine's memory
# rules import torch (seconds), so the functions that use them import them
# when they first run, after the window is on screen (ui/startup.py).

# Names other layers import from here; the rules behind them are the engine's.
__all__ = [
    "EMBEDDING_NAME", "LM_HEAD_NAME", "FitResult", "LoadedModel", "MemoryEstimate", "ModelShape",
    "QuantizedWeights", "available_memory", "check_fits", "cpu_available_memory", "cpu_packs_weights",
    "estimate_memory", "parse_meminfo",
]


@dataclass(slots=True, frozen=True)
class MemoryEstimate:
    weights_bytes: int
    kv_bytes: int
    # CUDA only: what the engine keeps free for the desktop and the runtime
    # (engine/runner/memory.py); activations are not counted.
    overhead_bytes: int
    device: str  # "cpu" | "cuda" | "cuda:N"
    dtype: str  # the weights' dtype, e.g. "float32"
    # True on CUDA without a KV budget: the engine then gives the pool what
    # is free after loading, and kv_bytes is the least it needs (one
    # conversation at the model's full context).
    kv_adaptive: bool = False
    # True on the CPU: the engine commits the KV pool's memory as pages are
    # first used, so kv_bytes is what a full pool holds, not what start-up does.
    kv_grows: bool = False
    # How the weights are held, as Engine.stats().weights says it:
    # "q4_1+q8_0 (kernel)", "float32 (dequantized from q4_1+q8_0)"; "" for
    # plain float weights (then `dtype` says it).
    weights: str = ""

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.overhead_bytes

    def describe(self) -> str:
        """'about 1.6 GB (weights 1.1 GB as float32 + KV cache up to 537 MB)'"""
        parts = [f"weights {format_bytes(self.weights_bytes)} as {self.weights or self.dtype}"]
        kv = f"KV cache {'up to ' if self.kv_grows else ''}{format_bytes(self.kv_bytes)}"
        parts.append(kv + (" or more" if self.kv_adaptive else ""))
        if self.overhead_bytes:
            parts.append(f"{format_bytes(self.overhead_bytes)} kept free for the desktop")
        return f"about {format_bytes(self.total_bytes)} ({' + '.join(parts)})"


def estimate_memory(
    shape: ModelShape,
    device: str = "auto",
    dtype: str = "auto",
    kv_cache_mb: int | None = None,
    page_size: int = 16,
    *,
    stored: QuantizedWeights | None = None,
    quantize: str | None = None,
    quantized: str = "auto",
    max_context: int | None = None,
) -> MemoryEstimate:
    """The memory an Engine(device=device, dtype=dtype, page_size=page_size,
    kv_cache_bytes=kv_cache_mb MiB, quantize=quantize, quantized=quantized,
    max_context=max_context) of this model will hold.

    `stored`: the weights the model's folder keeps block-quantized (an
    imported GGUF file); they count at their blocks' bytes where they will
    run quantized, at float size where they will be dequantized. `quantize`
    ("int8", "int4") quantizes a float checkpoint at load; it is ignored for
    a folder that is quantized already, as the engine ignores it.
    `max_context`: the context the engine is capped to (None: the model's
    trained context, `shape.max_context`); the KV pool's cap follows it.

    Raises engine.errors.ModelLoadError for a device, dtype or quantization
    the engine would refuse (CUDA asked for without a GPU, an unknown dtype,
    `quantize` where no quantized kernel runs).
    """
    if page_size < 1:
        raise ModelLoadError("page_size must be at least 1")
    dev = inspect.resolve_device(device)
    weight_dtype = inspect.resolve_dtype(dtype, dev)

    blocks = stored or QuantizedWeights()
    if quantize is not None and not blocks:
        blocks = QuantizedWeights.planned(shape, quantize)
        run_quantized = inspect.resolve_quantized_compute(quantized, dev, asked=True, probe=False) == "kernel"
    elif blocks:
        run_quantized = inspect.resolve_quantized_compute(quantized, dev, probe=False) == "kernel"
    else:
        run_quantized = False
    weights, described = weight_bytes(shape, dev, weight_dtype, blocks, run_quantized=run_quantized)

    context = shape.max_context if max_context is None else min(max_context, shape.max_context)
    # Every product on the quantized kernels runs the native CPU path, whose cache is fp16.
    kv_dtype = inspect.kv_cache_dtype(dev, weight_dtype, native=run_quantized and blocks.covers(shape))
    per_page = inspect.kv_bytes_per_page(shape.num_layers, shape.num_kv_heads, shape.head_dim, page_size, kv_dtype)
    budget = inspect.default_kv_budget(dev, None if kv_cache_mb is None else kv_cache_mb * inspect.MIB)
    adaptive = budget is None
    if budget is None:
        # The engine measures what is free once loaded; the least it needs
        # is one conversation at full context.
        budget = inspect.sequence_pages(context, page_size) * per_page
    pages = inspect.default_kv_pages(budget, per_page, context, page_size)
    return MemoryEstimate(
        weights_bytes=weights,
        kv_bytes=pages * per_page,
        overhead_bytes=inspect.DESKTOP_RESERVE_BYTES + inspect.RUNTIME_EXTRA_BYTES if dev.type == "cuda" else 0,
        device=str(dev),
        dtype=str(weight_dtype).removeprefix("torch."),
        kv_adaptive=adaptive,
        kv_grows=dev.type == "cpu",
        weights=described,
    )


def cpu_packs_weights(dtype: torch.dtype) -> bool:
    """Whether the engine keeps a oneDNN-packed second copy of float matmul
    weights of `dtype` on the CPU (engine/model/linear.py cpu_weight_packing)."""
    return inspect.cpu_weight_packing(dtype)


# ---------------------------------------------------------------------------
# What the device has


def available_memory(device: str = "auto") -> int:
    """Bytes the device can give a new model now.

    CPU: the kernel's MemAvailable (free memory plus caches it can drop), not
    MemFree, which a busy page cache keeps near zero. CUDA: the driver's free
    memory on that GPU.
    """
    import torch

    dev = inspect.resolve_device(device)
    if dev.type == "cuda":
        free, _total = torch.cuda.mem_get_info(dev)
        return int(free)
    return cpu_available_memory()


def cpu_available_memory(meminfo: Path = Path("/proc/meminfo")) -> int:
    try:
        text = meminfo.read_text(encoding="ascii")
    except OSError:
        text = None
    if text is not None:
        value = parse_meminfo(text)
        if value is not None:
            return value
    if sys.platform == "win32":
        return _windows_available_memory()
    names = os.sysconf_names
    if "SC_AVPHYS_PAGES" in names:  # other Unixes; macOS lacks it
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    # macOS: no cheap "available" figure without extra packages; the physical
    # size is an upper bound, so a model that does not fit it never fits.
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def parse_meminfo(text: str) -> int | None:
    """MemAvailable in bytes from /proc/meminfo's text (None if absent: kernels before 3.14)."""
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key == "MemAvailable":
            number, _, unit = rest.strip().partition(" ")
            return int(number) * (1024 if unit.strip().lower() == "kb" else 1)
    return None


def _windows_available_memory() -> int:
    class MemoryStatusEx(ctypes.Structure):
        _fields_ = [
            ("dwLength", ctypes.c_ulong), ("dwMemoryLoad", ctypes.c_ulong),
            ("ullTotalPhys", ctypes.c_ulonglong), ("ullAvailPhys", ctypes.c_ulonglong),
            ("ullTotalPageFile", ctypes.c_ulonglong), ("ullAvailPageFile", ctypes.c_ulonglong),
            ("ullTotalVirtual", ctypes.c_ulonglong), ("ullAvailVirtual", ctypes.c_ulonglong),
            ("ullAvailExtendedVirtual", ctypes.c_ulonglong),
        ]

    status = MemoryStatusEx()
    status.dwLength = ctypes.sizeof(MemoryStatusEx)
    ctypes.windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(status))  # type: ignore[attr-defined]
    return int(status.ullAvailPhys)


# ---------------------------------------------------------------------------
# Does it fit


@dataclass(slots=True, frozen=True)
class LoadedModel:
    model_id: str
    bytes: int  # what unloading it gives back
    idle: bool  # no pane is streaming from it


@dataclass(slots=True, frozen=True)
class FitResult:
    fits: bool
    needed_bytes: int  # the estimate's total
    available_bytes: int
    # Idle loaded models whose unloading would make room (empty when it fits
    # already, or when even unloading every idle model would not be enough).
    unload: tuple[str, ...] = ()
    # False when it does not fit even with every idle model unloaded.
    can_fit_by_unloading: bool = False
    message: str = field(default="", compare=False)

    @property
    def shortfall_bytes(self) -> int:
        return max(0, self.needed_bytes - self.available_bytes)


def check_fits(
    estimate: MemoryEstimate,
    available: int,
    loaded: Iterable[LoadedModel | tuple[str, int, bool]] = (),
    *,
    model_name: str = "The model",
    names: Mapping[str, str] | None = None,
) -> FitResult:
    """Whether `estimate` fits in `available` bytes, and if not, which idle
    models of `loaded` to unload so that it does.

    The suggestion frees the least memory that is enough while unloading as
    few models as it can: the smallest single idle model that is enough, or
    else the largest idle ones, biggest first, until enough is freed.
    """
    models = [m if isinstance(m, LoadedModel) else LoadedModel(*m) for m in loaded]
    names = dict(names or {})
    need = estimate.total_bytes
    head = f"{model_name} needs {estimate.describe()}, and {format_bytes(available)} is free"
    if need <= available:
        return FitResult(True, need, available, message=f"{head}.")
    shortfall = need - available
    idle = [m for m in models if m.idle]

    def label(m: LoadedModel) -> str:
        return f"{names.get(m.model_id, m.model_id)} ({format_bytes(m.bytes)})"

    enough_alone = sorted((m for m in idle if m.bytes >= shortfall), key=lambda m: m.bytes)
    chosen: list[LoadedModel] = []
    if enough_alone:
        chosen = [enough_alone[0]]
    else:
        freed = 0
        for m in sorted(idle, key=lambda m: m.bytes, reverse=True):
            chosen.append(m)
            freed += m.bytes
            if freed >= shortfall:
                break
        else:
            chosen = []
    if chosen:
        message = f"{head}: it does not fit. Unloading the idle {_join(label(m) for m in chosen)} makes room for it."
        return FitResult(False, need, available, tuple(m.model_id for m in chosen), True, message)
    busy = [m for m in models if not m.idle]
    options = ["choose a smaller model", "set a smaller KV cache in the settings"]
    if estimate.device == "cpu":
        options.append("close other programs")
    if busy:
        options.append(f"wait for {_join(label(m) for m in busy)} to finish its reply and unload it")
    advice = _join(options, "or")
    advice = advice[0].upper() + advice[1:]
    message = f"{head}: it does not fit, even with every idle model unloaded. {advice}."
    return FitResult(False, need, available, (), False, message)


def _join(items: Iterable[str], word: str = "and") -> str:
    """['a', 'b', 'c'] -> 'a, b and c'."""
    items = list(items)
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} {word} {items[-1]}"
