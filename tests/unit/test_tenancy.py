"""The guard around every method: roles, ownership of sessions and agent cards, agent binding, limits,
token budgets charged with what a run used, and the audit log; plus the rate limiter's counting."""

import json
import os
import stat

import pytest

from reasonray.api.access.auth import CURRENT_PRINCIPAL, Policy, Principal
from reasonray.api.access.limits import LocalLimits, RateLimiter, TokenBudgets
from reasonray.api.access.tenancy import (
    Guard,
    LocalOwners,
    agent_exists_via,
    agent_strategies_via,
    install_guard,
    personal_workspace,
)
from reasonray.api.app import local_dispatcher
from reasonray.api.jsonrpc import Call
from reasonray.gateway.simulator.inprocess import SimulatedLLM
from reasonray.gateway.testing import FunctionLLM
from reasonray.kernel.auth_settings import AuthSettings
from reasonray.kernel.config import ReasoningSettings
from reasonray.reasoner.builtin_tools import builtin_toolbox
from reasonray.reasoner.session import LocalSessions, SessionPipeline, SessionState
from reasonray.stores.audit import JsonlAuditLog
from reasonray.stores.counters import MemoryCounters
from reasonray.stores.ownership import OwnershipTable
from reasonray.stores.sessions import SqliteSessionStore
from tests.unit.memory_harness import local_memory, make_bank

ANSWER = "<thinking>easy</thinking><answer>4</answer>"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def api(tmp_path, *, memory=False, llm=None, **auth):
    reasoning = ReasoningSettings(enabled_strategies=["chain_of_thought", "tree_of_thought"], default_strategy="chain_of_thought")
    llm = llm or FunctionLLM(lambda req: ANSWER)
    sessions = LocalSessions(
        SessionPipeline(SqliteSessionStore(SessionState, tmp_path / "sessions"), llm, builtin_toolbox(), data_dir=tmp_path)
    )
    bank = local_memory(make_bank(tmp_path / "bank")) if memory else None
    rpc = local_dispatcher(reasoning, llm, data_dir=tmp_path, sessions=sessions, memory=bank)
    settings = AuthSettings(jwt_secret="s" * 40, **auth)

    async def get_agent(agent_id):
        method = rpc.methods["agent.get"]  # the handler itself: the guard asks for cards before it admits a call
        return await method.handler(method.params(agent_id=agent_id), Call("lookup", "agent.get"))

    async def strategy_of(params):
        return params.strategy or "chain_of_thought"

    limiter = RateLimiter(Clock())
    guard = Guard(
        Policy(settings),
        LocalOwners(OwnershipTable(tmp_path / "owners.json")),
        LocalLimits(limiter),
        agent_exists=lambda a: agent_exists_via(get_agent, a),
        strategy_of=strategy_of,
        agent_strategies=lambda a: agent_strategies_via(get_agent, a),
        audit=JsonlAuditLog(tmp_path / "audit" / "audit.jsonl"),
    )
    install_guard(rpc, guard)
    return rpc, limiter


async def call(rpc, principal, method, params):
    token = CURRENT_PRINCIPAL.set(principal)
    try:
        response, _ = await rpc.handle_payload({"jsonrpc": "2.0", "method": method, "params": params, "id": 1})
    finally:
        CURRENT_PRINCIPAL.reset(token)
    return response


ALICE, BOB = Principal("alice", ("reasoner",)), Principal("bob", ("reasoner",))
ADMIN, READER = Principal("root", ("admin",)), Principal("rita", ("reader",))
CARD = {"id": "planner", "name": "Planner", "capabilities": ["reasoning.strategy.chain_of_thought"]}


async def test_anonymous_and_unpermitted_callers_are_refused(tmp_path):
    rpc, _ = api(tmp_path)
    assert (await call(rpc, None, "reasoning.strategies", {}))["error"]["code"] == -32016
    refused = await call(rpc, READER, "reasoning.execute", {"query": "2+2?"})
    assert refused["error"]["code"] == -32003 and "may not call reasoning.execute" in refused["error"]["message"]
    assert "result" in await call(rpc, READER, "reasoning.strategies", {})


