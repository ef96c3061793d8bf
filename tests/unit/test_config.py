import os
from pathlib import Path

import pytest

from reasonray.kernel.config import ConfigError, Settings, load_settings

REPO_CONFIG = Path(__file__).resolve().parents[2] / "config.toml"


def write(tmp_path, text):
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_repository_config_loads_with_the_documented_structure():
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


def test_loopback_hosts_are_localhost_and_the_loopback_addresses_only():
    from reasonray.kernel.config import is_loopback_host

    assert [is_loopback_host(h) for h in ("localhost", "127.0.0.1", "127.8.9.10", "::1")] == [True] * 4
    assert [is_loopback_host(h) for h in ("0.0.0.0", "10.0.0.5", "::", "example.com", "")] == [False] * 5


def test_serving_off_loopback_needs_authentication(tmp_path):
    from reasonray.kernel.config import require_auth_off_loopback

    open_settings = load_settings(write(tmp_path, ""), environ={})
    require_auth_off_loopback("127.0.0.1", open_settings)
    with pytest.raises(ConfigError, match=r"refusing to serve on 0\.0\.0\.0 without authentication"):
        require_auth_off_loopback("0.0.0.0", open_settings)
    secured = load_settings(write(tmp_path, f'[auth]\njwt_secret = "{"s" * 32}"\n'), environ={})
    require_auth_off_loopback("0.0.0.0", secured)


