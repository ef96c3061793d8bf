"""memory.*, stats.* and the ReasoningBank MCP tool aliases, in-process: parameters, answers and error codes."""

from __future__ import annotations

import asyncio
import uuid

from reasonray.api.app import local_dispatcher
from reasonray.gateway.simulator.inprocess import SimulatedLLM
from reasonray.kernel.config import load_settings
from tests.unit.memory_harness import local_memory, make_bank

ITEM = {"title": "Check units", "description": "Convert before you compare.", "content": "Write every quantity with its unit."}


def api(tmp_path):
    settings = load_settings()
    bank = make_bank(tmp_path / "bank")
    rpc = local_dispatcher(
        settings.reasoning, SimulatedLLM(), data_dir=tmp_path, memory=local_memory(bank), memory_settings=settings.memory
    )

    async def call(method, params=None):
        payload, _ = await rpc.handle_payload({"jsonrpc": "2.0", "method": method, "params": params or {}, "id": 1}, None)
        return payload

    return call


async def test_store_get_retrieve_genealogy_and_workspaces(tmp_path):
    call = api(tmp_path)
    stored = (await call("memory.store", {"items": [ITEM], "workspace": "lab", "key": "compare two lengths in metres and feet"}))["result"]
    [root] = stored["stored"]
    assert uuid.UUID(root["id"]) and root["workspace"] == "lab"
    child = {**ITEM, "title": "Check units twice", "parent_memory_id": root["id"]}
    [child] = (await call("memory.store", {"items": [child], "workspace": "lab"}))["result"]["stored"]
    assert child["evolution_stage"] == 1
    assert (await call("memory.get", {"memory_id": root["id"], "workspace": "lab"}))["result"]["title"] == "Check units"
    found = (await call("memory.retrieve", {"query": "compare two lengths in metres and feet", "workspace": "lab"}))["result"]
    assert found["memories"][0]["memory"]["id"] == root["id"] and "scores" in found["memories"][0]
    tree = (await call("get_memory_genealogy", {"memory_id": child["id"], "workspace": "lab"}))["result"]
    assert [a["id"] for a in tree["ancestors"]] == [root["id"]]
    desc = (await call("memory.descendants", {"memory_id": root["id"], "workspace": "lab"}))["result"]
    assert [d["id"] for d in desc["descendants"]] == [child["id"]]
    alias = (await call("retrieve_memories", {"query": "compare two lengths in metres and feet", "workspace": "lab", "n_results": 1}))[
        "result"
    ]
    assert alias["memories"][0]["memory"]["id"] == root["id"]
    listed = (await call("memory.list_workspaces"))["result"]
    assert listed["workspaces"] == [{"workspace": "lab", "memories": 2, "traces": 0}]
    refused = await call("memory.delete_workspace", {"workspace": "lab"})
    assert refused["error"]["code"] == -32602 and "confirm: true" in refused["error"]["message"]
    deleted = (await call("memory.delete_workspace", {"workspace": "lab", "confirm": True}))["result"]
    assert deleted["deleted_memories"] == 2
    assert (await call("memory.get", {"memory_id": root["id"], "workspace": "lab"}))["error"]["code"] == -32005


async def test_bad_items_are_rejected_whole_with_the_field_named(tmp_path):
    call = api(tmp_path)
    missing = await call("memory.store", {"items": [ITEM, {"title": "no description", "content": "c"}]})
    assert missing["error"]["code"] == -32602 and "description" in missing["error"]["message"]
    orphan = await call("memory.store", {"items": [{**ITEM, "parent_memory_id": str(uuid.uuid4())}]})
    assert orphan["error"]["code"] == -32602 and "parent_memory_id" in orphan["error"]["message"]
    assert (await call("memory.list_workspaces"))["result"]["workspaces"] == []  # nothing half-written
    assert (await call("memory.get", {"memory_id": "nope"}))["error"]["code"] == -32602


async def test_error_queries_statistics_and_reset(tmp_path):
    call = api(tmp_path)
    lesson = {
        **ITEM,
        "error_context": {
            "error_type": "unit mix-up",
            "failure_pattern": "compared feet to metres",
            "corrective_guidance": "convert first",
        },
    }
    await call("memory.store", {"items": [ITEM, lesson]})
    errors = (await call("memory.errors", {"error_type": "unit mix-up"}))["result"]["memories"]
    assert [e["title"] for e in errors] == ["Check units"] and errors[0]["error_context"]
    await call("reasoning.execute", {"query": "What is 3 * 4?", "memory": {"learn": True, "task_id": "t1"}})
    traces = (await call("memory.traces", {"task_id": "t1"}))["result"]["traces"]
    assert traces[0]["outcome"] == "success"
    stats = (await call("get_statistics"))["result"]
    assert stats["traces"]["success"] == 1 and stats["retrieval"]["count"] == 1 and stats["embedder"] == "test-hash"
    assert stats["llm"]["calls"] >= 3
    reset = (await call("stats.reset"))["result"]
    assert reset["traces"]["total"] == 0


