"""Matrix products with the model's weights, in the fastest form the device has.

On the CPU, oneDNN can reorder a weight once into its blocked layout; every
later product then skips the per-call reorder that `F.linear` pays. Measured
on a 2-core AVX512-BF16 Xeon for SmolLM2-135M shapes, that is the difference
between bf16 being slower and faster than fp32. The op is private to
PyTorch, so it is verified once against `F.linear` and dropped if anything
about it differs.

Batch invariance (`Linear.tiled`): a GEMM library picks its kernel, blocking
and thread split from the product's shape, so one row's result can change
with the number of rows beside it (measured with oneDNN on an AVX2 CPU: a
1-row product, served by a GEMV kernel, differs in the last bits from the
same row inside any larger product; bmm differs between 1, 2-3 and 4+ rows).
Running every product on tiles of one fixed row count gives every call the
same shape, hence the same kernel and the same reduction order for each row,
whatever the batch: the approach of the published batch-invariant kernels
(Thinking Machines, "Defeating Nondeterminism in LLM Inference", 2025), done
here by fixing the shape from outside instead of writing the kernel.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

_packing_works: dict[torch.dtype, bool] = {}


class Linear:
    """y = x @ weight.T + bias."""

    __slots__ = ("weight", "bias", "_packed", "out_features")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight = weight
        self.bias = bias
        self.out_features = weight.shape[0]
        self._packed: torch.Tensor | None = None
        if weight.device.type == "cpu" and cpu_weight_packing(weight.dtype):
            self._packed = torch.ops.mkldnn._reorder_linear_weight(weight, 1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)

    def tiled(self, x: torch.Tensor, rows: int) -> torch.Tensor:
        """The same product, computed on tiles of exactly `rows` rows (the
        last one zero-padded): each row's result is then the same whatever
        the batch it arrives in. x: [M, weight.shape[1]]."""
        return tiled_product(self, x, rows)


def tiled_product(product: Any, x: torch.Tensor, rows: int) -> torch.Tensor:
    """product(x) on tiles of exactly `rows` rows (the last zero-padded), for
    any product (`__call__`, `out_features`) whose kernel picks its
    algorithm by shape."""
    count = x.shape[0]
    padded = -(-count // rows) * rows
    if padded != count:
        x = torch.cat((x, x.new_zeros(padded - count, x.shape[1])))
    if padded == rows:
        return product(x)[:count]
    out = x.new_empty(padded, product.out_features)
    for start in range(0, padded, rows):
        out[start : start + rows] = product(x[start : start + rows])
    return out[:count]


def cpu_weight_packing(dtype: torch.dtype) -> bool:
    """Whether CPU linear layers of this dtype keep a oneDNN-packed copy of
    their weights beside the original (memory estimates count it)."""
    if dtype not in _packing_works:
        _packing_works[dtype] = _check_packing(dtype)
    return _packing_works[dtype]


def _check_packing(dtype: torch.dtype) -> bool:
    if not torch.backends.mkldnn.is_available() or dtype not in (torch.float32, torch.bfloat16):
        return False
    try:
        gen = torch.Generator().manual_seed(0)
        weight = torch.randn(48, 64, generator=gen).to(dtype)
        bias = torch.randn(48, generator=gen).to(dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, 1)
        for rows in (1, 5, 33):
            x = torch.randn(rows, 64, generator=gen).to(dtype)
            got = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
            want = F.linear(x.float(), weight.float(), bias.float())
            if got.shape != want.shape or not torch.allclose(got.float(), want, atol=0.1, rtol=0.02):
                raise RuntimeError("packed product differs from F.linear")
    except Exception as exc:  # private op missing or changed in this torch build
        log.info("oneDNN weight packing unavailable for %s: %s", dtype, exc)
        return False
    return True