def test_haproxy_fronts_the_api_with_fast_ingress_unless_its_listeners_could_not_be_bound_without_auth(tmp_path):
    secret = f'[auth]\njwt_secret = "{"s" * 32}"\n'
    assert load_settings(write(tmp_path, ""), environ={}).haproxy_ingress()  # 127.0.0.1: the faster ingress by default
    assert load_settings(write(tmp_path, secret), environ={}).haproxy_ingress()
    # a host name: HAProxy's stats and metrics would listen on every interface, which needs a token
    assert not load_settings(write(tmp_path, '[server]\nhost = "localhost"\n'), environ={}).haproxy_ingress()
    assert load_settings(write(tmp_path, '[server]\nhost = "localhost"\n' + secret), environ={}).haproxy_ingress()
    assert not load_settings(write(tmp_path, "[server]\nfast_ingress = false\n" + secret), environ={}).haproxy_ingress()
    assert not load_settings(write(tmp_path, "[server]\nfast_ingress = false\n"), environ={}).haproxy_ingress()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[server.autoscaling]\nmin_replicas = 5\nmax_replicas = 4\n", r"min_replicas \(5\) is above max_replicas \(4\)"),
        ("[fanout]\npool_size = 9\nmax_pool_size = 8\n", r"pool_size \(9\) is above max_pool_size \(8\)"),
        ("[memory.weights]\nsimilarity = 0\nrecency = 0\nerror_context = 0\n", "at least one of similarity"),
        ('[reasoning]\nenabled_strategies = ["react", "react"]\n', "lists a strategy twice"),
    ],
)
def test_cross_field_rules_name_the_values_that_break_them(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        load_settings(write(tmp_path, text), environ={})


def test_equal_bounds_and_a_single_weight_are_valid(tmp_path):
    text = (
        "[server.autoscaling]\nmin_replicas = 4\nmax_replicas = 4\n[fanout]\npool_size = 8\nmax_pool_size = 8\n"
        "[memory.weights]\nsimilarity = 0\nrecency = 0\nerror_context = 0.5\n"
    )
    settings = load_settings(write(tmp_path, text), environ={})
    assert settings.server.autoscaling.serve_config() == {"min_replicas": 4, "max_replicas": 4, "target_ongoing_requests": 32.0}
    assert settings.fanout.pool_size == 8 and settings.memory.weights.error_context == 0.5


@pytest.mark.parametrize("unset", ["", "none", "null"])
def test_an_empty_default_strategy_means_none(tmp_path, unset):
    settings = load_settings(write(tmp_path, f'[reasoning]\ndefault_strategy = "{unset}"\n'), environ={})
    assert settings.reasoning.default_strategy is None


def test_the_environment_reaches_only_its_own_names_and_never_a_value_as_a_section(tmp_path):
    path = write(tmp_path, '[llm]\nbase_url = "http://127.0.0.1:1/v1"\n')
    env = {
        "REASONRAY_LLM__MODEL": "m",
        "REASONRAY_NO_SECTION": "ignored: no double underscore",
        "OTHER_LLM__MODEL": "ignored: not ours",
        "OPENAI_BASE_URL": "http://127.0.0.1:2/v1",  # the file's base_url wins
        "REASONRAY_DATA_DIR": str(tmp_path / "data"),
        "REASONRAY_LLM__TIMEOUT_S": "not json, kept as text",
    }
    with pytest.raises(ConfigError) as err:
        load_settings(path, environ=env)
    assert "llm.timeout_s" in str(err.value)
    del env["REASONRAY_LLM__TIMEOUT_S"]
    settings = load_settings(path, environ=env)
    assert settings.llm.model == "m" and settings.llm.base_url == "http://127.0.0.1:1/v1"
    assert settings.data_dir == tmp_path / "data"
    with pytest.raises(ConfigError, match=r"REASONRAY_LLM__MODEL__NAME: llm\.model is not a section"):
        load_settings(write(tmp_path, '[llm]\nmodel = "m"\n'), environ={"REASONRAY_LLM__MODEL__NAME": "x"})


def test_the_config_path_comes_from_the_argument_then_reasonray_config_then_the_repository(tmp_path):
    chosen = write(tmp_path, '[llm]\nmodel = "from-env-path"\n')
    assert load_settings(environ={"REASONRAY_CONFIG": str(chosen)}).llm.model == "from-env-path"
    assert load_settings(environ={}).reasoning.default_strategy == "chain_of_thought"  # the repository's config.toml
    # a REASONRAY_CONFIG that does not exist is not an error: the defaults apply
    assert (
        load_settings(environ={"REASONRAY_CONFIG": str(tmp_path / "absent.toml")}).llm.model
        == load_settings(write(tmp_path, ""), environ={}).llm.model
    )


def test_a_top_level_error_and_a_bad_choice_are_spelled_out():
    from pydantic import ValidationError

    from reasonray.kernel.config import Settings, format_validation_error

    with pytest.raises(ValidationError) as err:
        Settings.model_validate([])
    assert format_validation_error(err.value, "x.toml").splitlines()[1].startswith("  (top level): ")
    with pytest.raises(ValidationError) as err:
        Settings.model_validate({"llm": {"provider": "anthropic"}, "nope": 1})
    lines = format_validation_error(err.value, "x.toml").splitlines()
    assert lines[0] == "invalid configuration in x.toml:"
    assert any(line.startswith("  llm.provider: ") and line.endswith("(got 'anthropic')") for line in lines)
    assert "  nope: unknown key; check the spelling against docs/configuration.md" in lines


def test_environment_values_are_read_by_their_keys_type_and_free_form_tables_as_json(tmp_path):
    path = write(
        tmp_path,
        '[reasoning]\nenabled_strategies = ["chain_of_thought", "tree_of_thought"]\n'
        "[reasoning.strategies.tree_of_thought]\ndefault_branching = 2\n",
    )
    env = {
        "REASONRAY_REASONING__STRATEGIES__TREE_OF_THOUGHT__DEFAULT_DEPTH": "3",
        "REASONRAY_REASONING__STRATEGIES__CHAIN_OF_THOUGHT__DEFAULT_SYSTEM_PROMPT": "be brief",
        "REASONRAY_REASONING__DEFAULT_STRATEGY": "null",
        "REASONRAY_MEMORY__ENABLED": "false",
        "REASONRAY_LLM__MODEL": "123",  # a text key stays text
    }
    settings = load_settings(path, environ=env)
    # the file's table and the variables merge; a free-form value is JSON when it parses, else text
    assert settings.reasoning.strategies == {
        "tree_of_thought": {"default_branching": 2, "default_depth": 3},
        "chain_of_thought": {"default_system_prompt": "be brief"},
    }
    assert settings.reasoning.default_strategy is None and settings.memory.enabled is False
    assert settings.llm.model == "123"


def test_a_bad_environment_variable_is_named(tmp_path):
    path = write(tmp_path, "")
    with pytest.raises(ConfigError, match=r"REASONRAY_LMM__MODEL: \[lmm\] is not a section"):
        load_settings(path, environ={"REASONRAY_LMM__MODEL": "m"})
    with pytest.raises(ConfigError, match=r"REASONRAY_REASONING__ENABLED_STRATEGIES: .* takes a list as JSON, got '\[cot'"):
        load_settings(path, environ={"REASONRAY_REASONING__ENABLED_STRATEGIES": "[cot"})
    with pytest.raises(ConfigError) as err:
        load_settings(path, environ={"REASONRAY_SERVER__PORT": "eighty"})
    assert "REASONRAY_SERVER__PORT" in str(err.value) and "server.port" in str(err.value)


def test_the_variables_win_over_the_file_which_wins_over_openai_base_url(tmp_path):
    env = {"OPENAI_BASE_URL": "http://127.0.0.1:3/v1"}
    assert load_settings(write(tmp_path, ""), environ=env).llm.base_url == "http://127.0.0.1:3/v1"
    named = write(tmp_path, '[llm]\nbase_url = "http://127.0.0.1:1/v1"\n')
    assert load_settings(named, environ=env).llm.base_url == "http://127.0.0.1:1/v1"
    env["REASONRAY_LLM__BASE_URL"] = "http://127.0.0.1:2/v1"
    assert load_settings(named, environ=env).llm.base_url == "http://127.0.0.1:2/v1"


def test_settings_built_in_code_are_their_arguments_never_the_process_environment(monkeypatch):
    # a replica's settings arrive whole from the deployment: its own environment must not change them
    monkeypatch.setenv("REASONRAY_SERVER__PORT", "1234")
    assert Settings().server.port == Settings.model_validate({}).server.port != 1234
    assert load_settings(environ=dict(os.environ)).server.port == 1234
