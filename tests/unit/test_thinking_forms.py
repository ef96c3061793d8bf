"""Every surface over the simulated reasoning model in each form a server hands thinking over in (vLLM's
`reasoning_content` field, R1 raw text, OpenAI's hidden thinking with its refusals) and over the plain model that
does not think: the real OpenAI-compatible client, over HTTP, against the simulator in this process.

What a user relies on: a run ends with an answer or a classified error, the answer never holds thinking, and the
run's counts (calls, prompt, completion and reasoning tokens) are exactly what the server reported."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from reasonray.api.app import local_dispatcher
from reasonray.api.service import ReasoningService
from reasonray.api.surfaces.openai_compat import OpenAICompat, Reply, respond
from reasonray.evals.datasets import load_dataset
from reasonray.evals.grid import build_grid
from reasonray.evals.runner import InProcessEngine, ResultLog, run_grid
from reasonray.gateway.openai_client import OpenAILLM
from reasonray.gateway.protocol import Completion
from reasonray.gateway.simulator.reasoning import THOUGHT
from reasonray.gateway.simulator.server import SimulatorServer, SimulatorSettings
from reasonray.gateway.tokens import counter_for_model
from reasonray.reasoner.builtin_tools import builtin_toolbox
from reasonray.reasoner.session import LocalSessions, SessionPipeline, SessionState
from reasonray.stores.sessions import SqliteSessionStore
from reasonray.strategies.registry import StrategyRegistry, build_catalogue
from tests.unit.thinking_forms_setup import FORMS, MODEL, REASONING, STRATEGIES, Recorded

THINKING_TEXT = re.compile(r"Thought \d+:|\[thought \d+/\d+\]|think>|thinking>", re.IGNORECASE)


@pytest.fixture(scope="module")
def server():
    srv = SimulatorServer(SimulatorSettings(port=0)).start()
    yield srv
    srv.stop()


def thinking_model(server: SimulatorServer, form: str, thinking: int = 200) -> Recorded:
    """The server switched to `form` (its stats reset) and a fresh client for it, configured with nothing but the
    base URL and the model's name."""
    with httpx.Client(base_url=server.url) as http:
        http.post("/sim/reset").raise_for_status()
        http.post("/sim/reasoning", json={"form": "off" if form == "plain" else form, "thinking_tokens": thinking}).raise_for_status()
    return Recorded(OpenAILLM(MODEL[form], base_url=server.url, api_key="x", discover=False))


def server_usage(server: SimulatorServer) -> dict[str, int]:
    with httpx.Client(base_url=server.url) as http:
        stats = http.get("/sim/stats").json()
    return {"calls": stats["requests"], **stats["usage"]}


def assert_counts(form: str, ours: dict[str, int], server: dict[str, int]) -> None:
    """Ours equal the server's; in the R1 form the server reports no reasoning_tokens (the thinking is in the text), so
    the client splits completion_tokens by counting the thinking, which the simulator's own count may differ from by
    a token here and there where the thinking meets the answer."""
    if form != "r1":
        assert ours == server
        return
    assert {k: v for k, v in ours.items() if k != "reasoning_tokens"} == {k: v for k, v in server.items() if k != "reasoning_tokens"}
    assert abs(ours["reasoning_tokens"] - server["reasoning_tokens"]) <= server["reasoning_tokens"] // 200, (ours, server)


def counted(metrics: dict[str, Any]) -> dict[str, int]:
    return {
        "calls": metrics["llm_calls"],
        "prompt_tokens": metrics["prompt_tokens"],
        "completion_tokens": metrics["completion_tokens"],
        "reasoning_tokens": metrics["reasoning_tokens"],
    }


