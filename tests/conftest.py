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
        # the whole run; reasonray/stores/postgres.py is left out of mutation (docs/testing.md).
        pytest.skip("no PostgreSQL server per mutant in the mutation run")
    with TempPostgres() as pg:
        yield pg


@pytest.fixture
def pg_url(postgres) -> str:
    """A new, empty database on the session's PostgreSQL server, for a test that checks everything a
    service stored (the contract tests share the `reasonray` database and truncate it instead)."""
    return postgres.fresh_database()


# How a run on two workers (`scripts/test.sh default`: `-n 2 --dist loadgroup`, pytest-xdist) shares them.
# The integration modules go first, each on whichever worker is free, all on the one cluster, Serve instance and main
# application the workers share (tests/integration/stack.py). "cluster", the modules of tests/cluster that start Ray
# clusters of their own (`ray start`, `reasonray serve`, the container entrypoint), runs next, one module after
# the other on the first worker done with the integration modules: the longest piece that cannot be split (about
# 170 s). Handed out first, its `reasonray serve` started beside the shared cluster's start and missed Ray's
# 30-s node registration; handed out last, it left one worker running it alone at the end. Then everything else
# (unit tests, lint, notebooks, the in-process security tests), module by module, the short pieces that even out
# the ends. The group is read from the test ids in the scheduler: xdist's own `xdist_group` marks do not reach
# the ids under pytest 9.
OWN_CLUSTER = "tests/cluster/"


def worker_group(nodeid: str) -> str | None:
    return "cluster" if nodeid.startswith(OWN_CLUSTER) else None


def collection_rank(nodeid: str) -> int:
    """The integration modules first, then those with a cluster of their own, then the rest: the long pieces are
    handed out first and the many short modules last, to even out the ends of the two workers. A worker that leaves
    the integration folder never comes back to it, so the shared cluster starts once and stops once."""
    return 0 if nodeid.startswith("tests/integration/") else 1 if nodeid.startswith(OWN_CLUSTER) else 2


def pytest_configure(config):
    """On xdist's controller, with the integration folder in the run: start the shared cluster now, while the
    workers start and collect (tests/integration/stack.py)."""
    if hasattr(config, "workerinput") or not config.getoption("numprocesses", None):
        return
    integration = Path(__file__).parent / "integration"
    targets = [Path(str(arg).split("::", 1)[0]).resolve() for arg in config.args] or [integration]
    if any(target.is_relative_to(integration) or integration.is_relative_to(target) for target in targets):
        from tests.integration import stack

        stack.start_early(stack.run_dir())


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: collection_rank(item.nodeid))  # stable: each part keeps its order


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    # scopes in collection order (not the largest first: xdist counts tests, not seconds): the integration modules
    # on both workers, the own-cluster modules on the first one done, the short modules fill the ends
    config.option.loadscopereorder = False

    class GroupScheduling(LoadScopeScheduling):
        """xdist's scope scheduling with `worker_group` as the scope; a module outside the groups is its own scope."""

        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid) or nodeid.split("::", 1)[0]

    return GroupScheduling(config, log)
