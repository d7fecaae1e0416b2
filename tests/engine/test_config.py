"""EngineConfig: every option declared once and offered everywhere (Engine,
the command line, `serve`, the app's settings), and the option that proves
it, `max_context`: a model loaded with a smaller context refuses what does
not fit it and sizes a smaller KV pool, in the engine, the CLI and `serve`."""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from app.settings import Settings
from engine.config import EngineConfig
from engine.errors import EngineError, InvalidEngineConfig, MaxContextTooLargeError, RequestTooLargeError
from engine.entrypoints.cli import main as cli
from engine.entrypoints.cli.options import engine_config
from engine.llm import Engine
from engine.params import SAMPLING_FIELDS, InvalidSamplingParams, SamplingParams, sampling_field

ROOT = Path(__file__).resolve().parents[2]
TINY_CONTEXT = 2048  # tests/conftest.py TINY_MODEL_CONFIG's max_position_embeddings


def _subparser(command: str) -> argparse.ArgumentParser:
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def _flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {flag: a for a in parser._actions for flag in a.option_strings}


# --- every option, declared once, offered everywhere -----------------------------------------


@pytest.mark.parametrize("command", ["generate", "chat", "serve"])
def test_every_engine_option_is_a_flag_with_its_help_and_default(command: str) -> None:
    flags = _flags(_subparser(command))
    for name, option, default in EngineConfig.options():
        flag = option.cli_flag(name)
        assert flag in flags, f"{name} has no flag in {command}"
        action = flags[flag]
        assert action.dest == name
        assert option.help.split(";")[0].rstrip(".") in action.help
        if EngineConfig.option_kind(name) is bool and default is True:
            assert flag.startswith("--no-")  # on by default: the flag turns it off
        elif default is None or isinstance(default, bool):
            assert f"(default: {option.describe_default(default)})" in action.help, name
        else:
            assert action.default == default and "%(default)s" in action.help, name
        if option.choices is not None:
            assert list(action.choices) == list(option.choices)
        elif action.nargs != 0:
            assert action.metavar == option.metavar


# A value other than the default for every option.
CHANGED = {
    "model": "/models/x", "device": "cpu", "dtype": "float32", "quantize": "int8",
    "quantized": "dequantize", "max_context": 64, "threads": 3, "deterministic": True,
    "kv_pages": 7, "kv_cache_bytes": 1 << 20, "page_size": 8, "enable_prefix_cache": False,
    "max_batch_tokens": 100, "max_running": 5,
}


def test_every_engine_option_reaches_the_config_from_the_command_line() -> None:
    parser = _subparser("generate")
    changed = CHANGED
    assert set(changed) == {name for name, _, _ in EngineConfig.options()}, "a new option needs a value here"
    argv = ["--chat", "hi"]
    for name, value in changed.items():
        option = next(o for n, o, _ in EngineConfig.options() if n == name)
        flag = option.cli_flag(name)
        argv += [flag] if isinstance(value, bool) else [flag, str(value)]
    config = engine_config(parser.parse_args(argv))
    assert {name: getattr(config, name) for name in changed} == changed
    # Left out, every option is the config's default.
    assert engine_config(parser.parse_args(["--chat", "hi"])) == EngineConfig()


def test_engine_takes_every_option_as_a_keyword_or_in_a_config(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.core.engine_core import EngineCore

    loaded: list[EngineConfig] = []

    def record(core: EngineCore, config: EngineConfig) -> None:
        loaded.append(config)
        raise EngineError("recorded")  # no model is loaded

    monkeypatch.setattr(EngineCore, "start", record)
    for call in (
        lambda: Engine(**CHANGED),
        lambda: Engine(config=EngineConfig(**CHANGED)),
        lambda: Engine(CHANGED["model"], CHANGED["device"], CHANGED["dtype"],
                       config=EngineConfig(), **{k: v for k, v in CHANGED.items()
                                                 if k not in ("model", "device", "dtype")}),
    ):
        with pytest.raises(EngineError, match="recorded"):
            call()
    assert loaded == [EngineConfig(**CHANGED)] * 3
    # Keywords beside a config override its fields; the others stay the config's.
    with pytest.raises(EngineError, match="recorded"):
        Engine(config=EngineConfig(page_size=8, max_running=5), max_running=9)
    assert (loaded[-1].page_size, loaded[-1].max_running) == (8, 9)


def test_engine_and_settings_take_every_option_by_its_config_name() -> None:
    names = {name for name, _, _ in EngineConfig.options()}
    kwargs = Settings(device="cpu", kv_cache_mb=1).engine_kwargs()
    assert set(kwargs) <= names
    assert EngineConfig(**kwargs) == Settings(device="cpu", kv_cache_mb=1).engine_config()
    assert Settings().engine_config(max_context=512).max_context == 512
    with pytest.raises(InvalidEngineConfig, match="page_size"):
        Settings(page_size=0).engine_kwargs()
    # Engine refuses an option EngineConfig does not know, and a bad value, before loading.
    with pytest.raises(TypeError, match="unknown option"):
        Engine("default", page_sise=16)
    with pytest.raises(InvalidEngineConfig, match=r"^max_context must be a whole number of at least 1"):
        Engine("default", max_context=0)


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"device": "tpu"}, "device must be one of 'auto', 'cpu', 'cuda', got 'tpu'"),
        ({"page_size": 0}, "page_size must be a whole number of at least 1, got 0"),
        ({"max_running": True}, "max_running must be a whole number"),
        ({"enable_prefix_cache": None}, "enable_prefix_cache must be True or False"),
        ({"model": ""}, "model must be a model name, folder or file"),
        ({"max_context": 0}, "max_context must be a whole number of at least 1"),
    ],
)
def test_config_refuses_values_naming_the_option(changes: dict, needle: str) -> None:
    with pytest.raises(InvalidEngineConfig) as raised:
        EngineConfig(**changes)
    assert needle in str(raised.value)
    assert isinstance(raised.value, EngineError) and isinstance(raised.value, ValueError)


