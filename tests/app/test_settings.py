"""Settings: defaults in code, one JSON file, a bad file never stops the app."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.settings import (
    PAGE_SIZES,
    InvalidSettingsError,
    SettingProblem,
    Settings,
    check_value,
    settings_path,
)
from engine.params import SamplingParams


@pytest.fixture(autouse=True)
def config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "config"
    monkeypatch.setenv("TANDEM_CONFIG_DIR", str(folder))
    return folder


def test_missing_file_gives_defaults(config_dir: Path) -> None:
    settings = Settings.load()
    assert settings == Settings()
    assert settings.load_warning is None
    assert settings.threads is None and settings.device == "auto" and settings.theme == "system"
    assert not config_dir.exists()


def test_round_trip_through_the_config_dir(config_dir: Path) -> None:
    settings = Settings(
        model="/models/qwen",
        device="cpu",
        dtype="bfloat16",
        threads=3,
        kv_cache_mb=512,
        page_size=64,
        context_policy="drop_oldest",
        default_params=SamplingParams(
            temperature=0.3, top_p=0.9, top_k=40, min_p=0.05, repetition_penalty=1.1, max_tokens=256, seed=7
        ),
        default_system_prompt="Answer in French.",
        theme="dark",
        ui_state={"splitter": [400, 400, 400]},
    )
    written = settings.save()
    assert written == config_dir / "settings.json" == settings_path()
    loaded = Settings.load()
    assert loaded == settings
    assert loaded.load_warning is None
    assert json.loads(written.read_text(encoding="utf-8"))["threads"] == 3
    assert not list(config_dir.glob("*.tmp"))


def test_file_that_is_not_json_is_kept_aside(config_dir: Path) -> None:
    config_dir.mkdir()
    path = config_dir / "settings.json"
    path.write_text('{"theme": "dark",', encoding="utf-8")
    settings = Settings.load()
    assert settings == Settings()
    assert "not valid JSON" in settings.load_warning
    assert "settings.json.bad" in settings.load_warning
    assert not path.exists()
    assert (config_dir / "settings.json.bad").read_text(encoding="utf-8") == '{"theme": "dark",'


def test_file_that_is_not_an_object_is_kept_aside(config_dir: Path) -> None:
    config_dir.mkdir()
    (config_dir / "settings.json").write_text("[1, 2]", encoding="utf-8")
    settings = Settings.load()
    assert settings == Settings()
    assert "JSON object" in settings.load_warning
    assert (config_dir / "settings.json.bad").exists()


def test_the_old_sampling_defaults_a_save_wrote_give_way_to_todays(config_dir: Path) -> None:
    # Every save wrote the defaults of the day, so these were never chosen; a value
    # the user changed (repetition_penalty, max_tokens) is kept.
    old = {"temperature": 0.7, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.1,
           "max_tokens": 300, "seed": None}
    config_dir.mkdir()
    (config_dir / "settings.json").write_text(json.dumps({"default_params": old}), encoding="utf-8")
    settings = Settings.load()
    assert settings.default_params == SamplingParams(repetition_penalty=1.1, max_tokens=300)
    assert settings.load_warning is None
    # One of them changed: the user chose them all.
    (config_dir / "settings.json").write_text(
        json.dumps({"default_params": dict(old, temperature=0.9)}), encoding="utf-8"
    )
    assert Settings.load().default_params == SamplingParams(
        temperature=0.9, top_p=1.0, top_k=0, min_p=0.0, repetition_penalty=1.1, max_tokens=300
    )


def test_invalid_values_fall_back_one_by_one(config_dir: Path) -> None:
    config_dir.mkdir()
    (config_dir / "settings.json").write_text(
        json.dumps(
            {
                "theme": "dark",
                "threads": 0,
                "device": "tpu",
                "default_params": {"temperature": -1, "top_k": 20, "seed": 5},
                "a_key_from_a_newer_version": True,
            }
        ),
        encoding="utf-8",
    )
    settings = Settings.load()
    assert settings.theme == "dark"
    assert settings.threads is None
    assert settings.device == "auto"
    assert settings.default_params == SamplingParams(top_k=20, seed=5)
    warning = settings.load_warning
    assert "threads" in warning and "device" in warning and "temperature" in warning
    assert "newer" not in warning  # unknown keys are not an error
    assert (config_dir / "settings.json.bad").exists()
    # Saving afterwards writes a file that loads cleanly.
    settings.save()
    again = Settings.load()
    assert again == settings and again.load_warning is None


def test_engine_kwargs() -> None:
    kwargs = Settings(device="cpu", threads=2, kv_cache_mb=64, page_size=32).engine_kwargs()
    assert kwargs == {
        "model": "default",
        "device": "cpu",
        "dtype": "auto",
        "threads": 2,
        "page_size": 32,
        "kv_cache_bytes": 64 << 20,
    }
    assert "kv_cache_bytes" not in Settings().engine_kwargs()
    assert Settings().engine_kwargs()["page_size"] == 16


def test_engine_takes_every_page_size_the_settings_allow(tiny_model_dir: Path) -> None:
    from engine import Engine

    # The smallest and the largest both load, and the page size changes where
    # the KV cache is kept, not what the model says.
    replies = []
    for size in (PAGE_SIZES[0], PAGE_SIZES[-1]):
        settings = Settings(model=str(tiny_model_dir), device="cpu", dtype="float32", threads=1, page_size=size)
        engine = Engine(**settings.engine_kwargs())
        try:
            assert engine.stats().page_size == size
            (output,) = engine.generate_outputs([list(range(5, 25))], SamplingParams(max_tokens=6, temperature=0.0))
            assert output.error is None and len(output.token_ids) >= 1
            replies.append(output.token_ids)
        finally:
            engine.close()
    assert replies[0] == replies[1]


@pytest.mark.parametrize(
    ("key", "good", "bad"),
    [
        ("page_size", [1, 16, 256], [0, 3, 24, 512, -16, 16.0, "16", True, None]),
        ("context_policy", ["stop", "drop_oldest"], ["drop", "", None, 1]),
        ("threads", [None, 1, 64], [0, -2, 1.5, "4", False]),
        ("kv_cache_mb", [None, 1, 4096], [0, -1, 2.5, "512"]),
        ("device", ["auto", "cpu", "cuda"], ["tpu", "", None]),
        ("dtype", ["auto", "float32", "bfloat16", "float16"], ["int8", None]),
        ("theme", ["system", "light", "dark"], ["blue", None]),
    ],
)
def test_check_value_gives_the_reason(key: str, good: list[object], bad: list[object]) -> None:
    for value in good:
        assert check_value(key, value) is None, value
    for value in bad:
        reason = check_value(key, value)
        assert reason is not None, value
        assert reason.endswith(f"not {value!r}.")
    assert "power of two from 1 to 256" in check_value("page_size", 24)
    assert '"stop" or "drop_oldest"' in check_value("context_policy", "drop")


def test_problems_lists_each_invalid_field() -> None:
    assert Settings().problems() == []
    settings = Settings(page_size=24, context_policy="keep_all", threads=0)
    problems = settings.problems()
    assert [p.key for p in problems] == ["threads", "page_size", "context_policy"]
    assert all(isinstance(p, SettingProblem) and p.message for p in problems)
    with pytest.raises(InvalidSettingsError) as caught:
        settings.validate()
    assert caught.value.problems == problems
    assert "The page size must be a power of two" in str(caught.value)


def test_invalid_settings_are_not_saved(config_dir: Path) -> None:
    Settings(theme="dark").save()
    with pytest.raises(InvalidSettingsError, match="page size"):
        Settings(page_size=100).save()
    # The file on disk is still the last good one, and no temporary is left.
    assert Settings.load() == Settings(theme="dark")
    assert not list(config_dir.glob("*.tmp"))


def test_new_fields_read_from_a_file_fall_back_one_by_one(config_dir: Path) -> None:
    config_dir.mkdir()
    (config_dir / "settings.json").write_text(
        json.dumps({"page_size": 100, "context_policy": "drop_oldest", "kv_cache_mb": 256}), encoding="utf-8"
    )
    settings = Settings.load()
    assert settings.page_size == 16
    assert settings.context_policy == "drop_oldest"
    assert settings.kv_cache_mb == 256
    assert "page_size must be a power of two from 1 to 256" in settings.load_warning
    assert "not 100" in settings.load_warning
    assert (config_dir / "settings.json.bad").exists()


def test_settings_survive_a_restart(config_dir: Path, tmp_path: Path) -> None:
    """Save in one process, load in a fresh one: every field comes back."""
    settings = Settings(
        device="cpu",
        dtype="float16",
        threads=2,
        kv_cache_mb=300,
        page_size=8,
        context_policy="drop_oldest",
        default_params=SamplingParams(temperature=0.0, top_k=5, max_tokens=77, seed=3),
        default_system_prompt="Be brief.\nUse lists.",
        theme="light",
    )
    settings.save()
    root = Path(__file__).resolve().parents[2]
    script = (
        "import json; from app.settings import Settings; s = Settings.load(); "
        "assert s.load_warning is None, s.load_warning; "
        "print(json.dumps(s.to_dict()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=root, capture_output=True, text=True, check=True,
        env={**os.environ, "TANDEM_CONFIG_DIR": str(config_dir)},
    ).stdout
    assert json.loads(out) == settings.to_dict()
    assert Settings.load() == settings
