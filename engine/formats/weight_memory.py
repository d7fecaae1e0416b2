"""The bytes a loaded model's weights take, by how they are stored and run.

engine/formats/loader.py decides what a checkpoint becomes in memory; these
are its rules counted instead of allocated, for app.models.memory_estimate
to predict a load without doing it:

- float weights in the load dtype, and on the CPU a oneDNN-packed second
  copy of every float matmul weight, the LM head included (a tied head packs
  the embedding) where engine/model/linear.py `cpu_weight_packing` says it
  keeps one;
- block-quantized weights (engine.model.quant) run by a kernel: one copy of
  their blocks (a tied head multiplies by the embedding's own blocks), and a
  quantized product's bias in float32 on the CPU (QuantLinear);
- norms in the activation dtype (engine.runner.memory.activation_dtype).

tests/app/test_model_registry.py compares the counts with really loaded
engines.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.config import QUANTIZE_MODES
from engine.errors import ModelLoadError
from engine.formats.weight_names import EMBEDDING_NAME, LM_HEAD_NAME, expected_weights

if TYPE_CHECKING:
    import torch

    from engine.model.config import ModelConfig

# ModelShape and QuantizedWeights are built while the window is (the model
# registry's entries, app/models): this module imports torch's side of the
# engine (engine.model.quant, .linear, engine.runner.memory) in the functions
# that count bytes only, so that the window need not wait for torch.


@dataclass(slots=True, frozen=True)
class ModelShape:
    """What the memory of a loaded Llama-family model depends on.

    Parameter counts are split by how the engine stores them: matmul weights
    (fused q/k/v, o, gate/up, down; packed a second time on the CPU), the
    embedding, a separate lm_head (0 when tied to the embedding: the engine
    then multiplies by the embedding itself), norms (kept in the activation
    dtype) and biases (in the weights' dtype, never packed).
    """

    matmul_params: int
    embedding_params: int
    lm_head_params: int
    norm_params: int
    bias_params: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    max_context: int

    @property
    def parameters(self) -> int:
        return (
            self.matmul_params + self.embedding_params + self.lm_head_params
            + self.norm_params + self.bias_params
        )

    @classmethod
    def from_config(cls, c: ModelConfig) -> ModelShape:
        """The shape the loader builds for this config (it refuses any
        checkpoint whose tensors differ from `expected_weights`)."""
        counts: Counter[str] = Counter()
        for name, shape in expected_weights(c).items():
            count = 1
            for dim in shape:
                count *= dim
            if name == EMBEDDING_NAME:
                counts["embedding"] += count
            elif name == LM_HEAD_NAME:
                counts["lm_head"] += count
            elif name.endswith("norm.weight"):
                counts["norm"] += count
            elif name.endswith(".bias"):
                counts["bias"] += count
            else:
                counts["matmul"] += count
        return cls(
            matmul_params=counts["matmul"],
            embedding_params=counts["embedding"],
            lm_head_params=counts["lm_head"],
            norm_params=counts["norm"],
            bias_params=counts["bias"],
            num_layers=c.num_hidden_layers,
            num_kv_heads=c.num_key_value_heads,
            head_dim=c.head_dim,
            max_context=c.max_position_embeddings,
        )


@dataclass(slots=True, frozen=True)
class QuantizedWeights:
    """Which of a model's weights are block-quantized (engine.model.quant formats),
    counted the way ModelShape counts parameters. Empty: a float checkpoint.

    `matmul`: (format, parameters) of the layers' quantized matrices; the rest
    of ModelShape.matmul_params is float. `embedding` / `lm_head`: the
    format of that table, None when it is float (or, for the head, absent).
    """

    matmul: tuple[tuple[str, int], ...] = ()
    embedding: str | None = None
    lm_head: str | None = None

    def __bool__(self) -> bool:
        return bool(self.matmul or self.embedding or self.lm_head)

    def covers(self, shape: ModelShape) -> bool:
        """Whether every layer matrix of `shape` is block-quantized (the
        engine then runs its native CPU path)."""
        return sum(params for _, params in self.matmul) == shape.matmul_params

    @property
    def formats(self) -> tuple[str, ...]:
        """The formats present, sorted: ("q4_1", "q8_0")."""
        found = {fmt for fmt, _ in self.matmul} | {f for f in (self.embedding, self.lm_head) if f}
        return tuple(sorted(found))

    @classmethod
    def from_formats(
        cls, formats: Mapping[str, str], shapes: Mapping[str, tuple[int, ...]]
    ) -> QuantizedWeights:
        """From a folder's config.json "quantization" map (engine.formats.loader
        quantized_formats: weight name -> format) and the weights' [rows, cols]."""
        matmul: Counter[str] = Counter()
        embedding = lm_head = None
        for name, fmt in formats.items():
            if name == EMBEDDING_NAME:
                embedding = fmt
            elif name == LM_HEAD_NAME:
                lm_head = fmt
            elif name in shapes:
                rows, cols = shapes[name]
                matmul[fmt] += rows * cols
        return cls(tuple(sorted(matmul.items())), embedding, lm_head)

    @classmethod
    def planned(cls, shape: ModelShape, mode: str) -> QuantizedWeights:
        """What `quantize=mode` keeps of a float checkpoint (engine/formats/loader.py
        quantized_copy): every layer matrix in the mode's format, the
        embedding and a separate LM head in QUANTIZED_TABLE_FORMAT.
        Llama-family widths are multiples of the 32-weight group, so every
        matrix qualifies."""
        if mode not in QUANTIZE_MODES:
            raise ModelLoadError(f"Unknown quantization '{mode}': use {', '.join(QUANTIZE_MODES)}")
        from engine.model.quant import QUANTIZE_FORMATS, QUANTIZED_TABLE_FORMAT

        return cls(
            ((QUANTIZE_FORMATS[mode], shape.matmul_params),) if shape.matmul_params else (),
            QUANTIZED_TABLE_FORMAT,
            QUANTIZED_TABLE_FORMAT if shape.lm_head_params else None,
        )


