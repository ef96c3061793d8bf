"""A flooding client in a process of its own, as an attacker's script is: `python -m tests.flood SPEC` sends
`count` JSON-RPC calls at once, each on a connection of its own that closes when the caller gives up after
`timeout_s`, and prints each call's outcome (its JSON-RPC error code, its HTTP status, or "timeout") and how
long it took, one JSON line per call as it ends (so a test can tell when the refusals are in).

Out of the measuring test's process on purpose: 150 threads there compete with the test's own probes for one
interpreter lock, so what the test timed was its own client, not the service."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
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
            result = {"i": i, "outcome": outcome, "s": round(time.monotonic() - started, 3)}
            print(json.dumps(result), flush=True)
            return result

        return list(await asyncio.gather(*(one(i) for i in range(spec["count"]))))


class Flood:
    """A running flood: its calls' outcomes as they end."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.flood", json.dumps(spec)], stdout=subprocess.PIPE, text=True)
        self.calls: list[dict[str, Any]] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                self.calls.append(json.loads(line))
                self._changed.notify_all()

    def wait_ended(self, done: Callable[[int], bool], timeout_s: float) -> int:
        """Wait until `done(calls ended so far)` holds (or `timeout_s`); how many calls have ended. `done` is
        asked again at least every 50 ms, so it may also read state outside the flood (what a server holds)."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not done(len(self.calls)) and time.monotonic() < deadline:
                self._changed.wait(timeout=0.05)
            return len(self.calls)

    def finish(self, timeout_s: float = 120) -> list[dict[str, Any]]:
        assert self.proc.wait(timeout=timeout_s) == 0
        self._reader.join(timeout=10)
        return list(self.calls)


def start(spec: dict[str, Any]) -> Flood:
    """The flood, started (`finish` collects its outcomes). `spec`: base_url, method, params (a "{i}" in them
    becomes the call's number), headers, odd_headers (added to odd-numbered calls), count, timeout_s."""
    return Flood(spec)


def finish(flood: Flood, timeout_s: float = 120) -> list[dict[str, Any]]:
    return flood.finish(timeout_s)


if __name__ == "__main__":
    asyncio.run(_flood(json.loads(sys.argv[1])))
