"""Fixtures shared by all tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# Tests compare against transformers, which must never reach for a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def default_model_dir() -> Iterator[Path]:
    """The default model's imported folder.

    The import lives in .pytest_cache (or $TANDEM_TEST_DATA_DIR) so that later
    runs reuse it; TANDEM_DATA_DIR points there for the rest of the session.
    """
    from engine.formats.default_model import resolve_model

    previous = os.environ.get("TANDEM_DATA_DIR")
    os.environ["TANDEM_DATA_DIR"] = os.environ.get("TANDEM_TEST_DATA_DIR") or str(
        REPO_ROOT / ".pytest_cache" / "tandem-data"
    )
    try:
        yield resolve_model("default")
    finally:
        if previous is None:
            os.environ.pop("TANDEM_DATA_DIR", None)
        else:
            os.environ["TANDEM_DATA_DIR"] = previous


@pytest.fixture(scope="session")
def default_float_dir(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default model as a float32 Hugging Face folder (its imported
    folder keeps the GGUF's quantized blocks, which transformers cannot read)."""
    from engine.formats.loader import dequantized_copy

    return dequantized_copy(default_model_dir, tmp_path_factory.mktemp("default-float"))


# A random-weight model of the default model's family and tokenizer: every
# engine path runs on it, fast, where what the text says does not matter.
TINY_MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
}


def write_tiny_model(source: Path, dest: Path, seed: int = 0) -> Path:
    """A tiny random-weight Llama folder at `dest` using `source`'s tokenizer files."""
    import json
    import shutil

    import torch
    from safetensors.torch import save_file

    from engine.model.tokenizer import Tokenizer

    dest.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "chat_template.jinja", "chat_template.json", "generation_config.json"):
        if (source / name).is_file():
            shutil.copyfile(source / name, dest / name)
    source_config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    vocab = Tokenizer.from_folder(source).vocab_size
    config = dict(TINY_MODEL_CONFIG, vocab_size=vocab)
    for key in ("bos_token_id", "eos_token_id"):
        if key in source_config:
            config[key] = source_config[key]
    (dest / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")

    generator = torch.Generator().manual_seed(seed)
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head_dim = hidden // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * head_dim

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * 0.5

    tensors = {
        "model.embed_tokens.weight": rand(vocab, hidden),
        "model.norm.weight": 1 + 0.1 * rand(hidden),
    }
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors |= {
            p + "input_layernorm.weight": 1 + 0.1 * rand(hidden),
            p + "post_attention_layernorm.weight": 1 + 0.1 * rand(hidden),
            p + "self_attn.q_proj.weight": rand(hidden, hidden) / hidden**0.5,
            p + "self_attn.k_proj.weight": rand(kv, hidden) / hidden**0.5,
            p + "self_attn.v_proj.weight": rand(kv, hidden) / hidden**0.5,
            p + "self_attn.o_proj.weight": rand(hidden, hidden) / hidden**0.5,
            p + "mlp.gate_proj.weight": rand(inter, hidden) / hidden**0.5,
            p + "mlp.up_proj.weight": rand(inter, hidden) / hidden**0.5,
            p + "mlp.down_proj.weight": rand(hidden, inter) / inter**0.5,
        }
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(dest / "model.safetensors"))
    return dest


@pytest.fixture(scope="session")
def tiny_model_dir(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight 2-layer Llama folder with the default model's tokenizer and chat template."""
    return write_tiny_model(default_model_dir, tmp_path_factory.mktemp("tiny-model"))


def pytest_configure(config: pytest.Config) -> None:
    # Each of the README's two workers would start one torch thread per core:
    # twice as many busy threads as cores, whose OpenMP barriers then wait on
    # descheduled threads (engine/runner/threads.py). Reference computations
    # (transformers) run on the worker's share of the cores; an Engine still
    # chooses its own count.
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        import torch

        from engine.runner.threads import available_cores

        torch.set_num_threads(max(1, available_cores() // int(workers)))
    _read_each_gguf_file_once_in_transformers()


def _read_each_gguf_file_once_in_transformers() -> None:
    """transformers' GGUF loading (the reference several tests compare the
    importer with) parses a file twice, once for the config and once for the
    weights, and builds the same tensor-name table once per tensor: 28 s of
    a 30 s load of the default model. Both are pure functions of their
    arguments, so they are cached here, for the tests' process only; what
    transformers computes from them is unchanged."""
    import functools

    try:
        import gguf
    except ImportError:
        return
    reader = gguf.GGUFReader

    @functools.lru_cache(maxsize=4)
    def _reader(path: str, mode: str, stamp: tuple[int, int]) -> Any:
        return reader(path, mode)

    def cached_reader(path: Any, mode: str = "r") -> Any:
        stat = os.stat(path)
        return _reader(os.fspath(path), mode, (stat.st_mtime_ns, stat.st_size))

    gguf.GGUFReader = cached_reader  # type: ignore[assignment]
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=16)(gguf.get_tensor_name_map)


# The files that take longest (tens of seconds each, from --durations), run
# first: the README's two workers take whole files (--dist loadfile), and a
# long file left for last keeps one worker busy while the other idles.
LONGEST_FILES = (
    "engine/test_cli.py", "engine/test_deterministic.py", "engine/test_lifecycle.py", "engine/test_engine.py",
    "ui/test_smoke.py", "ui/test_model_manager.py", "ui/test_crash_recovery.py", "app/test_workspace.py",
    "engine/test_triton_kernels.py", "engine/test_server.py", "ui/test_window.py", "engine/test_gguf_import.py",
    "engine/test_memory_footprint.py", "engine/test_hostile_models.py", "engine/test_config.py",
    "app/test_chat_session.py", "engine/test_default_path_reference.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}

    def order(item: pytest.Item) -> int:
        try:
            relative = Path(str(item.path)).relative_to(REPO_ROOT / "tests").as_posix()
        except ValueError:  # a test file given from elsewhere
            return len(LONGEST_FILES)
        return rank.get(relative, len(LONGEST_FILES))

    items.sort(key=order)  # stable: each file's tests keep their order