def test_max_context_below_one_is_refused_in_the_words_of_the_flag(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["__main__.py"])
    with pytest.raises(SystemExit):
        cli.main(["generate", "--chat", "hi", "--max-context", "0"])
    assert "argument --max-context: must be at least 1, got 0" in capsys.readouterr().err


# --- the sampling table -------------------------------------------------------------------------


def test_sampling_table_is_what_sampling_params_accepts() -> None:
    assert [f.name for f in SAMPLING_FIELDS] == [
        "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens",
    ]
    for field in SAMPLING_FIELDS:
        assert sampling_field(field.name) is field
        assert field.kind in (int, float) and field.help.endswith(".") and field.label
        assert (field.decimals == 0) == (field.kind is int)
        SamplingParams(**{field.name: field.kind(field.form_minimum)})  # the form's ends are valid
        if field.form_maximum is not None:
            SamplingParams(**{field.name: field.kind(field.form_maximum)})
        below = field.minimum if field.exclusive_minimum else field.minimum - 1
        with pytest.raises(InvalidSamplingParams, match=rf"^{field.name} \({field.label}\) must be"):
            SamplingParams(**{field.name: field.kind(below)})
        if field.maximum is not None:
            above = field.maximum if field.exclusive_maximum else field.maximum + 1
            with pytest.raises(InvalidSamplingParams, match=field.range_text()):
                SamplingParams(**{field.name: field.kind(above)})
    with pytest.raises(KeyError, match="seed"):
        sampling_field("seed")


# --- max_context --------------------------------------------------------------------------------


def test_a_smaller_context_refuses_what_does_not_fit_and_sizes_a_smaller_pool(
    tiny_model_dir: Path,
) -> None:
    full = Engine(tiny_model_dir, "cpu", "float32", threads=1)
    try:
        full_stats = full.stats()
        assert full.max_context == full_stats.max_context == TINY_CONTEXT
        full.scheduler.check_fits(300, 8)  # fits the trained context
    finally:
        full.close()
    capped = Engine(config=EngineConfig(model=tiny_model_dir, device="cpu", dtype="float32", threads=1, max_context=256))
    try:
        stats = capped.stats()
        assert capped.max_context == stats.max_context == 256
        assert capped.engine_config.max_context == 256
        assert stats.pages_total < full_stats.pages_total
        assert stats.kv_bytes_total < full_stats.kv_bytes_total
        with pytest.raises(RequestTooLargeError, match="context holds 256 tokens"):
            capped.generate(list(range(5, 305)), max_tokens=8)
        # What fits still runs, and a reply stops at the context.
        (out,) = capped.generate_outputs([list(range(5, 250))], SamplingParams(max_tokens=6, temperature=0))
        assert out.error is None and len(out.prompt_token_ids) + len(out.token_ids) <= 256
    finally:
        capped.close()


def test_a_context_above_the_trained_one_is_refused_naming_both(tiny_model_dir: Path) -> None:
    with pytest.raises(MaxContextTooLargeError) as raised:
        Engine(tiny_model_dir, "cpu", max_context=TINY_CONTEXT + 1)
    assert raised.value.requested == TINY_CONTEXT + 1 and raised.value.trained == TINY_CONTEXT
    assert f"{TINY_CONTEXT + 1}" in str(raised.value) and f"trained context of {TINY_CONTEXT}" in str(raised.value)
    assert isinstance(raised.value, EngineError)


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "engine", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_cli_max_context_in_the_words_of_the_flag(tiny_model_dir: Path) -> None:
    base = ("generate", "--model", str(tiny_model_dir), "--device", "cpu", "--threads", "1")
    too_long = _run_cli(*base, "--max-context", "64", "--prompt", "hello " * 80, "--max-tokens", "4")
    assert too_long.returncode == 1
    lines = too_long.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in too_long.stderr, too_long.stderr
    assert "context holds 64 tokens" in lines[0] and "--max-context 64" in lines[0], lines[0]

    above = _run_cli(*base, "--max-context", str(TINY_CONTEXT + 952), "--chat", "hi")
    assert above.returncode == 1
    assert (
        f"--max-context {TINY_CONTEXT + 952} is more than {tiny_model_dir.name}'s trained context "
        f"of {TINY_CONTEXT} tokens" in above.stderr
    ), above.stderr

    fits = _run_cli(*base, "--max-context", "64", "--chat", "hi", "--max-tokens", "4", "--json",
                    "--temperature", "0")
    assert fits.returncode == 0, fits.stderr
    assert json.loads(fits.stdout)["finish_reason"] in ("stop", "length")


def test_serve_max_context_refuses_a_longer_prompt(tiny_model_dir: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine", "serve", "--model", str(tiny_model_dir), "--device", "cpu",
         "--threads", "1", "--host", "127.0.0.1", "--port", "0", "--max-context", "64",
         "--served-model-name", "tiny"],
        cwd=ROOT, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stderr is not None
        url = None
        for line in proc.stderr:  # loading progress, then the line saying where it serves
            match = re.search(r"Serving .* on (http://127\.0\.0\.1:\d+/v1)", line)
            if match:
                url = match.group(1)
                break
        assert url is not None, "the server never said where it listens"
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hello " * 80}]}
        r = httpx.post(f"{url}/chat/completions", json=body, timeout=60)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert "context holds 64 tokens" in error["message"], error
        ok = httpx.post(f"{url}/chat/completions", timeout=60, json={
            "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
        })
        assert ok.status_code == 200, ok.text
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
