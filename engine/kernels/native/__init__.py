"""The engine's native CPU kernels (quant_matmul.c: quantized products;
paged_attention.c: RoPE, KV writes and attention; forward.c: a step's
layers in one call, forward.py), built on first use.

torch's own weight-only CPU kernels are slower than oneDNN's fp32 GEMM for a
decode step on an AVX2 CPU (measured on a 2-core AMD EPYC, torch 2.13, the
default model's shapes: `_weight_int4pack_mm_for_cpu` 156 ms per token,
`_weight_int8pack_mm` 105 ms, fp32 `F.linear` 44 ms), so the quantized
products run a small C kernel of ours instead (bench/quant_kernels.py).

Which build: the fastest variant the CPU's features allow (cpu_variants:
avx512vnni, avxvnni, avx2, portable; every one computes the same bits),
falling back to the next one down when a build fails. Where it comes from,
first match wins:
1. a copy built ahead of time next to this file (the installer bundle,
   packaging/build.sh), named for its instruction set;
2. a copy in the user's cache folder built by an earlier run, named for the
   hash of the source and the compiler command;
3. the platform's C compiler, now (a few seconds).

With no compiler and no prebuilt copy the kernels are unavailable, and the
quantized weights are dequantized at load instead (engine/formats/loader.py).

OpenMP: the library is linked with -fopenmp and loaded after torch, so it
resolves to the OpenMP runtime torch already loaded and shares its threads
and its thread count (engine/runner/threads.py sets it per step).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Set
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCES = [Path(__file__).with_name(name) for name in ("quant_matmul.c", "paged_attention.c", "forward.c", "argmax.c")]
HEADERS = [Path(__file__).with_name("half.h")]
FORMAT_CODES = {"q8_0": 0, "q4_0": 1, "q4_1": 2, "q4_k": 3, "q5_k": 4, "q6_k": 5, "q5_0": 6, "q5_1": 7}
# Weights per block of each format: the packed data's second dimension counts blocks.
BLOCK_WEIGHTS = {fmt: 256 if fmt.endswith("_k") else 32 for fmt in FORMAT_CODES}
# Compiler flags per instruction set, best first; "portable" is plain C for
# any CPU. Every variant computes the same bits (quant_matmul.c), so the
# choice is only about speed.
VARIANT_FLAGS = {
    "avx512vnni": ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni",
                   "-mprefer-vector-width=256"],
    "avxvnni": ["-mavx2", "-mfma", "-mf16c", "-mavxvnni"],
    "avx2": ["-mavx2", "-mfma", "-mf16c"],
    "portable": [],
}
# The CPU features (as /proc/cpuinfo names them) each variant needs.
VARIANT_FEATURES = {
    "avx512vnni": {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"},
    "avxvnni": {"avx2", "fma", "f16c", "avx_vnni"},
    "avx2": {"avx2", "fma", "f16c"},
    "portable": set(),
}
# What tandem_quant_simd() returns for each.
VARIANT_CODES = {"portable": 0, "avx2": 1, "avxvnni": 2, "avx512vnni": 3}
# -ffp-contract=off: no fused multiply-add the source does not write, so the
# portable build rounds exactly as the SIMD ones.
_BASE_FLAGS = ["-O3", "-fPIC", "-shared", "-fopenmp", "-std=c11", "-ffp-contract=off"]

_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_failure: str | None = None
_variant: str | None = None


class NativeKernelError(RuntimeError):
    pass


@functools.cache
def cpu_features() -> frozenset[str]:
    """The CPU's instruction-set features, as Linux's /proc/cpuinfo names
    them. Elsewhere, what torch's own dispatch reports (AVX2 or AVX-512
    without the VNNI detail)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    if sys.platform == "darwin":
        return frozenset()
    capability = torch.backends.cpu.get_cpu_capability().upper()
    return frozenset({"avx2", "fma", "f16c"} if capability.startswith(("AVX2", "AVX512")) else ())


def cpu_variants(features: Set[str] | None = None) -> list[str]:
    """The variants this CPU can run, fastest first (portable last).
    TANDEM_KERNEL_VARIANT names one to use instead (tests, benchmarks)."""
    forced = os.environ.get("TANDEM_KERNEL_VARIANT")
    if forced:
        if forced not in VARIANT_FLAGS:
            raise NativeKernelError(
                f"TANDEM_KERNEL_VARIANT={forced!r} is not a kernel variant; known: {', '.join(VARIANT_FLAGS)}"
            )
        return [forced]
    have = cpu_features() if features is None else features
    return [name for name, needs in VARIANT_FEATURES.items() if needs <= have]


