"""Rate limits and token budgets per principal: the counting, pure and clock-driven, and its in-process client.

`RateLimiter` keeps, per key (a principal, or a principal and a strategy), rolling windows of
requests and tokens and the runs in flight. The Serve replicas share one limiter in a Ray actor
(`reasonray.actors.limits`); `LocalLimits` is the same API in this process for tests and scripts.
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from reasonray.kernel.auth_settings import LimitSettings
from reasonray.kernel.errors import RateLimitedError

MINUTE_S = 60.0
DAY_S = 86_400.0
STALE_RUN_S = 3600.0  # a run slot held this long belonged to a replica that died: it is freed

KeyedLimits = list[tuple[str, dict[str, Any]]]
"""(counter key, LimitSettings as a dict) pairs a request is checked against, all of them."""


@dataclass
class _Counters:
    requests: deque[float] = field(default_factory=deque)
    tokens_minute: deque[tuple[float, int]] = field(default_factory=deque)
    tokens_day: deque[tuple[float, int]] = field(default_factory=deque)
    runs: dict[str, float] = field(default_factory=dict)


class RateLimiter:
    """Rolling-window counters; `admit` checks every key first and counts only when all of them allow."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._keys: dict[str, _Counters] = {}

    def admit(self, keyed: KeyedLimits, *, requests: int = 1, run: bool = False) -> dict[str, Any]:
        """{"ok": True, "run_id", "limit", "remaining", "reset_s"} or {"ok": False, "limit_name", "retry_after_s", ...}."""
        now = self.clock()
        headroom: list[tuple[int, int, float]] = []
        for key, limits in keyed:
            c = self._counters(key, now)
            refusal = _refusal(c, limits, now, requests, run)
            if refusal is not None:
                return {"ok": False, "key": key, **refusal}
            rpm = limits.get("requests_per_minute")
            if rpm:
                reset = (c.requests[0] + MINUTE_S - now) if c.requests else MINUTE_S
                headroom.append((rpm, rpm - len(c.requests) - requests, max(reset, 0.0)))
        run_id = uuid.uuid4().hex if run else None
        for key, _ in keyed:
            c = self._keys[key]
            c.requests.extend([now] * requests)
            if run_id:
                c.runs[run_id] = now
        tightest = min(headroom, key=lambda h: h[1]) if headroom else None
        limit, remaining, reset_s = tightest if tightest is not None else (None, None, None)
        return {"ok": True, "run_id": run_id, "limit": limit, "remaining": remaining, "reset_s": reset_s}

    def finish(self, keys: list[str], run_id: str | None, tokens: int) -> None:
        """End a run: free its slot and charge the tokens it really used."""
        now = self.clock()
        for key in keys:
            c = self._counters(key, now)
            if run_id:
                c.runs.pop(run_id, None)
            if tokens > 0:
                c.tokens_minute.append((now, tokens))
                c.tokens_day.append((now, tokens))

    def usage(self, key: str) -> dict[str, int]:
        c = self._counters(key, self.clock())
        return {
            "requests_last_minute": len(c.requests),
            "runs_in_flight": len(c.runs),
            "tokens_last_minute": sum(n for _, n in c.tokens_minute),
            "tokens_last_day": sum(n for _, n in c.tokens_day),
        }

    def _counters(self, key: str, now: float) -> _Counters:
        c = self._keys.setdefault(key, _Counters())
        while c.requests and c.requests[0] <= now - MINUTE_S:
            c.requests.popleft()
        while c.tokens_minute and c.tokens_minute[0][0] <= now - MINUTE_S:
            c.tokens_minute.popleft()
        while c.tokens_day and c.tokens_day[0][0] <= now - DAY_S:
            c.tokens_day.popleft()
        for run_id in [r for r, started in c.runs.items() if started <= now - STALE_RUN_S]:
            del c.runs[run_id]
        return c


def _refusal(c: _Counters, limits: dict[str, Any], now: float, requests: int, run: bool) -> dict[str, Any] | None:
    rpm = limits.get("requests_per_minute")
    if rpm and len(c.requests) + requests > rpm:
        # the oldest requests leave the window first: wait until enough of them have
        index = min(len(c.requests) + requests - rpm - 1, len(c.requests) - 1)
        return (
            _refused("requests_per_minute", rpm, c.requests[index] + MINUTE_S - now)
            if index >= 0
            else _refused("requests_per_minute", rpm, MINUTE_S)
        )
    if not run:
        return None
    concurrent = limits.get("concurrent_runs")
    if concurrent and len(c.runs) >= concurrent:
        return _refused("concurrent_runs", concurrent, 1.0)
    for name, window, span in (("tokens_per_minute", c.tokens_minute, MINUTE_S), ("tokens_per_day", c.tokens_day, DAY_S)):
        budget = limits.get(name)
        if budget and sum(n for _, n in window) >= budget:
            return _refused(name, budget, _until_under(window, budget, now, span))
    return None


def _until_under(window: deque[tuple[float, int]], budget: int, now: float, span: float) -> float:
    """Seconds until enough charged tokens leave the window for the total to fall under the budget."""
    total = sum(n for _, n in window)
    for at, n in window:
        total -= n
        if total < budget:
            return at + span - now
    return span


def _refused(name: str, limit: int, retry_after_s: float) -> dict[str, Any]:
    return {"limit_name": name, "limit": limit, "remaining": 0, "retry_after_s": round(max(retry_after_s, 0.001), 3)}


def refusal_error(decision: dict[str, Any], sub: str) -> RateLimitedError:
    name = decision["limit_name"]
    what = {"tokens_per_minute": "token budget per minute", "tokens_per_day": "token budget per day"}.get(name, name.replace("_", " "))
    strategy = decision["key"].partition("|")[2]
    scope = f" for strategy {strategy!r}" if strategy else ""
    return RateLimitedError(
        f"rate limited: {sub!r} reached its {what}{scope} ({decision['limit']}); retry after {decision['retry_after_s']} s "
        "or ask an operator for a higher limit ([auth] roles / principals)",
        {
            "retry_after_s": decision["retry_after_s"],
            "limit_name": name,
            "limit": decision["limit"],
            "remaining": 0,
        },
    )


class Limits(Protocol):
    """The limiter as the guard uses it (in this process, or the cluster's shared actor)."""

    async def admit(self, keyed: KeyedLimits, *, run: bool) -> dict[str, Any]: ...

    async def finish(self, keys: list[str], run_id: str | None, tokens: int) -> None: ...


class LocalLimits:
    """A `RateLimiter` in this process."""

    def __init__(self, limiter: RateLimiter | None = None) -> None:
        self.limiter = limiter or RateLimiter()

    async def admit(self, keyed: KeyedLimits, *, run: bool) -> dict[str, Any]:
        return self.limiter.admit(keyed, run=run)

    async def finish(self, keys: list[str], run_id: str | None, tokens: int) -> None:
        self.limiter.finish(keys, run_id, tokens)


def limited(limits: LimitSettings) -> dict[str, Any]:
    """The configured limits only (None means unlimited and is left out)."""
    return limits.model_dump(exclude_none=True)
