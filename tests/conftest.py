"""Shared test set-up: offline tokenizer files, no real LLM requests, clean logging state."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

_SHARED_TIKTOKEN = Path(__file__).resolve().parents[2] / "shared" / "tiktoken"
if "TIKTOKEN_CACHE_DIR" not in os.environ and _SHARED_TIKTOKEN.is_dir():
    os.environ["TIKTOKEN_CACHE_DIR"] = str(_SHARED_TIKTOKEN)

from reasonray.gateway import openai_client  # noqa: E402

# No test may reach a real provider: only loopback endpoints (the simulated model) are allowed.
openai_client.ALLOW_REMOTE_REQUESTS = False


@pytest.fixture(autouse=True)
def _no_remote_llm_requests():
    openai_client.ALLOW_REMOTE_REQUESTS = False
    yield
    openai_client.ALLOW_REMOTE_REQUESTS = False


@pytest.fixture(autouse=True)
def _structlog_config_restored():
    """A command under test may configure logging (`reasonray eval` does); the next test gets it back as it was."""
    import structlog

    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


@pytest.fixture(scope="session")
def postgres():
    """A throw-away PostgreSQL cluster for the whole test session (tests/pg.py); skipped where none is installed."""
    from tests.pg import TempPostgres, available

    if not available():
        pytest.skip("PostgreSQL is not installed (scripts/setup.sh installs it)")
    if "MUTANT_UNDER_TEST" in os.environ:
        # Under mutmut every mutant is its own pytest session: a server per mutant would cost more than
        # the whole run; reasonray/kernel/pgstore.py is left out of mutation (docs/testing.md).
        pytest.skip("no PostgreSQL server per mutant in the mutation run")
    with TempPostgres() as pg:
        yield pg


@pytest.fixture
def pg_url(postgres) -> str:
    """A new, empty database on the session's PostgreSQL server, for a test that checks everything a
    service stored (the contract tests share the `reasonray` database and truncate it instead)."""
    return postgres.fresh_database()


# How the default run (`scripts/test.sh default`: pytest-xdist, `-n 2 --dist loadgroup`) shares two workers.
# Each xdist group runs on one worker, in collection order:
# - "stack": the tests on the session's Ray cluster, Serve and main application (tests/integration/conftest.py),
#   so one process owns them as in a serial run;
# - "own-cluster": the modules that start a Ray cluster of their own (`ray start`, `reasonray serve`, the
#   container entrypoint), one after the other on the other worker, so at most two clusters run at once;
# everything else (unit tests, notebooks, the in-process security tests) fills the second worker around them.
_INTEGRATION = Path(__file__).parent / "integration"
_OWN_CLUSTER = {"test_cli_serve.py", "test_entrypoint.py", "test_cluster_commands.py"}
_STACK_FIXTURES = {"ray_cluster", "serve_base", "api", "serve_url"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups into the test ids
def pytest_collection_modifyitems(items):
    for item in items:
        path = Path(item.fspath)
        if path.parent == _INTEGRATION and path.name in _OWN_CLUSTER:
            item.add_marker(pytest.mark.xdist_group("own-cluster"))
        elif path.is_relative_to(_INTEGRATION) or _STACK_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.xdist_group("stack"))
