"""`python -m engine` as other tools call it (greedy output equal to Hugging
Face transformers token for token, the JSON contract, clear errors) and as a
new user meets it (help, version, first-start import, messages in flags)."""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import pytest
import torch

from engine.entrypoints.cli import main as cli
from engine.formats.default_model import default_gguf_path
from engine.progress import LoadProgress

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
    # Dequantized: what the GGUF file means, which transformers computes.
    args += ["--max-tokens", "32", "--dtype", "float32", "--quantized", "dequantize", "--device", "cpu", "--json"]
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


def test_greedy_matches_transformers_token_for_token(
    default_float_dir: Path, greedy_json: list[dict]
) -> None:
    transformers = pytest.importorskip("transformers")
    gguf = default_gguf_path()
    tok = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The model from the imported folder, dequantized: that its tensors equal
    # transformers' own reading of the GGUF file is test_gguf_import's check,
    # and this is a minute faster than dequantizing the file again.
    model = transformers.AutoModelForCausalLM.from_pretrained(
        default_float_dir, dtype=torch.float32
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
        "--temperature", "0", "--max-tokens", "32", "--dtype", "float32", "--quantized", "dequantize",
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


def test_a_kv_cache_too_small_names_the_flag(default_model_dir: Path) -> None:
    proc = run_cli("generate", "--model", str(default_model_dir), "--chat", "hi", "--kv-pages", "2")
    _assert_clean_error(proc, "KV-cache pages")
    assert "--kv-pages 2 holds 32 tokens" in proc.stderr  # 2 pages of the default 16 tokens


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


# --- what a new user meets --------------------------------------------------------------------


def _help(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *argv: str) -> str:
    # As `python -m engine` runs it: argv[0] is the path of engine/__main__.py.
    monkeypatch.setattr(sys, "argv", [str(ROOT / "engine" / "__main__.py"), *argv])
    with pytest.raises(SystemExit) as exited:
        cli.main([*argv, "--help"])
    assert exited.value.code == 0
    return capsys.readouterr().out


def test_version() -> None:
    proc = run_cli("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"python -m engine (tandem {version('tandem')})"


def test_top_level_help_names_the_command_and_gives_examples(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    text = _help(capsys, monkeypatch)
    assert text.startswith("usage: python -m engine [-h] [--version] COMMAND")
    assert "generate" in text and "chat" in text
    assert "examples:\n  python -m engine chat\n" in text
    assert "python -m engine generate --chat" in text


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_every_option_is_described_with_its_default(command: str) -> None:
    sub = next(
        a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    )
    parser = sub.choices[command]
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        flag = action.option_strings[0]
        assert action.help, f"{flag} has no description"
        if action.default not in (None, False, []):
            assert "%(default)s" in action.help, f"{flag} does not show its default"
        elif action.nargs != 0 and action.dest not in ("inputs", "stop", "system"):
            # An option without a fixed default says what happens when it is left out.
            assert "default:" in action.help, f"{flag} does not say what it defaults to"
        if action.nargs != 0 and not action.choices:
            assert action.metavar in ("TEXT", "PATH", "N", "T", "K", "P", "X"), flag


def test_sampling_left_out_takes_the_models_recommendation_then_tandems_defaults() -> None:
    from engine.entrypoints.cli.options import sampling_params, sampling_source
    from engine.params import MODEL_RECOMMENDED, TANDEM_DEFAULTS, SamplingParams

    parse = cli.build_parser().parse_args
    bare = parse(["generate", "--chat", "Hi"])
    assert sampling_params(bare) == SamplingParams()
    assert sampling_source(bare, {}) == TANDEM_DEFAULTS
    recommended = {"temperature": 0.6, "top_k": 20}
    assert sampling_params(bare, recommended) == SamplingParams(temperature=0.6, top_k=20)
    assert sampling_source(bare, recommended) == MODEL_RECOMMENDED
    # A flag given beats the model's recommendation.
    flagged = parse(["generate", "--chat", "Hi", "--temperature", "0", "--top-k", "0"])
    assert sampling_params(flagged, recommended) == SamplingParams(temperature=0, top_k=0)
    assert sampling_source(flagged, recommended) == TANDEM_DEFAULTS


def test_generate_help_shows_defaults_metavars_and_examples(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    text = " ".join(_help(capsys, monkeypatch, "generate").split())
    assert text.startswith("usage: python -m engine generate")
    assert "--chat TEXT" in text and "--prompt TEXT" in text and "INPUTS" not in text
    assert "--max-tokens N most tokens a reply may have (default: 512)" in text
    assert "(greedy) (default: the model's recommendation, else 0.8)" in text
    assert "--threads N a fixed number of CPU threads for the model's math (default: the engine's CPU thread policy" in text
    assert "--deterministic, --no-deterministic reproducible replies" in text
    assert "--model PATH" in text
    assert "examples: python -m engine generate --chat" in text
    assert "token_ids include the end-of-turn token that stopped the reply" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max-tokens", "0"], "argument --max-tokens: must be at least 1, got 0"),
        (["--max-tokens", "ten"], "argument --max-tokens: must be a whole number, got 'ten'"),
        (["--threads", "0"], "argument --threads: must be at least 1, got 0"),
        (["--kv-pages", "0"], "argument --kv-pages: must be at least 1, got 0"),
        (["--page-size", "0"], "argument --page-size: must be at least 1, got 0"),
        (["--temperature", "-1"], "argument --temperature: must be at least 0, got -1"),
        (["--temperature", "nan"], "argument --temperature: must be a finite number, got 'nan'"),
        (["--top-p", "0"], "argument --top-p: must be above 0 and at most 1, got 0"),
        (["--min-p", "1"], "argument --min-p: must be at least 0 and below 1, got 1"),
        (["--top-k", "-1"], "argument --top-k: must be at least 0, got -1"),
        (["--repetition-penalty", "0"], "argument --repetition-penalty: must be above 0, got 0"),
        (["--seed", "1.5"], "argument --seed: must be a whole number, got '1.5'"),
        (["--stop", ""], "argument --stop: must not be empty"),
    ],
)
@pytest.mark.parametrize("command", ["generate", "chat"])
def test_bad_options_are_answered_in_flags(
    command: str, argv: list[str], message: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "argv", ["__main__.py"])
    with pytest.raises(SystemExit) as exited:
        cli.main([command, "--chat", "hi", *argv] if command == "generate" else [command, *argv])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err == (
        f"python -m engine {command}: error: {message}\n"
        f"Try 'python -m engine {command} --help' for the options.\n"
    )


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        (None, "is not a model folder: it has no config.json"),
        ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, "Unsupported architecture 'gpt2'"),
    ],
)
def test_a_folder_that_is_no_model_says_so_first(
    tmp_path: Path, config: dict | None, needle: str
) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    proc = run_cli("generate", "--model", str(folder), "--chat", "hi")
    _assert_clean_error(proc, needle)
    assert "has no tokenizer.json" not in proc.stderr


