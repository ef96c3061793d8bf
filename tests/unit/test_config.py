from pathlib import Path

import pytest

from reasonray.kernel.config import ConfigError, load_settings

REPO_CONFIG = Path(__file__).resolve().parents[2] / "config.toml"


def write(tmp_path, text):
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_repository_config_loads_with_the_seed_structure():
    settings = load_settings(REPO_CONFIG, environ={})
    assert settings.reasoning.default_strategy == "chain_of_thought"
    assert settings.reasoning.strategies["chain_of_thought"] == {"default_max_tokens": 32768}
    assert settings.reasoning.performance.strategy_selection_timeout_ms == 50
    assert settings.llm.retry.max_attempts == 4 and settings.llm.circuit_breaker.failure_rate_threshold == 0.5


def test_environment_overrides_nested_keys_and_parses_json(tmp_path):
    env = {
        "REASONRAY_LLM__MODEL": "gpt-4.1-mini",
        "REASONRAY_LLM__RETRY__MAX_ATTEMPTS": "5",
        "REASONRAY_REASONING__ENABLED_STRATEGIES": '["chain_of_thought"]',
        "OPENAI_BASE_URL": "http://127.0.0.1:9999/v1",
    }
    settings = load_settings(write(tmp_path, ""), environ=env)
    assert settings.llm.model == "gpt-4.1-mini"
    assert settings.llm.retry.max_attempts == 5
    assert settings.reasoning.enabled_strategies == ["chain_of_thought"]
    assert settings.llm.base_url == "http://127.0.0.1:9999/v1"


def test_unknown_key_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"llm\.modle: unknown key"):
        load_settings(write(tmp_path, '[llm]\nmodle = "x"\n'), environ={})


def test_bad_choice_names_the_allowed_values(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_settings(write(tmp_path, '[llm]\nprovider = "anthropic"\n'), environ={})
    assert "llm.provider" in str(err.value) and "'openai'" in str(err.value) and "'anthropic'" in str(err.value)


def test_default_strategy_must_be_enabled(tmp_path):
    text = '[reasoning]\ndefault_strategy = "chain_of_thought"\nenabled_strategies = []\n'
    with pytest.raises(ConfigError, match="default_strategy 'chain_of_thought' is not enabled"):
        load_settings(write(tmp_path, text), environ={})


def test_zero_enabled_strategies_is_valid(tmp_path):
    settings = load_settings(write(tmp_path, "[reasoning]\nenabled_strategies = []\n"), environ={})
    assert settings.reasoning.enabled_strategies == [] and settings.reasoning.default_strategy is None


def test_missing_file_and_bad_toml_are_reported(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.toml", environ={})
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(write(tmp_path, "[llm\n"), environ={})


def test_auto_provider_is_simulated_until_an_endpoint_or_key_is_set(tmp_path):
    settings = load_settings(write(tmp_path, ""), environ={})
    assert settings.resolved_provider({}) == "simulated"
    assert settings.resolved_provider({"OPENAI_API_KEY": "sk-test"}) == "openai"
    explicit = load_settings(write(tmp_path, '[llm]\nprovider = "openai"\n'), environ={})
    assert explicit.resolved_provider({}) == "openai"