def cpu_variant() -> str:
    """The variant this CPU runs the kernels with (the fastest it can run)."""
    return cpu_variants()[0]


def library_name(variant: str) -> str:
    suffix = ".dll" if sys.platform == "win32" else ".so"
    return f"tandem_quant_{variant}{suffix}"


def c_compiler() -> str | None:
    """The C compiler the kernels are built with: $CC, else cc, else gcc (None: none here)."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def compile_library(variant: str, output: Path, compiler: str | None = None, sources: Path | None = None) -> Path:
    """Build the kernels for `variant` into `output` (atomically), from this
    folder's sources or from the same files in `sources` (bench/kernel_ab.py:
    another revision's)."""
    compiler = compiler or c_compiler()
    if compiler is None:
        raise NativeKernelError("no C compiler found (cc or gcc; set CC to choose one)")
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=output.parent, prefix=f".{output.name}.", suffix=".partial")
    os.close(fd)
    files = SOURCES if sources is None else [sources / source.name for source in SOURCES]
    command = [compiler, *_BASE_FLAGS, *VARIANT_FLAGS[variant], *map(str, files), "-o", partial, "-lm"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise NativeKernelError(f"{' '.join(command)} failed:\n{done.stderr.strip()[-2000:]}")
        os.replace(partial, output)
    except (OSError, subprocess.SubprocessError) as exc:
        raise NativeKernelError(f"could not run the C compiler {compiler}: {exc}") from exc
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return output


def _cache_dir() -> Path:
    override = os.environ.get("TANDEM_KERNEL_CACHE")
    if override:
        return Path(override)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("tandem", appauthor=False)) / "kernels"


def _cached_name(variant: str) -> str:
    digest = hashlib.sha256(b"".join(source.read_bytes() for source in SOURCES + HEADERS))
    digest.update(" ".join(_BASE_FLAGS + VARIANT_FLAGS[variant]).encode())
    stem, suffix = os.path.splitext(library_name(variant))
    return f"{stem}-{digest.hexdigest()[:16]}{suffix}"


def _find_or_build(variant: str) -> Path:
    prebuilt = Path(__file__).with_name(library_name(variant))
    if prebuilt.is_file():
        return prebuilt
    cached = _cache_dir() / _cached_name(variant)
    if cached.is_file():
        return cached
    log.info("building the quantized CPU kernels (%s) into %s", variant, cached)
    return compile_library(variant, cached)


