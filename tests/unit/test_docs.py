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
