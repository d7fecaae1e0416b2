"""The KV cache: the device memory behind the page pool, K and V for every layer.

Layout (engine.model.attention reads it): each of K and V is one tensor
[num_layers, num_pages * kv_heads, page_size, head_dim]; row
`page * kv_heads + h` of a layer holds head h of one page.
"""

from __future__ import annotations

import ctypes
import os
import sys

import torch

from engine.runner.memory import kv_bytes_per_page


class KVCache:
    """The device memory behind the page pool: K and V for every layer.

    With `commit_on_use` the tensors are allocated but not written, so the
    operating system backs them with memory only as pages are first touched
    (a CPU pool sized for a long day of chats costs nothing until a chat
    needs it), and `commit` zeroes pages before their first use. Readers
    rely on that: attention reads whole pages, so the unwritten tail of a
    sequence's last page, and the page-0 padding of shorter sequences, must
    hold finite values. Their scores are masked to -inf, but a masked
    weight of 0 times a NaN or inf value is still NaN; zeros (or stale
    K/V of an earlier request) are safe. Pages are handed out lowest id
    first (engine.core.page_pool.PagePool), so the committed pages are a prefix
    [0, committed_pages) that grows with use.

    Without it (CUDA: the pool is sized from free device memory and the
    kernels and CUDA graphs take it whole) the pool is zero-filled at once.
    """

    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        *,
        commit_on_use: bool = False,
    ) -> None:
        shape = (num_layers, num_pages * num_kv_heads, page_size, head_dim)
        self.num_pages = num_pages
        self.page_size = page_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.commit_on_use = commit_on_use
        if commit_on_use:
            self.k = torch.empty(shape, dtype=dtype, device=device)
            self.v = torch.empty(shape, dtype=dtype, device=device)
            if self.k.device.type == "cpu":
                # With transparent huge pages on "always", the first touch
                # of a page would commit a 2 MiB huge page around it: in
                # each layer's slab, ~170 pages at once.
                _no_huge_pages(self.k)
                _no_huge_pages(self.v)
            self.committed_pages = 0
        else:
            self.k = torch.zeros(shape, dtype=dtype, device=device)
            self.v = torch.zeros(shape, dtype=dtype, device=device)
            self.committed_pages = num_pages

    @property
    def bytes_per_page(self) -> int:
        """K and V of one page over all layers."""
        return kv_bytes_per_page(self.k.shape[0], self.num_kv_heads, self.head_dim, self.page_size, self.k.dtype)

    @property
    def total_bytes(self) -> int:
        return self.num_pages * self.bytes_per_page

    @property
    def committed_bytes(self) -> int:
        """Bytes of the pool written so far: what it holds in memory."""
        return self.committed_pages * self.bytes_per_page

    def commit(self, num_pages: int) -> None:
        """Make pages [0, num_pages) safe to read, zeroing those never used.

        Cheap when they already are (one comparison), so call it every step
        with one more than the highest page id the step writes.
        """
        if num_pages <= self.committed_pages:
            return
        if num_pages > self.num_pages:
            raise ValueError(
                f"page {num_pages - 1} is outside the KV pool of {self.num_pages} pages"
            )
        rows = slice(self.committed_pages * self.num_kv_heads, num_pages * self.num_kv_heads)
        self.k[:, rows].zero_()
        self.v[:, rows].zero_()
        self.committed_pages = num_pages


def _no_huge_pages(tensor: torch.Tensor) -> None:
    """Ask Linux not to back `tensor` with transparent huge pages (best effort:
    elsewhere, or where the call fails, memory is committed in bigger steps)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        page = os.sysconf("SC_PAGE_SIZE")
        start = tensor.data_ptr()
        end = start + tensor.numel() * tensor.element_size()
        aligned = -(-start // page) * page
        if end - aligned >= page:
            libc.madvise(
                ctypes.c_void_p(aligned),
                ctypes.c_size_t((end - aligned) // page * page),
                _MADV_NOHUGEPAGE,
            )
    except (OSError, AttributeError, ValueError):
        pass


_MADV_NOHUGEPAGE = 15  # <sys/mman.h> on Linux
