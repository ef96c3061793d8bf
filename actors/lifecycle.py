"""Named actors that outlive a deployment follow the settings of the one deployed now.

The application's detached actors (memory bank, LLM cache, strategy registry, session hosts, the
branch pool) keep running when the application is deployed again. Each is built from some settings;
it remembers their fingerprint (`Fingerprinted`), and a replica starting with other settings
replaces it (`NamedActor.deploy`: started then, or, for actors created on first use, retired), so a
redeploy with another data directory, model or size never keeps writing through the old one.

To manage an actor this way: subclass `Fingerprinted`, take the fingerprint as the first argument of
`__init__` and store it in `self._fingerprint`; reach it through `NamedActor(cls, name, fp, args)`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Self

import ray
import structlog
from ray.exceptions import GetTimeoutError, RayActorError

from reasonray.actors import NAMESPACE, unwrap

log = structlog.get_logger(__name__)

GONE_TIMEOUT_S = 30.0
ANSWER_TIMEOUT_S = 120.0  # a memory bank opening a large store, or loading its model, takes a while


def fingerprint(*parts: Any) -> str:
    """A stable digest of the settings an actor is built from (JSON-able parts: dicts, Pydantic dumps)."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def private_files() -> None:
    """What this actor's process writes (sessions, Chroma, counters, ownership) is the service's user's alone:
    0600 files, 0700 directories, whatever umask the Ray worker inherited. `reasonray serve` sets 077 before
    it starts Ray; a cluster from `ray start`, `serve deploy` or a test's `ray.init` keeps the shell's 022."""
    os.umask(0o077)


class Fingerprinted:
    """Mixin of managed actors: they answer which settings they were built from."""

    _fingerprint: str = ""

    def fingerprint(self) -> str:
        return self._fingerprint


def lookup(name: str) -> Any | None:
    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return None


def fingerprint_of(handle: Any) -> str | None:
    """The running actor's fingerprint; None when it cannot answer (dead, or not a managed actor)."""
    try:
        return ray.get(handle.fingerprint.remote(), timeout=ANSWER_TIMEOUT_S)
    except (RayActorError, GetTimeoutError, AttributeError):
        return None


def retire_if_stale(name: str, fp: str) -> bool:
    """Kill the actor `name` when it runs with other settings than `fp`; True when one was killed."""
    if (handle := lookup(name)) is None or (current := fingerprint_of(handle)) == fp:
        return False
    log.info("actor.retired", name=name, fingerprint=current, wanted=fp)
    ray.kill(handle, no_restart=True)
    _wait_gone(name)
    return True


@dataclass(eq=False)
class NamedActor:
    """A managed actor reached by name: got, or created from these settings, at its first use, and kept. Its first
    use never replaces a running actor (a call finding its actor dead makes a new one): a replica of the previous
    deployment still draining its requests must not kill the actor the new deployment built."""

    actor_class: Any
    name: str
    fp: str
    args: tuple[Any, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)
    _handle: Any = None

    @property
    def handle(self) -> Any:
        if self._handle is None:
            named = self.actor_class.options(name=self.name, namespace=NAMESPACE, get_if_exists=True, lifetime="detached", **self.options)
            self._handle = named.remote(self.fp, *self.args)
        return self._handle

    def forget(self) -> None:
        """The actor is gone for good (killed by an operator, a lost node): the next call starts a new one."""
        self._handle = None

    def deploy(self, start: bool = True) -> Self:
        """Deploy time: the running actor when it was built from these settings, else a new one replacing it, answering
        (blocking: not the request path); or, not `start`, one built from other settings retired and this one left to
        its first use."""
        for _ in range(5):  # replicas of one deployment race here; they all want the same fingerprint
            retire_if_stale(self.name, self.fp)
            self._handle = None
            if not start or fingerprint_of(self.handle) == self.fp:
                return self
        raise RuntimeError(f"actor {self.name!r} keeps being replaced with other settings: are two deployments of one app running?")

    async def running(self) -> bool:
        """Whether the actor runs, without starting it (a handle found is kept for the calls after)."""
        if self._handle is None:
            self._handle = await asyncio.to_thread(lookup, self.name)
        return self._handle is not None

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """One method of the actor (its signature is there), awaited."""
        return await unwrap(getattr(self.handle, method).remote(*args, **kwargs))


def retire_extra(prefix: str, keep: set[str]) -> list[str]:
    """Kill the actors named `prefix...` that are not in `keep` (a redeploy with fewer session hosts)."""
    gone = []
    for actor in ray.util.list_named_actors(all_namespaces=True):
        name = actor["name"]
        if actor["namespace"] == NAMESPACE and name.startswith(prefix) and name not in keep and (handle := lookup(name)) is not None:
            ray.kill(handle, no_restart=True)
            gone.append(name)
    for name in gone:
        _wait_gone(name)
    return gone


def _wait_gone(name: str) -> None:
    """Until Ray has released the name, so the next `get_if_exists` creates a new actor."""
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while lookup(name) is not None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"actor {name!r} was killed but its name is still taken after {GONE_TIMEOUT_S:g} s")
        time.sleep(0.05)
