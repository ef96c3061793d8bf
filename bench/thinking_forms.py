"""Every strategy over the simulated reasoning model in each form a server hands thinking over in, through the real
OpenAI-compatible client over HTTP, and bounded context's delethink carryover against its summary carryover.

    .venv/bin/python bench/thinking_forms.py

1. Per form (plain: no thinking; field: `reasoning_content`; r1: raw text closed by `</think>`; hidden: OpenAI's,
   with its refusals) and strategy: the run's calls and prompt / completion / reasoning tokens as ReasonRay counted
   them against the simulator's own usage (they must match exactly), or the error the run ended with.
2. Bounded context on the thinking model (thinking=3000 tokens, chunk_size=1024, carryover_size=512), delethink
   against summary: iterations, tokens, whether the run answered and whether any chunk started its thinking over
   (its first thought marker below the furthest one before it).
"""

from __future__ import annotations

import asyncio
from typing import Any

import _env  # noqa: F401  (sets up the environment first)
import httpx

from reasonray.api.app import local_dispatcher
from reasonray.gateway.openai_client import OpenAILLM
from reasonray.gateway.simulator.reasoning import THOUGHT
from reasonray.gateway.simulator.server import SimulatorServer, SimulatorSettings
from tests.unit.thinking_forms_setup import FORMS, MODEL, REASONING, STRATEGIES, Recorded

KEYS = ("calls", "prompt_tokens", "completion_tokens", "reasoning_tokens")


async def run(
    http: httpx.AsyncClient, url: str, form: str, strategy: str, config: dict[str, Any], thinking: int
) -> tuple[dict, dict, Recorded]:
    await http.post("/sim/reset")
    await http.post("/sim/reasoning", json={"form": "off" if form == "plain" else form, "thinking_tokens": thinking})
    llm = Recorded(OpenAILLM(MODEL[form], base_url=url, api_key="x", discover=False))
    request = {"query": "What is 17 * 23?", "strategy": strategy, "strategy_config": config}
    payload, _ = await local_dispatcher(REASONING, llm).handle_payload(
        {"jsonrpc": "2.0", "id": 1, "method": "reasoning.execute", "params": request}, None
    )
    stats = (await http.get("/sim/stats")).json()
    server = {"calls": stats["requests"], **stats["usage"], "refused": stats["rejected"]}
    return payload, server, llm


def ours(payload: dict) -> dict[str, int] | None:
    if "result" in payload:
        m = payload["result"]["metrics"]
        return {"calls": m["llm_calls"], **{k: m[k] for k in KEYS[1:]}}
    partial = (payload["error"].get("data") or {}).get("partial") or {}
    return {k: partial[k] for k in KEYS if k in partial} or None


def outcome(payload: dict) -> str:
    if "result" in payload:
        return f"answer {payload['result']['answer']!r}"
    return f"error {payload['error']['code']}"


async def counts_table(http: httpx.AsyncClient, url: str) -> None:
    print("## The run's counts against the server's usage (thinking=200)\n")
    print("| form | strategy | outcome | calls (ours/server) | prompt | completion | reasoning | match |")
    print("|---|---|---|---|---|---|---|---|")
    for form in FORMS:
        for strategy, config in STRATEGIES.items():
            payload, server, _ = await run(http, url, form, strategy, config, 200)
            mine = ours(payload) or {}
            cells = [f"{mine.get(k, '-')}/{server[k]}" for k in KEYS]
            match = all(mine.get(k) == server[k] for k in KEYS) if mine else server["calls"] == 0
            refused = f" ({server['refused']} refused)" if server["refused"] else ""
            print(f"| {form} | {strategy} | {outcome(payload)}{refused} | " + " | ".join(cells) + f" | {'yes' if match else 'NO'} |")


def restarted(llm: Recorded) -> int:
    """Chunks whose thinking began below the furthest thought marker shown before them."""
    furthest, restarts = -1, 0
    for request, completion in llm.calls:
        if request.purpose is not None:
            continue
        marks = [int(done) for done, _ in THOUGHT.findall(completion.reasoning)]
        if marks and furthest >= 0 and marks[0] < furthest:
            restarts += 1
        furthest = max([furthest, *marks])
    return restarts


async def carryover_table(http: httpx.AsyncClient, url: str) -> None:
    print("\n## Bounded context on the thinking model (thinking=3000, chunk_size=1024, carryover_size=512)\n")
    print(
        "| form | carryover | outcome | iterations | calls | prompt | completion | reasoning | ours match | thinking reached | chunks restarted |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for form in ("field", "r1"):
        for mode in ("delethink", "summary"):
            config = {"chunk_size": 1024, "carryover_size": 512, "carryover_mode": mode, "max_iterations": 10}
            payload, server, llm = await run(http, url, form, "bounded_context", config, 3000)
            chunks = [completion for request, completion in llm.calls if request.purpose is None]
            reached = max((int(done) for c in chunks for done, _ in THOUGHT.findall(c.reasoning)), default=0)
            mine = ours(payload) or {}
            match = (
                "yes"
                if all(mine.get(k) == server[k] for k in KEYS)
                else "NO: " + ", ".join(f"{k} {mine.get(k)}" for k in KEYS if mine.get(k) != server[k])
            )
            print(
                f"| {form} | {mode} | {outcome(payload)} | {len(chunks)} | {server['calls']} | {server['prompt_tokens']} | "
                f"{server['completion_tokens']} | {server['reasoning_tokens']} | {match} | {reached}/3000 | {restarted(llm)} |"
            )


async def main() -> None:
    server = SimulatorServer(SimulatorSettings(port=0)).start()
    try:
        async with httpx.AsyncClient(base_url=server.url) as http:
            await counts_table(http, server.url)
            await carryover_table(http, server.url)
    finally:
        server.stop()


if __name__ == "__main__":
    asyncio.run(main())