def weight_bytes(
    shape: ModelShape,
    device: torch.device,
    dtype: torch.dtype,
    blocks: QuantizedWeights = QuantizedWeights(),
    *,
    run_quantized: bool = False,
) -> tuple[int, str]:
    """Bytes the loaded weights hold (norms included) and how they are held,
    as engine/formats/loader.py describe_weights says it: "q4_1+q8_0 (kernel)",
    "float32 (dequantized from q4_1+q8_0)", or "" for plain float weights.

    `blocks`: the weights kept block-quantized (stored so, or quantized at
    load); `run_quantized`: a kernel runs them (else they are dequantized to
    `dtype` at load, engine/formats/loader.py resolve_quantized_compute).
    """
    from engine.runner.memory import activation_dtype

    norms = shape.norm_params * activation_dtype(device, dtype).itemsize
    if run_quantized:
        total, held = _quantized_weight_bytes(shape, blocks, device, dtype)
        kernel = "kernel" if device.type == "cpu" else "triton"
        return total + norms, f"{held} ({kernel})"
    w = dtype.itemsize
    total = (shape.matmul_params + shape.embedding_params + shape.lm_head_params + shape.bias_params) * w
    if _packs(device, dtype):
        # Linear keeps the plain weight and oneDNN's blocked copy; a tied
        # lm_head packs the embedding.
        total += (shape.matmul_params + (shape.lm_head_params or shape.embedding_params)) * w
    dtype_name = str(dtype).removeprefix("torch.")
    described = f"{dtype_name} (dequantized from {'+'.join(blocks.formats)})" if blocks else ""
    return total + norms, described


def _packs(device: torch.device, dtype: torch.dtype) -> bool:
    from engine.model.linear import cpu_weight_packing

    return device.type == "cpu" and cpu_weight_packing(dtype)


def _quantized_weight_bytes(
    shape: ModelShape, blocks: QuantizedWeights, device: torch.device, dtype: torch.dtype
) -> tuple[int, str]:
    """Bytes of the weights (norms apart) of a model whose blocks run
    quantized, and what they are held as ("q4_1+q8_0", with the float dtype
    of any float matrix beside them)."""
    from engine.model.quant import quantized_nbytes

    w = dtype.itemsize
    packs = _packs(device, dtype)
    kinds = set(blocks.formats)
    quantized_params = sum(params for _, params in blocks.matmul)
    float_matmul = shape.matmul_params - quantized_params
    total = sum(quantized_nbytes(fmt, params) for fmt, params in blocks.matmul)
    total += float_matmul * w * (2 if packs else 1)
    if blocks.embedding:
        total += quantized_nbytes(blocks.embedding, shape.embedding_params)
    else:
        total += shape.embedding_params * w
    if shape.lm_head_params:
        if blocks.lm_head:
            total += quantized_nbytes(blocks.lm_head, shape.lm_head_params)
        else:
            total += shape.lm_head_params * w * (2 if packs else 1)
    elif not blocks.embedding and packs:
        total += shape.embedding_params * w  # the tied head packs the float embedding
    # QuantLinear keeps its bias in float32 on the CPU.
    bias_size = 4 if device.type == "cpu" and quantized_params else w
    total += shape.bias_params * bias_size
    has_float_matrix = float_matmul > 0 or (shape.lm_head_params and not blocks.lm_head) or (
        not shape.lm_head_params and not blocks.embedding
    )
    if has_float_matrix:
        kinds.add(str(dtype).removeprefix("torch."))
    return total, "+".join(sorted(kinds))
