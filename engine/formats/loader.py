"""Load a Hugging Face checkpoint folder into an engine.model.decoder.DecoderModel.

Only safetensors are read: pickle checkpoints (.bin/.pt) can run arbitrary
code when loaded, so a folder that has nothing else is refused.

A folder whose config.json has a "quantization" section (written by the GGUF
importer, see engine.model.quant) stores some weights block-quantized. They are
either run by weight-only quantized kernels (`quantized="kernel"`: the
weights stay at 4.5-8.5 bits in memory, one copy each) or dequantized once
here to the load dtype (`quantized="dequantize"`: float memory; fp32 takes
3.8x the bytes of q8_0, 6.4x those of q4_1, 7.1x those of q4_0).
"auto" runs the kernels wherever the device has them: on the CPU when
engine.model.quant.cpu_kernel_available() says the native kernel works, on CUDA
when engine.kernels.triton.quant can run there; otherwise it dequantizes. A
one-sequence decode step reads every weight once, so it gains from reading
4.5-8.5 bits per weight instead of 16 or 32.

`quantize="int8" | "int4"` quantizes a float checkpoint at load (the layers'
matrices to q8_0 / q4_1; the embedding and LM head to q8_0 in both, as
llama.cpp's 4-bit mixes keep them at 6-8 bits). The result is cached as a
folder under models_dir(), stamped with the source files' sizes and mtimes,
so the next load reads it instead of quantizing again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.errors import CorruptSafetensorsError, FolderWriteError, ModelLoadError
from engine.formats.model_json import shown_value
from engine.formats.safetensors import count_tensors, read_tensors, weight_files
from engine.formats.staged_folder import (
    MARKER_NAME,
    fsync_dir,
    is_current,
    publish,
    staging_path,
    write_json,
)
from engine.formats.weight_names import (  # the rules the app checks folders by, torch-free
    EMBEDDING_NAME,
    IGNORED_WEIGHT_SUFFIX,
    LM_HEAD_NAME,
    expected_weights,
    is_model_weight,
    model_weight_name,
    quantized_layer_weights,
)
from engine.model.config import ModelConfig, check_layer_indices, hf_layer_indices, read_config_json
from engine.model.families import family_named, text_model_config
from engine.config import QUANTIZE_MODES, QUANTIZED_COMPUTE
from engine.model.linear import Linear
from engine.model.decoder import LayerWeights, DecoderModel, Product
from engine.progress import LoadReporter, ProgressCallback, as_reporter
from engine.model.quant import (
    FOLDER_FORMAT_VERSION,
    GROUP_SIZE,
    QUANTIZE_FORMATS,
    QUANTIZED_TABLE_FORMAT,
    ConcatLinear,
    RAW_BLOCK_FORMATS,
    QuantizedTensor,
    QuantLinear,
    cpu_kernel_available,
    cpu_kernel_expected,
)
from engine.model.quant import (
    quantize as quantize_weight,
)

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Bump when quantized copies of the same source change.
_QUANTIZED_COPY_VERSION = 1


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


def quantized_formats(folder: Path) -> dict[str, str]:
    """Weight name -> engine.model.quant format, from config.json's "quantization"
    section ({} for a float checkpoint)."""
    path = folder / "config.json"
    section = read_config_json(folder).get("quantization")
    if section is None:
        return {}
    if not isinstance(section, dict) or section.get("method") != "tandem-blocks":
        raise ModelLoadError(
            f"{path}: the quantization method {shown_value(section.get('method') if isinstance(section, dict) else section)} "
            "is not one Tandem runs; use a float checkpoint or a GGUF file of this model."
        )
    if section.get("version") != FOLDER_FORMAT_VERSION:
        raise ModelLoadError(
            f"{path}: quantized folder version {shown_value(section.get('version'))} was written by another "
            f"Tandem (this one reads version {FOLDER_FORMAT_VERSION}); import the GGUF file again."
        )
    tensors = section.get("tensors")
    if not isinstance(tensors, dict) or not all(isinstance(v, str) for v in tensors.values()):
        raise ModelLoadError(f"{path}: the quantization section has no valid 'tensors' map.")
    return dict(tensors)


def resolve_quantized_compute(
    quantized: str, device: torch.device, asked: bool = False, *, probe: bool = True
) -> str:
    """"kernel" or "dequantize" for a folder with quantized weights on
    `device`; `asked`: the caller quantized them (`quantize`), for the
    memory, so they are never silently dequantized. `probe=False` predicts
    instead of building and checking the CPU kernels (a memory estimate on
    the GUI thread must not wait for a compiler)."""
    if quantized not in QUANTIZED_COMPUTE:
        raise ModelLoadError(f"Unknown quantized compute '{quantized}': use {', '.join(QUANTIZED_COMPUTE)}")
    if quantized == "dequantize":
        return "dequantize"
    if quantized_kernel_available(device, probe=probe):
        return "kernel"
    if asked:
        raise ModelLoadError(
            f"Quantizing at load keeps the weights quantized, but no quantized kernel runs on "
            f"{device.type} in this installation (on the CPU the kernels need a C compiler the first "
            "time); load the model without quantizing it."
        )
    if quantized == "kernel" and device.type == "cpu":
        raise ModelLoadError(
            "The CPU quantized kernel is not usable in this installation; load with "
            "quantized='dequantize'."
        )
    if quantized == "kernel":
        log.warning("No quantized kernel runs on %s here: the weights are dequantized at load", device)
    return "dequantize"


def quantized_kernel_available(device: torch.device, *, probe: bool = True) -> bool:
    """Whether block-quantized weights can run quantized on `device`."""
    if device.type == "cpu":
        return cpu_kernel_available() if probe else cpu_kernel_expected()
    if device.type != "cuda":
        return False
    try:
        from engine.kernels.triton.quant import triton_quant_available
    except ImportError as exc:  # no triton in this installation
        log.info("Triton quantized kernels are unavailable: %s", exc)
        return False
    return bool(triton_quant_available(device))


def _quant_linear(device: torch.device) -> Callable[[QuantizedTensor, torch.Tensor | None], Product]:
    """The quantized product class of `device` (its kernel is available)."""
    if device.type == "cpu":
        return QuantLinear
    from engine.kernels.triton.quant import TritonQuantLinear

    return lambda weight, bias: TritonQuantLinear(_on_device(weight, device), bias)


def _on_device(weight: QuantizedTensor, device: torch.device) -> QuantizedTensor:
    """`weight` itself when it is on `device` already (a tied table stays one object)."""
    here = weight.data.device
    if here.type == device.type and (device.index is None or here.index == device.index):
        return weight
    return weight.to(device)


def load_model(
    folder: str | Path,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "auto",
    *,
    on_progress: ProgressCallback | LoadReporter | None = None,
    cancel: threading.Event | None = None,
    quantized: str = "auto",
    quantize: str | None = None,
) -> DecoderModel:
    """Load a checkpoint folder. "weights" progress counts tensors read and
    then layers placed on the device; setting `cancel` stops between two of
    those steps with LoadCancelled. `quantized` says how block-quantized
    weights run, `quantize` ("int8", "int4") quantizes a float checkpoint
    first (see the module docstring); a folder that is quantized already
    (an imported GGUF file) keeps its formats."""
    reporter = as_reporter(on_progress, cancel)
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelLoadError(f"Model folder not found: {folder}")
    config = ModelConfig.from_folder(folder)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    if quantize is not None and quantize not in QUANTIZE_MODES:
        raise ModelLoadError(f"Unknown quantization '{quantize}': use {', '.join(QUANTIZE_MODES)}")
    formats = quantized_formats(folder)
    if quantize is not None and not formats:
        resolve_quantized_compute(quantized, dev, asked=True)  # refuse before the work
        folder = quantized_copy(folder, quantize, on_progress=reporter)
        formats = quantized_formats(folder)
    compute = resolve_quantized_compute(quantized, dev, quantize is not None) if formats else "dequantize"
    quant_linear = _quant_linear(dev) if compute == "kernel" else None

    files = weight_files(folder)
    total = count_tensors(files, keep=is_model_weight) + config.num_hidden_layers + 1
    detail = f"Reading the weights onto {dev.type}, kept as " + (
        f"{'+'.join(sorted(set(formats.values())))} for the quantized kernels" if compute == "kernel"
        else str(dt).removeprefix("torch.") + (f", dequantized from {'+'.join(sorted(set(formats.values())))}"
                                                if formats else "")
    )
    done = 0
    reporter.report("weights", done, total, detail)
    expected = expected_weights(config)
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in read_tensors(files, keep=is_model_weight):
        loaded_name = model_weight_name(name)
        if loaded_name in tensors:
            raise CorruptSafetensorsError(
                f"{folder}: the weight '{loaded_name}' is stored twice (also as '{name}'). "
                "Download the model's .safetensors files again."
            )
        tensors[loaded_name] = tensor
        done += 1
        reporter.report("weights", done, total, detail)
    # A config.json whose layer count the weights do not have is refused with
    # one line naming num_hidden_layers, not with the first missing weight.
    check_layer_indices(config.num_hidden_layers, hf_layer_indices(tensors), f"{folder / 'config.json'}")

    def pop(name: str) -> torch.Tensor:
        try:
            return tensors.pop(name)
        except KeyError:
            raise ModelLoadError(f"{folder}: weight '{name}' is missing") from None

    def take_weight(name: str) -> torch.Tensor | QuantizedTensor:
        """A weight as stored: a float tensor on the device in `dt`, or a
        quantized one left on the CPU for `product` to pack."""
        shape = expected[name]
        fmt = formats.get(name)
        if fmt is None:
            tensor = pop(name)
            if tuple(tensor.shape) != shape:
                raise ModelLoadError(
                    f"{folder}: weight '{name}' has shape {tuple(tensor.shape)}, "
                    f"config.json implies {shape}"
                )
            return tensor.to(device=dev, dtype=dt)
        try:
            weight = stored_quantized(pop, name, fmt)
        except ValueError as exc:
            raise ModelLoadError(f"{folder}: quantized weight '{name}' is inconsistent: {exc}") from None
        if weight.shape != shape:
            raise ModelLoadError(
                f"{folder}: weight '{name}' has shape {weight.shape}, config.json implies {shape}"
            )
        return weight

    def take(name: str) -> torch.Tensor:
        """A float weight (norms, biases; quantized ones are dequantized)."""
        weight = take_weight(name)
        if isinstance(weight, QuantizedTensor):
            return weight.dequantize(dt).to(dev)
        return weight

    def product(
        weights: Sequence[torch.Tensor | QuantizedTensor], biases: Sequence[torch.Tensor] | None = None
    ) -> Product:
        """One product with the weights stacked along their output rows."""
        bias = None if biases is None else torch.cat(list(biases))
        if compute == "dequantize" or not any(isinstance(w, QuantizedTensor) for w in weights):
            floats = [_as_float(w, dt, dev) for w in weights]
            # No copy of a lone weight: a tied embedding stays one tensor.
            return Linear(floats[0] if len(floats) == 1 else torch.cat(floats), bias)
        assert quant_linear is not None
        formats_here = {w.format if isinstance(w, QuantizedTensor) else None for w in weights}
        if len(formats_here) == 1:
            quantized = [w for w in weights if isinstance(w, QuantizedTensor)]
            # The parts are dropped once stacked: one copy of the weight stays.
            stacked = quantized[0] if len(quantized) == 1 else QuantizedTensor.cat(quantized)
            return quant_linear(stacked, bias)
        # Mixed formats (a Q4_K_M file keeps some v projections at 6 bits):
        # one product per part.
        parts: list[Product] = []
        for i, weight in enumerate(weights):
            part_bias = None if biases is None else biases[i]
            parts.append(
                quant_linear(weight, part_bias)
                if isinstance(weight, QuantizedTensor)
                else Linear(weight, part_bias)
            )
        return ConcatLinear(parts)

    c = config
    names = family_named(c.family).layer

    def take_norm(name: str) -> torch.Tensor:
        """A norm's multiplier: Gemma's `1 + w` is stored as w (Hugging Face)."""
        weight = take(name)
        return weight + c.norm_offset if c.norm_offset else weight

    def parts(fused: str | None, *separate: str | None) -> list[str]:
        return [fused] if fused is not None else [name for name in separate if name is not None]

    qkv_parts = parts(names.qkv, names.q, names.k, names.v)
    gate_up_parts = parts(names.gate_up, names.gate, names.up)
    layers = []
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."

        def weights(modules: list[str]) -> list[torch.Tensor | QuantizedTensor]:
            return [take_weight(f"{p}{module}.weight") for module in modules]

        def biases(modules: list[str], present: bool) -> list[torch.Tensor] | None:
            return [take(f"{p}{module}.bias") for module in modules] if present else None

        def optional_norm(module: str | None) -> torch.Tensor | None:
            return None if module is None else take_norm(f"{p}{module}.weight")

        layers.append(
            LayerWeights(
                input_norm=take_norm(f"{p}{names.attn_norm}.weight"),
                qkv=product(weights(qkv_parts), biases(qkv_parts, c.qkv_bias)),
                o=product(weights([names.o]), biases([names.o], c.o_bias)),
                post_norm=take_norm(f"{p}{names.ffn_norm}.weight"),
                gate_up=product(weights(gate_up_parts), biases(gate_up_parts, c.mlp_bias)),
                down=product(weights([names.down]), biases([names.down], c.mlp_bias)),
                q_norm=optional_norm(names.q_norm),
                k_norm=optional_norm(names.k_norm),
                attn_out_norm=optional_norm(names.attn_out_norm),
                ffn_out_norm=optional_norm(names.ffn_out_norm),
            )
        )
        done += 1
        reporter.report("weights", done, total, detail)
    embed = take_weight("model.embed_tokens.weight")
    if compute == "dequantize":
        embed = _as_float(embed, dt, dev)
    elif isinstance(embed, QuantizedTensor):
        embed = _on_device(embed, dev)
    norm = take_norm("model.norm.weight")
    head_stored = "lm_head.weight" in tensors or "lm_head.weight.qdata" in tensors
    if head_stored and not c.tie_word_embeddings:
        lm_head = product([take_weight(LM_HEAD_NAME)])
    elif c.tie_word_embeddings:
        for suffix in ("", ".qdata", ".scales", ".mins"):
            tensors.pop("lm_head.weight" + suffix, None)
        lm_head = product([embed])
        head_weight = getattr(lm_head, "weight", None)
        if isinstance(embed, QuantizedTensor) and isinstance(head_weight, QuantizedTensor):
            # One table for the lookups and the head, whatever the product
            # class made of the one it was given.
            embed = head_weight
    else:
        raise ModelLoadError(f"{folder}: weight 'lm_head.weight' is missing")
    leftovers = sorted(n for n in tensors if not n.endswith(IGNORED_WEIGHT_SUFFIX))
    if leftovers:
        raise ModelLoadError(
            f"{folder}: unexpected weights {', '.join(leftovers[:5])}"
            + (" ..." if len(leftovers) > 5 else "")
            + f" (is this really a {c.family_title} model?)"
        )
    model = DecoderModel(config, embed, layers, norm, lm_head, dtype=dt)
    reporter.report("weights", total, total, detail)
    return model


def describe_weights(model: DecoderModel, stored: dict[str, str] | None = None) -> str:
    """How the model's matrices are held, for stats and logs: "q4_1+q8_0
    (kernel)" when they run quantized (float matrices beside them named by
    dtype), else the dtype, with the formats they were dequantized from
    (`stored`: quantized_formats() of the folder)."""
    products: list = [model.lm_head]
    for layer in model.layers:
        products += [layer.qkv, layer.o, layer.gate_up, layer.down]
    kinds: set[str] = set()
    quantized = isinstance(model.embed, QuantizedTensor)
    if quantized:
        kinds.add(model.embed.format)
    while products:
        product = products.pop()
        if isinstance(product, ConcatLinear):
            products += product.parts
        elif isinstance(product, Linear):
            kinds.add(str(product.weight.dtype).removeprefix("torch."))
        else:
            weight = getattr(product, "weight", None)
            fmt = getattr(product, "format", None) or getattr(weight, "format", None)
            kinds.add(str(fmt))
            quantized = True
    if quantized:
        kernel = "kernel" if model.device.type == "cpu" else "triton"
        return f"{'+'.join(sorted(kinds))} ({kernel})"
    described = "+".join(sorted(kinds)) or str(model.dtype).removeprefix("torch.")
    if stored:
        described += f" (dequantized from {'+'.join(sorted(set(stored.values())))})"
    return described


def _as_float(weight: torch.Tensor | QuantizedTensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if isinstance(weight, QuantizedTensor):
        return weight.dequantize(dtype).to(device)
    return weight


def stored_quantized(pop: Callable[[str], torch.Tensor], name: str, fmt: str) -> QuantizedTensor:
    """The weight `name` of format `fmt` from a folder's tensors (`pop` takes
    one out by its safetensors name): `.qdata` and `.scales` (and q4_1's
    `.mins`), or `.qdata` alone for a format kept as GGUF blocks. Raises
    ValueError when the parts do not fit together."""
    if fmt in RAW_BLOCK_FORMATS:
        return QuantizedTensor(fmt, pop(name + ".qdata"))
    data, scales = pop(name + ".qdata"), pop(name + ".scales")
    return QuantizedTensor(fmt, data, scales, pop(name + ".mins") if fmt == "q4_1" else None)


def read_weights(folder: str | Path) -> dict[str, torch.Tensor]:
    """Every weight of a checkpoint folder by its Hugging Face name, as
    float32 (block-quantized ones dequantized): what the folder means,
    whatever format it stores it in. For tools and tests, not the engine."""
    folder = Path(folder)
    formats = quantized_formats(folder)
    stored = dict(read_tensors(weight_files(folder)))
    out: dict[str, torch.Tensor] = {}
    for name, fmt in formats.items():
        out[name] = stored_quantized(stored.pop, name, fmt).dequantize()
    out.update((name, tensor.float()) for name, tensor in stored.items())
    return out


def dequantized_copy(folder: str | Path, dest: str | Path) -> Path:
    """`folder` written to `dest` as a plain float32 Hugging Face checkpoint
    (block-quantized weights dequantized, no "quantization" section): what
    transformers and other tools can read. For benchmarks and tests."""
    folder, dest = Path(folder), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for entry in folder.iterdir():
        if entry.is_file() and entry.suffix in (".json", ".txt", ".jinja", ".model") and entry.name not in (
            "config.json", "model.safetensors.index.json",
        ):
            shutil.copyfile(entry, dest / entry.name)
    config = read_config_json(folder)
    config.pop("quantization", None)
    (dest / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    weights = {name: tensor.contiguous() for name, tensor in read_weights(folder).items()}
    if config.get("tie_word_embeddings"):
        weights.pop("lm_head.weight", None)
    save_file(weights, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest


def quantized_copy(
    folder: str | Path,
    mode: str,
    *,
    cache_dir: str | Path | None = None,
    on_progress: ProgressCallback | LoadReporter | None = None,
) -> Path:
    """The folder of `folder`'s float checkpoint quantized as `mode` ("int8"
    or "int4"), written once under `cache_dir` (default: models_dir()) and
    reused while the source's files keep their sizes and mtimes. Reports
    "import" progress (tensors quantized)."""
    from engine.formats.default_model import (
        models_dir,  # data folder helpers (import late: no cycle)
    )
    reporter = as_reporter(on_progress, None)
    source = Path(folder).resolve()
    fmt = QUANTIZE_FORMATS[mode]
    files = weight_files(source)
    stamp = {
        "quantized_copy_version": _QUANTIZED_COPY_VERSION,
        "mode": mode,
        "source": str(source),
        "files": {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in [source / "config.json", *files]},
    }
    digest = hashlib.sha256(str(source).encode()).hexdigest()[:10]
    dest = Path(cache_dir) if cache_dir is not None else models_dir()
    dest = dest / f"{source.name}-{mode}-{digest}"
    if is_current(dest, stamp):
        return dest

    config = ModelConfig.from_folder(source)
    # A multimodal folder's copy is of its text model: the config it runs as, the weights it reads.
    raw_config = dict(text_model_config(read_config_json(source)))
    layers = {
        f"model.layers.{i}.{name}" for i in range(config.num_hidden_layers) for name in quantized_layer_weights(config)
    }
    total = count_tensors(files)
    detail = f"Quantizing {source.name} to {mode}; this happens once"
    reporter.report("import", 0, total, detail)
    out: dict[str, torch.Tensor] = {}
    kept: dict[str, str] = {}
    for done, (stored_name, tensor) in enumerate(read_tensors(files), 1):
        name = model_weight_name(stored_name)
        if name is None:
            reporter.report("import", done, total, detail)
            continue
        target = fmt if name in layers else QUANTIZED_TABLE_FORMAT if name in (EMBEDDING_NAME, LM_HEAD_NAME) else None
        if target is not None and tensor.ndim == 2 and tensor.shape[1] % GROUP_SIZE == 0:
            q = quantize_weight(tensor, target)
            out[name + ".qdata"], out[name + ".scales"] = q.data, q.scales
            if q.mins is not None:
                out[name + ".mins"] = q.mins
            kept[name] = target
        else:
            out[name] = tensor
        reporter.report("import", done, total, detail)
    raw_config["quantization"] = {
        "method": "tandem-blocks",
        "version": FOLDER_FORMAT_VERSION,
        "group_size": GROUP_SIZE,
        "source": f"quantize={mode}",
        "requantized": {},
        "tensors": kept,
    }

    staging = staging_path(dest)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        staging.mkdir()
        for entry in source.iterdir():
            # Tokenizer and generation files travel along; weights are rewritten.
            if entry.is_file() and entry.suffix in (".json", ".model", ".txt", ".jinja", ".tiktoken") and entry.name not in (
                "config.json", "model.safetensors.index.json", MARKER_NAME,
            ):
                shutil.copyfile(entry, staging / entry.name)
        write_json(staging / "config.json", raw_config)
        save_file(out, str(staging / "model.safetensors"), metadata={"format": "pt"})
        write_json(staging / MARKER_NAME, stamp)
        fsync_dir(staging)
        return publish(staging, dest, stamp)
    except OSError as exc:
        raise FolderWriteError(
            f"Could not write the quantized copy of {source.name} to {dest.parent}: {exc}"
        ) from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
