"""Load a Hugging Face checkpoint folder into an engine.model.LlamaModel.

Only safetensors are read: pickle checkpoints (.bin/.pt) can run arbitrary
code when loaded, so a folder that has nothing else is refused.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from engine.config import ModelConfig
from engine.errors import ModelLoadError, PickleCheckpointError
from engine.linear import Linear
from engine.model import LayerWeights, LlamaModel
from engine.progress import LoadReporter, ProgressCallback, as_reporter

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(
            "CUDA was asked for but this PyTorch build sees no CUDA GPU "
            "(install a CUDA build of torch, see README, or use --device cpu)"
        )
    if device != "cpu" and not device.startswith("cuda"):
        raise ModelLoadError(f"Unknown device '{device}': use auto, cpu or cuda")
    return torch.device(device)


def cpu_has_native_bf16() -> bool:
    """True when the CPU has bf16 dot-product instructions (AVX512-BF16 or AMX).

    Without them bf16 matmuls are emulated and slower than fp32.
    """
    cpu = torch.cpu
    return bool(cpu._is_avx512_bf16_supported() or cpu._is_amx_tile_supported())


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.bfloat16 if cpu_has_native_bf16() else torch.float32
    if dtype not in DTYPES:
        raise ModelLoadError(f"Unknown dtype '{dtype}': use auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def _safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelLoadError(f"{index} is not a valid safetensors index: {exc}") from exc
        files = sorted({folder / name for name in weight_map.values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ModelLoadError(
                f"{folder} is incomplete: shard(s) {', '.join(missing)} named in "
                f"{index.name} are missing"
            )
        return files
    files = sorted(folder.glob("*.safetensors"))
    if files:
        return files
    pickles = sorted(
        p.name for pattern in ("*.bin", "*.pt", "*.pth", "*.ckpt") for p in folder.glob(pattern)
    )
    if pickles:
        raise PickleCheckpointError(
            f"{folder} only has pickle checkpoints ({', '.join(pickles)}). Tandem does not "
            "load them because unpickling can run arbitrary code; convert the model to "
            "safetensors or use a GGUF file"
        )
    raise ModelLoadError(
        f"{folder} has no weights: a model folder needs model.safetensors (or the "
        "*.safetensors shards of model.safetensors.index.json) next to its config.json"
    )


def _iter_tensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    for path in files:
        try:
            with safe_open(str(path), framework="pt", device="cpu") as handle:
                for name in handle.keys():
                    yield name, handle.get_tensor(name)
        except (SafetensorError, OSError, ValueError) as exc:
            raise ModelLoadError(f"{path} is not a readable safetensors file: {exc}") from exc


def _count_tensors(files: list[Path]) -> int:
    """How many tensors the files hold (reads only their headers)."""
    count = 0
    for path in files:
        try:
            with safe_open(str(path), framework="pt", device="cpu") as handle:
                count += len(handle.keys())
        except (SafetensorError, OSError, ValueError) as exc:
            raise ModelLoadError(f"{path} is not a readable safetensors file: {exc}") from exc
    return count


def load_model(
    folder: str | Path,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "auto",
    *,
    on_progress: ProgressCallback | LoadReporter | None = None,
    cancel: threading.Event | None = None,
) -> LlamaModel:
    """Load a checkpoint folder. "weights" progress counts tensors read and
    then layers placed on the device; setting `cancel` stops between two of
    those steps with LoadCancelled."""
    reporter = as_reporter(on_progress, cancel)
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelLoadError(f"Model folder not found: {folder}")
    config = ModelConfig.from_folder(folder)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)

    files = _safetensors_files(folder)
    total = _count_tensors(files) + config.num_hidden_layers + 1
    detail = (
        f"Loading the weights of {folder.name} onto {dev.type} as "
        f"{str(dt).removeprefix('torch.')}"
    )
    done = 0
    reporter.report("weights", done, total, detail)
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in _iter_tensors(files):
        if name.startswith("model.") or name == "lm_head.weight":
            tensors[name] = tensor
        done += 1
        reporter.report("weights", done, total, detail)

    def take(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        try:
            tensor = tensors.pop(name)
        except KeyError:
            raise ModelLoadError(f"{folder}: weight '{name}' is missing") from None
        if tuple(tensor.shape) != shape:
            raise ModelLoadError(
                f"{folder}: weight '{name}' has shape {tuple(tensor.shape)}, "
                f"config.json implies {shape}"
            )
        return tensor.to(device=dev, dtype=dt)

    def take_optional(name: str, shape: tuple[int, ...], present: bool) -> torch.Tensor | None:
        return take(name, shape) if present else None

    c = config
    hidden, inter, d = c.hidden_size, c.intermediate_size, c.head_dim
    q_out, kv_out = c.num_attention_heads * d, c.num_key_value_heads * d
    layers = []
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        attn, mlp = p + "self_attn.", p + "mlp."
        qkv = torch.cat(
            [
                take(attn + "q_proj.weight", (q_out, hidden)),
                take(attn + "k_proj.weight", (kv_out, hidden)),
                take(attn + "v_proj.weight", (kv_out, hidden)),
            ]
        )
        qkv_bias = None
        if c.qkv_bias:
            qkv_bias = torch.cat(
                [
                    take(attn + "q_proj.bias", (q_out,)),
                    take(attn + "k_proj.bias", (kv_out,)),
                    take(attn + "v_proj.bias", (kv_out,)),
                ]
            )
        gate_up = torch.cat(
            [take(mlp + "gate_proj.weight", (inter, hidden)), take(mlp + "up_proj.weight", (inter, hidden))]
        )
        gate_up_bias = None
        if c.mlp_bias:
            gate_up_bias = torch.cat(
                [take(mlp + "gate_proj.bias", (inter,)), take(mlp + "up_proj.bias", (inter,))]
            )
        layers.append(
            LayerWeights(
                input_norm=take(p + "input_layernorm.weight", (hidden,)),
                qkv=Linear(qkv, qkv_bias),
                o=Linear(
                    take(attn + "o_proj.weight", (hidden, q_out)),
                    take_optional(attn + "o_proj.bias", (hidden,), c.o_bias),
                ),
                post_norm=take(p + "post_attention_layernorm.weight", (hidden,)),
                gate_up=Linear(gate_up, gate_up_bias),
                down=Linear(
                    take(mlp + "down_proj.weight", (hidden, inter)),
                    take_optional(mlp + "down_proj.bias", (hidden,), c.mlp_bias),
                ),
            )
        )
        done += 1
        reporter.report("weights", done, total, detail)
    embed = take("model.embed_tokens.weight", (c.vocab_size, hidden))
    norm = take("model.norm.weight", (hidden,))
    if "lm_head.weight" in tensors and not c.tie_word_embeddings:
        lm_head = take("lm_head.weight", (c.vocab_size, hidden))
    elif c.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
        lm_head = embed
    else:
        raise ModelLoadError(f"{folder}: weight 'lm_head.weight' is missing")
    # Rotary inverse-frequency buffers saved by old exports carry no information.
    leftovers = sorted(n for n in tensors if not n.endswith("rotary_emb.inv_freq"))
    if leftovers:
        raise ModelLoadError(
            f"{folder}: unexpected weights {', '.join(leftovers[:5])}"
            + (" ..." if len(leftovers) > 5 else "")
            + " (is this really a Llama-family model?)"
        )
    model = LlamaModel(config, embed, layers, norm, Linear(lm_head))
    reporter.report("weights", total, total, detail)
    return model
