"""A run on two workers (tests/conftest.py, docs/testing.md): the tests on a Ray cluster keep one
worker, those on the session's cluster first and the modules with a cluster of their own after them; everything
else runs on the other worker."""

from __future__ import annotations

import re

from tests.conftest import OWN_CLUSTER, STACK_ELSEWHERE, worker_group
from tests.docs_examples import REPO


def test_the_stack_and_the_own_clusters_share_one_group_and_the_rest_none():
    assert worker_group("tests/integration/test_service_http.py::test_rest_mirrors_and_openapi") == "stack"
    assert worker_group("tests/security/test_caps_http.py::test_a_provider_failure_is_summarised_without_its_url") == "stack"
    assert worker_group("tests/integration/test_cli_serve.py::test_serve_with_a_bad_config_reports_the_key") == "stack"
    assert worker_group("tests/integration/test_entrypoint.py::test_sigterm_drains_the_in_flight_turn_and_saves_the_session") == "stack"
    assert worker_group("tests/unit/test_tags.py::test_strip_handles_nested_blocks") is None
    assert worker_group("tests/notebooks/test_notebooks.py::test_the_three_research_notebooks_exist") is None


def test_the_modules_with_a_cluster_of_their_own_are_collected_after_the_rest(request):
    order = [item.nodeid.split("::", 1)[0] for item in request.session.items]
    own = [i for i, module in enumerate(order) if module in OWN_CLUSTER]
    if own:  # collected in this run (a run of the unit tests alone has none)
        assert own == list(range(len(order) - len(own), len(order))), "an own-cluster module runs before another test"


def test_every_module_named_in_a_group_exists():
    for module in OWN_CLUSTER | STACK_ELSEWHERE:
        assert (REPO / module).is_file(), f"{module} is gone: drop it from tests/conftest.py"


def test_every_module_on_the_session_stack_outside_the_integration_folder_is_in_the_stack_group():
    """Else it would start a Ray cluster of its own beside the stack's (tests/security/conftest.py's `serve_url`)."""
    uses = re.compile(r"def \w+\([^)]*\bserve_url\b")  # a test or a fixture asking for it
    found = {
        str(path.relative_to(REPO))
        for path in (REPO / "tests").rglob("test_*.py")
        if not path.is_relative_to(REPO / "tests" / "integration") and uses.search(path.read_text())
    }
    assert found <= STACK_ELSEWHERE, f"add {sorted(found - STACK_ELSEWHERE)} to STACK_ELSEWHERE in tests/conftest.py"


def test_xdist_still_schedules_by_the_scope_the_groups_replace():
    from xdist.scheduler import LoadScopeScheduling

    assert callable(getattr(LoadScopeScheduling, "_split_scope", None))