async def test_solve_coding_task_verifies_with_the_tests_in_the_sandbox(tmp_path):
    call = api(tmp_path)
    # the simulator answers the directive verbatim: one line of valid Python
    task = 'Write add(a, b) returning the sum. [[sim answer="add=lambda a,b: a+b"]]'
    r = (await call("solve_coding_task", {"task": task, "matts_k": 2, "tests": "assert add(2, 3) == 5", "task_id": "code-1"}))["result"]
    assert r["solution"] == "add=lambda a,b: a+b" and (r["outcome"], r["judged_by"]) == ("success", "verifier")
    assert r["matts"]["k"] == 2 and r["memories_stored"]
    wrong = (await call("solve_coding_task", {"task": task, "enable_matts": False, "tests": "assert add(2, 3) == 6", "task_id": "code-2"}))[
        "result"
    ]
    assert wrong["outcome"] == "failure" and wrong["matts"]["fallback"] is True


async def test_repeated_tasks_after_warmup_are_served_from_the_cache_and_stats_show_the_saving(tmp_path):
    """Repeatable calls are answered from the response cache, and stats.get reports the hit rate and the API calls made."""
    from reasonray.gateway.cache import CachingLLM, LRUTTLCache

    settings = load_settings()
    bank = make_bank(tmp_path / "bank")

    class Counting(SimulatedLLM):
        calls = 0

        async def complete(self, request):
            Counting.calls += 1
            return await super().complete(request)

    simulated = Counting()
    rpc = local_dispatcher(
        settings.reasoning,
        CachingLLM(simulated, LRUTTLCache()),
        data_dir=tmp_path,
        memory=local_memory(bank),
        memory_settings=settings.memory,
    )

    async def run(query):
        payload, _ = await rpc.handle_payload({"jsonrpc": "2.0", "method": "reasoning.execute", "params": {"query": query}, "id": 1}, None)
        return payload["result"]

    async def recorded(calls):
        """Run statistics are recorded in the background: wait until `calls` runs are counted."""
        for _ in range(200):
            payload, _ = await rpc.handle_payload({"jsonrpc": "2.0", "method": "stats.get", "params": {}, "id": 3}, None)
            if payload["result"]["llm"]["calls"] >= calls:
                return payload["result"]["llm"]
            await asyncio.sleep(0.05)
        raise AssertionError(f"stats.get counted {payload['result']['llm']['calls']} of {calls} runs after 10 s")

    workload = [f"What is {a} * 7?" for a in range(10)]
    for query in workload:  # warm-up
        await run(query)
    await recorded(10)
    await rpc.handle_payload({"jsonrpc": "2.0", "method": "stats.reset", "params": {}, "id": 2}, None)
    requests_before = Counting.calls
    for query in workload[:3] + [f"What is {a} * 9?" for a in range(7)]:  # 30% of the tasks seen before
        await run(query)
    llm = await recorded(10)
    assert llm["calls"] == 10 and llm["cache_hits"] == 3 and llm["cache_hit_rate"] == 0.3
    assert llm["api_calls"] == 7 == Counting.calls - requests_before  # 30% fewer calls reached the model


def test_each_embedding_choice_builds_its_embedder():
    from reasonray.memory.embeddings import (
        ChromaDefaultEmbedder,
        OpenAIEmbedder,
        SentenceTransformerEmbedder,
    )
    from reasonray.memory.service import build_embedder

    base = load_settings(environ={})

    def with_memory(**memory):
        return base.model_copy(update={"memory": base.memory.model_copy(update=memory)})

    st = build_embedder(with_memory())
    assert isinstance(st, SentenceTransformerEmbedder) and st.name == "sentence-transformers:all-MiniLM-L6-v2"
    assert st._loaded is None  # loaded on first use, not at construction
    oa = build_embedder(with_memory(embedding="openai", embedding_base_url="http://127.0.0.1:9/v1"), environ={})
    assert isinstance(oa, OpenAIEmbedder) and oa.model == "simulated" and oa.base_url == "http://127.0.0.1:9/v1"
    assert isinstance(build_embedder(with_memory(embedding="chroma_default")), ChromaDefaultEmbedder)  # nothing downloaded yet


async def test_a_store_that_stops_answering_is_memory_unavailable(tmp_path):
    import httpx
    import pytest

    from reasonray.kernel.errors import MemoryUnavailableError
    from reasonray.memory.service import BankService, LocalMemory

    bank = make_bank(tmp_path)

    def gone(*args, **kwargs):
        raise httpx.ConnectError("connection refused")

    bank.store.nearest = gone
    memory = LocalMemory(BankService(bank))
    with pytest.raises(MemoryUnavailableError, match="chroma_url"):
        await memory.retrieve("anything", "default")
