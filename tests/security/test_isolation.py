"""The small things one principal could learn of another: cached prompts, trace ids, reserved names."""

from __future__ import annotations

import asyncio
import re

from reasonray.api.access.auth import CURRENT_PRINCIPAL, Principal, principal_trace_id
from reasonray.api.directory import RESERVED_AGENT_IDS
from reasonray.gateway.cache import CACHE_SCOPE, CachingLLM, LRUTTLCache
from reasonray.gateway.protocol import LLMRequest, Message
from reasonray.gateway.testing import FunctionLLM
from tests.unit.test_tenancy import ALICE, BOB, api, call


async def test_one_principals_cache_entries_are_not_another_ones_hits():
    model = FunctionLLM(lambda request: "<answer>4</answer>")
    cached = CachingLLM(model, LRUTTLCache(max_entries=10, ttl_s=60))
    request = LLMRequest(messages=(Message(role="user", content="alice's exact prompt"),))
    for who in ("alice", "bob", "alice"):
        token = CACHE_SCOPE.set(who)
        try:
            completion = await cached.complete(request)
        finally:
            CACHE_SCOPE.reset(token)
        hit = completion.cached
        assert hit is (who == "alice" and len(model.requests) == 2), who
    assert len(model.requests) == 2  # alice once, bob once: bob's first call was no hit on alice's entry


def test_a_chosen_trace_id_is_made_the_callers_own():
    assert principal_trace_id("abcdef123456") == "abcdef123456"  # authentication off: unchanged
    ids = {}
    for sub in ("alice", "mallory"):
        token = CURRENT_PRINCIPAL.set(Principal(sub, ("reasoner",)))
        try:
            ids[sub] = principal_trace_id("abcdef123456")
            assert principal_trace_id(None) is None
            assert principal_trace_id("x" * 128) and len(principal_trace_id("x" * 128) or "") <= 128
        finally:
            CURRENT_PRINCIPAL.reset(token)
    assert ids["alice"] != ids["mallory"] and all(i.startswith("abcdef123456.u") for i in ids.values())
    assert all(re.fullmatch(r"[A-Za-z0-9._-]{8,128}", i) for i in ids.values())
    # mallory naming alice's derived id still gets one of her own
    token = CURRENT_PRINCIPAL.set(Principal("mallory", ("reasoner",)))
    try:
        assert principal_trace_id(ids["alice"]) != ids["alice"]
    finally:
        CURRENT_PRINCIPAL.reset(token)


async def test_reserved_workspace_names_are_nobodys_to_claim(tmp_path):
    rpc, _ = api(tmp_path, memory=True)
    item = {"title": "t", "description": "d", "content": "c"}
    for name in ("default", "shared"):
        refused = await call(rpc, BOB, "memory.store", {"workspace": name, "items": [item]})
        assert refused["error"]["code"] == -32003 and "reserved" in refused["error"]["message"], refused
    assert "result" in await call(rpc, ALICE, "memory.store", {"workspace": "alices", "items": [item]})


async def test_reserved_agent_ids_are_refused_and_an_owned_id_is_nobody_elses_to_claim(tmp_path):
    from tests.unit.test_tenancy import ADMIN, CARD

    rpc, _ = api(tmp_path)
    for ident in ("default", "system", "reasonray"):
        refused = await call(rpc, BOB, "agent.register", {**CARD, "id": ident})
        assert refused["error"]["code"] == -32602, refused
        assert repr(ident) in refused["error"]["message"] and "reserved ids: admin, default, global" in refused["error"]["message"]
        assert refused["error"]["data"]["reserved"] == sorted(RESERVED_AGENT_IDS)
        assert (await call(rpc, BOB, "agent.get", {"agent_id": ident}))["error"]["code"] == -32003  # nothing was registered
    assert "result" in await call(rpc, ADMIN, "agent.register", {**CARD, "id": "default"})  # an admin's to fill

    assert "result" in await call(rpc, ALICE, "agent.register", CARD)
    taken = await call(rpc, BOB, "agent.register", {**CARD, "name": "Hijacked"})
    assert taken["error"]["code"] == -32003 and "no agent 'planner' that you may use" in taken["error"]["message"]
    assert (await call(rpc, ALICE, "agent.get", {"agent_id": "planner"}))["result"]["name"] == "Planner"  # still Alice's card
    assert "result" in await call(rpc, ALICE, "agent.register", {**CARD, "name": "Planner 2"})  # its owner may replace it