async def test_sessions_belong_to_their_creator_and_strangers_cannot_tell_them_from_nothing(tmp_path):
    rpc, _ = api(tmp_path)
    created = (await call(rpc, ALICE, "session.create", {}))["result"]["session_id"]
    assert (await call(rpc, ALICE, "session.turn", {"session_id": created, "message": "hi"}))["result"]["answer"] == "4"
    theirs = await call(rpc, BOB, "session.get", {"session_id": created})
    missing = await call(rpc, BOB, "session.get", {"session_id": "0" * len(created)})
    assert theirs["error"]["code"] == missing["error"]["code"] == -32003
    assert theirs["error"]["message"].replace(created, "ID") == missing["error"]["message"].replace("0" * len(created), "ID")
    for method in ("session.turn", "session.close"):
        params = {"session_id": created, **({"message": "x"} if method == "session.turn" else {})}
        assert (await call(rpc, BOB, method, params))["error"]["code"] == -32003
    assert "result" in await call(rpc, ADMIN, "session.get", {"session_id": created})


async def test_agent_cards_are_owned_and_bound_principals_are_their_agent(tmp_path):
    rpc, _ = api(tmp_path)
    assert "result" in await call(rpc, ALICE, "agent.register", CARD)
    assert (await call(rpc, BOB, "agent.register", {**CARD, "name": "Hijacked"}))["error"]["code"] == -32003
    assert (await call(rpc, BOB, "agent.get", {"agent_id": "planner"}))["error"]["code"] == -32003
    assert (await call(rpc, BOB, "agent.list", {}))["result"]["agents"] == []
    assert [a["id"] for a in (await call(rpc, ALICE, "agent.list", {}))["result"]["agents"]] == ["planner"]
    assert (await call(rpc, BOB, "reasoning.execute", {"query": "2+2?", "agent_id": "planner"}))["error"]["code"] == -32003

    bound = Principal("planner-bot", ("reasoner",), agent_id="planner")
    other = await call(rpc, bound, "reasoning.execute", {"query": "2+2?", "agent_id": "someone-else"})
    assert other["error"]["code"] == -32003 and "cannot act as another agent" in other["error"]["message"]
    assert (await call(rpc, bound, "agent.register", {**CARD, "id": "someone-else"}))["error"]["code"] == -32003
    # a method that names its own strategy still keeps to the card: planner offers chain_of_thought only
    refused = await call(rpc, bound, "reasoning.bounded_context", {"query": "What is 2 + 2?"})
    assert refused["error"]["code"] == -32003 and "does not offer strategy 'bounded_context'" in refused["error"]["message"]


async def test_roles_restrict_strategies(tmp_path):
    rpc, _ = api(tmp_path, roles={"cot": {"methods": ["reasoning.*"], "strategies": ["chain_of_thought"]}})
    cot = Principal("c", ("cot",))
    assert (await call(rpc, cot, "reasoning.execute", {"query": "2+2?"}))["result"]["answer"] == "4"
    refused = await call(rpc, cot, "reasoning.execute", {"query": "2+2?", "strategy": "tree_of_thought"})
    assert refused["error"]["code"] == -32003 and "tree_of_thought" in refused["error"]["message"]


async def test_requests_per_minute_and_token_budgets_hold_and_tokens_are_charged(tmp_path):
    rpc, limiter = api(tmp_path, roles={"metered": {"methods": ["*"], "strategies": ["*"], "limits": {"requests_per_minute": 3}}})
    p = Principal("m", ("metered",))
    for _ in range(3):
        assert "result" in await call(rpc, p, "reasoning.strategies", {})
    refused = await call(rpc, p, "reasoning.strategies", {})
    assert refused["error"]["code"] == -32012 and refused["error"]["data"]["limit_name"] == "requests_per_minute"
    assert 59 <= refused["error"]["data"]["retry_after_s"] <= 60

    rpc, limiter = api(tmp_path / "b", principals={"t": {"tokens_per_day": 1}})
    t = Principal("t", ("reasoner",))
    ran = (await call(rpc, t, "reasoning.execute", {"query": "2+2?"}))["result"]
    assert limiter.usage("t")["tokens_today"] == ran["metrics"]["total_tokens"] > 0  # charged what the run used
    budget = await call(rpc, t, "reasoning.execute", {"query": "2+2?"})
    assert budget["error"]["code"] == -32012 and budget["error"]["data"]["limit_name"] == "tokens_per_day"