def test_a_model_folder_without_weights_says_so(default_model_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "no-weights"
    shutil.copytree(default_model_dir, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    _assert_clean_error(
        run_cli("generate", "--model", str(folder), "--chat", "hi"),
        f"{folder} has no weights: a model folder needs model.safetensors",
    )


def test_first_start_says_what_it_imports_where_and_how_big(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = {"TANDEM_DATA_DIR": str(data)}
    args = ("generate", "--chat", "Hi", "--max-tokens", "2", "--temperature", "0")
    first = run_cli(*args, env_extra=env)
    assert first.returncode == 0, first.stderr
    dest = data / "models" / "SmolLM2-135M-Instruct"
    gguf = default_gguf_path()
    lines = first.stderr.splitlines()
    said = re.fullmatch(
        rf"Importing {re.escape(gguf.name)} \((\d+) MB\) into {re.escape(str(dest))} "
        rf"\((\d+) MB\); this happens once\.\.\.",
        lines[0],
    )
    assert said, first.stderr
    assert int(said[1]) == round(gguf.stat().st_size / 1e6)
    folder_mb = sum(f.stat().st_size for f in dest.iterdir()) / 1e6
    assert abs(int(said[2]) - folder_mb) < 0.02 * folder_mb  # the size it said it would take
    assert lines[1:] == ["Import done."]  # nothing else on a clean stderr

    again = run_cli(*args, env_extra=env)
    assert again.returncode == 0, again.stderr
    assert again.stderr == ""


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_on_a_terminal_is_one_line_rewritten_then_cleared(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    out = _Terminal()
    show = cli.ProgressPrinter(out)
    detail = "Importing m.gguf (98 MB) into ~/models/m (538 MB); this happens once"
    show(LoadProgress("import", 0, 400, detail))
    show(LoadProgress("import", 100, 400, detail))
    show(LoadProgress("import", 101, 400, detail))  # the same line: not written again
    show(LoadProgress("weights", 3, 4, "Loading the weights"))
    show(LoadProgress("ready", 1, 1, "m is ready"))
    show.finish()
    assert out.getvalue() == (
        "\r\x1b[K  0% Importing m.gguf (98 MB) into ~/mo"  # 39 columns: it must not wrap
        "\r\x1b[K 25% Importing m.gguf (98 MB) into ~/mo"
        "\r\x1b[K 75% Loading the weights"
        "\r\x1b[K"
    )


def test_progress_line_is_ended_when_loading_stops() -> None:
    out = _Terminal()
    show = cli.ProgressPrinter(out)
    show(LoadProgress("weights", 1, 4, "Loading the weights"))
    show.finish()
    assert out.getvalue().endswith(" 25% Loading the weights\n")


def test_progress_in_a_log_mentions_only_the_import() -> None:
    out = io.StringIO()
    show = cli.ProgressPrinter(out)
    for progress in [
        LoadProgress("import", 0, 2, "Importing m.gguf (98 MB) into /d/m (538 MB)"),
        LoadProgress("import", 1, 2, "Importing m.gguf (98 MB) into /d/m (538 MB)"),
        LoadProgress("import", 2, 2, "Importing m.gguf (98 MB) into /d/m (538 MB)"),
        LoadProgress("weights", 0, 4, "Loading the weights"),
        LoadProgress("weights", 4, 4, "Loading the weights"),
        LoadProgress("ready", 1, 1, "m is ready"),
    ]:
        show(progress)
    show.finish()
    assert out.getvalue() == (
        "Importing m.gguf (98 MB) into /d/m (538 MB)...\nImport done.\n"
    )


def _wait_until_reading(pid: int) -> None:
    """Until the process's main thread sleeps in a pipe read (Linux), or a
    second where /proc does not say."""
    wchan = Path(f"/proc/{pid}/wchan")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if "pipe_read" in wchan.read_text():
                return
        except OSError:
            time.sleep(1)
            return
        time.sleep(0.01)


def test_ctrl_c_at_the_empty_chat_prompt_ends_the_line(default_model_dir: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-m", "engine", "chat", "--model", str(default_model_dir)],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.read(2) == b"> "  # input() flushes its prompt, then waits
        # A signal between that flush and the read it waits in only sets a
        # flag the blocked read never looks at (as a person's Ctrl+C, which
        # comes later, never does): send it once the read is waiting.
        _wait_until_reading(child.pid)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 130, err
    assert out == b"\n"  # the rest of the line the prompt was on
    assert b"Traceback" not in err


def test_deterministic_flag_reaches_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    import engine.llm as engine_module
    from engine.errors import EngineError

    seen: dict[str, object] = {}

    class Recorder:
        def __init__(self, model: object, **kwargs: object) -> None:
            seen.update(kwargs)
            raise EngineError("recorded")

    monkeypatch.setattr(engine_module, "Engine", Recorder)
    for flags, want in (([], None), (["--deterministic"], True), (["--no-deterministic"], False)):
        seen.clear()
        assert cli.main(["generate", "--chat", "Hi", *flags]) == 1
        assert seen.get("deterministic") is want  # absent: the engine's own default


def test_readme_python_snippet_streams_and_stops(default_model_dir: Path) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    snippets = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert len(snippets) == 1
    snippet = snippets[0]
    assert "max_tokens=" in snippet and "print(" in snippet.split("for ", 1)[1]
    # TANDEM_DATA_DIR (set by the fixture) points "default" at the imported model.
    proc = subprocess.run(
        [sys.executable, "-c", snippet], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
