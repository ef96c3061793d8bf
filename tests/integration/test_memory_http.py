"""The ReasoningBank through the running service: Ray Serve over HTTP, the memory bank actor, Chroma
embedded on disk and as a server, the simulated model through the openai client, MaTTS as Ray tasks."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
import ray

from reasonray.actors import NAMESPACE
from reasonray.actors.session import host_index, host_name
from reasonray.gateway.simulator.server import (
    SimulatorServer,
    SimulatorSettings,
    free_port,
)
from reasonray.memory.store import StoreError
from tests.integration.conftest import deploy, own_app, result_of, rpc, settings_for

pytestmark = pytest.mark.integration

TASK_A = "A baker packs 17 * 23 rolls into boxes. How many rolls? [[sim slip=1]]"
TASK_B = "A baker packs 17 * 24 rolls into boxes. How many rolls?"


def system_prompt(trace: list[dict]) -> str:
    return next(e for e in trace if e["type"] == "LLM_INVOCATION")["messages"][0]["content"]


EMBEDDERS = [
    # the simulator's /v1/embeddings; the default embedder runs in-process in docs/memory.md's example (tests/unit/test_docs.py)
    pytest.param("openai", "openai:simulated", id="openai"),  # a simulated provider names its embeddings model "simulated"
    # all-MiniLM-L6-v2 via sentence-transformers, offline, in the memory bank actor: it imports torch (about a minute here)
    pytest.param("sentence_transformers", "sentence-transformers:all-MiniLM-L6-v2", id="sentence_transformers", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("embedding", "embedder"), EMBEDDERS)
def test_a_memory_aware_run_learns_into_chroma_on_disk_and_a_similar_task_uses_it_after_a_restart(
    serve_base, simulator, embedding, embedder
):
    from ray import serve

    with own_app(serve_base, simulator.url, "mem-e2e", memory={"embedding": embedding}) as (client, settings):
        a = result_of(
            rpc(
                client,
                "reasoning.execute",
                {"query": TASK_A, "strategy_config": {"temperature": 0.8}, "memory": {"learn": True, "task_id": "A"}},
            )
        )
        learned = a["memory"]
        assert learned["outcome"] == "failure" and learned["judged_by"] == "llm_judge" and learned["stored"]
        assert any(Path(settings["data_dir"], "chroma").glob("*.sqlite3"))  # embedded Chroma, on disk

        b = result_of(rpc(client, "reasoning.execute", {"query": TASK_B, "include_trace": True, "memory": {"task_id": "B"}}))
        assert [m["id"] for m in b["memory"]["retrieved"]] == learned["stored"]
        assert "[WARNING: past failure]" in system_prompt(b["trace"])
        assert next(e["type"] for e in b["trace"]) == "MEMORY_RETRIEVAL"
        assert b["answer"] == "408"

        stats = result_of(rpc(client, "stats.get"))
        assert stats["embedder"] == embedder and stats["traces"]["failure"] == 1
        assert stats["embedding"]["count"] >= 2 and stats["retrieval"]["count"] == 2 and "hit_rate" in stats["llm_cache"]
        # runs reach the bank in batches (one actor call per half second); stats.get sends what is pending first
        assert stats["runs"] == {"total": 2, "errors": 0}
        assert stats["llm"]["calls"] >= a["metrics"]["llm_calls"] + b["metrics"]["llm_calls"]

        serve.delete("mem-e2e")
        ray.kill(ray.get_actor("mem-e2e-memory", namespace=NAMESPACE), no_restart=True)
        deploy(settings, "mem-e2e", "/mem-e2e")
        again = result_of(rpc(client, "reasoning.execute", {"query": TASK_B, "memory": {"task_id": "B2"}}))
        assert [m["id"] for m in again["memory"]["retrieved"]] == learned["stored"]
        assert result_of(rpc(client, "memory.get", {"memory_id": learned["stored"][0]}))["error_context"]


def test_the_memory_bank_actor_restarts_after_a_crash_and_reopens_the_store(api):
    # the session's main application (default settings): its bank crashes and comes back for the next tests
    stored = result_of(rpc(api, "memory.store", {"items": [{"title": "T", "description": "D.", "content": "C."}]}))
    actor = ray.get_actor("reasonray-memory", namespace=NAMESPACE)
    ray.kill(actor, no_restart=False)  # a crash: Ray restarts it (max_restarts=-1)
    got = result_of(rpc(api, "memory.get", {"memory_id": stored["stored"][0]["id"]}))
    assert got["title"] == "T"


def test_matts_parallel_k5_fans_out_as_five_ray_tasks(api):
    # the session's main application: what the timing test below checks, but not how long it takes
    five = result_of(
        rpc(
            api,
            "reasoning.execute",
            {
                "query": "What is 19 * 22? [[sim slip=0.3]]",
                "strategy": "matts",
                "include_trace": True,
                "strategy_config": {"k": 5, "seed": 5},
            },
        )
    )
    branches = [e for e in five["trace"] if e["type"] == "BRANCH" and e["label"] == "matts.attempt"]
    assert len(branches) == 5 and len({b["task_id"] for b in branches}) == 5
    assert five["metrics"]["strategy_specific"]["k"] == 5 and len(five["metrics"]["strategy_specific"]["scores"]) == 5


# slow suite: an application of its own on a slow model, three runs (bench/matts.py prints the same ratio closely)
@pytest.mark.slow
def test_matts_parallel_k5_fans_out_as_ray_tasks_in_about_one_attempts_time(serve_base, ray_cluster):
    slow = SimulatorServer(SimulatorSettings(port=0, ttft_ms=1500)).start()
    try:
        with own_app(serve_base, slow.url, "mem-matts", llm={"cache": {"enabled": False}}) as (client, _):

            def run(k: int) -> tuple[dict, float]:
                started = time.perf_counter()
                result = result_of(
                    rpc(
                        client,
                        "reasoning.execute",
                        {
                            "query": f"What is 19 * 21? (run {k}) [[sim slip=0.3]]",
                            "strategy": "matts",
                            "include_trace": True,
                            "strategy_config": {"k": k, "seed": k},
                        },
                    )
                )
                return result, time.perf_counter() - started

            run(5)  # start the worker processes the branches run in
            one, _ = run(1)
            five, _ = run(5)
        branches = [e for e in five["trace"] if e["type"] == "BRANCH" and e["label"] == "matts.attempt"]
        assert len(branches) == 5 and len({b["task_id"] for b in branches}) == 5
        assert five["metrics"]["strategy_specific"]["k"] == 5 and len(five["metrics"]["strategy_specific"]["scores"]) == 5
        assert one["metrics"]["strategy_specific"]["fallback"] is True
        # the five attempts run at once (in turn they would take 5x): bench/matts.py measures the ratio closely
        t1, t5 = one["metrics"]["strategy_specific"]["attempts_ms"], five["metrics"]["strategy_specific"]["attempts_ms"]
        assert t5 < 2.5 * t1, (t1, t5)
        assert five["metrics"]["strategy_specific"]["selection_ms"] < 2.5 * t1  # the five judges run at once too
    finally:
        slow.stop()


@pytest.fixture
def chroma_server():
    port = free_port()
    path = tempfile.mkdtemp(prefix="reasonray-chroma-server-")
    chroma = shutil.which("chroma", path=str(Path(sys.executable).parent))
    proc = subprocess.Popen([chroma, "run", "--path", path, "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/api/v2/heartbeat", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.3)
    else:
        proc.kill()
        pytest.fail("chroma run did not start within 60 s")
    yield url
    proc.terminate()
    proc.wait(timeout=20)
    shutil.rmtree(path, ignore_errors=True)


# slow suite: a `chroma run` server and an application of their own (45 s of the default run); the bank's code is the
# same on a server as on disk (only chromadb's client differs), and the on-disk store, its restart and the refusal of
# an unreachable server are tested in the default run
@pytest.mark.slow
def test_a_chroma_server_backs_the_bank_and_outlives_the_actor(serve_base, simulator, chroma_server):
    with own_app(serve_base, simulator.url, "mem-server", memory={"chroma_url": chroma_server}) as (client, _):
        stored = result_of(
            rpc(
                client,
                "memory.store",
                {
                    "workspace": "shared",
                    "key": "merge two sorted lists",
                    "items": [{"title": "Two pointers", "description": "Walk both lists.", "content": "Advance the smaller."}],
                },
            )
        )
        ray.kill(ray.get_actor("mem-server-memory", namespace=NAMESPACE), no_restart=True)
        found = result_of(rpc(client, "memory.retrieve", {"workspace": "shared", "query": "merge two sorted lists"}))
        assert [m["memory"]["id"] for m in found["memories"]] == [stored["stored"][0]["id"]]
        import chromadb

        port = int(chroma_server.rsplit(":", 1)[1])
        names = [c.name for c in chromadb.HttpClient(host="127.0.0.1", port=port).list_collections()]
        assert "rb-m-shared" in names  # the items live on the server, not in the actor


def test_a_session_turn_is_learned_passively_on_its_session_host_and_retrieved_later(serve_base, simulator):
    explanation = (
        "Pack the rolls in boxes of 24 and count full boxes first; the remainder goes in one extra box, so 391 rolls need 17 boxes."
    )
    with own_app(serve_base, simulator.url, "mem-passive", memory={"passive_learning": True}) as (client, settings):
        sid = result_of(rpc(client, "session.create", {}))["session_id"]
        turn = result_of(
            rpc(client, "session.turn", {"session_id": sid, "message": f'How many boxes do 391 rolls need? [[sim answer="{explanation}"]]'})
        )
        assert turn["answer"] == explanation and turn["memory"]["passive"] == "captured"
        assert turn["memory"]["task_id"] == f"{sid}-turn-1" and turn["trace"][-1]["type"] == "MEMORY_LEARNING"
        host = ray.get_actor(host_name("mem-passive", host_index(sid, settings["sessions"]["hosts"])), namespace=NAMESPACE)
        assert ray.get(host.is_live.remote(sid))  # the turn, and its learning, ran on the session's host
        found = result_of(rpc(client, "memory.retrieve", {"query": "How many boxes do 391 rolls need?", "min_similarity": 0}))
        assert {m["memory"]["id"] for m in found["memories"]} >= set(turn["memory"]["stored"])
        assert all(m["memory"]["source_type"] == "passive" for m in found["memories"])
        assert result_of(rpc(client, "session.get", {"session_id": sid}))["trace"] == turn["trace"]
        assert result_of(rpc(client, "stats.get"))["passive_learning"]["captured"] == 1


def test_an_unreachable_chroma_server_fails_the_deployment_clearly(simulator):
    from reasonray.serve_app import build_app

    settings = settings_for(simulator.url, memory={"chroma_url": f"http://127.0.0.1:{free_port()}"})
    with pytest.raises(StoreError, match="chroma run"):
        build_app({"settings": settings, "app_name": "mem-nowhere"})


def test_memory_methods_aliases_and_errors_over_http(api):
    ws = "http-api"
    item = {"title": "Check edge cases", "description": "Empty input breaks loops.", "content": "Test the empty list first."}
    root = result_of(rpc(api, "memory.store", {"workspace": ws, "items": [item]}))["stored"][0]
    child = result_of(
        rpc(api, "memory.store", {"workspace": ws, "items": [{**item, "title": "Check more edges", "parent_memory_id": root["id"]}]})
    )["stored"][0]
    tree = result_of(rpc(api, "get_memory_genealogy", {"memory_id": root["id"], "workspace": ws}))
    assert [d["memory"]["id"] for d in tree["descendants"]] == [child["id"]]
    found = result_of(rpc(api, "retrieve_memories", {"query": "Check edge cases. Empty input breaks loops.", "workspace": ws}))
    assert found["memories"]
    assert result_of(rpc(api, "get_statistics"))["items_stored"] >= 2
    missing = rpc(api, "memory.store", {"workspace": ws, "items": [{"title": "only a title"}]}).json()["error"]
    assert missing["code"] == -32602 and "description" in missing["message"]
    unknown = rpc(api, "memory.get", {"workspace": ws, "memory_id": "00000000-0000-0000-0000-000000000000"}).json()["error"]
    assert unknown["code"] == -32005
    assert result_of(rpc(api, "memory.delete_workspace", {"workspace": ws, "confirm": True}))["deleted_memories"] == 2
    solved = result_of(
        rpc(
            api,
            "solve_coding_task",
            {
                "task": 'Write add(a, b). [[sim answer="add=lambda a,b: a+b"]]',
                "matts_k": 2,
                "tests": "assert add(1, 2) == 3",
                "workspace": ws,
            },
        )
    )
    assert solved["outcome"] == "success" and solved["judged_by"] == "verifier"
