"""Model hyper-parameters read from a Hugging Face `config.json`.

Every family Tandem runs (engine/model/families: Llama and Mistral, Qwen2,
Qwen3, Gemma 2 and 3, Granite) is one decoder layout with switches: the
common fields are read here, and each family's module reads the features of
its block (norm offset, q/k norms, activation, scales, soft-caps, which
layers slide) into the same ModelConfig.

Configurations come from strangers (a downloaded config.json, a GGUF file's
metadata), so the model's dimensions are checked here, once, for every
format: `check_dimensions` refuses zero, absurd or non-dividing head counts
and sizes before anything loops over or allocates by them,
`check_rope_and_window` refuses RoPE and sliding-window settings the
rotation tables cannot be computed from (a negative base, a scaling factor
of 0, a window of 10^30), and `check_layer_indices` refuses a layer count
the tensors do not have. All raise InvalidModelConfigError, one line naming
the field. config.json itself is read by engine.formats.model_json's bounded
reader (`read_config_json`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import InvalidModelConfigError, ModelLoadError, UnsupportedModelError
from engine.formats.model_json import ModelJSONError, read_json_object, shown_value
from engine.model import families
from engine.model.families import SUPPORTED_MODEL_TYPES

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "longrope", "yarn")

# Upper bounds far above any real model (the largest dense models have ~130
# layers, 128 heads, hidden sizes of 16k-25k and vocabularies of 256k), low
# enough that a loop or a table sized by them stays small.
MAX_LAYERS = 1024
MAX_HEADS = 4096
MAX_DIMENSION = 1 << 20  # hidden size, feed-forward size, head dimension
MAX_VOCAB = 1 << 24
MAX_POSITIONS = 1 << 30  # max_position_embeddings / context length, sliding_window
# A RoPE base below 1 would turn the rotation frequencies up instead of down
# (and at 0 or below they cannot be computed); scaling factors below 1 are
# refused by transformers' own validation.
MIN_ROPE_THETA = 1.0
MIN_ROPE_FACTOR = 1.0


# config.json field -> (smallest, largest) value; fields that may be absent
# have a derived default (head_dim, num_key_value_heads).
_DIMENSIONS: dict[str, tuple[int, int]] = {
    "vocab_size": (1, MAX_VOCAB),
    "hidden_size": (1, MAX_DIMENSION),
    "intermediate_size": (1, MAX_DIMENSION),
    "num_hidden_layers": (1, MAX_LAYERS),
    "num_attention_heads": (1, MAX_HEADS),
    "num_key_value_heads": (1, MAX_HEADS),
    "head_dim": (1, MAX_DIMENSION),
    "max_position_embeddings": (1, MAX_POSITIONS),
}
_OPTIONAL = frozenset({"num_key_value_heads", "head_dim", "max_position_embeddings"})


@dataclass(slots=True, frozen=True)
class RopeScaling:
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    # LongRoPE (Phi-3.5, Phi-4-mini): per-frequency divisors. Which set
    # applies is chosen once, as llama.cpp does, by the context the model is
    # configured for (`long_factors_apply`), not per request as transformers
    # does: a prefix-cached key must not change its rotation later.
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    # YaRN: the ramp between interpolated and extrapolated frequencies.
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    # What cos and sin are multiplied by (LongRoPE and YaRN scale attention).
    attention_factor: float = 1.0


@dataclass(slots=True, frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    sliding_window: int | None
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # The block's features (engine/model/families); the defaults are Llama's.
    family: str = "llama"
    norm_offset: float = 0.0  # norms multiply by (offset + w): Gemma's 1 + w
    qk_norm: bool = False  # an RMSNorm over each query and key head before RoPE
    activation: str = "silu"  # of the gated feed-forward: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    embedding_scale: float = 1.0
    residual_scale: float = 1.0  # on both branches before they join the residual stream
    attention_scale: float | None = None  # None: head_dim ** -0.5
    logit_scale: float = 1.0
    attn_softcap: float | None = None  # scores -> cap * tanh(scores / cap)
    final_softcap: float | None = None
    # Which layers attend over `sliding_window`; () means every layer does
    # (when there is a window at all).
    sliding_layers: tuple[bool, ...] = ()
    # The RoPE base of the sliding layers, unscaled (Gemma 3); None: rope_theta.
    local_rope_theta: float | None = None
    # The leading share of each head's dimensions that RoPE rotates (Phi-4-mini: 0.75).
    partial_rotary_factor: float = 1.0

    @classmethod
    def from_folder(cls, folder: str | Path) -> ModelConfig:
        return cls.from_dict(read_config_json(folder), source=str(Path(folder) / "config.json"))

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config.json") -> ModelConfig:
        raw = dict(families.text_model_config(raw))
        model_type = raw.get("model_type", "")
        family = families.for_model_type(model_type) if isinstance(model_type, str) else None
        if family is None:
            archs = raw.get("architectures")
            named = model_type or (archs[0] if isinstance(archs, list) and archs else "unknown")
            raise UnsupportedModelError(
                f"Unsupported architecture {shown_value(named)} in {source}: Tandem runs "
                f"{families.supported_titles()} models (model_type {', '.join(SUPPORTED_MODEL_TYPES[:-1])} "
                f"or {SUPPORTED_MODEL_TYPES[-1]})"
            )
        check_dimensions(raw, source)
        rope_theta, rope_scaling, sliding_window = _rope_and_window(raw, source)
        features = family.read_features(raw, source)
        partial = _rope_params(raw)[0].get("partial_rotary_factor", raw.get("partial_rotary_factor"))
        if partial is not None:
            if isinstance(partial, bool) or not isinstance(partial, (int, float)) or not 0 < partial <= 1:
                raise _refusals(source, None)[1]("partial_rotary_factor", f"is {shown_value(partial)}, not in (0, 1]")
            features["partial_rotary_factor"] = float(partial)
        local_theta = _local_rope_theta(raw, source)
        if local_theta is not None:
            features["local_rope_theta"] = local_theta
        if family.qkv_bias_always:
            qkv_bias, o_bias = True, False
        else:
            qkv_bias = o_bias = bool(raw.get("attention_bias", False))
        try:
            hidden = int(raw["hidden_size"])
            heads = int(raw["num_attention_heads"])
            kv_heads = int(raw.get("num_key_value_heads") or heads)
            head_dim = int(raw.get("head_dim") or hidden // heads)
            cfg = cls(
                model_type=model_type,
                vocab_size=int(raw["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(raw["intermediate_size"]),
                num_hidden_layers=int(raw["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=kv_heads,
                head_dim=head_dim,
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope_theta=rope_theta,
                max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                # Qwen2 always has q/k/v bias; the others expose it as a switch
                # that also covers o_proj.
                qkv_bias=qkv_bias,
                o_bias=o_bias,
                mlp_bias=bool(raw.get("mlp_bias", False)),
                sliding_window=sliding_window,
                rope_scaling=rope_scaling,
                bos_token_id=_optional_int(raw.get("bos_token_id")),
                eos_token_ids=_int_tuple(raw.get("eos_token_id")),
                family=family.name,
                **features,
            )
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            # Cut short: the message may quote a value of megabytes.
            raise ModelLoadError(f"{source} is missing or has a bad value for {str(exc)[:120]}") from exc
        if heads % kv_heads != 0:
            raise ModelLoadError(
                f"{source}: num_attention_heads ({heads}) is not a multiple of "
                f"num_key_value_heads ({kv_heads})"
            )
        if cfg.activation == "silu" and raw.get("hidden_act", "silu") not in ("silu", "swish"):
            raise UnsupportedModelError(
                f"Unsupported activation {shown_value(raw.get('hidden_act'))} in {source}; "
                f"{family.title} models are run with SiLU"
            )
        if cfg.sliding_layers and len(cfg.sliding_layers) != cfg.num_hidden_layers:
            raise InvalidModelConfigError(f"{source}: the sliding-window layer pattern does not match the layers")
        return cfg

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def query_scale(self) -> float:
        """What attention scores are multiplied by."""
        return self.attention_scale if self.attention_scale is not None else self.head_dim**-0.5

    def layer_window(self, layer: int) -> int | None:
        """The sliding window layer `layer` attends over, None for all keys."""
        if self.sliding_window is None or (self.sliding_layers and not self.sliding_layers[layer]):
            return None
        return self.sliding_window

    def layer_rope_theta(self, layer: int) -> float:
        """The RoPE base of layer `layer` (Gemma 3's sliding layers have their own)."""
        if self.local_rope_theta is not None and self.layer_window(layer) is not None:
            return self.local_rope_theta
        return self.rope_theta

    @property
    def rotary_dim(self) -> int:
        """The leading dimensions of each head that RoPE rotates (even)."""
        return int(self.head_dim * self.partial_rotary_factor) // 2 * 2

    @property
    def family_title(self) -> str:
        return families.family_named(self.family).title


def read_config_json(folder: str | Path) -> dict[str, Any]:
    """The object in a model folder's config.json, read by the bounded reader.

    Raises ModelLoadError: "not a model folder" without config.json, else
    naming what is wrong with the file (not JSON, an integer of 5,000
    digits, nesting 100,000 deep, not an object, too big).
    """
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise ModelLoadError(
            f"{folder} is not a model folder: it has no config.json. Choose a Hugging Face "
            "model folder (config.json, *.safetensors, tokenizer.json) or a .gguf file."
        )
    try:
        return read_json_object(path)
    except FileNotFoundError:
        raise ModelLoadError(f"{folder} is not a model folder: its config.json is gone.") from None
    except ModelJSONError as exc:
        raise ModelLoadError(f"{path} {exc}; download the model's config.json again.") from None


def check_dimensions(raw: Mapping[str, Any], source: str, labels: Mapping[str, str] | None = None) -> None:
    """Refuse a configuration whose sizes no real model has, before anything
    is sized by them: every dimension a whole number within its bounds,
    heads that divide the hidden size (when head_dim is not given) and KV
    heads that divide the heads.

    raw: config.json's fields (an importer's converted metadata alike).
    labels: how the caller's format names each field, for the message
        ({"num_attention_heads": "llama.attention.head_count"}).
    """
    name, refuse = _refusals(source, labels)
    values: dict[str, int] = {}
    for key, (low, high) in _DIMENSIONS.items():
        value = raw.get(key)
        if value is None and key in _OPTIONAL:
            continue
        if value is None:
            raise refuse(key, "is missing")
        if not _is_whole(value):
            raise refuse(key, f"is {shown_value(value)}, not a whole number")
        if not low <= value <= high:
            raise refuse(key, f"is {value}, outside {low}..{high}")
        values[key] = int(value)
    heads, hidden = values["num_attention_heads"], values["hidden_size"]
    if "head_dim" not in values and hidden % heads:
        raise refuse("num_attention_heads", f"({heads}) does not divide {name('hidden_size')} ({hidden})")
    kv_heads = values.get("num_key_value_heads", heads)
    if heads % kv_heads:
        raise refuse("num_key_value_heads", f"({kv_heads}) does not divide {name('num_attention_heads')} ({heads})")


def check_layer_indices(
    num_layers: int, layer_indices: Iterable[int], source: str, label: str = "num_hidden_layers"
) -> None:
    """Refuse a layer count the tensors do not have: the layers numbered in
    the tensors' names must be exactly 0..num_layers-1."""
    # Never builds range(num_layers): the count may be as absurd as the file's maker likes.
    present = sorted(set(layer_indices))
    if present and present[-1] >= num_layers:
        beyond = next(index for index in present if index >= num_layers)
        problem = f"says {num_layers} layers, but the tensors have layer {beyond}"
    elif len(present) == num_layers:
        return  # distinct, all below num_layers: exactly 0..num_layers-1
    else:
        missing = next((i for i, index in enumerate(present) if index != i), len(present))
        problem = f"says {num_layers} layers, but the tensors have {len(present)} (layer {missing} is missing)"
    raise InvalidModelConfigError(f"{source}: {label} {problem}; the model file is corrupt or incomplete.")


# A Hugging Face checkpoint's layer tensors: model.layers.<index>.<rest>.
HF_LAYER_TENSOR_RE = re.compile(r"model\.layers\.(\d+)\.")


def hf_layer_indices(names: Iterable[str]) -> list[int]:
    """The layer numbers of a Hugging Face checkpoint's tensor names."""
    return [int(match[1]) for name in names if (match := HF_LAYER_TENSOR_RE.match(name))]


def check_rope_and_window(raw: Mapping[str, Any], source: str, labels: Mapping[str, str] | None = None) -> None:
    """Refuse RoPE and sliding-window settings the rotation tables and the
    attention cannot be computed from: a base (rope_theta) that is not a
    finite number of at least MIN_ROPE_THETA, a scaling factor below
    MIN_ROPE_FACTOR (0 divides by zero), llama3 frequency factors that are
    not positive or not increasing, and a sliding window that is not a whole
    number within 1..MAX_POSITIONS. The values checked are the ones
    `ModelConfig.from_dict` takes (which also refuses scaling types it does
    not run, e.g. yarn; this check leaves that to the load).

    raw, labels: as for `check_dimensions`; labels are keyed by "rope_theta",
        "rope_scaling.factor" (whichever dict holds it) and "sliding_window".
    """
    _rope_and_window(raw, source, labels, supported_only=False)


def _rope_and_window(
    raw: Mapping[str, Any], source: str, labels: Mapping[str, str] | None = None, *, supported_only: bool = True
) -> tuple[float, RopeScaling, int | None]:
    """rope_theta, the RoPE scaling and the sliding window `from_dict` takes.
    `supported_only=False` checks the factor of a scaling type the engine
    does not run (yarn) instead of refusing it: an importer writes it, the
    load refuses it."""
    _, refuse = _refusals(source, labels)
    params, where = _rope_params(raw)

    def real(key: str, value: Any, low: float, what: str) -> float:
        """A finite number of at least `low`; `what` says why the bound."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise refuse(key, f"is {shown_value(value)}, not a finite number")
        if value < low:
            raise refuse(key, f"is {value}, less than {low} ({what})")
        return float(value)

    theta, theta_key = params.get("rope_theta"), f"{where}.rope_theta"
    if theta is None:
        theta, theta_key = raw.get("rope_theta"), "rope_theta"
    rope_theta = 10000.0 if theta is None else real(
        theta_key, theta, MIN_ROPE_THETA, "a smaller base turns the rotation frequencies up, and 0 or less has none"
    )

    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES and supported_only:
        raise UnsupportedModelError(
            f"Unsupported RoPE scaling {shown_value(rope_type)} in {source}; "
            f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    scaling = RopeScaling()
    original = params.get("original_max_position_embeddings") or raw.get("original_max_position_embeddings") \
        or raw.get("max_position_embeddings", 8192)
    original_key = f"{where}.original_max_position_embeddings"
    if rope_type == "longrope" and params.get("factor") is None:
        # Phi-3 derives it from the two context lengths.
        maximum = raw.get("max_position_embeddings", original)
        factor = max(1.0, maximum / original) if _is_whole(maximum) and _is_whole(original) and original else 1.0
    elif rope_type != "default":
        factor = real(f"{where}.factor", params.get("factor", 1.0), MIN_ROPE_FACTOR, "a factor below 1 is no scaling")
    if rope_type in ("linear", "llama3"):
        low, high = scaling.low_freq_factor, scaling.high_freq_factor
        if rope_type == "llama3":
            low_key, high_key = f"{where}.low_freq_factor", f"{where}.high_freq_factor"
            low = real(low_key, params.get("low_freq_factor", low), 0.0, "it divides the original context")
            high = real(high_key, params.get("high_freq_factor", high), 0.0, "it divides the original context")
            if not 0 < low < high:
                raise refuse(low_key, f"({low}) must be more than 0 and less than {high_key} ({high})")
        scaling = RopeScaling(
            rope_type=rope_type,
            factor=factor,
            low_freq_factor=low,
            high_freq_factor=high,
            original_max_position_embeddings=_positions(original_key, original, refuse),
        )
    elif rope_type in ("longrope", "yarn"):
        original = _positions(original_key, original, refuse)
        attention = params.get("attention_factor")
        if rope_type == "longrope":
            factors = {}
            for name in ("short_factor", "long_factor"):
                values = params.get(name)
                if not isinstance(values, list) or len(values) > MAX_DIMENSION or not all(
                    not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in values
                ):
                    raise refuse(f"{where}.{name}", "must be a list of positive numbers, one per rotated pair")
                factors[name] = tuple(float(v) for v in values)
            default_attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
            scaling = RopeScaling(
                rope_type=rope_type, factor=factor, original_max_position_embeddings=original,
                short_factor=factors["short_factor"], long_factor=factors["long_factor"],
                attention_factor=default_attention if attention is None else real(
                    f"{where}.attention_factor", attention, 0.0, "it scales cos and sin"),
            )
        else:
            mscale, mscale_all = params.get("mscale"), params.get("mscale_all_dim")
            if attention is not None:
                attention = real(f"{where}.attention_factor", attention, 0.0, "it scales cos and sin")
            elif mscale and mscale_all:
                attention = _yarn_mscale(factor, float(mscale)) / _yarn_mscale(factor, float(mscale_all))
            else:
                attention = _yarn_mscale(factor)
            scaling = RopeScaling(
                rope_type=rope_type, factor=factor, original_max_position_embeddings=original,
                beta_fast=real(f"{where}.beta_fast", params.get("beta_fast") or 32.0, 0.0, "a rotation count"),
                beta_slow=real(f"{where}.beta_slow", params.get("beta_slow") or 1.0, 0.0, "a rotation count"),
                truncate=bool(params.get("truncate", True)),
                attention_factor=attention,
            )

    window: Any = raw.get("sliding_window")
    if raw.get("model_type") in ("qwen2", "qwen3") and not raw.get("use_sliding_window", False):
        window = None  # Qwen configs name a window they do not use
    sliding_window = _positions("sliding_window", window, refuse) if window else None
    return rope_theta, scaling, sliding_window


def _rope_params(raw: Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    """The dict holding the RoPE settings and its name, for messages.

    transformers >= 5 writes `rope_parameters` (theta inside); older configs
    write `rope_theta` and an optional `rope_scaling` dict.
    """
    params = raw.get("rope_parameters")
    if isinstance(params, dict) and isinstance(params.get("full_attention"), dict):
        # Per layer type (Gemma 3): the global layers' settings; the sliding
        # layers' base is read by _local_rope_theta.
        return params["full_attention"], "rope_parameters.full_attention"
    if isinstance(params, dict):
        return params, "rope_parameters"
    scaling = raw.get("rope_scaling")
    return (scaling if isinstance(scaling, dict) else {}), "rope_scaling"


def _local_rope_theta(raw: Mapping[str, Any], source: str) -> float | None:
    """The sliding layers' own RoPE base, unscaled: `rope_local_base_freq`
    (transformers 4), or `rope_parameters.sliding_attention.rope_theta`."""
    params = raw.get("rope_parameters")
    key, value = "rope_local_base_freq", raw.get("rope_local_base_freq")
    if isinstance(params, dict) and isinstance(params.get("sliding_attention"), dict):
        key, value = "rope_parameters.sliding_attention.rope_theta", params["sliding_attention"].get("rope_theta")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < MIN_ROPE_THETA:
        raise _refusals(source, None)[1](key, f"is {shown_value(value)}, not a finite number of at least {MIN_ROPE_THETA}")
    return float(value)


def _yarn_frequencies(inv: list[float], dim: int, theta: float, scaling: RopeScaling) -> list[float]:
    """YaRN (as transformers computes it): high frequencies kept, low ones
    interpolated by the factor, a linear ramp between."""

    def correction_dim(rotations: float) -> float:
        return dim * math.log(scaling.original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(scaling.beta_fast), correction_dim(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    out = []
    for i, f in enumerate(inv):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        extrapolation = 1 - ramp
        out.append(f / scaling.factor * (1 - extrapolation) + f * extrapolation)
    return out


_Refuse = Callable[[str, str], InvalidModelConfigError]


def _positions(key: str, value: Any, refuse: _Refuse) -> int:
    if not _is_whole(value):
        raise refuse(key, f"is {shown_value(value)}, not a whole number")
    if not 1 <= value <= MAX_POSITIONS:
        raise refuse(key, f"is {shown_value(value)}, outside 1..{MAX_POSITIONS}")
    return int(value)


def _refusals(source: str, labels: Mapping[str, str] | None) -> tuple[Callable[[str], str], _Refuse]:
    """name(key): the field as the caller's format names it, with config.json's
    name; refuse(key, problem): the InvalidModelConfigError saying so."""
    labels = labels or {}

    def name(key: str) -> str:
        label = labels.get(key)
        return f"{label} ({key})" if label else key

    def refuse(key: str, problem: str) -> InvalidModelConfigError:
        return InvalidModelConfigError(
            f"{source}: {name(key)} {problem}; the model file is corrupt or not a real model."
        )

    return name, refuse


def _is_whole(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


def _optional_int(value: Any) -> int | None:
    if isinstance(value, list):
        value = value[0] if value else None
    return None if value is None else int(value)


def _int_tuple(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, list):
        return tuple(int(v) for v in value)
    return (int(value),)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def long_factors_apply(cfg: ModelConfig) -> bool:
    """Whether LongRoPE's long factors rotate every position: the model is
    configured for more context than it was pretrained with (llama.cpp's
    rule; transformers switches per request, which a prefix cache cannot)."""
    return cfg.max_position_embeddings > cfg.rope_scaling.original_max_position_embeddings


def rope_attention_factor(cfg: ModelConfig, layer: int = 0) -> float:
    """What layer `layer`'s cos and sin are multiplied by."""
    return 1.0 if cfg.layer_rope_theta(layer) != cfg.rope_theta else cfg.rope_scaling.attention_factor


def rope_inverse_frequencies(cfg: ModelConfig, layer: int = 0) -> list[float]:
    """Per-pair rotation frequencies of layer `layer` (rotary_dim / 2 of
    them), with the config's RoPE scaling applied (not to a sliding layer's
    own base, as Gemma 3 has it)."""
    dim = cfg.rotary_dim
    theta = cfg.layer_rope_theta(layer)
    inv = [1.0 / (theta ** (i / dim)) for i in range(0, dim, 2)]
    if theta != cfg.rope_theta:
        return inv
    scaling = cfg.rope_scaling
    if scaling.rope_type == "longrope":
        factors = scaling.long_factor if long_factors_apply(cfg) else scaling.short_factor
        if len(factors) != len(inv):
            raise InvalidModelConfigError(
                f"LongRoPE has {len(factors)} factors for {len(inv)} rotated pairs; the model's config is inconsistent."
            )
        return [f / factor for f, factor in zip(inv, factors)]
    if scaling.rope_type == "yarn":
        return _yarn_frequencies(inv, dim, theta, scaling)
    if scaling.rope_type == "linear":
        return [f / scaling.factor for f in inv]
    if scaling.rope_type == "llama3":
        old_ctx = scaling.original_max_position_embeddings
        low_wavelen = old_ctx / scaling.low_freq_factor
        high_wavelen = old_ctx / scaling.high_freq_factor
        out = []
        for f in inv:
            wavelen = 2 * math.pi / f
            if wavelen < high_wavelen:
                out.append(f)
            elif wavelen > low_wavelen:
                out.append(f / scaling.factor)
            else:
                smooth = (old_ctx / wavelen - scaling.low_freq_factor) / (
                    scaling.high_freq_factor - scaling.low_freq_factor
                )
                out.append((1 - smooth) * f / scaling.factor + smooth * f)
        return out
    return inv
