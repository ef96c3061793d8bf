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
