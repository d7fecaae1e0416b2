"""Every sizing rule of the engine: a KV page's bytes, the default pool, and
how much GPU memory the KV cache gets.

`kv_bytes_per_page`, `activation_dtype`, `default_kv_budget`,
`default_kv_pages` (with `kv_page_cap` and `sequence_pages`) are the one
place these rules are written: the engine sizes its pool with them at load
and app.models.memory_estimate predicts a model's memory with them, so the
estimate and the allocation cannot drift apart. A context capped below the
model's trained one (`max_context`) caps the pool with it. The weights' side
of an estimate is engine/formats/weight_memory.py.

The pool takes what is free once the weights are loaded, less the peak of a
forward pass's activations (measured, not guessed: it depends on the model,
the step's token budget and the attention path), less a reserve for
everything else on the card. Tandem runs on the user's desktop GPU, so the
reserve is for the compositor, the browser and whatever else they start
after Tandem, not only for allocator slack; a server engine would take
nearly all of it.

`plan_kv_cache` is the arithmetic (tested with made-up numbers);
`measure_activation_peak` runs one forward of a full step on the device;
`cuda_kv_cache_bytes` puts them together for the engine.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)

MIB = 1 << 20
# Room for the rest of the desktop: at least this much, or this share of the card.
DESKTOP_RESERVE_BYTES = 768 * MIB
DESKTOP_RESERVE_FRACTION = 0.06
# A measured peak is one shape; other step mixes and allocator fragmentation
# need some more.
ACTIVATION_HEADROOM = 1.25
# CUDA graphs' pool, the sampler's buffers and the CUDA context's own growth.
RUNTIME_EXTRA_BYTES = 256 * MIB
# The KV budget on the CPU when none is given: pages commit memory only as
# chats first reach them, so this is a ceiling, not what start-up takes.
CPU_DEFAULT_KV_BYTES = 1 << 30
# Never more pages than this many sequences at full context could use.
KV_CAP_SEQUENCES = 8


def activation_dtype(device: torch.device, weight_dtype: torch.dtype) -> torch.dtype:
    """What norms and activations run in (and the KV cache, but on the native
    CPU path: kv_cache_dtype): float32 on the CPU (no native half-precision
    arithmetic worth having there), else the weights' dtype."""
    return torch.float32 if device.type == "cpu" else weight_dtype


def kv_cache_dtype(device: torch.device, weight_dtype: torch.dtype, native: bool) -> torch.dtype:
    """What the KV cache holds: fp16 on the native CPU path (`native`: every
    product runs on the quantized kernels), as llama.cpp keeps it: half the
    memory, and half the bytes attention reads per key (paged_attention.c);
    elsewhere the activations' dtype."""
    return torch.float16 if native and device.type == "cpu" else activation_dtype(device, weight_dtype)


def kv_bytes_per_page(
    num_layers: int, num_kv_heads: int, head_dim: int, page_size: int, dtype: torch.dtype
) -> int:
    """Bytes of one KV page: K and V of `page_size` tokens in every layer."""
    return 2 * num_layers * page_size * num_kv_heads * head_dim * dtype.itemsize


