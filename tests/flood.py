"""A flooding client in a process of its own, as an attacker's script is: `python -m tests.flood SPEC` sends
`count` JSON-RPC calls at once, each on a connection of its own that closes when the caller gives up after
`timeout_s`, and prints each call's outcome (its JSON-RPC error code, its HTTP status, or "timeout") and how
long it took as one JSON line.

Out of the measuring test's process on purpose: 150 threads there compete with the test's own probes for one
interpreter lock, so what the test timed was its own client, not the service."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from typing import Any

import httpx


async def _flood(spec: dict[str, Any]) -> list[dict[str, Any]]:
    # no kept-alive connections: every call opens its own and closes it when it ends or its caller gives up
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=spec["base_url"], limits=limits, timeout=spec["timeout_s"]) as client:

        async def one(i: int) -> dict[str, Any]:
            body = {
                "jsonrpc": "2.0",
                "method": spec["method"],
                "params": json.loads(json.dumps(spec["params"]).replace("{i}", str(i))),
                "id": i,
            }
            headers = {**spec["headers"], **(spec["odd_headers"] if i % 2 else {})}
            started = time.monotonic()
            try:
                response = await client.post("/rpc", json=body, headers=headers)
                payload = response.json()
                outcome: int | str = payload["error"]["code"] if "error" in payload else response.status_code
            except httpx.TimeoutException:
                outcome = "timeout"
            return {"i": i, "outcome": outcome, "s": round(time.monotonic() - started, 3)}

        return list(await asyncio.gather(*(one(i) for i in range(spec["count"]))))


def start(spec: dict[str, Any]) -> subprocess.Popen[str]:
    """The flood, started (`finish` collects its outcomes). `spec`: base_url, method, params (a "{i}" in them
    becomes the call's number), headers, odd_headers (added to odd-numbered calls), count, timeout_s."""
    return subprocess.Popen([sys.executable, "-m", "tests.flood", json.dumps(spec)], stdout=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str], timeout_s: float = 120) -> list[dict[str, Any]]:
    out, _ = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, out
    return list(json.loads(out.strip().splitlines()[-1]))


if __name__ == "__main__":
    print(json.dumps(asyncio.run(_flood(json.loads(sys.argv[1])))))
