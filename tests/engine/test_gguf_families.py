"""GGUF files of every model family, written as llama.cpp's converter writes
them, import into folders whose logits equal transformers' on the original
model: exactly for F32 files, within Q8_0's error for Q8_0 ones.

The tiny models are made by transformers here (the configurations of
tests/engine/test_model_parity.py). `write_like_the_converter` mirrors
convert_hf_to_gguf.py of the llama.cpp that bench/llamacpp.py fetches
(llama.cpp/conversion/*.py, gguf-py): the tensor names come from gguf-py's
own tensor map, and the metadata, the q/k permutation and Gemma's norm shift
follow the lines cited there.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from safetensors.numpy import load_file

from engine.formats.gguf.importer import import_gguf
from engine.formats.loader import load_model, quantized_formats
from engine.runner.cpu import ModelRunner
from tests.engine.test_gguf_import import byte_level_vocab, llama_cpp_permute, read_json
from tests.engine.test_model_parity import CLASSES, TINY, _chunk, _hf_logits, _run

transformers = pytest.importorskip("transformers")

VOCAB = byte_level_vocab(pre="qwen2")
SMALL = {**TINY, "vocab_size": len(VOCAB.tokens)}

# name -> (GGUF architecture, the transformers config)
FAMILIES: dict[str, tuple[str, Any]] = {
    # Mistral Nemo's shape: head_dim (24) is not hidden/heads (16).
    "llama-head-dim": ("llama", lambda: transformers.MistralConfig(**SMALL, head_dim=24, rope_theta=1e6)),
    "qwen3": ("qwen3", lambda: transformers.Qwen3Config(**SMALL, head_dim=24, rope_theta=1e6)),
    # llama.cpp scales Gemma's attention by head_dim^-0.5 (the converter
    # writes no scale), which is what query_pre_attn_scalar says for every
    # Gemma but the 27B ones; head_dim is not hidden/heads, so a scale taken
    # from the wrong one shows. The soft-caps are small enough to matter.
    "gemma2": ("gemma2", lambda: transformers.Gemma2Config(
        **SMALL, head_dim=24, query_pre_attn_scalar=24, sliding_window=5,
        attn_logit_softcapping=0.5, final_logit_softcapping=0.3,
    )),
    # Six layers: five slide on the local base, the sixth is global, scaled.
    "gemma3": ("gemma3", lambda: transformers.Gemma3TextConfig(
        **{**SMALL, "num_hidden_layers": 6}, head_dim=24, query_pre_attn_scalar=24, sliding_window=5,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
    )),
    "granite": ("granite", lambda: transformers.GraniteConfig(
        **SMALL, embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.1, logits_scaling=4.0,
    )),
    # Phi-4-mini's shape: LongRoPE past a pretrained context of 6 (so the long
    # factors rotate, as they do in transformers for 16 tokens), half of each
    # head rotating, fused qkv and gate/up.
    "phi3": ("phi3", lambda: transformers.Phi3Config(
        **{**SMALL, "max_position_embeddings": 256}, original_max_position_embeddings=6,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
        rope_parameters={
            "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
            "short_factor": [1.0, 1.3, 1.6, 1.9], "long_factor": [2.0, 3.5, 5.0, 6.5],
        },
    )),
}


def tiny_model(config: Any) -> Any:
    torch.manual_seed(0)
    config._attn_implementation = "eager"
    model = getattr(transformers, CLASSES[config.model_type])(config).eval()
    with torch.no_grad():  # norms start at 1 and biases at 0: perturb every tensor
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def converter_metadata(arch: str, hp: dict[str, Any]) -> dict[str, Any]:
    """`<arch>.<key>` -> value, as convert_hf_to_gguf.py writes it for these hparams (config.json)."""
    if arch == "phi3":
        return phi3_metadata(hp)
    rope = hp.get("rope_parameters") or {}
    global_rope = rope.get("full_attention", rope)
    heads = hp["num_attention_heads"]
    kv: dict[str, Any] = {  # conversion/base.py TextModel.set_gguf_parameters
        "block_count": hp["num_hidden_layers"],
        "context_length": hp["max_position_embeddings"],
        "embedding_length": hp["hidden_size"],
        "feed_forward_length": hp["intermediate_size"],
        "attention.head_count": heads,
        "attention.head_count_kv": hp["num_key_value_heads"],
        "attention.layer_norm_rms_epsilon": hp["rms_norm_eps"],
    }
    # Gemma2Model.set_gguf_parameters does not call TextModel's, which writes
    # the RoPE base, its scaling, the sliding layers' base and head_dim.
    if arch != "gemma2":
        if (theta := global_rope.get("rope_theta")) is not None:
            kv["rope.freq_base"] = theta
        if global_rope.get("rope_type") == "linear":
            kv["rope.scaling.type"] = "linear"
            kv["rope.scaling.factor"] = global_rope["factor"]
        if (local := rope.get("sliding_attention", {}).get("rope_theta")) is not None:
            kv["rope.freq_base_swa"] = local
    # GraniteModel pops head_dim before TextModel's parameters are written.
    if hp.get("head_dim") and arch != "granite":
        kv["attention.key_length"] = kv["attention.value_length"] = hp["head_dim"]
    if arch in ("llama", "granite"):  # conversion/llama.py LlamaModel.set_gguf_parameters
        kv["vocab_size"] = hp["vocab_size"]
        kv["rope.dimension_count"] = (hp["head_dim"] if arch == "llama" else None) or hp["hidden_size"] // heads
    if arch == "gemma2":  # conversion/gemma.py Gemma2Model.set_gguf_parameters
        kv["attention.key_length"] = kv["attention.value_length"] = hp["head_dim"]
        kv["attn_logit_softcapping"] = hp["attn_logit_softcapping"]
        kv["final_logit_softcapping"] = hp["final_logit_softcapping"]
        kv["attention.sliding_window"] = hp["sliding_window"]
    if arch == "gemma3":  # conversion/gemma.py Gemma3Model.set_gguf_parameters
        if hp.get("final_logit_softcapping"):
            kv["final_logit_softcapping"] = hp["final_logit_softcapping"]
        kv["attention.sliding_window"] = hp["sliding_window"]
    if arch == "granite":  # conversion/granite.py GraniteModel.set_gguf_parameters
        kv["attention.scale"] = hp["attention_multiplier"]
        kv["embedding_scale"] = hp["embedding_multiplier"]
        kv["residual_scale"] = hp["residual_multiplier"]
        kv["logit_scale"] = hp["logits_scaling"]
    return {f"{arch}.{key}": value for key, value in kv.items()}


def phi3_metadata(hp: dict[str, Any]) -> dict[str, Any]:
    """conversion/phi.py Phi3MiniModel.set_gguf_parameters: its own set (not
    TextModel's), no key_length, the rotated dimensions per head, a window of
    0 for none, and the LongRoPE attention factor (generate_extra_tensors)."""
    import math

    rope = hp["rope_parameters"]
    heads, hidden = hp["num_attention_heads"], hp["hidden_size"]
    original, maximum = rope["original_max_position_embeddings"], hp["max_position_embeddings"]
    scale = maximum / original
    kv = {
        "context_length": maximum,
        "rope.scaling.original_context_length": original,
        "embedding_length": hidden,
        "feed_forward_length": hp["intermediate_size"],
        "block_count": hp["num_hidden_layers"],
        "attention.head_count": heads,
        "attention.head_count_kv": hp["num_key_value_heads"],
        "attention.layer_norm_rms_epsilon": hp["rms_norm_eps"],
        "rope.dimension_count": int(rope.get("partial_rotary_factor", 1.0) * hidden) // heads,
        "rope.freq_base": rope["rope_theta"],
        "attention.sliding_window": hp.get("sliding_window") or 0,
        "rope.scaling.attn_factor": math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0,
    }
    return {f"phi3.{key}": value for key, value in kv.items()}


def write_like_the_converter(path: Path, arch: str, model: Any, qtype: Q) -> None:
    hp = model.config.to_dict()
    writer = gguf.GGUFWriter(path, arch)
    for key, value in converter_metadata(arch, hp).items():
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, value)
    writer.add_tokenizer_model(VOCAB.model)
    writer.add_tokenizer_pre(VOCAB.pre)
    writer.add_token_list(VOCAB.tokens)
    writer.add_token_types(VOCAB.types)
    writer.add_token_merges(VOCAB.merges)
    writer.add_bos_token_id(VOCAB.bos)
    writer.add_eos_token_id(VOCAB.eos)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], hp["num_hidden_layers"])
    if arch == "phi3":  # conversion/phi.py generate_extra_tensors: the LongRoPE factors, F32
        rope = hp["rope_parameters"]
        writer.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
        writer.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))
    heads, kv_heads = hp["num_attention_heads"], hp["num_key_value_heads"]
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and hp["tie_word_embeddings"]:
            continue  # not in the checkpoint's files
        data = tensor.numpy().copy()
        # conversion/llama.py LlamaModel.modify_tensors (GraniteModel is one):
        # q/k rows reordered for ggml's RoPE.
        if arch in ("llama", "granite") and ".q_proj." in name:
            data = llama_cpp_permute(data, heads)
        if arch in ("llama", "granite") and ".k_proj." in name:
            data = llama_cpp_permute(data, kv_heads)
        # conversion/gemma.py Gemma2Model / Gemma3Model.modify_tensors: `1 + w` stored as one weight.
        if arch.startswith("gemma") and name.endswith("norm.weight"):
            data = data + 1
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert gguf_name is not None, name
        if data.ndim == 1 or qtype == Q.F32:  # norms stay F32, as the converter keeps 1-D tensors
            writer.add_tensor(gguf_name, data.astype(np.float32))
        else:
            writer.add_tensor(gguf_name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def engine_logits(folder: Path, ids: list[int], quantized: str = "auto") -> torch.Tensor:
    model = load_model(folder, "cpu", "float32", quantized=quantized)
    runner = ModelRunner(model, model.new_kv_cache(8, 4))
    pages = [3, 0, 6, 1, 5, 2, 7]
    return _run(runner, [], [_chunk(ids, pages, 0, len(ids))])


@pytest.mark.parametrize("qtype", [Q.F32, Q.Q8_0], ids=lambda qtype: qtype.name)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_gguf_of_each_family_imports_to_transformers_logits(family: str, qtype: Q, tmp_path: Path) -> None:
    arch, make_config = FAMILIES[family]
    hf = tiny_model(make_config())
    write_like_the_converter(tmp_path / "m.gguf", arch, hf, qtype)
    folder = import_gguf(tmp_path / "m.gguf", tmp_path / "out")
    config = read_json(folder / "config.json")
    assert config["model_type"] == hf.config.model_type.replace("mistral", "llama")

    rng = random.Random(1)
    ids = [rng.randrange(len(VOCAB.tokens)) for _ in range(16)]  # longer than the windows of 5
    if qtype == Q.F32:
        torch.testing.assert_close(engine_logits(folder, ids), _hf_logits(hf, ids), atol=2e-4, rtol=1e-4)
    else:
        assert set(quantized_formats(folder).values()) == {"q8_0"}
        # Against the same model with the file's Q8_0 weights, computed in
        # float: the import is exact; the int8 products' own rounding is the
        # quantized kernels' tests' matter.
        expected = _hf_logits(with_weights_through(hf, Q.Q8_0), ids)
        dequantized = engine_logits(folder, ids, quantized="dequantize")
        torch.testing.assert_close(dequantized, expected, atol=2e-4, rtol=1e-4)


def with_weights_through(model: Any, qtype: Q) -> Any:
    """`model` with each matrix replaced by its round trip through `qtype`."""
    with torch.no_grad():
        for param in model.parameters():
            if param.ndim == 2:
                blocks = gguf.quants.quantize(param.numpy(), qtype)
                param.copy_(torch.from_numpy(gguf.quants.dequantize(blocks, qtype)))
    return model


def test_gemma_config_follows_llama_cpp_defaults(tmp_path: Path) -> None:
    """What the converter leaves out of a Gemma 3 file is what llama.cpp
    assumes (src/models/gemma3.cpp): five of six layers slide, on a base of
    10000 unless the file says."""
    hf = tiny_model(FAMILIES["gemma3"][1]())
    write_like_the_converter(tmp_path / "m.gguf", "gemma3", hf, Q.F32)
    folder = import_gguf(tmp_path / "m.gguf", tmp_path / "out")
    config = read_json(folder / "config.json")
    assert config["layer_types"] == ["sliding_attention"] * 5 + ["full_attention"]
    assert (config["rope_theta"], config["rope_local_base_freq"]) == (1e6, 1e4)
    assert config["rope_scaling"] == {"rope_type": "linear", "factor": 2.0}
    assert config["query_pre_attn_scalar"] == 24  # head_dim, not hidden/heads (16)
    assert config["tie_word_embeddings"] is True
    # The folder holds Hugging Face's w, not the file's 1 + w.
    weights = load_file(folder / "model.safetensors")
    shifted = ("model.norm.weight", "model.layers.5.self_attn.k_norm.weight", "model.layers.5.post_feedforward_layernorm.weight")
    for name in shifted:
        np.testing.assert_allclose(weights[name], hf.state_dict()[name].numpy(), atol=1e-6, err_msg=name)


@pytest.mark.parametrize("layers", [4, 7])
def test_gemma3_sliding_pattern_on_either_side_of_the_layer_count(layers: int, tmp_path: Path) -> None:
    """Gemma 3's default period (6) in a file of fewer layers leaves every
    layer sliding, as llama.cpp's set_swa_pattern reads it; with more, the
    sixth is global and the pattern starts again."""
    hf = tiny_model(transformers.Gemma3TextConfig(**{**SMALL, "num_hidden_layers": layers}, head_dim=24,
                                                  query_pre_attn_scalar=24, sliding_window=5))
    write_like_the_converter(tmp_path / "m.gguf", "gemma3", hf, Q.F32)
    config = read_json(import_gguf(tmp_path / "m.gguf", tmp_path / "out") / "config.json")
    assert config["layer_types"] == [
        "full_attention" if i % 6 == 5 else "sliding_attention" for i in range(layers)
    ]


@pytest.mark.parametrize("family", ["gemma3", "qwen3"])
def test_the_details_predict_what_the_import_holds(family: str, tmp_path: Path) -> None:
    """The model details read the GGUF header only (app/models/checks.py);
    their shape and kept formats are the imported folder's."""
    from app.models.checks import describe_model_folder, read_gguf_summary
    from engine.formats.weight_memory import ModelShape
    from engine.model.config import ModelConfig

    arch, make_config = FAMILIES[family]
    write_like_the_converter(tmp_path / "m.gguf", arch, tiny_model(make_config()), Q.Q8_0)
    folder = import_gguf(tmp_path / "m.gguf", tmp_path / "out")
    summary = read_gguf_summary(tmp_path / "m.gguf")
    assert summary.shape() == ModelShape.from_config(ModelConfig.from_folder(folder))
    assert summary.kept_formats() == describe_model_folder(folder).stored
    assert summary.kept_formats().matmul and summary.kept_formats().embedding == "q8_0"
