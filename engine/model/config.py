"""Model hyper-parameters read from a Hugging Face `config.json`.

Only the Llama family is run: Llama 2/3, Mistral, Qwen2/2.5 and SmolLM share
one decoder layout and differ in a handful of switches captured here.

Configurations come from strangers (a downloaded config.json, a GGUF file's
metadata), so the model's dimensions are checked here, once, for every
format: `check_dimensions` refuses zero, absurd or non-dividing head counts
and sizes before anything loops over or allocates by them, and
`check_layer_indices` refuses a layer count the tensors do not have. Both
raise InvalidModelConfigError, one line naming the field.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import InvalidModelConfigError, ModelLoadError, UnsupportedModelError

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")

# Upper bounds far above any real model (the largest dense models have ~130
# layers, 128 heads, hidden sizes of 16k-25k and vocabularies of 256k), low
# enough that a loop or a table sized by them stays small.
MAX_LAYERS = 1024
MAX_HEADS = 4096
MAX_DIMENSION = 1 << 20  # hidden size, feed-forward size, head dimension
MAX_VOCAB = 1 << 24
MAX_POSITIONS = 1 << 30  # max_position_embeddings / context length


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

    @classmethod
    def from_folder(cls, folder: str | Path) -> ModelConfig:
        path = Path(folder) / "config.json"
        if not path.is_file():
            raise ModelLoadError(
                f"{folder} is not a model folder: it has no config.json. Choose a Hugging Face "
                "model folder (config.json, *.safetensors, tokenizer.json) or a .gguf file."
            )
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ModelLoadError(f"{path} is not valid JSON: {exc}") from exc
        if not isinstance(raw, dict):
            raise ModelLoadError(f"{path} does not hold a JSON object")
        return cls.from_dict(raw, source=str(path))

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config.json") -> ModelConfig:
        model_type = str(raw.get("model_type", ""))
        if model_type not in SUPPORTED_MODEL_TYPES:
            archs = raw.get("architectures") or []
            named = model_type or (archs[0] if archs else "unknown")
            raise UnsupportedModelError(
                f"Unsupported architecture '{named}' in {source}: Tandem runs Llama-family "
                f"models (model_type {', '.join(SUPPORTED_MODEL_TYPES[:-1])} or "
                f"{SUPPORTED_MODEL_TYPES[-1]})"
            )
        check_dimensions(raw, source)
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
                rope_theta=_rope_theta(raw),
                max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                # Qwen2 always has q/k/v bias; Llama exposes it as a switch that
                # also covers o_proj.
                qkv_bias=model_type == "qwen2" or bool(raw.get("attention_bias", False)),
                o_bias=model_type != "qwen2" and bool(raw.get("attention_bias", False)),
                mlp_bias=bool(raw.get("mlp_bias", False)),
                sliding_window=_sliding_window(raw),
                rope_scaling=_rope_scaling(raw, source),
                bos_token_id=_optional_int(raw.get("bos_token_id")),
                eos_token_ids=_int_tuple(raw.get("eos_token_id")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelLoadError(f"{source} is missing or has a bad value for {exc}") from exc
        if heads % kv_heads != 0:
            raise ModelLoadError(
                f"{source}: num_attention_heads ({heads}) is not a multiple of "
                f"num_key_value_heads ({kv_heads})"
            )
        if raw.get("hidden_act", "silu") not in ("silu", "swish"):
            raise UnsupportedModelError(
                f"Unsupported activation '{raw.get('hidden_act')}' in {source}; only SiLU is run"
            )
        return cfg

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads


def check_dimensions(raw: Mapping[str, Any], source: str, labels: Mapping[str, str] | None = None) -> None:
    """Refuse a configuration whose sizes no real model has, before anything
    is sized by them: every dimension a whole number within its bounds,
    heads that divide the hidden size (when head_dim is not given) and KV
    heads that divide the heads.

    raw: config.json's fields (an importer's converted metadata alike).
    labels: how the caller's format names each field, for the message
        ({"num_attention_heads": "llama.attention.head_count"}).
    """
    labels = labels or {}

    def name(key: str) -> str:
        label = labels.get(key)
        return f"{label} ({key})" if label else key

    def refuse(key: str, problem: str) -> InvalidModelConfigError:
        return InvalidModelConfigError(
            f"{source}: {name(key)} {problem}; the model file is corrupt or not a real model."
        )

    values: dict[str, int] = {}
    for key, (low, high) in _DIMENSIONS.items():
        value = raw.get(key)
        if value is None and key in _OPTIONAL:
            continue
        if value is None:
            raise refuse(key, "is missing")
        whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        if isinstance(value, bool) or not whole:
            raise refuse(key, f"is {value!r}, not a whole number")
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


def _rope_params(raw: dict[str, Any]) -> dict[str, Any]:
    # transformers >= 5 writes `rope_parameters` (theta inside); older configs
    # write `rope_theta` and an optional `rope_scaling` dict.
    params = raw.get("rope_parameters")
    if isinstance(params, dict):
        return params
    scaling = raw.get("rope_scaling")
    return dict(scaling) if isinstance(scaling, dict) else {}


def _rope_theta(raw: dict[str, Any]) -> float:
    params = _rope_params(raw)
    return float(params.get("rope_theta") or raw.get("rope_theta") or 10000.0)


def _rope_scaling(raw: dict[str, Any], source: str) -> RopeScaling:
    params = _rope_params(raw)
    rope_type = str(params.get("rope_type") or params.get("type") or "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"Unsupported RoPE scaling '{rope_type}' in {source}; "
            f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    if rope_type == "default":
        return RopeScaling()
    return RopeScaling(
        rope_type=rope_type,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(
            params.get("original_max_position_embeddings")
            or raw.get("max_position_embeddings", 8192)
        ),
    )


def _sliding_window(raw: dict[str, Any]) -> int | None:
    window = raw.get("sliding_window")
    if raw.get("model_type") == "qwen2" and not raw.get("use_sliding_window", False):
        return None
    return int(window) if window else None


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


def rope_inverse_frequencies(cfg: ModelConfig) -> list[float]:
    """Per-pair rotation frequencies, with the config's RoPE scaling applied."""
    dim = cfg.head_dim
    inv = [1.0 / (cfg.rope_theta ** (i / dim)) for i in range(0, dim, 2)]
    scaling = cfg.rope_scaling
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