def sequence_pages(max_context: int, page_size: int) -> int:
    """Pages one sequence at full context fills (a partial last page counts)."""
    return -(-max_context // page_size)


def kv_page_cap(max_context: int, page_size: int) -> int:
    """The most pages a pool gets: KV_CAP_SEQUENCES sequences at full context."""
    return sequence_pages(max_context, page_size) * KV_CAP_SEQUENCES


def default_kv_budget(device: torch.device, kv_cache_bytes: int | None) -> int | None:
    """The KV pool's budget: the one given, else CPU_DEFAULT_KV_BYTES on the
    CPU; None on CUDA, where `cuda_kv_cache_bytes` measures it after loading."""
    if kv_cache_bytes is not None:
        return kv_cache_bytes
    return CPU_DEFAULT_KV_BYTES if device.type == "cpu" else None


def default_kv_pages(budget_bytes: int, per_page: int, max_context: int, page_size: int) -> int:
    """Pages in a pool given `budget_bytes`: as many as fit, at least one, at
    most `kv_page_cap` (a smaller context means a smaller pool)."""
    return max(1, min(budget_bytes // per_page, kv_page_cap(max_context, page_size)))


@dataclass(slots=True, frozen=True)
class MemoryPlan:
    free_bytes: int  # free on the device after the weights were loaded
    total_bytes: int
    activation_bytes: int  # measured peak, before headroom
    reserve_bytes: int  # kept for the rest of the desktop
    kv_cache_bytes: int  # what the KV pool gets (0: nothing is left)

    def describe(self) -> str:
        return (
            f"KV cache {self.kv_cache_bytes / MIB:.0f} MiB: {self.free_bytes / MIB:.0f} MiB free "
            f"of {self.total_bytes / MIB:.0f} MiB after the weights, less "
            f"{self.activation_bytes * ACTIVATION_HEADROOM / MIB:.0f} MiB for activations and "
            f"{(self.reserve_bytes + RUNTIME_EXTRA_BYTES) / MIB:.0f} MiB kept for the desktop "
            "and runtime"
        )


def plan_kv_cache(free_bytes: int, total_bytes: int, activation_peak_bytes: int) -> MemoryPlan:
    """The KV pool size from the device's free and total memory (after the
    weights) and a measured activation peak."""
    if free_bytes < 0 or total_bytes <= 0 or activation_peak_bytes < 0:
        raise ValueError("memory sizes must be non-negative (total positive)")
    reserve = max(DESKTOP_RESERVE_BYTES, int(total_bytes * DESKTOP_RESERVE_FRACTION))
    activations = int(activation_peak_bytes * ACTIVATION_HEADROOM)
    spare = free_bytes - activations - reserve - RUNTIME_EXTRA_BYTES
    return MemoryPlan(free_bytes, total_bytes, activation_peak_bytes, reserve, max(0, spare))


def measure_activation_peak(model, num_tokens: int, num_sampled: int, page_size: int = 16) -> int:
    """Peak bytes a forward of `num_tokens` prompt tokens (one chunk from
    position 0) and the logits of `num_sampled` rows allocate on the model's
    CUDA device, beyond what was allocated before and the scratch KV pages."""
    dev = model.device
    if dev.type != "cuda":
        raise ValueError("activation peaks are measured on CUDA devices only")
    num_tokens = max(1, min(num_tokens, model.config.max_position_embeddings))
    num_pages = -(-num_tokens // page_size)
    torch.cuda.synchronize(dev)
    base = torch.cuda.memory_allocated(dev)
    cache = model.new_kv_cache(num_pages, page_size)
    cache_bytes = torch.cuda.memory_allocated(dev) - base
    torch.cuda.reset_peak_memory_stats(dev)
    try:
        ids = torch.zeros(num_tokens, dtype=torch.long, device=dev)
        positions = torch.arange(num_tokens, device=dev)
        meta = _prefill_metadata(model, num_tokens, num_pages, page_size)
        hidden = model.forward(ids, positions, meta, cache, num_tokens - 1)
        rows = torch.arange(min(num_sampled, num_tokens), device=dev)
        model.logits(hidden.index_select(0, rows))
        torch.cuda.synchronize(dev)
        return max(0, torch.cuda.max_memory_allocated(dev) - base - cache_bytes)
    finally:
        del cache
        torch.cuda.empty_cache()


def _prefill_metadata(model, num_tokens: int, num_pages: int, page_size: int):
    """Attention metadata for one chunk at position 0 over pages 0..n-1 in
    order, for the attention path the engine will use on this device."""
    from engine.runner.cuda import triton_available

    c = model.config
    dev = model.device
    if triton_available():
        from engine.runner.cuda_attention import KernelAttentionMetadata

        as_i32 = lambda values: torch.tensor(values, dtype=torch.int32, device=dev)  # noqa: E731
        return KernelAttentionMetadata(
            # Pages 0..n-1 in order: token t's slot is t itself.
            slots=torch.arange(num_tokens, dtype=torch.int32, device=dev),
            num_decode=0, decode_block_table=None, decode_seq_lens=None, num_splits=1,
            prefill_block_table=torch.arange(num_pages, dtype=torch.int32, device=dev)[None],
            prefill_query_start=as_i32([0]), prefill_query_len=as_i32([num_tokens]),
            prefill_context_len=as_i32([0]), max_prefill_len=num_tokens,
            window=c.sliding_window or 0, num_kv_heads=c.num_key_value_heads,
        )
    from engine.model.attention import AttentionMetadata, PrefillChunk

    pos = torch.arange(num_tokens, device=dev)
    heads = torch.arange(c.num_key_value_heads, device=dev)
    base = (pos // page_size) * c.num_key_value_heads * page_size + pos % page_size
    write_index = (base[:, None] + heads * page_size).reshape(-1)
    mask = None
    if c.sliding_window is not None:
        mask = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - c.sliding_window)
    return AttentionMetadata(
        write_index=write_index, num_decode=0, decode_rows=None, decode_bias=None,
        prefills=[PrefillChunk(0, num_tokens, num_tokens, key_rows=None, mask=mask)],
    )


def cuda_kv_cache_bytes(model, max_batch_tokens: int = 2048, max_running: int = 64) -> int:
    """The default KV pool size for a model loaded on CUDA; logs the plan."""
    peak = measure_activation_peak(model, max_batch_tokens, max_running)
    free, total = torch.cuda.mem_get_info(model.device)
    plan = plan_kv_cache(free, total, peak)
    log.info("%s", plan.describe())
    return plan.kv_cache_bytes


def release_freed_heap() -> bool:
    """Give the C heap's freed pages back to the system, where the C library
    can (glibc's malloc_trim); whether it could.

    Loading a model allocates and frees tens of MiB of temporaries (tensors
    read from the file, packed, converted). glibc keeps freed memory in its
    arenas for reuse, so without this the process stays that much larger
    than what the engine holds: 23 MiB on the default model as Q4_K_M
    (bench/resident_memory.py), a fifth of its weights. Later steps reuse
    buffers of their own, so once after loading is enough."""
    import ctypes
    import ctypes.util
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # musl and others: no malloc_trim
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim(0)
    return True
