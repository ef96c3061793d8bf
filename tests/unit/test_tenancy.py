"""The guard around every method: roles, ownership of sessions and agent cards, agent binding, limits,
token budgets charged with what a run used, and the audit log; plus the rate limiter's counting."""

import json
import os
import stat

import pytest

from reasonray.api.app import local_dispatcher
from reasonray.api.audit import JsonlAuditLog
from reasonray.api.auth import CURRENT_PRINCIPAL, Policy, Principal
from reasonray.api.limits import LocalLimits, RateLimiter
from reasonray.api.tenancy import Guard, LocalOwners, OwnershipTable, agent_exists_via, install_guard
from reasonray.gateway.testing import FunctionLLM
from reasonray.kernel.auth_settings import AuthSettings
from reasonray.kernel.config import ReasoningSettings
from reasonray.reasoner.builtin_tools import builtin_toolbox
from reasonray.reasoner.session import FileSessionRepository, LocalSessions, SessionPipeline

ANSWER = "<thinking>easy</thinking><answer>4</answer>"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def api(tmp_path, **auth):
    reasoning = ReasoningSettings(enabled_strategies=["chain_of_thought", "tree_of_thought"], default_strategy="chain_of_thought")
    llm = FunctionLLM(lambda req: ANSWER)
    sessions = LocalSessions(SessionPipeline(FileSessionRepository(tmp_path / "sessions"), llm, builtin_toolbox(), data_dir=tmp_path))
    rpc = local_dispatcher(reasoning, llm, data_dir=tmp_path, sessions=sessions)
    settings = AuthSettings(jwt_secret="s" * 40, **auth)

    async def get_agent(agent_id):
        return await rpc.methods["agent.get"].handler(rpc.methods["agent.get"].params(agent_id=agent_id), None)

    async def strategy_of(params):
        return params.strategy or "chain_of_thought"

    limiter = RateLimiter(Clock())
    guard = Guard(
        Policy(settings),
        LocalOwners(OwnershipTable(tmp_path / "owners.json")),
        LocalLimits(limiter),
        agent_exists=lambda a: agent_exists_via(get_agent, a),
        strategy_of=strategy_of,
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
    assert (await call(rpc, None, "reasoning.strategies", {}))["error"]["code"] == -32001
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
    assert limiter.usage("t")["tokens_last_day"] == ran["metrics"]["total_tokens"] > 0  # charged what the run used
    budget = await call(rpc, t, "reasoning.execute", {"query": "2+2?"})
    assert budget["error"]["code"] == -32012 and budget["error"]["data"]["limit_name"] == "tokens_per_day"


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
