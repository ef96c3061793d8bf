"""`reasonray eval --url`: an evaluation over HTTP through the running service and the real model; every
example's record holds the calls and tokens the server counted for it, failed examples included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime

from tests.real.conftest import CLASSIFIED, REPO

DATASET = REPO / "reasonray" / "evals" / "samples" / "arithmetic.jsonl"


def test_eval_over_http_records_what_the_server_counted(service, recorder, tmp_path):
    out = tmp_path / "eval"
    command = [
        sys.executable,
        "-c",
        "from reasonray.cli import main; main()",
        "eval",
        "--url",
        service.url,
        "--dataset",
        str(DATASET),
        "--limit",
        "3",
        "--strategies",
        "chain_of_thought,self_consistency",
        "--config",
        'chain_of_thought:small={"max_tokens": 96}',
        "--config",
        'self_consistency:small={"samples": 3, "max_tokens": 96}',
        "--concurrency",
        "1",  # one example at a time: the server's calls fall in each example's own time window
        "--out",
        str(out),
        "--no-progress",
    ]
    wall_minus_monotonic = time.time() - time.monotonic()
    mark = recorder.mark()
    run = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    recorder.wait_idle()
    assert run.returncode in (0, 1), run.stderr[-3000:]  # 1: the evaluation ran and some example failed
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(records) == 6
    calls = recorder.since(mark)
    for record in records:
        finished = datetime.fromisoformat(record["finished_at"]).timestamp() - wall_minus_monotonic
        started = finished - record["latency_ms"] / 1000
        # a call of this example arrived after it started and before its answer; the next example starts at once
        mine = [c for c in calls if started - 0.05 <= c.arrived <= finished]
        if record["status"] == "error":
            assert record["error_code"] in CLASSIFIED and record["error_type"], record
        else:
            assert record["model"] == "smollm2" and record["simulated"] is False
        # failed examples too: the calls they made were paid for
        # a call the server cut short and ReasonRay sent again is a retry: each attempt is a request it saw
        assert record["llm_calls"] + record["retries"] == len(mine), (
            record["example_id"],
            record["strategy"],
            record["status"],
            record["llm_calls"],
            len(mine),
        )
        reported = [c for c in mine if c.usage]
        prompt = sum(c.usage["prompt_tokens"] for c in reported)
        completion = sum(c.usage["completion_tokens"] for c in reported)
        if len(reported) == len(mine):
            assert (record["prompt_tokens"], record["completion_tokens"]) == (prompt, completion), record
        else:  # streams the server cut short (its default --interrupt_requests) report no usage: they were retried, and charged on top
            assert len(mine) - len(reported) == record["retries"], record
            assert record["prompt_tokens"] > prompt and record["completion_tokens"] >= completion, record
    report = json.loads((out / "report.json").read_text())
    assert report["simulated"] is False and report["model"] == "smollm2"
    [comparison] = report["comparisons"]
    assert comparison["paired"] == 3 and 0.0 <= comparison["mcnemar_p"] <= 1.0
    assert (out / "pareto.png").read_bytes()[:4] == b"\x89PNG"
    assert "## Paired comparisons" in (out / "report.md").read_text()
