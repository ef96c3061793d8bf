"""The DSPy side of bench/peers.py, run with .venv-peers/bin/python (DSPy is never installed in the
project's .venv). It reads a plan as JSON on stdin and prints the figures as JSON on stdout:

    {"base_url": "http://127.0.0.1:PORT/v1", "warmup": [[query, expected], ...],
     "runs": [{"workload": "cot" | "sc", "concurrency": 16, "questions": [[query, expected], ...]}, ...]}

-> {"runs": [{"latencies": [s, ...], "wall_s": s, "right": n, "errors": {kind: n}, "calls": n}, ...]}

Workloads: `cot` is one async `dspy.ChainOfThought("question -> answer")` call (`acall`) per request;
`sc` is five of them in flight at once (`asyncio.gather`, temperature 1.0, a distinct `rollout_id` each)
and a majority vote over their answers. DSPy's cache is off (`cache=False`), so every sample reaches the
model. `calls` is the simulator's own request count (`GET /v1/sim/stats`) over the run, warm-up excluded.

The one adaptation: the simulated model writes `<thinking>...</thinking>` then `<answer>...</answer>`
whatever format a prompt asks for, so the adapter is DSPy's own XMLAdapter that reads `<thinking>` as the
`reasoning` field (without it DSPy fails to parse and retries through JSONAdapter, a second call).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import urllib.request
from collections import Counter

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of litellm's price list at import
os.environ.setdefault("DSPY_CACHEDIR", os.path.join(os.environ.get("TMPDIR", "/tmp"), "reasonray-bench-dspy-cache"))

import dspy


class SimXMLAdapter(dspy.XMLAdapter):
    """DSPy's XMLAdapter, reading the simulator's `<thinking>` block as the `reasoning` output field."""

    def __init__(self) -> None:
        super().__init__(use_json_adapter_fallback=False)

    def parse(self, signature, completion: str):
        text = completion.replace("<thinking>", "<reasoning>").replace("</thinking>", "</reasoning>")
        return super().parse(signature, text)


def sim_requests(base_url: str) -> int:
    with urllib.request.urlopen(f"{base_url}/sim/stats", timeout=10) as reply:
        return int(json.load(reply)["requests"])


async def cot_request(program: dspy.Module, query: str) -> str:
    prediction = await program.acall(question=query)
    return str(prediction.answer).strip()


async def sc_request(program: dspy.Module, query: str, samples: int = 5) -> str:
    predictions = await asyncio.gather(
        *(program.acall(question=query, config={"temperature": 1.0, "rollout_id": k}) for k in range(samples)),
        return_exceptions=True,
    )
    answers = [str(p.answer).strip() for p in predictions if not isinstance(p, BaseException)]
    if not answers:
        raise next(p for p in predictions if isinstance(p, BaseException))
    return Counter(answers).most_common(1)[0][0]


async def run(program: dspy.Module, workload: str, concurrency: int, questions: list[list[str]]) -> dict:
    request = cot_request if workload == "cot" else sc_request
    latencies: list[float] = []
    errors: dict[str, int] = {}
    right = 0
    queue = iter(questions)

    async def worker() -> None:
        nonlocal right
        for query, expected in queue:
            started = time.perf_counter()
            try:
                answer = await request(program, query)
                right += answer == expected
            except Exception as exc:
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return {"latencies": latencies, "wall_s": time.perf_counter() - started, "right": right, "errors": errors}


async def main() -> None:
    plan = json.load(sys.stdin)
    lm = dspy.LM("openai/simulated", api_base=plan["base_url"], api_key="simulated", cache=False, num_retries=0)
    dspy.configure(lm=lm, adapter=SimXMLAdapter())
    program = dspy.ChainOfThought("question -> answer")
    for query, _ in plan.get("warmup", []):  # first calls open connections and build the prompt templates
        await cot_request(program, query)
    results = []
    for spec in plan["runs"]:
        before = sim_requests(plan["base_url"])
        figures = await run(program, spec["workload"], spec["concurrency"], spec["questions"])
        figures["calls"] = sim_requests(plan["base_url"]) - before
        results.append(figures)
        print(
            f"dspy {spec['workload']} @{spec['concurrency']}: {len(figures['latencies'])} requests in {figures['wall_s']:.1f} s",
            file=sys.stderr,
            flush=True,
        )
    json.dump({"dspy": dspy.__version__, "runs": results}, sys.stdout)


if __name__ == "__main__":
    asyncio.run(main())
