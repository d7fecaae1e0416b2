"""The block formats a model folder may keep, as plain facts: no torch here,
so reading or importing a model file (and refusing a bad one) does not pay
for loading PyTorch. engine.model.quant re-exports them with the code that
runs the formats; its docstring describes the layout."""

from __future__ import annotations

GROUP_SIZE = 32
# Output rows per tile of the packed layout (quant_matmul.c's "octet").
PACK_ROWS = 8
FORMATS = ("q8_0", "q4_0", "q4_1")
# Bytes of one group of GROUP_SIZE weights in each format: the levels (8 or
# 4 bits each) plus a float16 scale (and a float16 min for q4_1).
BLOCK_BYTES = {"q8_0": GROUP_SIZE + 2, "q4_0": GROUP_SIZE // 2 + 2, "q4_1": GROUP_SIZE // 2 + 4}
# Formats kept byte for byte as a GGUF file holds them (ggml's block structs):
# format -> (weights per block, bytes per block). Their QuantizedTensor.data is
# each row's blocks in file order; scales and mins live inside the blocks.
RAW_BLOCK_FORMATS = {"q4_k": (256, 144), "q5_k": (256, 176), "q6_k": (256, 210), "q5_0": (32, 22), "q5_1": (32, 24)}
# Every format a model folder may keep: FORMATS (which `quantize` can also
# produce from float weights) and the raw GGUF blocks.
KEPT_FORMATS = FORMATS + tuple(RAW_BLOCK_FORMATS)
# Version of the folder layout written by the GGUF importer and `quantize`.
FOLDER_FORMAT_VERSION = 1
# "Quantize at load" (--quantize, engine.config.QUANTIZE_MODES) -> the format of the layers' matrices.
QUANTIZE_FORMATS = {"int8": "q8_0", "int4": "q4_1"}
# ... and of the embedding and a separate LM head, whatever the choice (as
# llama.cpp's 4-bit mixes keep them at 6-8 bits).
QUANTIZED_TABLE_FORMAT = "q8_0"


def block_shape(fmt: str) -> tuple[int, int]:
    """(weights, bytes) of one block of `fmt`."""
    if fmt in RAW_BLOCK_FORMATS:
        return RAW_BLOCK_FORMATS[fmt]
    return GROUP_SIZE, BLOCK_BYTES[fmt]


def quantized_nbytes(fmt: str, params: int) -> int:
    """Bytes of `params` weights held in the block format `fmt` (rows are whole blocks)."""
    weights, nbytes = block_shape(fmt)
    return params * nbytes // weights