def _bind(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    i64, ptr, c_int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    lib.tandem_quant_gemm.argtypes = [
        c_int, i64, i64, i64, ptr, i64, ptr, ptr, ptr, ptr, ptr, i64, c_int, c_int, ptr, ctypes.c_float, c_int,
        ptr, ctypes.c_float,
    ]
    lib.tandem_quant_gemm.restype = c_int
    lib.tandem_quant_take_packed.argtypes = [c_int, i64, ptr, i64, ptr, ptr, ptr, ptr]
    lib.tandem_quant_take_packed.restype = c_int
    lib.tandem_paged_attention.argtypes = [
        i64, i64, i64, i64, ptr, i64, ptr, ptr, ptr, i64, i64, i64, i64, ctypes.c_float, ptr, ptr, ptr, i64, c_int,
        ctypes.c_float, c_int,
    ]
    lib.tandem_paged_attention.restype = c_int
    lib.tandem_rope_write_kv.argtypes = [
        i64, i64, i64, i64, ptr, i64, ptr, ptr, ptr, ptr, ptr, ptr, c_int, ptr, ptr, ctypes.c_float, i64, c_int,
    ]
    lib.tandem_rope_write_kv.restype = c_int
    lib.tandem_quant_take_rows.argtypes = [c_int, i64, ptr, i64, ptr, ptr, ptr, ptr]
    lib.tandem_quant_take_rows.restype = c_int
    lib.tandem_argmax_rows.argtypes = [i64, i64, ptr, i64, ptr, c_int]
    lib.tandem_argmax_rows.restype = c_int
    lib.tandem_prepare_rows.argtypes = [c_int, i64, i64, ptr, i64, ptr, ctypes.c_float, ptr]
    lib.tandem_prepare_rows.restype = c_int
    lib.tandem_quant_simd.argtypes = []
    lib.tandem_quant_simd.restype = c_int
    lib.tandem_forward_layers.argtypes = [ptr, i64, ptr]
    lib.tandem_forward_layers.restype = c_int
    for name in ("tandem_forward_step_words", "tandem_forward_record_words"):
        getattr(lib, name).argtypes = []
        getattr(lib, name).restype = c_int
    return lib


def likely_available() -> bool:
    """Whether library() would succeed, judged without building, loading or
    running anything (for memory estimates on the GUI thread): its known
    result once it has run, else whether a prebuilt or cached copy exists or
    a C compiler is on PATH."""
    if _library is not None or _failure is not None:
        return _library is not None
    if os.environ.get("TANDEM_NO_NATIVE_KERNELS"):
        return False
    try:
        variant = cpu_variant()
    except NativeKernelError:
        return False
    if Path(__file__).with_name(library_name(variant)).is_file():
        return True
    if (_cache_dir() / _cached_name(variant)).is_file():
        return True
    compiler = os.environ.get("CC") or "cc"
    return shutil.which(compiler) is not None or shutil.which("gcc") is not None


def library() -> ctypes.CDLL:
    """The loaded kernels; raises NativeKernelError (once per process,
    then the same message) when they cannot be had."""
    global _library, _failure, _variant
    with _lock:
        if _library is not None:
            return _library
        if _failure is not None:
            raise NativeKernelError(_failure)
        if os.environ.get("TANDEM_NO_NATIVE_KERNELS"):
            _failure = "native kernels disabled by TANDEM_NO_NATIVE_KERNELS"
            raise NativeKernelError(_failure)
        errors = []
        try:
            variants = cpu_variants()
        except NativeKernelError as exc:
            _failure = str(exc)
            raise
        for variant in variants:
            try:
                _library = load_variant(variant)
                break
            except (NativeKernelError, OSError, AttributeError) as exc:
                # An older compiler may not know the newest instruction
                # sets: the next variant down still runs at full accuracy.
                errors.append(f"{variant}: {exc}")
                log.info("quantized CPU kernels (%s) unavailable: %s", variant, exc)
        else:
            _failure = "quantized CPU kernels unavailable (" + "; ".join(errors) + ")"
            log.warning("%s", _failure)
            raise NativeKernelError(_failure)
        _variant = variant
        return _library


def loaded_variant() -> str:
    """The variant the kernels in use were built for (loads them)."""
    library()
    assert _variant is not None
    return _variant


def available() -> bool:
    try:
        library()
    except NativeKernelError:
        return False
    return True


def loaded() -> bool:
    """Whether the kernels are loaded already (a question that builds nothing:
    code that only might use them, such as greedy sampling, asks this)."""
    return _library is not None


def _pointer(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


def _check(status: int, function: str) -> None:
    if status:
        raise NativeKernelError(f"{function} failed with status {status}")


def quant_matmul(
    fmt: str,
    x: torch.Tensor,
    data: torch.Tensor,
    scales: torch.Tensor | None,
    mins: torch.Tensor | None,
    bias: torch.Tensor | None,
    *,
    rows: int,
    lib: ctypes.CDLL | None = None,
) -> torch.Tensor:
    """x [M, K] float32 @ W.T (+ bias) -> a new float32 [M, rows], W packed
    (engine.model.quant.pack_weight) with `rows` output rows."""
    if x.stride(1) != 1:
        x = x.contiguous()
    out = torch.empty(x.shape[0], rows, dtype=torch.float32)
    return quant_matmul_into(fmt, x, data, scales, mins, bias, out, lib=lib)


INPUT_OPS = {None: 0, "rms_norm": 1, "swiglu": 2, "geglu": 3}


def quant_matmul_into(
    fmt: str,
    x: torch.Tensor,
    data: torch.Tensor,
    scales: torch.Tensor | None,
    mins: torch.Tensor | None,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    *,
    input_op: str | None = None,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
    accumulate: bool = False,
    out_norm: torch.Tensor | None = None,
    out_scale: float = 1.0,
    lib: ctypes.CDLL | None = None,
) -> torch.Tensor:
    """out (+)= out_scale * out_op(op(x) @ W.T (+ bias)), float32, every
    tensor row-contiguous, W packed (data [octets, blocks, bytes], scales
    and mins [octets, blocks, 8], None for the raw GGUF blocks) with
    out.shape[1] output rows. op: None;
    "rms_norm" (x normalised, times norm_weight); "swiglu" / "geglu" (x is
    [M, 2K], gate then up: silu(gate) * up, or gelu(gate) * up with GELU's
    tanh form). out_op: an RMSNorm times out_norm where that is given (eps
    is both norms'). With `accumulate` the result is added to `out` (a
    residual stream updated in place). `lib`: a library of load_variant()
    instead of the one this CPU runs."""
    status = (lib or library()).tandem_quant_gemm(
        FORMAT_CODES[fmt], x.shape[0], out.shape[1], data.shape[1] * BLOCK_WEIGHTS[fmt], x.data_ptr(), x.stride(0),
        data.data_ptr(), _pointer(scales), _pointer(mins), _pointer(bias),
        out.data_ptr(), out.stride(0), torch.get_num_threads(),
        INPUT_OPS[input_op], _pointer(norm_weight), eps, int(accumulate), _pointer(out_norm), out_scale,
    )
    _check(status, "tandem_quant_gemm")
    return out


def prepare_rows(
    input_op: str, x: torch.Tensor, *, norm_weight: torch.Tensor | None = None, eps: float = 0.0,
    lib: ctypes.CDLL | None = None,
) -> torch.Tensor:
    """A product's input preparation alone: op(x) per row of x (float32,
    [M, K], or [M, 2K] gate then up for "swiglu" / "geglu"), as
    quant_matmul_into's input_op computes it before rounding to int8."""
    if x.stride(1) != 1:
        x = x.contiguous()
    width = x.shape[1] if input_op == "rms_norm" else x.shape[1] // 2
    out = torch.empty(x.shape[0], width, dtype=torch.float32)
    status = (lib or library()).tandem_prepare_rows(
        INPUT_OPS[input_op], x.shape[0], width, x.data_ptr(), x.stride(0), _pointer(norm_weight), eps, out.data_ptr(),
    )
    _check(status, "tandem_prepare_rows")
    return out


def argmax_rows(logits: torch.Tensor, *, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """torch.argmax(logits, dim=1) for float32 [rows, n] logits on the CPU
    (the first index of each row's largest value, a NaN counting as the
    largest), as int64 [rows]."""
    if logits.dtype != torch.float32 or logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError("argmax_rows takes float32 [rows, n] logits with contiguous rows")
    out = torch.empty(logits.shape[0], dtype=torch.int64)
    status = (lib or library()).tandem_argmax_rows(
        logits.shape[0], logits.shape[1], logits.data_ptr(), logits.stride(0), out.data_ptr(), torch.get_num_threads(),
    )
    _check(status, "tandem_argmax_rows")
    return out


class BoundProduct:
    """One packed weight's product with its arguments resolved once (format
    code, shape, data pointers): a decode step makes 120+ of these calls,
    and resolving them per call was a tenth of a one-sequence step. The
    tensors must outlive it (the model holds them)."""

    __slots__ = ("_call", "_fmt", "_n", "_k", "_data", "_scales", "_mins", "_bias", "_keep")

    def __init__(
        self, fmt: str, data: torch.Tensor, scales: torch.Tensor | None, mins: torch.Tensor | None,
        bias: torch.Tensor | None, rows: int,
    ) -> None:
        for tensor in (data, scales, mins, bias):
            if tensor is not None and not tensor.is_contiguous():
                raise ValueError("BoundProduct needs contiguous tensors")
        self._call = library().tandem_quant_gemm
        self._fmt = FORMAT_CODES[fmt]
        self._n = rows
        self._k = data.shape[1] * BLOCK_WEIGHTS[fmt]
        self._data, self._scales = data.data_ptr(), _pointer(scales)
        self._mins, self._bias = _pointer(mins), _pointer(bias)
        self._keep = (data, scales, mins, bias)

    def words(self) -> tuple[int, int, int, int, int, int, int]:
        """(format code, rows, columns, data, scales, mins, bias) for a program record
        (engine/kernels/native/forward.py); 0 for a pointer that is not there."""
        return (self._fmt, self._n, self._k, self._data, self._scales or 0, self._mins or 0, self._bias or 0)

    def __call__(
        self, x: torch.Tensor, out: torch.Tensor, threads: int, input_op: int = 0,
        norm_weight: int | None = None, eps: float = 0.0, accumulate: bool = False,
        out_norm: int | None = None, out_scale: float = 1.0,
    ) -> None:
        """out (+)= out_scale * out_op(op(x) @ W.T), as quant_matmul_into;
        input_op is an INPUT_OPS code, norm_weight and out_norm data pointers."""
        status = self._call(
            self._fmt, x.shape[0], self._n, self._k, x.data_ptr(), x.stride(0),
            self._data, self._scales, self._mins, self._bias,
            out.data_ptr(), out.stride(0), threads, input_op, norm_weight, eps, accumulate, out_norm, out_scale,
        )
        _check(status, "tandem_quant_gemm")


# What the kernels keep the KV cache in: float32, or fp16 (1 below).
KV_DTYPES = {torch.float32: 0, torch.float16: 1}


def kv_half(k_layer: torch.Tensor, v_layer: torch.Tensor) -> int:
    """The kernels' word for a cache layer's dtype (KV_DTYPES)."""
    if k_layer.dtype != v_layer.dtype or k_layer.dtype not in KV_DTYPES:
        raise ValueError(f"the native kernels keep K and V in float32 or float16, not {k_layer.dtype}/{v_layer.dtype}")
    if not (k_layer.is_contiguous() and v_layer.is_contiguous()):
        raise ValueError("the KV cache layers must be contiguous")
    return KV_DTYPES[k_layer.dtype]


def paged_attention(
    qkv: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    positions: torch.Tensor,
    row_table: torch.Tensor,
    page_table: torch.Tensor,
    k_layer: torch.Tensor,
    v_layer: torch.Tensor,
    page_size: int,
    window: int | None,
    scale: float,
    out: torch.Tensor,
    *,
    softcap: float | None = None,
    lib: ctypes.CDLL | None = None,
) -> torch.Tensor:
    """Attention of every row of qkv [T, (Hq + 2 Hkv) D] (its q heads, already
    rotated; its k and v already in the cache: rope_write_kv) over the
    pages of its sequence, into out [T, Hq D]. positions: int64 [T];
    row_table: int64 [T], each row's line of page_table (int64 [S, pages]).
    window: each row sees its last `window` keys; softcap: scores become
    softcap * tanh(scores / softcap) before the softmax (Gemma 2)."""
    status = (lib or library()).tandem_paged_attention(
        qkv.shape[0], num_heads, num_kv_heads, head_dim, qkv.data_ptr(), qkv.stride(0),
        positions.data_ptr(), row_table.data_ptr(), page_table.data_ptr(), page_table.shape[0],
        page_table.shape[1], page_size, window or 0, scale, k_layer.data_ptr(), v_layer.data_ptr(),
        out.data_ptr(), out.stride(0), torch.get_num_threads(), softcap or 0.0, kv_half(k_layer, v_layer),
    )
    _check(status, "tandem_paged_attention")
    return out


def rope_write_kv(
    qkv: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    cos_table: torch.Tensor,
    sin_table: torch.Tensor,
    positions: torch.Tensor,
    k_layer: torch.Tensor,
    v_layer: torch.Tensor,
    write_rows: torch.Tensor,
    *,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
    eps: float = 0.0,
    rotary_dim: int | None = None,
    lib: ctypes.CDLL | None = None,
) -> None:
    """Rotate q and k of every row of qkv in place, each head first
    RMS-normalised times q_norm / k_norm ([head_dim]) where they are given;
    write k and v to the cache rows write_rows [T * Hkv]
    (AttentionMetadata.write_index). rotary_dim: the leading dimensions of
    each head that rotate (default all), the tables' width."""
    if (q_norm is None) != (k_norm is None):
        raise ValueError("q and k head norms come together")
    status = (lib or library()).tandem_rope_write_kv(
        qkv.shape[0], num_heads, num_kv_heads, head_dim, qkv.data_ptr(), qkv.stride(0),
        cos_table.data_ptr(), sin_table.data_ptr(), positions.data_ptr(),
        k_layer.data_ptr(), v_layer.data_ptr(), write_rows.data_ptr(), torch.get_num_threads(),
        _pointer(q_norm), _pointer(k_norm), eps, rotary_dim or head_dim, kv_half(k_layer, v_layer),
    )
    _check(status, "tandem_rope_write_kv")


def quant_take_rows(
    fmt: str, index: torch.Tensor, data: torch.Tensor, scales: torch.Tensor | None, mins: torch.Tensor | None,
    cols: int,
    *, packed: bool = False,
) -> torch.Tensor:
    """Dequantized float32 rows `index` of a quantized table, [len(index), cols];
    `packed`: the table is in the kernels' packed layout (PackedQuantizedTensor)."""
    lib = library()
    take = lib.tandem_quant_take_packed if packed else lib.tandem_quant_take_rows
    flat = index.reshape(-1).to(torch.int64).contiguous()
    out = torch.empty(flat.numel(), cols, dtype=torch.float32)
    status = take(
        FORMAT_CODES[fmt], flat.numel(), flat.data_ptr(), cols,
        data.data_ptr(), _pointer(scales), _pointer(mins), out.data_ptr(),
    )
    _check(status, "tandem_quant_take_packed" if packed else "tandem_quant_take_rows")
    return out


def load_variant(variant: str) -> ctypes.CDLL:
    """The kernels built for `variant` (into the cache folder if needed),
    loaded beside the one in use: tests compare every variant this CPU runs
    with the portable build."""
    lib = _bind(_find_or_build(variant))
    if lib.tandem_quant_simd() != VARIANT_CODES[variant]:
        raise NativeKernelError(f"the {variant} build reports instruction set {lib.tandem_quant_simd()}")
    return lib