async def call(rpc, method: str, params: dict[str, Any]) -> dict[str, Any]:
    payload, _ = await rpc.handle_payload({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, None)
    return payload


def assert_no_thinking(answer: str) -> None:
    assert not THINKING_TEXT.search(answer), answer


# -- every strategy ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("form", FORMS)
async def test_every_strategy_answers_without_thinking_and_counts_what_the_server_reported(server, form, strategy):
    llm = thinking_model(server, form)
    params = {"query": "What is 17 * 23?", "strategy": strategy, "strategy_config": STRATEGIES[strategy]}
    result = (await call(local_dispatcher(REASONING, llm), "reasoning.execute", params))["result"]
    assert result["answer"] == "391"
    assert_no_thinking(result["answer"])
    usage = server_usage(server)
    assert_counts(form, counted(result["metrics"]), usage)
    assert (usage["reasoning_tokens"] > 0) is (form != "plain")
    assert result["metrics"]["completion_tokens"] > result["metrics"]["reasoning_tokens"]
    if form in ("field", "r1"):  # the thinking behind the answer, as the server handed it over
        assert THOUGHT.search(result["reasoning"])
    else:
        assert not result.get("reasoning")


# -- sessions ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("form", FORMS)
async def test_a_session_turn_with_a_server_tool_keeps_the_answer_not_the_thinking(server, form, tmp_path):
    llm = thinking_model(server, form)
    sessions = LocalSessions(
        SessionPipeline(SqliteSessionStore(SessionState, tmp_path / "sessions"), llm, builtin_toolbox(), data_dir=tmp_path)
    )
    rpc = local_dispatcher(REASONING, llm, sessions=sessions)
    sid = (await call(rpc, "session.create", {"server_tools": ["calculator"]}))["result"]["session_id"]
    message = 'What is 6 * 7? [[sim call=calculator {"expression": "6*7"}]]'
    first = (await call(rpc, "session.turn", {"session_id": sid, "message": message}))["result"]
    assert first["status"] == "completed" and first["answer"] == "42"
    assert (first["usage"]["reasoning_tokens"] > 0) is (form != "plain")
    second = (await call(rpc, "session.turn", {"session_id": sid, "message": "What is 2 + 3?"}))["result"]
    assert second["answer"] == "5"
    shown = [m for m in llm.calls[-1][0].messages if m.role == "assistant"]
    assert any("42" in (m.content or "") for m in shown)  # the history keeps the first turn's answer
    assert not any(THINKING_TEXT.search(m.content or "") for m in shown)  # and none of its thinking
    assert sum(c.usage.completion_tokens for _, c in llm.calls) == server_usage(server)["completion_tokens"]


# -- evaluations ------------------------------------------------------------------------------------------------


def arithmetic(path: Path) -> Path:
    rows = [("What is 12 * 7?", 84), ("What is 45 + 38?", 83), ("What is 9 * 13?", 117)]
    path.write_text("".join(json.dumps({"question": q, "answer": f"{q} #### {a}"}) + "\n" for q, a in rows))
    return path


@pytest.mark.parametrize("form", FORMS)
async def test_an_evaluation_scores_every_example_and_counts_the_thinking(server, form, tmp_path):
    llm = thinking_model(server, form)
    examples = load_dataset(arithmetic(tmp_path / "a.jsonl")).examples
    catalogue = build_catalogue(StrategyRegistry().discover(), REASONING)
    service = ReasoningService(catalogue, llm, counter_for_model("simulated"))
    log = ResultLog(tmp_path / "results.jsonl")
    await run_grid(InProcessEngine(service), examples, build_grid(catalogue, ["chain_of_thought"], {}, [0]), log)
    records = log.select(examples, build_grid(catalogue, ["chain_of_thought"], {}, [0]))
    assert len(records) == 3 and all(r.status == "ok" and r.correct for r in records), records
    usage = server_usage(server)
    assert sum(r.llm_calls for r in records) == usage["calls"] == 3
    assert sum(r.prompt_tokens for r in records) == usage["prompt_tokens"]
    assert sum(r.completion_tokens for r in records) == usage["completion_tokens"]  # the thinking included
    assert (usage["reasoning_tokens"] > 0) is (form != "plain")


# -- /v1, over the real client ----------------------------------------------------------------------------------


@pytest.mark.parametrize("form", FORMS)
async def test_v1_plain_and_streamed_carries_the_thinking_and_the_servers_counts(server, form):
    """The /v1 mapping in process (tests/unit/test_reasoning_surfaces.py), here over the real client and server."""
    llm = thinking_model(server, form)
    compat = OpenAICompat(local_dispatcher(REASONING, llm), counter_for_model("simulated"), "simulated")
    body = {"model": "reasonray", "messages": [{"role": "user", "content": "What is 17 * 23?"}]}
    plain = await respond(compat, json.dumps(body).encode(), "t-forms-1")
    assert isinstance(plain, Reply) and plain.status == 200, plain
    message = plain.body["choices"][0]["message"]
    assert message["content"] == "391"
    assert ("reasoning_content" in message) is (form in ("field", "r1"))
    usage = server_usage(server)
    assert plain.body["reasonray"]["metrics"]["reasoning_tokens"] == usage["reasoning_tokens"]
    assert plain.body["usage"]["completion_tokens_details"]["reasoning_tokens"] >= usage["reasoning_tokens"]
    stream = await respond(compat, json.dumps({**body, "stream": True}).encode(), "t-forms-2")
    chunks = [json.loads(p) for p in [p async for p in stream] if p != "[DONE]"]
    answer = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    thinking = "".join(c["choices"][0]["delta"]["reasoning_content"] for c in chunks if c.get("reasonray", {}).get("kind") == "thinking")
    assert answer == "391" and thinking == message.get("reasoning_content", "")


# -- thinking that uses up max_tokens ---------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["field", "r1", "hidden"])
async def test_chain_of_thought_never_reads_thinking_cut_by_max_tokens_as_an_answer(server, form):
    llm = thinking_model(server, form, thinking=2000)
    params = {"query": "What is 17 * 23?", "strategy": "chain_of_thought", "strategy_config": {"max_tokens": 128}}
    payload = await call(local_dispatcher(REASONING, llm), "reasoning.execute", params)
    assert llm.calls[0][1].thinking_unfinished  # the first reply ran out while thinking
    usage = server_usage(server)
    if "result" in payload:  # the answer forced from the thinking: the model's own, never a phrase of its thinking
        assert payload["result"]["answer"] == "391"
        spent = {k: payload["result"]["metrics"][k] for k in ("prompt_tokens", "completion_tokens", "reasoning_tokens")}
    else:
        error = payload["error"]
        assert error["code"] == -32010 and error["data"]["thinking_unfinished"], error
        spent = {k: error["data"]["partial"][k] for k in ("prompt_tokens", "completion_tokens", "reasoning_tokens")}
    # tokens, not calls: budget forcing answers one call of the strategy's with two requests to the server
    assert spent == {k: usage[k] for k in ("prompt_tokens", "completion_tokens", "reasoning_tokens")}


def furthest_thought(completion: Completion) -> int:
    return max((int(done) for done, _ in THOUGHT.findall(completion.reasoning)), default=-1)


@pytest.mark.parametrize(
    "form,mode",
    [
        ("field", "auto"),
        ("field", "delethink"),
        ("field", "summary"),
        ("r1", "summary"),
        ("r1", "delethink"),
        ("r1", "auto"),
    ],
)
async def test_bounded_context_progresses_every_chunk_when_thinking_uses_up_each_one(server, form, mode):
    """The simulator's thinking model as the measurement runs it (thinking=3000, chunk_size=1024). The field form's
    model is one the gateway knows nothing of, so it cannot continue a reply: delethink learns that from its first
    continuation and carries the thinking in the prompt from then on."""
    llm = thinking_model(server, form, thinking=3000)
    config = {"chunk_size": 1024, "carryover_size": 512, "carryover_mode": mode, "max_iterations": 10}
    params = {"query": "What is 17 * 23?", "strategy": "bounded_context", "strategy_config": config}
    payload = await call(local_dispatcher(REASONING, llm), "reasoning.execute", params)
    chunks = [c for r, c in llm.calls if r.purpose is None]
    assert len(chunks) >= 3 and chunks[0].thinking_unfinished
    cut = [(r.max_tokens, c.usage.completion_tokens) for r, c in llm.calls if c.finish_reason == "length"]
    assert all(asked == used for asked, used in cut), cut  # a reply cut by max_tokens used all of it, as a server's does
    continued = [c for c in chunks if c.thinking_control != "unsupported"]  # the one that found no continuation aside
    assert len(chunks) - len(continued) <= 1
    reached = [furthest_thought(c) for c in continued if c.reasoning]
    assert reached == sorted(set(reached)), reached  # every chunk thinks further than the one before: none starts over
    assert "result" in payload, payload["error"]
    assert payload["result"]["answer"] == "391"
    assert_counts(form, counted(payload["result"]["metrics"]), server_usage(server))