async def test_session_turns_are_charged_the_tokens_they_used(tmp_path):
    rpc, limiter = api(tmp_path, principals={"t": {"tokens_per_day": 1}})
    t = Principal("t", ("reasoner",))
    sid = (await call(rpc, t, "session.create", {}))["result"]["session_id"]
    turned = (await call(rpc, t, "session.turn", {"session_id": sid, "message": "2+2?"}))["result"]
    usage = turned["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0
    assert limiter.usage("t")["tokens_today"] == usage["total_tokens"]  # charged what the turn used
    budget = await call(rpc, t, "session.turn", {"session_id": sid, "message": "again?"})
    assert budget["error"]["code"] == -32012 and budget["error"]["data"]["limit_name"] == "tokens_per_day"


async def test_a_resumption_is_charged_only_its_own_llm_calls(tmp_path):
    rpc, limiter = api(tmp_path, llm=SimulatedLLM(), principals={"t": {"tokens_per_day": 10**6}})
    t = Principal("t", ("reasoner",))
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}
    sid = (await call(rpc, t, "session.create", {"client_tools": [weather]}))["result"]["session_id"]
    message = "Weather? [[sim call=get_weather {}]]"
    handed = (await call(rpc, t, "session.turn", {"session_id": sid, "message": message}))["result"]
    [pending] = handed["pending_tool_calls"]
    results = [{"tool_call_id": pending["tool_call_id"], "content": "Snow"}]
    resumed = (await call(rpc, t, "session.resume", {"session_id": sid, "tool_results": results}))["result"]
    assert resumed["status"] == "completed" and resumed["llm_calls"] == 2  # the turn's count; the usage is this call's
    used = [handed["usage"]["total_tokens"], resumed["usage"]["total_tokens"]]
    assert min(used) > 0 and limiter.usage("t")["tokens_today"] == sum(used)


async def test_your_own_personal_workspace_is_readable_before_you_store_in_it_and_nobody_else_may_touch_it(tmp_path):
    rpc, _ = api(tmp_path, memory=True)
    item = {"title": "Check units", "description": "Convert first.", "content": "Convert both lengths to metres."}
    empty = await call(rpc, ALICE, "memory.retrieve", {"query": "units"})  # no workspace named: alice's own
    assert empty["result"]["memories"] == []
    theirs = personal_workspace("alice")
    for method, params in [
        ("memory.retrieve", {"query": "units", "workspace": theirs}),
        ("memory.store", {"items": [item], "workspace": theirs}),  # nobody may claim another's personal workspace
    ]:
        assert (await call(rpc, BOB, method, params))["error"]["code"] == -32003, method
    assert "result" in await call(rpc, ALICE, "memory.store", {"items": [item]})
    assert len((await call(rpc, ALICE, "memory.retrieve", {"query": "units"}))["result"]["memories"]) == 1
    assert (await call(rpc, BOB, "memory.retrieve", {"query": "units", "workspace": theirs}))["error"]["code"] == -32003
    assert (await call(rpc, BOB, "memory.retrieve", {"query": "units"}))["result"]["memories"] == []  # bob's own, empty
    # the owner (a plain reasoner) shares it read-only: bob reads, still may not write or re-share it
    assert "result" in await call(rpc, ALICE, "memory.share_workspace", {"workspace": theirs, "readers": ["bob"]})
    assert len((await call(rpc, BOB, "memory.retrieve", {"query": "units", "workspace": theirs}))["result"]["memories"]) == 1
    assert (await call(rpc, BOB, "memory.store", {"items": [item], "workspace": theirs}))["error"]["code"] == -32003
    assert (await call(rpc, BOB, "memory.share_workspace", {"workspace": theirs, "readers": ["bob"]}))["error"]["code"] == -32003


async def test_every_call_is_audited_in_a_private_file(tmp_path):
    rpc, _ = api(tmp_path)
    await call(rpc, ALICE, "session.create", {})
    await call(rpc, BOB, "session.get", {"session_id": "s" * 32})
    path = tmp_path / "audit" / "audit.jsonl"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["principal"], r["method"], r["outcome"]) for r in records] == [
        ("alice", "session.create", "ok"),
        ("bob", "session.get", "forbidden"),
    ]
    assert records[1]["target"] == "session:" + "s" * 32 and records[1]["trace_id"]


def test_limiter_counts_windows_slots_and_budgets():
    clock = Clock()
    limiter = RateLimiter(clock)
    keyed = [("p", {"requests_per_minute": 2, "concurrent_runs": 1, "tokens_per_minute": 100})]
    first = limiter.admit(keyed, run=True)
    assert first["ok"] and first["remaining"] == 1
    assert limiter.admit(keyed, run=True)["limit_name"] == "concurrent_runs"  # refused: not counted
    limiter.finish(["p"], first["run_id"], tokens=150)
    assert limiter.admit(keyed, run=True)["limit_name"] == "tokens_per_minute"
    clock.now += 30
    assert limiter.admit(keyed)["ok"]
    assert limiter.admit(keyed)["limit_name"] == "requests_per_minute"
    clock.now += 31  # the first request and the tokens have left the window
    assert limiter.admit(keyed, run=True)["ok"]


