"""Every strategy against a model that disobeys, as real models do.

The simulated model runs as llama.cpp's server would serve a small model (docs/simulator.md, "Disobeying"):
replies ignore the `<answer>`/`<score>`/`<step>`/`<vote>` formats and answer in prose, ramble on to
`max_tokens`, drop tools or send arguments that are not JSON; it counts tokens with another tokenizer,
generates one request at a time and has a 4,096-token context. Each strategy runs over HTTP through the
LLM stack a deployment builds (OpenAI client, retries, breaker), with every reply disobeying and with half
of them disobeying (two draws), and what must hold whatever the model says is checked against what the server saw:

- the run ends with a result or a classified ReasonRay error, never another exception, and never sends a
  request the server has to refuse;
- the tokens and calls the run reports are the ones the server reported;
- nothing degenerate is preferred to a real attempt: when any reply stated an answer (tagged, in prose,
  in JSON), the run answers, and with one of the answers stated, not with a ramble, an empty reply or an
  evaluation's text;
- a tool call whose arguments are not a JSON object is never executed as if it were;
- a bounded-context chunk (prompt and reply) stays within `chunk_size` by the server's count.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from reasonray.gateway.factory import build_llm, client_for
from reasonray.gateway.openai_client import OpenAILLM
from reasonray.gateway.simulator.server import SimulatorServer, SimulatorSettings
from reasonray.kernel.config import Settings
from reasonray.kernel.errors import ReasonRayError
from reasonray.reasoner.trace import ToolExecuted
from reasonray.strategies.base import ReasoningResult
from reasonray.strategies.bounded_context import BoundedContext
from reasonray.strategies.chain_of_thought import ChainOfThought
from reasonray.strategies.matts import Matts
from reasonray.strategies.react import ReAct
from reasonray.strategies.refine import Refine
from reasonray.strategies.self_consistency import SelfConsistency
from reasonray.strategies.tree_of_thought import TreeOfThought
from tests.unit.strategy_harness import context_for

CLASSES: dict[str, type] = {cls.name: cls for cls in (ChainOfThought, BoundedContext, ReAct, TreeOfThought, SelfConsistency, Refine, Matts)}
CHUNK_SIZE = 2048
CASES: list[tuple[str, str, str, dict[str, Any]]] = [
    ("chain_of_thought", "chain_of_thought", "What is 17 * 23?", {}),
    (
        "bounded_context",
        "bounded_context",
        "[[sim think=3000 answer=7]] Think it through.",
        {"chunk_size": CHUNK_SIZE, "carryover_size": 1024, "max_iterations": 4},
    ),
    (
        "react",
        "react",
        'What is 2**10 + 3*7? [[sim call=calculator {"expression": "2**10"}]] [[sim call=calculator {"expression": "3*7"}]]',
        {"tools": ["calculator"]},
    ),
    ("tree_of_thought", "tree_of_thought", "What is 6 * 7? [[sim steps=2]]", {"breadth": 2}),
    ("self_consistency", "self_consistency", "What is 17 * 23?", {"samples": 5}),
    ("refine", "refine", "What is 17 * 23?", {}),
    ("matts-judge", "matts", "What is 17 * 23?", {"k": 3, "selection": "judge"}),
    ("matts-contrast", "matts", "What is 17 * 23?", {"k": 3, "selection": "contrast"}),
]
# (rate, seed): the seed picks which replies disobey and how, so two seeds at one rate cover more paths
MODELS = {"every reply disobeys": (1.0, 3), "half the replies disobey": (0.5, 3), "half of them, other draws": (0.5, 0)}
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@pytest.fixture(scope="module", params=list(MODELS), ids=list(MODELS))
def server(request: pytest.FixtureRequest):
    rate, seed = MODELS[request.param]
    srv = SimulatorServer(SimulatorSettings(port=0, disobey_rate=rate, seed=seed)).start()
    yield srv
    srv.stop()


@dataclass
class Run:
    result: ReasoningResult | None
    error: BaseException | None
    metrics: Any
    tool_events: list[ToolExecuted]
    stats: dict[str, Any]
    exchanges: list[dict[str, Any]]


def resolver(name: str, config: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    return CLASSES[name](), config


async def run(server: SimulatorServer, strategy: str, query: str, config: dict[str, Any]) -> Run:
    control = httpx.AsyncClient(base_url=server.url.rstrip("/"), verify=False)  # plain HTTP on loopback: no TLS set-up to pay for
    (await control.post("/sim/reset")).raise_for_status()
    retry = {"max_attempts": 2, "initial_backoff_s": 0.0, "max_backoff_s": 0.0, "jitter_s": 0.0}
    settings = Settings.model_validate(
        {"llm": {"provider": "simulated", "base_url": server.url, "retry": retry, "cache": {"enabled": False}}}
    )
    client: OpenAILLM = client_for(settings, environ={})
    llm, _ = build_llm(settings, client, None)
    context, recorder = context_for(llm, strategy=strategy)
    context.resolve = resolver
    result, error = None, None
    try:
        result = await asyncio.wait_for(CLASSES[strategy]().reason(query, context=context, config=config), timeout=60)
    except Exception as exc:  # judged below: a classified error is an acceptable end, anything else is not
        error = exc
    finally:
        await client.close()
    stats = (await control.get("/sim/stats")).json()
    exchanges = (await control.get("/sim/exchanges")).json()["exchanges"]
    await control.aclose()
    return Run(
        result=result,
        error=error,
        metrics=result.metrics if result is not None else context.metrics(),
        tool_events=[e for e in recorder.events if isinstance(e, ToolExecuted)],
        stats=stats,
        exchanges=exchanges,
    )


def final_number(text: str) -> str | None:
    found = NUMBER.findall(text.replace(",", ""))
    return found[-1] if found else None


def same_number(a: str | None, b: str) -> bool:
    try:
        return a is not None and float(a) == float(b)
    except ValueError:
        return False


@pytest.mark.parametrize(("strategy", "query", "config"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
async def test_every_strategy_survives_a_disobedient_model(
    server: SimulatorServer, strategy: str, query: str, config: dict[str, Any]
) -> None:
    outcome = await run(server, strategy, query, config)
    said = [s for e in outcome.exchanges for s in e["stated"] if s]
    replies = sum(len(e["finish_reasons"]) for e in outcome.exchanges)
    assert outcome.exchanges, "the strategy never reached the model"
    if server.settings.disobey_rate == 1.0:
        assert sum(outcome.stats["disobeyed"].values()) == replies  # the case exercises what it claims to

    # the run ends with a result or a classified error, and the server refused nothing it sent
    error = outcome.error
    assert error is None or (isinstance(error, ReasonRayError) and type(error) is not ReasonRayError), (
        f"{strategy} ended with an unclassified {type(error).__name__}: {error!r}"
    )
    assert outcome.stats["rejected"] == 0, f"{strategy} sent requests the server refused: {outcome.stats['last_rejection']}"

    # what the run reports is what the server reported
    usage = outcome.stats["usage"]
    assert (outcome.metrics.prompt_tokens, outcome.metrics.completion_tokens) == (usage["prompt_tokens"], usage["completion_tokens"]), (
        f"{strategy} reports {outcome.metrics.prompt_tokens}+{outcome.metrics.completion_tokens} tokens; the server reported "
        f"{usage['prompt_tokens']}+{usage['completion_tokens']}"
    )
    assert outcome.metrics.llm_calls == outcome.stats["requests"] == len(outcome.exchanges)

    # nothing degenerate preferred to a real attempt
    if outcome.result is not None:
        assert outcome.result.answer.strip(), f"{strategy} answered with nothing"
    if said:
        assert outcome.result is not None, f"{strategy} failed ({error!r}) although the model stated an answer {sorted(set(said))}"
        answer = outcome.result.answer.strip()
        assert answer in said or any(same_number(final_number(answer), s) for s in said), (
            f"{strategy} answered {answer[:300]!r}, none of the answers the model stated: {sorted(set(said))}"
        )

    # a call with arguments that are not a JSON object is never executed as if they were
    malformed = {c["id"] for e in outcome.exchanges for c in e["tool_calls"] if not _json_object(c["arguments"])}
    executed = {e.tool_call_id for e in outcome.tool_events if e.status == "ok"}
    assert not malformed & executed, f"{strategy} ran tools on arguments that are not JSON: {malformed & executed}"

    # a bounded-context chunk fits chunk_size by the model's own count
    if strategy == "bounded_context":
        chunks = [e["prompt_tokens"] + e["completion_tokens"] for e in outcome.exchanges]
        assert max(chunks) <= CHUNK_SIZE, f"chunks of {chunks} tokens by the server's count, above chunk_size {CHUNK_SIZE}"


def _json_object(arguments: str) -> bool:
    try:
        return isinstance(json.loads(arguments), dict)
    except json.JSONDecodeError:
        return False


def test_the_cases_cover_every_built_in_strategy() -> None:
    from reasonray.strategies.registry import StrategyRegistry

    found = StrategyRegistry().discover().classes
    built_in = {name for name, cls in found.items() if cls.__module__.startswith("reasonray.strategies.")}
    assert {c[1] for c in CASES} == built_in == set(CLASSES)
