"""A run on two workers (tests/conftest.py, docs/testing.md): the integration modules first, each wherever a worker
is free, on the cluster the workers share; then the modules with a cluster of their own, in one group; then
everything else."""

from __future__ import annotations

import re

from tests.conftest import collection_rank, worker_group
from tests.docs_examples import REPO

# checked by hand: test_ray_compat starts no cluster (it asserts, in a subprocess, that importing the api starts none)
ALLOWED = {"test_ray_compat.py", "test_worker_groups.py"}


def test_the_own_clusters_form_one_group_and_every_other_module_is_its_own():
    assert worker_group("tests/cluster/test_cli_serve.py::test_serve_with_a_bad_config_reports_the_key") == "cluster"
    assert worker_group("tests/cluster/test_entrypoint.py::test_sigterm_drains_the_in_flight_turn_and_saves_the_session") == "cluster"
    assert worker_group("tests/integration/test_service_http.py::test_rest_mirrors_and_openapi") is None
    assert worker_group("tests/unit/test_tags.py::test_strip_handles_nested_blocks") is None
    assert worker_group("tests/security/test_caps.py::test_anything") is None
    assert worker_group("tests/notebooks/test_notebooks.py::test_the_three_research_notebooks_exist") is None


def test_the_long_pieces_are_collected_first_and_the_short_modules_last(request):
    ranks = [collection_rank(item.nodeid) for item in request.session.items]
    assert ranks == sorted(ranks), "a module is collected out of its place: integration, own clusters, the rest"
    assert collection_rank("tests/integration/test_a2a_http.py::t") < collection_rank("tests/cluster/test_cli_serve.py::t")
    assert collection_rank("tests/cluster/test_cli_serve.py::t") < collection_rank("tests/unit/test_tags.py::t")


def test_no_module_outside_the_stack_folders_starts_ray_or_serve():
    """A module elsewhere that started Ray would start a cluster beside the shared one, unplanned."""
    starts = re.compile(r"\bray\.init\(|\bserve\.start\(|\bserve_base\b|\bray start\b")
    found = {
        str(path.relative_to(REPO))
        for folder in ("unit", "security", "notebooks")
        for path in (REPO / "tests" / folder).rglob("test_*.py")
        if starts.search(path.read_text()) and path.name not in ALLOWED
    }
    assert not found, f"move {sorted(found)} to tests/integration (or tests/cluster if it starts its own cluster)"


def test_xdist_still_schedules_by_the_scope_the_groups_replace():
    from xdist.scheduler import LoadScopeScheduling

    assert callable(getattr(LoadScopeScheduling, "_split_scope", None))