def test_token_budgets_live_in_the_counters_so_a_new_limiter_keeps_them():
    clock, counters = Clock(), MemoryCounters()
    keyed = [("p", {"tokens_per_day": 100})]
    first = RateLimiter(clock, TokenBudgets(counters))
    first.finish(["p"], first.admit(keyed, run=True)["run_id"], tokens=120)
    restarted = RateLimiter(clock, TokenBudgets(counters))  # the limiter actor came back: memory empty, store not
    refused = restarted.admit(keyed, run=True)
    assert refused["limit_name"] == "tokens_per_day" and refused["retry_after_s"] == 86_400 - 1_000  # until the UTC day ends
    clock.now += 86_400
    assert restarted.admit(keyed, run=True)["ok"]


class FailingOnce(MemoryCounters):
    """A store that is down for one write."""

    def __init__(self) -> None:
        super().__init__()
        self.down = True

    def add(self, key, amount=1, window_s=None, now=None):
        if self.down:
            self.down = False
            raise ConnectionError("the store is restarting")
        return super().add(key, amount, window_s, now)


def test_a_charge_the_store_cannot_take_is_kept_and_written_with_the_next():
    clock, counters = Clock(), FailingOnce()
    limiter = RateLimiter(clock, TokenBudgets(counters))
    limiter.finish(["p"], None, tokens=70)  # the store is down: not lost, still counted here
    assert limiter.usage("p")["tokens_today"] == 70
    limiter.finish(["p"], None, tokens=30)
    assert counters.get("tokens_per_day:p", 86_400, clock.now) == 100 and limiter.usage("p")["tokens_today"] == 100


def test_a_refused_key_counts_nothing_on_the_others():
    limiter = RateLimiter(Clock())
    both = [("p", {"requests_per_minute": 10}), ("p|tree_of_thought", {"requests_per_minute": 1})]
    assert limiter.admit(both)["ok"]
    assert not limiter.admit(both)["ok"]
    assert limiter.usage("p")["requests_last_minute"] == 1


def test_ownership_table_persists_claims_and_shares(tmp_path):
    table = OwnershipTable(tmp_path / "owners.json")
    assert table.claim("workspace", "w", "alice") and not table.claim("workspace", "w", "bob")
    table.share("workspace", "w", ["bob", "bob"])
    reopened = OwnershipTable(tmp_path / "owners.json")
    assert reopened.get("workspace", "w") == {"owner": "alice", "readers": ["bob"]}
    assert reopened.readable("workspace", "bob") == ["w"] and reopened.readable("workspace", "carol") == []


@pytest.mark.parametrize("tool", ["memory_search"])
async def test_sessions_cannot_take_a_tool_that_reads_any_workspace(tmp_path, tool):
    rpc, _ = api(tmp_path)
    assert (await call(rpc, ALICE, "session.create", {"server_tools": [tool]}))["error"]["code"] == -32003


class CountingCounters(MemoryCounters):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def add(self, key, amount=1, window_s=None, now=None):
        self.writes += 1
        return super().add(key, amount, window_s, now)


def test_charges_count_at_once_and_reach_the_store_summed_once_per_flush_interval():
    """The limiter actor writes budgets at most once a second (a file write is fsynced: two per run cost ~28 ms),
    and the budget holds in between because unwritten charges count too."""
    clock, counters = Clock(), CountingCounters()
    keyed = [("p", {"tokens_per_day": 100})]
    limiter = RateLimiter(clock, TokenBudgets(counters, flush_s=1.0))
    limiter.finish(["p"], limiter.admit(keyed, run=True)["run_id"], tokens=40)  # the first charge is written at once
    assert counters.writes == 2  # the minute's and the day's window
    for _ in range(2):
        limiter.finish(["p"], limiter.admit(keyed, run=True)["run_id"], tokens=40)
    assert counters.writes == 2 and counters.get("tokens_per_day:p", 86_400, clock.now) == 40  # not written yet
    assert limiter.usage("p")["tokens_today"] == 120 and limiter.admit(keyed, run=True)["limit_name"] == "tokens_per_day"
    clock.now += 1.0
    limiter.budgets.flush_due(clock.now)
    assert counters.writes == 4 and counters.get("tokens_per_day:p", 86_400, clock.now) == 120  # both charges, summed
    limiter.budgets.flush_due(clock.now)
    assert counters.writes == 4  # nothing pending: nothing written
