"""Leased run slots: a replica admits most runs without an actor round trip, concurrency limits stay exact
across replicas, and a replica that dies holding slots frees them within the lease's TTL."""

from __future__ import annotations

import asyncio

from reasonray.actors import tenancy
from reasonray.actors.tenancy import RUN_SLOT_TTL_S, RayLimits
from reasonray.api.access.limits import RateLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class Method:
    """`actor.method.remote(...)` over a RateLimiter in this process, counting the calls."""

    def __init__(self, fn, calls: list[str], name: str) -> None:
        self.fn, self.calls, self.name = fn, calls, name

    def remote(self, *args, **kwargs):
        self.calls.append(self.name)

        async def call():
            return self.fn(*args, **kwargs)

        return call()


class Actor:
    def __init__(self, limiter: RateLimiter) -> None:
        self.calls: list[str] = []
        self.admit = Method(limiter.admit, self.calls, "admit")
        self.finish = Method(limiter.finish, self.calls, "finish")
        self.renew = Method(limiter.renew, self.calls, "renew")
        self.release = Method(limiter.release, self.calls, "release")


def keyed(concurrent: int | None = 16, rpm: int | None = None) -> list:
    return [("alice", {"concurrent_runs": concurrent, "requests_per_minute": rpm})]


def test_a_lease_takes_its_slots_at_once_and_they_expire_unless_renewed():
    clock = Clock()
    limiter = RateLimiter(clock=clock)
    lease = limiter.admit(keyed(8), requests=0, run=True, runs=4, lease_s=10)
    assert lease["ok"] and len(lease["run_ids"]) == 4
    assert limiter.usage("alice")["runs_in_flight"] == 4
    refused = limiter.admit(keyed(8), requests=0, run=True, runs=5, lease_s=10)
    assert not refused["ok"] and refused["limit_name"] == "concurrent_runs"
    clock.now += 6
    limiter.renew(["alice"], lease["run_ids"][:2], 10)
    clock.now += 6  # the two not renewed are past their TTL: their replica is gone
    assert limiter.usage("alice")["runs_in_flight"] == 2
    limiter.release(["alice"], lease["run_ids"][:1])
    limiter.finish(["alice"], lease["run_ids"][1], tokens=0)
    assert limiter.usage("alice")["runs_in_flight"] == 0


def test_runs_not_leased_are_kept_until_they_finish():
    clock = Clock()
    limiter = RateLimiter(clock=clock)
    run = limiter.admit(keyed(1), run=True)
    clock.now += 600  # a long run: no TTL
    assert not limiter.admit(keyed(1), run=True)["ok"]
    limiter.finish(["alice"], run["run_id"], tokens=0)
    assert limiter.admit(keyed(1), run=True)["ok"]


async def test_a_replica_admits_most_runs_without_a_round_trip():
    limiter = RateLimiter()
    actor = Actor(limiter)
    replica = RayLimits(actor)
    for _ in range(20):  # one user's runs, one after another
        decision = await replica.admit(keyed(16), run=True)
        assert decision["ok"] and decision["run_id"]
        await replica.finish(["alice"], decision["run_id"], tokens=10)
    assert actor.calls.count("admit") <= 3, actor.calls  # the permit lease and one run lease (not one call per run)
    assert actor.calls.count("finish") == 0  # charges go in batches
    for _ in range(100):  # the keeper sends them within half a lease
        await asyncio.sleep(0.02)
        if limiter.usage("alice")["tokens_this_minute"] == 200:
            break
    assert limiter.usage("alice")["tokens_this_minute"] == 200  # every run's tokens were charged
    assert actor.calls.count("finish") == 1, actor.calls


async def test_concurrency_limits_hold_across_replicas():
    limiter = RateLimiter()
    a, b = RayLimits(Actor(limiter)), RayLimits(Actor(limiter))
    admitted = []
    for replica in (a, b, a, b, a, b, a, b, a, b):
        decision = await replica.admit(keyed(8), run=True)
        admitted.append(decision["ok"])
    assert admitted.count(True) == 8, admitted  # exactly the limit, whichever replica asked
    assert limiter.usage("alice")["runs_in_flight"] == 8


async def test_a_small_concurrency_limit_is_not_leased(monkeypatch):
    limiter = RateLimiter()
    a, b = RayLimits(Actor(limiter)), RayLimits(Actor(limiter))
    run = await a.admit(keyed(2), run=True)
    await a.finish(["alice"], run["run_id"], tokens=0)
    await asyncio.sleep(0)
    # nothing sits idle on replica a: b gets both slots at once
    assert (await b.admit(keyed(2), run=True))["ok"] and (await b.admit(keyed(2), run=True))["ok"]


async def test_idle_leased_slots_go_back_and_held_ones_are_renewed(monkeypatch):
    monkeypatch.setattr(tenancy, "RUN_LEASE_S", 0.05)
    monkeypatch.setattr(tenancy, "RUN_RENEW_S", 0.05)
    limiter = RateLimiter()
    actor = Actor(limiter)
    replica = RayLimits(actor)
    running = await replica.admit(keyed(16), run=True)
    assert limiter.usage("alice")["runs_in_flight"] == 4  # the lease
    for _ in range(50):
        await asyncio.sleep(0.02)
        if limiter.usage("alice")["runs_in_flight"] == 1:
            break
    assert limiter.usage("alice")["runs_in_flight"] == 1, "the three idle slots went back; the running one stays"
    assert "release" in actor.calls and "renew" in actor.calls
    await replica.finish(["alice"], running["run_id"], tokens=0)
    for _ in range(50):
        await asyncio.sleep(0.02)
        if limiter.usage("alice")["runs_in_flight"] == 0:
            break
    assert limiter.usage("alice")["runs_in_flight"] == 0
    assert RUN_SLOT_TTL_S > tenancy.RUN_RENEW_S


async def test_a_spent_budget_refuses_the_next_run_at_once():
    """The lease knows what the budget had left; a run that spends it sends the charges before the next admission."""
    limiter = RateLimiter()
    replica = RayLimits(Actor(limiter))
    limits = [("alice", {"tokens_per_minute": 100})]
    run = await replica.admit(limits, run=True)
    await replica.finish(["alice"], run["run_id"], tokens=150)
    refused = await replica.admit(limits, run=True)  # the lease has free slots, but not the budget
    assert not refused["ok"] and refused["limit_name"] == "tokens_per_minute"


async def test_a_lease_spends_within_what_the_budget_had_left():
    limiter = RateLimiter()
    actor = Actor(limiter)
    replica = RayLimits(actor)
    limits = [("alice", {"tokens_per_minute": 100})]
    for _ in range(3):  # 3 x 30 tokens: within the budget, all on the lease
        run = await replica.admit(limits, run=True)
        assert run["ok"]
        await replica.finish(["alice"], run["run_id"], tokens=30)
    assert actor.calls.count("admit") == 2 and "finish" not in actor.calls  # one permit lease, one run lease
    fourth = await replica.admit(limits, run=True)  # 10 left: still allowed (a budget stops the *next* run)
    await replica.finish(["alice"], fourth["run_id"], tokens=30)
    refused = await replica.admit(limits, run=True)
    assert not refused["ok"] and limiter.usage("alice")["tokens_this_minute"] == 120
