"""A GGUF file's RoPE scaling, as config.json's `rope_scaling`.

llama.cpp's converter writes linear and YaRN scaling as `<arch>.rope.scaling.*`
keys (older ones `rope.scale_linear`), bakes Llama 3's scaling into a
`rope_freqs` tensor of per-frequency divisors, and stores Phi-3's LongRoPE as
two factor tensors. Each is read back here into the fields Hugging Face's
config.json gives the same model, so the imported folder rotates as the
original does (engine/model/config.py checks what it may run).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import UnsupportedModelError
from engine.formats.gguf.reader import GGUFMetadata
from engine.formats.model_json import shown_value
from engine.model.config import MAX_POSITIONS


def rope_labels(meta: GGUFMetadata, arch_name: str, from_tensor: bool) -> dict[str, str]:
    """config.json's RoPE fields -> the GGUF keys (or tensor) they came from."""
    old_key = meta.get(f"{arch_name}.rope.scaling.type") is None and meta.get(f"{arch_name}.rope.scale_linear") is not None
    factor = (
        "rope_freqs.weight" if from_tensor
        else f"{arch_name}.rope.scale_linear" if old_key
        else f"{arch_name}.rope.scaling.factor"
    )
    return {
        "rope_theta": f"{arch_name}.rope.freq_base",
        "rope_scaling.factor": factor,
        "rope_scaling.low_freq_factor": "rope_freqs.weight",
        "rope_scaling.original_max_position_embeddings": f"{arch_name}.rope.scaling.original_context_length",
    }


def longrope_scaling(
    meta: GGUFMetadata,
    arch_name: str,
    long_factors: np.ndarray | None,
    short_factors: np.ndarray | None,
    rotary_dim: int,
    other: dict[str, Any] | None,
) -> dict[str, Any]:
    """LongRoPE from the factor tensors conversion/phi.py writes (one per
    rotated pair, short and long; their values) and its `rope.scaling.*` metadata."""
    name = meta.source.name
    if long_factors is None or short_factors is None or other is not None:
        raise UnsupportedModelError(
            f"{name} has LongRoPE factors that are incomplete or combined with another RoPE scaling."
        )
    factors = {}
    for label, values in (("long_factor", long_factors), ("short_factor", short_factors)):
        if values.size != rotary_dim // 2:
            raise UnsupportedModelError(
                f"{name}: rope_factors_{label.removesuffix('_factor')} has {values.size} factors for "
                f"{rotary_dim // 2} rotated pairs; the file is corrupt."
            )
        factors[label] = [float(v) for v in values]
    scaling: dict[str, Any] = {
        "rope_type": "longrope",
        **factors,
        "original_max_position_embeddings": meta.integer(f"{arch_name}.rope.scaling.original_context_length"),
    }
    attention = meta.optional_real(f"{arch_name}.rope.scaling.attn_factor")
    if attention is not None:
        scaling["attention_factor"] = attention
    return scaling


def rope_scaling(
    meta: GGUFMetadata, arch_name: str, rope_freqs: np.ndarray | None, rope_theta: float, head_dim: int
) -> dict[str, Any] | None:
    """config.json's rope_scaling from the file's `rope.scaling.*` keys (linear, YaRN) or its
    rope_freqs tensor (Llama 3's, baked in by llama.cpp's converter); None for none."""
    kind = meta.optional_string(f"{arch_name}.rope.scaling.type")
    factor = meta.optional_real(f"{arch_name}.rope.scaling.factor")
    if kind is None and (linear := meta.optional_real(f"{arch_name}.rope.scale_linear")) is not None:
        kind, factor = "linear", linear  # the key older converters wrote
    if rope_freqs is not None:
        if kind not in (None, "none"):
            raise UnsupportedModelError(
                f"{meta.source.name} combines a rope_freqs tensor with {shown_value(kind)} RoPE scaling."
            )
        return _llama3_rope_scaling(meta.source, rope_freqs, rope_theta, head_dim)
    if kind in (None, "none") or factor in (None, 1.0):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": factor}
    if kind == "yarn":
        scaling = {
            "rope_type": "yarn",
            "factor": factor,
            "original_max_position_embeddings": meta.integer(f"{arch_name}.rope.scaling.original_context_length"),
        }
        for name in ("beta_fast", "beta_slow"):
            if (value := meta.optional_real(f"{arch_name}.rope.scaling.yarn_{name}")) is not None:
                scaling[name] = value
        return scaling
    raise UnsupportedModelError(
        f"{meta.source.name} uses {shown_value(kind)} RoPE scaling, which Tandem does not support."
    )


def _llama3_rope_scaling(
    source: Path, rope_freqs: np.ndarray, rope_theta: float, head_dim: int
) -> dict[str, Any]:
    """Recover HF's "llama3" rope_scaling from the rope_freqs tensor llama.cpp bakes it into.

    llama.cpp divides rotary frequency i by rope_freqs[i]: 1 for wavelengths
    below L/high, `factor` above L/low, and 1/((1-s)/factor + s) with
    s = (L/wavelength - low)/(high - low) in between (L: the original context).
    Only the ratios L/low and L/high affect the frequencies, so low = 1 and a
    line fit of L/wavelength = 1 + s (high - 1) over the blended band gives L
    and high. The result is checked by recomputing the tensor.
    """
    divisors = rope_freqs.astype(np.float64)
    wavelengths = 2 * np.pi * rope_theta ** (np.arange(0, head_dim, 2) / head_dim)
    sane = len(divisors) == len(wavelengths) and bool(np.isfinite(divisors).all() and (divisors > 0).all())
    factor = float(divisors.max()) if sane else 0.0
    blended = (divisors > 1 + 1e-6) & (divisors < factor * (1 - 1e-6))
    scaling: dict[str, Any] | None = None
    if sane and factor > 1 and blended.sum() >= 2:
        s = (1 / divisors[blended] - 1 / factor) / (1 - 1 / factor)
        with np.errstate(all="ignore"):
            slope, intercept = np.polyfit(s, 1 / wavelengths[blended], 1)
        # A hostile tensor can fit any line; only a context the engine could have is recomputed.
        if np.isfinite(slope) and np.isfinite(intercept) and intercept * MAX_POSITIONS >= 1:
            original = round(1 / intercept)
            scaling = {
                "rope_type": "llama3",
                "factor": float(str(np.float32(factor))),
                "low_freq_factor": 1.0,
                "high_freq_factor": float(f"{1 + slope * original:.6g}"),
                "original_max_position_embeddings": original,
            }
    if scaling is None or not np.allclose(_llama3_divisors(scaling, wavelengths), divisors, rtol=1e-4):
        raise UnsupportedModelError(
            f"{source.name} has a rope_freqs tensor that is not Llama 3 RoPE scaling; Tandem cannot run it."
        )
    return scaling


def _llama3_divisors(scaling: dict[str, Any], wavelengths: np.ndarray) -> np.ndarray:
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    with np.errstate(all="ignore"):  # a fit of a hostile tensor may divide by zero; allclose then fails
        s = (original / wavelengths - low) / (high - low)
        blended = 1 / ((1 - s) / factor + s)
    scaled = np.where(wavelengths > original / low, factor, blended)
    return np.where(wavelengths < original / high, 1.0, scaled)
