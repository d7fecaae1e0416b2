"""`python -m engine generate` as other tools call it: greedy output equal to
Hugging Face transformers token for token, the JSON contract, clear errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.default_model import default_gguf_path

ROOT = Path(__file__).resolve().parents[2]

CHATS = [
    "What is the capital of France?",
    "Write a short poem about autumn leaves.",
    "Explain recursion to a child in two sentences.",
    "Bonjour ! Comment ça va aujourd'hui ?",
    "Give me three tips for staying focused while studying.",
]


def run_cli(*args: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run(
        [sys.executable, "-m", "engine", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def greedy_json(default_model_dir: Path) -> list[dict]:
    args = ["generate", "--model", str(default_model_dir), "--temperature", "0"]
    args += ["--max-tokens", "32", "--dtype", "float32", "--device", "cpu", "--json"]
    for text in CHATS:
        args += ["--chat", text]
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def test_json_contract(greedy_json: list[dict]) -> None:
    assert [r["index"] for r in greedy_json] == list(range(len(CHATS)))
    for record in greedy_json:
        assert set(record) == {"index", "prompt_token_ids", "token_ids", "text", "finish_reason"}
        assert record["finish_reason"] in ("stop", "length")
        if record["finish_reason"] == "length":
            assert len(record["token_ids"]) == 32
        else:
            assert record["token_ids"][-1] == 2  # <|im_end|> ended the turn
        assert record["text"] and "<|im_end|>" not in record["text"]


def test_greedy_matches_transformers_token_for_token(greedy_json: list[dict]) -> None:
    transformers = pytest.importorskip("transformers")
    gguf = default_gguf_path()
    tok = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    ).eval()
    for text, record in zip(CHATS, greedy_json):
        ids = tok.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        if not isinstance(ids, list):
            ids = ids["input_ids"]
        assert record["prompt_token_ids"] == list(ids)
        with torch.no_grad():
            out = model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=32,
                do_sample=False,
                eos_token_id=2,
                pad_token_id=2,
            )
        assert record["token_ids"] == out[0, len(ids) :].tolist(), text


def test_plain_output_streams_text(default_model_dir: Path, greedy_json: list[dict]) -> None:
    proc = run_cli(
        "generate", "--model", str(default_model_dir), "--chat", CHATS[0],
        "--temperature", "0", "--max-tokens", "32", "--dtype", "float32",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == greedy_json[0]["text"] + "\n"


def _assert_clean_error(proc: subprocess.CompletedProcess, needle: str) -> None:
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert needle.lower() in lines[0].lower(), lines[0]


def test_missing_model_folder(tmp_path: Path) -> None:
    _assert_clean_error(
        run_cli("generate", "--model", str(tmp_path / "nope"), "--chat", "hi"), "not found"
    )


def test_corrupt_safetensors(default_model_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(default_model_dir, broken)
    weights = broken / "model.safetensors"
    with weights.open("r+b") as fh:
        fh.truncate(weights.stat().st_size // 3)
    _assert_clean_error(
        run_cli("generate", "--model", str(broken), "--chat", "hi"), "model.safetensors"
    )


def test_unknown_architecture(default_model_dir: Path, tmp_path: Path) -> None:
    odd = tmp_path / "odd"
    shutil.copytree(default_model_dir, odd)
    config = json.loads((odd / "config.json").read_text())
    config["model_type"] = "gpt_neox"
    (odd / "config.json").write_text(json.dumps(config))
    _assert_clean_error(run_cli("generate", "--model", str(odd), "--chat", "hi"), "gpt_neox")


def test_empty_prompt(default_model_dir: Path) -> None:
    _assert_clean_error(
        run_cli("generate", "--model", str(default_model_dir), "--prompt", ""), "empty"
    )
    _assert_clean_error(
        run_cli("generate", "--model", str(default_model_dir), "--chat", "  "), "empty"
    )


def test_prompt_longer_than_context(default_model_dir: Path) -> None:
    proc = run_cli(
        "generate", "--model", str(default_model_dir), "--prompt", "hello " * 9000,
        "--max-tokens", "8",
    )
    _assert_clean_error(proc, "context")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message for a machine without CUDA")
def test_cuda_without_gpu(default_model_dir: Path) -> None:
    _assert_clean_error(
        run_cli("generate", "--model", str(default_model_dir), "--chat", "hi", "--device", "cuda"),
        "CUDA",
    )


def test_cache_too_small_and_bad_sampling(default_model_dir: Path) -> None:
    _assert_clean_error(
        run_cli("generate", "--model", str(default_model_dir), "--chat", "hi", "--kv-pages", "2"),
        "KV-cache pages",
    )
    _assert_clean_error(
        run_cli("generate", "--model", str(default_model_dir), "--chat", "hi", "--top-p", "0"),
        "top_p",
    )


def test_chat_second_turn_is_served_from_the_prefix_cache(default_model_dir: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "engine", "chat", "--model", str(default_model_dir),
         "--temperature", "0", "--max-tokens", "24", "--dtype", "float32", "--stats"],
        cwd=ROOT, input="Tell me about cats.\nAnd dogs?\n/exit\n",
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("> ") == 3  # two replies, then the prompt that read /exit
    stats = json.loads(proc.stderr.strip().splitlines()[-1])
    # Turn 2's prompt extends turn 1's ids as generated, so every full page of
    # turn 1 (at least its 30-token prompt's first page) comes from the cache.
    assert stats["prompt_tokens_reused"] >= 16
    assert stats["prompt_tokens_reused"] % 16 == 0
