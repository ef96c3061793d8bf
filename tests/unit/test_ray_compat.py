"""The private parts of Ray that `reasonray.actors.ray_compat` stands on still have the shape it uses.

These fail on a Ray upgrade that renames or reshapes one of them; the live behaviour is exercised by the
integration suite (the fan-out pool's actor ids, the security modules finding the running Serve instance).
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys

import pytest
import ray
from ray.actor import ActorHandle
from ray.serve._private.client import ServeControllerClient
from ray.serve.config import HTTPOptions

from reasonray.actors import ray_compat
from tests.docs_examples import REPO
from tests.ray_private import validate_cluster_config


def test_serve_lookup_takes_the_flag_that_keeps_it_from_raising():
    from ray.serve.context import _get_global_client

    flag = inspect.signature(_get_global_client).parameters["raise_if_no_controller_running"]
    assert flag.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def test_the_serve_client_exposes_its_http_options_with_host_and_port():
    assert isinstance(inspect.getattr_static(ServeControllerClient, "http_config"), property)
    options = HTTPOptions(host="127.0.0.1", port=8123)
    assert (options.host, options.port) == ("127.0.0.1", 8123)


def test_without_ray_there_is_no_serve_instance_and_ray_is_not_started():
    # in a process of its own: the test session may already hold the integration suite's cluster
    probe = (
        "import ray\n"
        "from reasonray.actors import ray_compat\n"
        "assert not ray.is_initialized()\n"
        "assert ray_compat.serve_http() is None\n"
        "assert not ray.is_initialized(), 'the lookup started Ray'\n"  # Serve's own lookup would have called ray.init()
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


class _HandleWithoutCluster(ActorHandle):
    """An actor handle's id and nothing else: no cluster behind it to register with or release from."""

    def __init__(self, actor_id: ray.ActorID) -> None:
        self._ray_actor_id = actor_id

    def __del__(self) -> None:
        pass


def test_an_actor_handle_gives_its_actor_id_as_hex():
    assert isinstance(inspect.getattr_static(ActorHandle, "_actor_id"), property)
    actor_id = ray.ActorID.from_random()
    assert ray_compat.actor_id_of(_HandleWithoutCluster(actor_id)) == actor_id.hex()
    assert len(actor_id.hex()) == 32  # the form `get_runtime_context().get_actor_id()` returns inside the actor


MINIMAL_LOCAL_CLUSTER = {
    "cluster_name": "compat",
    "provider": {"type": "local", "head_ip": "10.0.0.1", "worker_ips": ["10.0.0.2"]},
    "auth": {"ssh_user": "ubuntu"},
}


def test_a_cluster_file_is_filled_in_with_rays_defaults_and_validated():
    prepared = validate_cluster_config(MINIMAL_LOCAL_CLUSTER)
    assert prepared["cluster_name"] == "compat"
    assert "cluster_synced_files" in prepared and prepared["available_node_types"]  # defaults `ray up` adds


def test_a_wrong_cluster_file_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"idle_timeout_minutes: 'soon' is not of type 'number'"):
        validate_cluster_config({**MINIMAL_LOCAL_CLUSTER, "idle_timeout_minutes": "soon"})
    with pytest.raises(ValueError, match=r"the top level: .*'head_nodes' was unexpected"):
        validate_cluster_config({**MINIMAL_LOCAL_CLUSTER, "head_nodes": 1})


PRIVATE_RAY = re.compile(r"\bray(\.\w+)*\._private\b|_get_global_client|\._actor_id\b")
ALLOWED = {"actors/ray_compat.py", "tests/ray_private.py", "tests/unit/test_ray_compat.py"}


def test_nothing_else_reaches_into_rays_private_names():
    folders = ["reasonray", "actors", "strategies", "memory", "bench", "tests", "examples"]
    files = {p.resolve() for folder in folders for p in (REPO / folder).rglob("*.py")} | {(REPO / "serve_app.py").resolve()}
    offenders = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in sorted(files)
        if str(path.relative_to(REPO)) not in ALLOWED
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if PRIVATE_RAY.search(line)
    ]
    assert offenders == [], "go through reasonray.actors.ray_compat instead:\n" + "\n".join(offenders)
