"""How much memory a model will take once loaded, and whether that fits.

Before the window loads another model it asks three questions, answered here
without loading anything:

- `estimate_memory(shape, device, dtype, kv_cache_mb, page_size, stored=,
  quantize=, quantized=)`: the bytes the engine will hold for the weights and
  the KV pool. It mirrors what the engine does at load time, and must be kept
  in step with it: engine/formats/loader.py `resolve_device`/`resolve_dtype` (which
  device and dtype "auto" means; reused here), `resolve_quantized_compute`
  (whether block-quantized weights run quantized or are dequantized; reused)
  and `quantized_copy` (what `quantize="int8"|"int4"` keeps quantized),
  engine/model/llama.py `LlamaModel.__init__` (norms and the KV cache in
  `act_dtype`, fp32 on the CPU), engine/model/linear.py `Linear` (on the CPU a
  oneDNN-packed second copy of every float matmul weight, lm_head included),
  engine/model/quant.py `QuantLinear` (one copy of the blocks, a float32 bias) and
  engine/llm.py `_EngineCore._default_kv_pages` /
  `kv_cache_bytes_per_page` (the KV pool size). tests/app/test_model_registry.py
  checks the estimate against really loaded engines, so a change there that
  is not made here fails a test.
- `available_memory(device)`: the bytes free on the device now.
- `check_fits(estimate, available, loaded)`: fits, or which idle models to
  unload so that it does.

All sizes are bytes.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.model.config import ModelConfig
from engine.errors import ModelLoadError
from engine.formats.loader import QUANTIZE_MODES, resolve_device, resolve_dtype, resolve_quantized_compute
from engine.runner.memory import DESKTOP_RESERVE_BYTES, RUNTIME_EXTRA_BYTES
from engine.progress import format_bytes
from engine.model.quant import GROUP_SIZE

MIB = 1 << 20
# engine/llm.py _default_kv_pages: the KV budget on the CPU when none is given.
CPU_DEFAULT_KV_BYTES = 1 << 30
# engine/llm.py _default_kv_pages: never more pages than this many
# sequences at full context.
KV_CAP_SEQUENCES = 8
# Bytes of one group of GROUP_SIZE weights in each engine.model.quant format: the
# levels (8 or 4 bits each) plus a float16 scale (and a float16 min for q4_1).
BLOCK_BYTES = {"q8_0": GROUP_SIZE + 2, "q4_0": GROUP_SIZE // 2 + 2, "q4_1": GROUP_SIZE // 2 + 4}
EMBEDDING_NAME = "model.embed_tokens.weight"
LM_HEAD_NAME = "lm_head.weight"


def quantized_bytes(fmt: str, params: int) -> int:
    """Bytes of `params` weights held in the block format `fmt` (rows are whole groups)."""
    return params * BLOCK_BYTES[fmt] // GROUP_SIZE


@dataclass(slots=True, frozen=True)
class ModelShape:
    """What the memory of a loaded Llama-family model depends on.

    Parameter counts are split by how the engine stores them: matmul weights
    (fused q/k/v, o, gate/up, down; packed a second time on the CPU), the
    embedding, a separate lm_head (0 when tied to the embedding: the engine
    then multiplies by the embedding itself), norms (kept in the activation
    dtype) and biases (in the weights' dtype, never packed).
    """

    matmul_params: int
    embedding_params: int
    lm_head_params: int
    norm_params: int
    bias_params: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    max_context: int

    @property
    def parameters(self) -> int:
        return (
            self.matmul_params + self.embedding_params + self.lm_head_params
            + self.norm_params + self.bias_params
        )

    @classmethod
    def from_config(cls, c: ModelConfig) -> ModelShape:
        """The shape engine/formats/loader.py builds for this config (the loader
        refuses any checkpoint whose tensors differ from it)."""
        hidden, inter, d = c.hidden_size, c.intermediate_size, c.head_dim
        q_out, kv_out = c.num_attention_heads * d, c.num_key_value_heads * d
        per_layer_matmul = (q_out + 2 * kv_out) * hidden + hidden * q_out + 3 * inter * hidden
        per_layer_bias = (
            (q_out + 2 * kv_out if c.qkv_bias else 0)
            + (hidden if c.o_bias else 0)
            + (2 * inter + hidden if c.mlp_bias else 0)
        )
        return cls(
            matmul_params=c.num_hidden_layers * per_layer_matmul,
            embedding_params=c.vocab_size * hidden,
            lm_head_params=0 if c.tie_word_embeddings else c.vocab_size * hidden,
            norm_params=(2 * c.num_hidden_layers + 1) * hidden,
            bias_params=c.num_hidden_layers * per_layer_bias,
            num_layers=c.num_hidden_layers,
            num_kv_heads=c.num_key_value_heads,
            head_dim=d,
            max_context=c.max_position_embeddings,
        )


@dataclass(slots=True, frozen=True)
class QuantizedWeights:
    """Which of a model's weights are block-quantized (engine.model.quant formats),
    counted the way ModelShape counts parameters. Empty: a float checkpoint.

    `matmul`: (format, parameters) of the layers' quantized matrices; the rest
    of ModelShape.matmul_params is float. `embedding` / `lm_head`: the
    format of that table, None when it is float (or, for the head, absent).
    """

    matmul: tuple[tuple[str, int], ...] = ()
    embedding: str | None = None
    lm_head: str | None = None

    def __bool__(self) -> bool:
        return bool(self.matmul or self.embedding or self.lm_head)

    @property
    def formats(self) -> tuple[str, ...]:
        """The formats present, sorted: ("q4_1", "q8_0")."""
        found = {fmt for fmt, _ in self.matmul} | {f for f in (self.embedding, self.lm_head) if f}
        return tuple(sorted(found))

    @classmethod
    def from_formats(
        cls, formats: Mapping[str, str], shapes: Mapping[str, tuple[int, ...]]
    ) -> QuantizedWeights:
        """From a folder's config.json "quantization" map (engine.formats.loader
        quantized_formats: weight name -> format) and the weights' [rows, cols]."""
        matmul: Counter[str] = Counter()
        embedding = lm_head = None
        for name, fmt in formats.items():
            if name == EMBEDDING_NAME:
                embedding = fmt
            elif name == LM_HEAD_NAME:
                lm_head = fmt
            elif name in shapes:
                rows, cols = shapes[name]
                matmul[fmt] += rows * cols
        return cls(tuple(sorted(matmul.items())), embedding, lm_head)

    @classmethod
    def planned(cls, shape: ModelShape, mode: str) -> QuantizedWeights:
        """What `quantize=mode` keeps of a float checkpoint (engine/formats/loader.py
        quantized_copy): every layer matrix in the mode's format, the
        embedding and a separate LM head in q8_0. Llama-family widths are
        multiples of the 32-weight group, so every matrix qualifies."""
        if mode not in QUANTIZE_MODES:
            raise ModelLoadError(f"Unknown quantization '{mode}': use {', '.join(QUANTIZE_MODES)}")
        return cls(
            ((QUANTIZE_MODES[mode], shape.matmul_params),) if shape.matmul_params else (),
            "q8_0",
            "q8_0" if shape.lm_head_params else None,
        )


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
) -> MemoryEstimate:
    """The memory an Engine(device=device, dtype=dtype, page_size=page_size,
    kv_cache_bytes=kv_cache_mb MiB, quantize=quantize, quantized=quantized)
    of this model will hold.

    `stored`: the weights the model's folder keeps block-quantized (an
    imported GGUF file); they count at their blocks' bytes where they will
    run quantized, at float size where they will be dequantized. `quantize`
    ("int8", "int4") quantizes a float checkpoint at load; it is ignored for
    a folder that is quantized already, as the engine ignores it.

    Raises engine.errors.ModelLoadError for a device, dtype or quantization
    the engine would refuse (CUDA asked for without a GPU, an unknown dtype,
    `quantize` where no quantized kernel runs).
    """
    if page_size < 1:
        raise ModelLoadError("page_size must be at least 1")
    dev = resolve_device(device)
    weight_dtype = resolve_dtype(dtype, dev)
    # engine/model/llama.py: norms, activations and the KV cache run in fp32 on the CPU.
    act_dtype = torch.float32 if dev.type == "cpu" else weight_dtype
    w, a = weight_dtype.itemsize, act_dtype.itemsize
    dtype_name = str(weight_dtype).removeprefix("torch.")

    blocks = stored or QuantizedWeights()
    if quantize is not None and not blocks:
        blocks = QuantizedWeights.planned(shape, quantize)
        run_quantized = resolve_quantized_compute(quantized, dev, asked=True, probe=False) == "kernel"
    elif blocks:
        run_quantized = resolve_quantized_compute(quantized, dev, probe=False) == "kernel"
    else:
        run_quantized = False

    if run_quantized:
        weights, held = _quantized_weight_bytes(shape, blocks, dev, weight_dtype)
        kernel = "kernel" if dev.type == "cpu" else "triton"
        described = f"{held} ({kernel})"
    else:
        weights = (
            shape.matmul_params + shape.embedding_params + shape.lm_head_params + shape.bias_params
        ) * w
        if dev.type == "cpu" and cpu_packs_weights(weight_dtype):
            # engine/model/linear.py keeps the plain weight and oneDNN's blocked copy;
            # a tied lm_head packs the embedding.
            weights += (shape.matmul_params + (shape.lm_head_params or shape.embedding_params)) * w
        described = f"{dtype_name} (dequantized from {'+'.join(blocks.formats)})" if blocks else ""
    weights += shape.norm_params * a

    per_page = 2 * shape.num_layers * page_size * shape.num_kv_heads * shape.head_dim * a
    pages_for_context = -(-shape.max_context // page_size)
    cap = pages_for_context * KV_CAP_SEQUENCES
    adaptive = False
    overhead = 0
    if kv_cache_mb is not None:
        budget = kv_cache_mb * MIB
    elif dev.type == "cpu":
        budget = CPU_DEFAULT_KV_BYTES
    else:
        adaptive = True
        budget = pages_for_context * per_page
    if dev.type == "cuda":
        overhead = DESKTOP_RESERVE_BYTES + RUNTIME_EXTRA_BYTES
    pages = max(1, min(budget // per_page, cap))
    return MemoryEstimate(
        weights_bytes=weights,
        kv_bytes=pages * per_page,
        overhead_bytes=overhead,
        device=str(dev),
        dtype=dtype_name,
        kv_adaptive=adaptive,
        kv_grows=dev.type == "cpu",
        weights=described,
    )


def _quantized_weight_bytes(
    shape: ModelShape, blocks: QuantizedWeights, device: torch.device, dtype: torch.dtype
) -> tuple[int, str]:
    """Bytes of the weights (norms apart) of a model whose blocks run
    quantized, and what they are held as ("q4_1+q8_0", with the float dtype
    of any float matrix beside them, as engine/formats/loader.py describe_weights).

    engine/formats/loader.py keeps one copy of each quantized weight (a tied LM head
    multiplies by the embedding's own blocks), float matrices as Linear
    (packed a second time on the CPU where oneDNN does), and a quantized
    product's bias in float32 on the CPU (engine.model.quant.QuantLinear).
    """
    w = dtype.itemsize
    packs = device.type == "cpu" and cpu_packs_weights(dtype)
    kinds = set(blocks.formats)
    quantized_params = sum(params for _, params in blocks.matmul)
    float_matmul = shape.matmul_params - quantized_params
    total = sum(quantized_bytes(fmt, params) for fmt, params in blocks.matmul)
    total += float_matmul * w * (2 if packs else 1)
    if blocks.embedding:
        total += quantized_bytes(blocks.embedding, shape.embedding_params)
    else:
        total += shape.embedding_params * w
    if shape.lm_head_params:
        if blocks.lm_head:
            total += quantized_bytes(blocks.lm_head, shape.lm_head_params)
        else:
            total += shape.lm_head_params * w * (2 if packs else 1)
    elif not blocks.embedding and packs:
        total += shape.embedding_params * w  # the tied head packs the float embedding
    bias_size = 4 if device.type == "cpu" and quantized_params else w
    total += shape.bias_params * bias_size
    has_float_matrix = float_matmul > 0 or (shape.lm_head_params and not blocks.lm_head) or (
        not shape.lm_head_params and not blocks.embedding
    )
    if has_float_matrix:
        kinds.add(str(dtype).removeprefix("torch."))
    return total, "+".join(sorted(kinds))


def cpu_packs_weights(dtype: torch.dtype) -> bool:
    """Whether engine/model/linear.py keeps a oneDNN-packed copy of CPU weights of this dtype.

    It decides with a one-off self-check of the private oneDNN op (bf16
    packing, for one, needs AVX512-BW/VL/DQ or AVX-NE-CONVERT), so ask it
    rather than guess; the answer is cached there.
    """
    from engine.model.linear import cpu_weight_packing

    return cpu_weight_packing(dtype)


# ---------------------------------------------------------------------------
# What the device has


def available_memory(device: str = "auto") -> int:
    """Bytes the device can give a new model now.

    CPU: the kernel's MemAvailable (free memory plus caches it can drop), not
    MemFree, which a busy page cache keeps near zero. CUDA: the driver's free
    memory on that GPU.
    """
    dev = resolve_device(device)
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
