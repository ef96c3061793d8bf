"""Named actors outlive a deployment and follow the settings of the one deployed now (actors/lifecycle.py): built
from other settings (another data directory, store, model), the running actor is replaced; from the same ones, kept.
A whole redeploy with another data directory, every store followed into it, is the slow suite's
(`test_session_hosts_http.py::test_a_redeploy_with_another_data_directory_replaces_the_named_actors`)."""

from __future__ import annotations

import pytest
import ray
from ray.exceptions import RayActorError

from reasonray.actors.fanout import LLMSpec
from reasonray.actors.lifecycle import fingerprint, fingerprint_of, retire_extra, retire_if_stale
from reasonray.actors.memory import memory_fingerprint
from reasonray.actors.registry import registry_actor
from reasonray.actors.tenancy import owners_actor
from reasonray.kernel.config import Settings
from tests.integration.conftest import settings_for

APP = "named-actors"


def test_an_actor_built_from_other_settings_is_replaced_and_one_built_from_the_same_is_kept(ray_cluster, tmp_path):
    name = f"{APP}-owners"
    try:
        first = owners_actor(APP, None, tmp_path / "a")
        built_for_a = fingerprint_of(first)
        owners_actor(APP, None, tmp_path / "a")  # the same settings: the running actor is the one
        assert ray.get(first.fingerprint.remote(), timeout=60) == built_for_a
        second = owners_actor(APP, None, tmp_path / "b")  # another data directory: a new actor, the old one gone
        assert fingerprint_of(second) not in (None, built_for_a)
        with pytest.raises(RayActorError):
            ray.get(first.fingerprint.remote(), timeout=60)
        # an actor started at its first use (the memory bank, lazy session hosts) is retired at deploy time alike
        assert retire_if_stale(name, built_for_a) is True
        with pytest.raises(RayActorError):
            ray.get(second.fingerprint.remote(), timeout=60)
        assert retire_if_stale(name, built_for_a) is False  # nothing runs under that name now
    finally:
        retire_extra(f"{APP}-", keep=set())


def test_every_managed_actors_fingerprint_moves_with_the_data_directory():
    a, b = (Settings.model_validate(settings_for("http://127.0.0.1:9/v1", data_dir=d)) for d in ("/srv/a", "/srv/b"))
    assert memory_fingerprint(a) != memory_fingerprint(b)
    assert registry_actor(APP, a.reasoning, a.data_dir).fp != registry_actor(APP, b.reasoning, b.data_dir).fp
    # the session hosts: the whole settings, as the replica hands them over (branch runners are each replica's own)
    assert fingerprint(LLMSpec(a.model_dump_json(), APP).settings_json) != fingerprint(LLMSpec(b.model_dump_json(), APP).settings_json)
    assert memory_fingerprint(a) == memory_fingerprint(Settings.model_validate(a.model_dump(mode="json")))  # stable
