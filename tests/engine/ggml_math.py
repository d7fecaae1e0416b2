"""ggml-cpu's float arithmetic spelled out in numpy, for tests that compare
the native kernels with it bit for bit: a correctly rounded float32
fused multiply-add, and the SwiGLU of ggml's AVX2 build (ggml_v_expf,
ggml_v_silu in ggml-cpu/vec.h)."""

from __future__ import annotations

import numpy as np


def fma32(a, b, c) -> np.ndarray:
    """round_to_float32(a * b + c) with one rounding, elementwise (what
    fmaf and vfmadd give). The product of two float32 is exact in float64;
    the sum is rounded to float64 towards odd (the exact error from
    TwoSum decides), which then rounds to float32 exactly as the exact sum
    would."""
    a, b, c = (np.asarray(v, dtype=np.float32).astype(np.float64) for v in (a, b, c))
    with np.errstate(over="ignore", invalid="ignore"):
        product = a * b
        total = product + c
        back = total - product
        error = (product - (total - back)) + (c - back)
        even = (total.view(np.uint64) & 1) == 0
        towards = np.where(error > 0, np.inf, -np.inf)
        total = np.where((error != 0) & even & np.isfinite(total), np.nextafter(total, towards), total)
        return total.astype(np.float32)


_F = np.float32
SHIFT = _F(float.fromhex("0x1.8p23"))
LOG2E = _F(float.fromhex("0x1.715476p+0"))
LN2_HI = _F(float.fromhex("0x1.62e4p-1"))
LN2_LO = _F(float.fromhex("0x1.7f7d1cp-20"))
C1, C2, C3, C4, C5 = (_F(float.fromhex(h)) for h in ("0x1.0e4020p-7", "0x1.573e2ep-5", "0x1.555e66p-3",
                                                      "0x1.fffdb6p-2", "0x1.ffffecp-1"))


def exp_ggml(x) -> np.ndarray:
    """e^x as ggml_v_expf computes it, lane by lane."""
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        z = fma32(x, LOG2E, SHIFT)
        n = z - SHIFT
        b = fma32(-n, LN2_LO, fma32(-n, LN2_HI, x))
        e = z.view(np.uint32) << np.uint32(23)
        k = (e + _F(1).view(np.uint32)).view(np.float32)
        u = b * b
        j = fma32(fma32(fma32(C1, b, C2), u, fma32(C3, b, C4)), u, C5 * b)
        near = fma32(k, j, k)
        g = np.where(n <= 0, np.uint32(0x82000000), np.uint32(0))
        s1 = (g + np.uint32(0x7F000000)).view(np.float32)
        s2 = (e - g).view(np.float32)
        scaled = np.where(np.abs(n) > 126, fma32(s2, j, s2) * s1, near)
        return np.where(np.abs(n) > 192, s1 * s1, scaled).astype(np.float32)


def swiglu(gate, up) -> np.ndarray:
    """silu(gate) * up as ggml_vec_swiglu_f32: gate / (1 + e^-gate) * up, float32."""
    gate = np.asarray(gate, dtype=np.float32)
    up = np.asarray(up, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return (gate / (_F(1) + exp_ggml(_F(0) - gate)) * up).astype(np.float32)


def geglu(gate, up) -> np.ndarray:
    """gelu(gate) * up with GELU's tanh form as the kernels compute it (not
    ggml's, which looks GELU up in an fp16 table): x / (1 + e^(-2u)),
    u = 0.7978845608028654 (x + 0.044715 x^3), e^ by exp_ggml, float32."""
    x = np.asarray(gate, dtype=np.float32)
    up = np.asarray(up, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        inner = _F(0.7978845608028654) * (x + _F(0.044715) * x * x * x)
        return (x / (_F(1) + exp_ggml(_F(-2) * inner)) * up).astype(np.float32)
