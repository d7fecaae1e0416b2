"""Where sampling settings come from: Tandem's defaults, or a model's recommendation."""

from __future__ import annotations

from pathlib import Path

from engine.params import (
    MODEL_RECOMMENDED,
    TANDEM_DEFAULTS,
    SamplingParams,
    defaults_for,
    read_recommended_sampling,
    recommended_sampling,
)


def test_defaults_are_the_ecosystems() -> None:
    # llama.cpp's: at temperature 0.7 with nothing cut, the 135M default model wrote gibberish.
    params = SamplingParams()
    assert (params.temperature, params.top_k, params.top_p, params.min_p) == (0.8, 40, 0.95, 0.05)
    assert params.repetition_penalty == 1.0 and params.seed is None


def test_recommendation_keeps_only_sampling_values_the_engine_accepts() -> None:
    config = {
        "temperature": 0.6, "top_p": 0.95, "top_k": 20.0, "min_p": 0, "repetition_penalty": 0,
        "do_sample": True, "max_new_tokens": 4096, "eos_token_id": 2,
    }
    assert recommended_sampling(config) == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0}
    assert recommended_sampling({"temperature": "hot", "top_p": 0.0, "top_k": 1.5}) == {}


def test_defaults_for_says_which_settings_it_chose() -> None:
    assert defaults_for({}) == (SamplingParams(), TANDEM_DEFAULTS)
    params, source = defaults_for({"temperature": 0.6, "top_k": 20}, SamplingParams(max_tokens=64))
    assert source == MODEL_RECOMMENDED
    assert (params.temperature, params.top_k, params.top_p, params.max_tokens) == (0.6, 20, 0.95, 64)


def test_a_folder_without_a_readable_generation_config_recommends_nothing(tmp_path: Path) -> None:
    assert read_recommended_sampling(tmp_path) == {}
    (tmp_path / "generation_config.json").write_text("{not json", encoding="utf-8")
    assert read_recommended_sampling(tmp_path) == {}
    (tmp_path / "generation_config.json").write_text('{"temperature": 0.3, "top_k": 5}', encoding="utf-8")
    assert read_recommended_sampling(tmp_path) == {"temperature": 0.3, "top_k": 5}
