"""Settings: defaults in code, one JSON file, a bad file never stops the app."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.settings import Settings, settings_path
from engine.sampling import SamplingParams


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
    kwargs = Settings(device="cpu", threads=2, kv_cache_mb=64).engine_kwargs()
    assert kwargs == {"model": "default", "device": "cpu", "dtype": "auto", "threads": 2, "kv_cache_bytes": 64 << 20}
    assert "kv_cache_bytes" not in Settings().engine_kwargs()