async def test_stats_show_a_non_admin_its_own_activity_only(tmp_path):
    from tests.unit.test_tenancy import ADMIN, READER

    rpc, _ = api(tmp_path, memory=True)
    for _ in range(3):
        assert "result" in await call(rpc, ALICE, "reasoning.execute", {"query": "2 + 2?"})
    # a run is counted in the bank's statistics after its answer goes out (ReasoningService._settle)
    for _ in range(200):
        server = (await call(rpc, ADMIN, "stats.get", {}))["result"]
        if server["runs"]["total"] >= 3:
            break
        await asyncio.sleep(0.01)
    assert server.get("scope", "server") == "server" and server["runs"]["total"] >= 3
    for who in (BOB, READER):
        own = (await call(rpc, who, "stats.get", {}))["result"]
        assert own["scope"] == "principal" and own["runs"]["total"] == 0 and own["llm"]["calls"] == 0, own
        assert own["usage"]["tokens_today"] == 0 and own["usage"]["runs_in_flight"] == 0
    alices = (await call(rpc, ALICE, "get_statistics", {}))["result"]
    assert alices["scope"] == "principal" and alices["usage"]["tokens_today"] > 0 and alices["usage"]["requests_last_minute"] >= 3


async def test_session_turns_on_a_host_use_the_callers_cache_scope(tmp_path):
    """A session turn runs on a session host, in another process: the caller's scope travels with the call."""
    import asyncio
    import contextvars

    from reasonray.actors.lifecycle import NamedActor
    from reasonray.actors.session import RaySessions, SessionHost
    from reasonray.reasoner.builtin_tools import builtin_toolbox
    from reasonray.reasoner.hosting import LiveSessions
    from reasonray.reasoner.session import SessionPipeline, SessionSpec, SessionState
    from reasonray.stores.sessions import SqliteSessionStore

    model = FunctionLLM(lambda request: "<answer>4</answer>")
    cached = CachingLLM(model, LRUTTLCache(max_entries=10, ttl_s=60))
    pipeline = SessionPipeline(SqliteSessionStore(SessionState, tmp_path / "sessions"), cached, builtin_toolbox(), data_dir=tmp_path)
    host = object.__new__(SessionHost.__ray_metadata__.modified_class)  # the actor's own code, without Ray
    host.pipeline, host.live, host._sweeper = pipeline, LiveSessions(8, 60.0), None

    class Method:
        def __init__(self, name: str) -> None:
            self.name = name

        def remote(self, *args):
            # as in a Ray actor: a task of its own, with none of the caller's context variables
            return asyncio.get_running_loop().create_task(getattr(host, self.name)(*args), context=contextvars.Context())

    class Handle:
        turn, resume = Method("turn"), Method("resume")

    sessions = RaySessions([NamedActor(SessionHost, "host-0", "fp", _handle=Handle())], pipeline)
    answers = []
    for who in ("alice", "bob", "alice"):
        session_id = (await sessions.create(SessionSpec()))["session_id"]
        token = CACHE_SCOPE.set(who)
        try:
            answers.append(await sessions.turn(session_id, "alice's exact question", "t" * 32))
        finally:
            CACHE_SCOPE.reset(token)
    host._sweeper.cancel()
    assert [a["answer"] for a in answers] == ["4", "4", "4"]
    assert len(model.requests) == 2  # alice's first turn and bob's: bob's was no hit on alice's entry; alice's second was
