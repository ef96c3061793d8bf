"""Docs that run: the Python examples in docs/ are executed as written, and the README stays true."""

import re

import pytest

from tests.docs_examples import REPO, blocks


@pytest.mark.parametrize(
    "page", ["docs/simulator.md", "docs/custom-strategies.md", "docs/sessions.md", "docs/memory.md", "docs/evaluation.md"]
)
def test_python_examples_run(page, in_repo):
    code = blocks(page, "python")
    assert code, f"{page} has no python example"
    namespace: dict = {"__name__": "docs_example"}
    for block in code:
        exec(compile(block, page, "exec"), namespace)


def test_readme_starts_with_the_two_commands_and_ci_runs_the_test_one():
    first_block = blocks("README.md", "bash")[0]
    commands = [line.split("#")[0].strip() for line in first_block.strip().splitlines()]
    assert commands == ["make serve", "make test"]
    assert "make test" in (REPO / ".ci" / "run").read_text()


def test_every_page_the_readme_links_exists():
    links = re.findall(r"\]\(((?:docs/|config)[^)#]*)\)", (REPO / "README.md").read_text())
    assert links
    missing = [link for link in links if not (REPO / link).exists()]
    assert missing == []


def test_custom_strategy_entry_point_example_matches_our_own_group():
    toml = blocks("docs/custom-strategies.md", "toml")[0]
    assert '[project.entry-points."reasonray.strategies"]' in toml
    assert '[project.entry-points."reasonray.strategies"]' in (REPO / "pyproject.toml").read_text()


def test_the_reasoning_model_recipes_configure_the_gateway_as_they_say(monkeypatch):
    """docs/reasoning-models.md's [llm] blocks: each is a valid configuration, and the client built from it treats
    the model as the page says (family, output limit, what it leaves out, thinking read from the text)."""
    import tomllib

    from reasonray.gateway.factory import client_for
    from reasonray.kernel.config import Settings

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("DEEPSEEK_API_KEY", "sk-test")
    recipes = [tomllib.loads(block) for block in blocks("docs/reasoning-models.md", "toml")]
    clients = {r["llm"]["model"]: client_for(Settings.model_validate(r)) for r in recipes}
    assert set(clients) == {"Qwen/Qwen3-8B", "deepseek-reasoner", "o4-mini", "my-r1-finetune"}
    assert clients["Qwen/Qwen3-8B"].traits.family == "qwen3" and clients["Qwen/Qwen3-8B"].traits.thinks
    assert clients["deepseek-reasoner"].traits.family == "deepseek-reasoner" and "logprobs" in clients["deepseek-reasoner"].traits.refuses
    o4 = clients["o4-mini"].traits
    assert o4.max_tokens_param == "max_completion_tokens" and {"temperature", "stop"} <= o4.refuses and o4.takes_reasoning_effort
    custom = clients["my-r1-finetune"]
    assert custom.traits.family == "" and custom.traits.thinks and custom.replies.thinks_in_text
    assert custom.traits.prefix_continuation == "continue_final_message"
