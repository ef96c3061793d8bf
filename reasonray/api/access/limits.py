"""Rate limits and token budgets per principal: the counting, clock-driven, and its in-process client.

`RateLimiter` keeps, per key (a principal, or a principal and a strategy), a rolling window of
requests and the runs in flight in memory, and charges tokens to `TokenBudgets`: fixed windows (the
current minute, the current UTC day) in a `Counters` repository, which is the data directory's
`counters.sqlite3` or the cluster store's `counters` table when the application has one, so budgets
outlive the limiter and are shared with every limiter on the same store. The Serve replicas share
one limiter in a Ray actor (`reasonray.actors.tenancy`); `LocalLimits` is the same API in this
process for tests and scripts.
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, NotRequired, Protocol, TypedDict

import structlog

from reasonray.kernel.auth_settings import LimitSettings
from reasonray.kernel.errors import RateLimitedError
from reasonray.stores.counters import Counters, MemoryCounters, window_start

log = structlog.get_logger(__name__)

MINUTE_S = 60.0
DAY_S = 86_400.0
STALE_RUN_S = 3600.0  # a run slot held this long belonged to a replica that died: it is freed


LimitValues = dict[str, int]
"""The limits a key has, by `LimitSettings` name (the unset ones left out: those are unlimited)."""

KeyedLimits = list[tuple[str, LimitValues]]
"""(counter key, its limits) pairs a request is checked against, all of them."""


class Decision(TypedDict):
    """What `admit` answers: admitted (`ok`) with the tightest request window's headroom and the run slots taken,
    or refused, naming the key and the limit that refused and when to retry."""

    ok: bool
    limit: int | None
    remaining: int | None
    reset_s: NotRequired[float | None]
    run_id: NotRequired[str | None]
    run_ids: NotRequired[list[str]]
    budget_left: NotRequired[int | None]  # tokens the tightest budget has left, for a leased run
    key: NotRequired[str]
    limit_name: NotRequired[str]
    retry_after_s: NotRequired[float]


@dataclass
class _Window:
    requests: deque[float] = field(default_factory=deque)
    runs: dict[str, float] = field(default_factory=dict)
    expires: dict[str, float] = field(default_factory=dict)  # leased run slots: freed unless renewed by then


Budget = Literal["tokens_per_minute", "tokens_per_day"]
BUDGET_WINDOWS: dict[Budget, int] = {"tokens_per_minute": int(MINUTE_S), "tokens_per_day": int(DAY_S)}
"""Token budgets and the fixed window (seconds, aligned to the epoch: a minute, a UTC day) each counts in."""


class TokenBudgets:
    """Tokens charged per key and budget window, kept in a `Counters` repository.

    Reads are cached for `refresh_s` (a run's admission costs no store round trip while the cache is
    fresh; a limiter on another cluster sharing the store is seen that much later). Charges count at
    once here (`spent` adds what is not yet stored) and are written to the store at most every
    `flush_s`, summed per key and window, by the next charge or `flush_due` after that: one write per
    second rather than two durable writes per run (each file write is fsynced; measured 14 ms here).
    A limiter that dies loses what it had not written yet, at most `flush_s` of charges when its
    owner calls `flush_due` on a timer (the limiter actor does). A charge the store cannot take (it
    is down) is kept and written with the next flush: a finished run never fails for its bookkeeping.
    """

    def __init__(self, counters: Counters | None = None, refresh_s: float = 1.0, flush_s: float = 0.0) -> None:
        self.counters: Counters = counters if counters is not None else MemoryCounters()
        self.refresh_s = refresh_s
        self.flush_s = flush_s  # 0: every charge is written at once
        self._flushed_at = float("-inf")
        self._seen: dict[tuple[str, Budget], tuple[int, int, float]] = {}  # (key, budget) -> (window start, total, read at)
        self._pending: dict[tuple[str, Budget, int], int] = {}  # (key, budget, window start) -> tokens not yet stored

    def spent(self, key: str, budget: Budget, now: float) -> int:
        span = BUDGET_WINDOWS[budget]
        start = window_start(span, now)
        seen = self._seen.get((key, budget))
        if seen is None or seen[0] != start or now - seen[2] >= self.refresh_s:
            seen = (start, self.counters.get(f"{budget}:{key}", span, now), now)
            self._seen[(key, budget)] = seen
        return seen[1] + self._pending.get((key, budget, start), 0)

    def charge(self, key: str, tokens: int, now: float) -> None:
        for budget, span in BUDGET_WINDOWS.items():
            slot = (key, budget, window_start(span, now))
            self._pending[slot] = self._pending.get(slot, 0) + tokens
        self.flush_due(now)

    def flush_due(self, now: float) -> None:
        """Write the pending charges when `flush_s` has passed since the last write."""
        if self._pending and now - self._flushed_at >= self.flush_s:
            self.flush(now)

    def flush(self, now: float) -> None:
        self._flushed_at = now
        for (key, budget, start), tokens in list(self._pending.items()):
            span = BUDGET_WINDOWS[budget]
            try:
                total = self.counters.add(f"{budget}:{key}", tokens, span, now=start)
            except Exception as exc:  # the store is unreachable: keep the charge for the next flush
                log.warning("limits.charge_deferred", key=key, budget=budget, tokens=tokens, error=f"{type(exc).__name__}: {exc}"[:200])
                return
            del self._pending[(key, budget, start)]
            if start == window_start(span, now):
                self._seen[(key, budget)] = (start, total, now)


class RateLimiter:
    """Request windows and run slots in memory, token budgets in `TokenBudgets`; `admit` checks every key
    first and counts only when all of them allow."""

    def __init__(self, clock: Callable[[], float] = time.time, budgets: TokenBudgets | None = None) -> None:
        self.clock = clock
        self.budgets = budgets if budgets is not None else TokenBudgets()
        self._keys: dict[str, _Window] = {}

    def admit(self, keyed: KeyedLimits, *, requests: int = 1, run: bool = False, runs: int = 1, lease_s: float | None = None) -> Decision:
        """Check every key, then count the requests and take the run slots under each of them; or refuse.

        With `run`, `runs` run slots are taken at once (a replica's lease, `run_ids`); with `lease_s` they are
        freed that many seconds from now unless `renew`ed, so a replica that dies holding them frees them soon.
        """
        now = self.clock()
        headroom: list[tuple[int, int, float]] = []
        wanted = runs if run else 0
        for key, limits in keyed:
            c = self._window(key, now)
            if (refusal := self._refusal(key, c, limits, now, requests, wanted)) is not None:
                return {**refusal, "key": key}
            rpm = limits.get("requests_per_minute")
            if rpm:
                reset = (c.requests[0] + MINUTE_S - now) if c.requests else MINUTE_S
                headroom.append((rpm, rpm - len(c.requests) - requests, max(reset, 0.0)))
        run_ids = [uuid.uuid4().hex for _ in range(wanted)]
        for key, _ in keyed:
            c = self._keys[key]
            c.requests.extend([now] * requests)
            for run_id in run_ids:
                c.runs[run_id] = now
                if lease_s is not None:
                    c.expires[run_id] = now + lease_s
        limit, remaining, reset_s = min(headroom, key=lambda h: h[1]) if headroom else (None, None, None)
        # tokens the tightest budget of these keys has left (None: no budget), what a leased run may spend
        left = [lim[name] - self.budgets.spent(key, name, now) for key, lim in keyed for name in BUDGET_WINDOWS if run and lim.get(name)]
        return {
            "ok": True,
            "run_id": run_ids[0] if run_ids else None,
            "run_ids": run_ids,
            "limit": limit,
            "remaining": remaining,
            "reset_s": reset_s,
            "budget_left": min(left) if left else None,
        }

    def renew(self, keys: list[str], run_ids: list[str], lease_s: float) -> None:
        """Keep leased run slots (free or running) another `lease_s` seconds."""
        now = self.clock()
        for key in keys:
            c = self._window(key, now)
            for run_id in run_ids:
                if run_id in c.runs:
                    c.expires[run_id] = now + lease_s

    def release(self, keys: list[str], run_ids: list[str]) -> None:
        """Give back leased run slots that were not used."""
        now = self.clock()
        for key in keys:
            c = self._window(key, now)
            for run_id in run_ids:
                c.runs.pop(run_id, None)
                c.expires.pop(run_id, None)

    def finish(self, keys: list[str], run_id: str | None, tokens: int) -> None:
        """End a run: free its slot and charge the tokens it really used."""
        self.release(keys, [run_id] if run_id else [])
        now = self.clock()
        for key in keys if tokens > 0 else []:
            self.budgets.charge(key, tokens, now)

    def usage(self, key: str) -> dict[str, int]:
        now = self.clock()
        c = self._window(key, now)
        return {
            "requests_last_minute": len(c.requests),
            "runs_in_flight": len(c.runs),
            "tokens_this_minute": self.budgets.spent(key, "tokens_per_minute", now),
            "tokens_today": self.budgets.spent(key, "tokens_per_day", now),
        }

    def _window(self, key: str, now: float) -> _Window:
        c = self._keys.setdefault(key, _Window())
        while c.requests and c.requests[0] <= now - MINUTE_S:
            c.requests.popleft()
        # a leased slot lives while its replica renews it; any other one until STALE_RUN_S
        gone = [r for r, started in c.runs.items() if (c.expires[r] < now if r in c.expires else started <= now - STALE_RUN_S)]
        for run_id in gone:
            del c.runs[run_id]
            c.expires.pop(run_id, None)
        return c

    def _refusal(self, key: str, c: _Window, limits: LimitValues, now: float, requests: int, runs: int) -> Decision | None:
        rpm = limits.get("requests_per_minute")
        if rpm and len(c.requests) + requests > rpm:
            # the oldest requests leave the window first: wait until enough of them have
            index = min(len(c.requests) + requests - rpm - 1, len(c.requests) - 1)
            return _refused("requests_per_minute", rpm, c.requests[index] + MINUTE_S - now if index >= 0 else MINUTE_S)
        if not runs:
            return None
        concurrent = limits.get("concurrent_runs")
        if concurrent and len(c.runs) + runs > concurrent:
            return _refused("concurrent_runs", concurrent, 1.0)
        for name, span in BUDGET_WINDOWS.items():
            budget = limits.get(name)
            if budget and self.budgets.spent(key, name, now) >= budget:
                return _refused(name, budget, window_start(span, now) + span - now)  # when the budget's window ends
        return None


def _refused(name: str, limit: int, retry_after_s: float) -> Decision:
    return {"ok": False, "limit_name": name, "limit": limit, "remaining": 0, "retry_after_s": round(max(retry_after_s, 0.001), 3)}


def refusal_error(decision: Decision, sub: str) -> RateLimitedError:
    name = decision["limit_name"]
    what = {"tokens_per_minute": "token budget per minute", "tokens_per_day": "token budget per day"}.get(name, name.replace("_", " "))
    strategy = decision["key"].partition("|")[2]
    scope = f" for strategy {strategy!r}" if strategy else ""
    return RateLimitedError(
        f"rate limited: {sub!r} reached its {what}{scope} ({decision['limit']}); retry after {decision['retry_after_s']} s "
        "or ask an operator for a higher limit ([auth] roles / principals)",
        {k: decision[k] for k in ("retry_after_s", "limit_name", "limit", "remaining")},  # as `_refused` made them
    )


class Limits(Protocol):
    """The limiter as the guard uses it (in this process, or the cluster's shared actor)."""

    async def admit(self, keyed: KeyedLimits, *, run: bool, requests: int = 1) -> Decision:
        """Count `requests` requests (0: counted already, at the gate) and, with `run`, take a run slot."""
        ...

    async def finish(self, keys: list[str], run_id: str | None, tokens: int) -> None: ...

    async def usage(self, key: str) -> dict[str, int]: ...


class LocalLimits:
    """A `RateLimiter` in this process."""

    def __init__(self, limiter: RateLimiter | None = None) -> None:
        self.limiter = limiter or RateLimiter()

    async def admit(self, keyed: KeyedLimits, *, run: bool, requests: int = 1) -> Decision:
        return self.limiter.admit(keyed, requests=requests, run=run)

    async def finish(self, keys: list[str], run_id: str | None, tokens: int) -> None:
        self.limiter.finish(keys, run_id, tokens)

    async def usage(self, key: str) -> dict[str, int]:
        return self.limiter.usage(key)


def limited(limits: LimitSettings) -> LimitValues:
    """The configured limits only (None means unlimited and is left out)."""
    return limits.model_dump(exclude_none=True)


def own_statistics(server: dict[str, Any], usage: dict[str, int]) -> dict[str, Any]:
    """`stats.get` as a principal that does not see every principal's data gets it: its own usage (requests
    this minute, runs in flight, tokens this minute and today), the server-wide counters withheld (zero),
    so that nobody learns from them what the others ran."""
    zero_latency = {"count": 0, "mean_ms": None, "p50_ms": None, "p95_ms": None, "total_ms": 0.0}
    return {
        **{k: server[k] for k in ("since", "embedder", "trace_id") if k in server},
        "scope": "principal",
        "usage": usage,
        "traces": {**dict.fromkeys(("total", "success", "failure"), 0), "success_rate": None, "failure_rate": None},
        "items_stored": 0,
        "passive_learning": {},
        "runs": {"total": 0, "errors": 0},
        "llm": {
            **dict.fromkeys(("calls", "cache_hits", "retries", "prompt_tokens", "completion_tokens", "api_calls"), 0),
            "cache_hit_rate": None,
        },
        "retrieval": zero_latency,
        "embedding": zero_latency,
        "llm_cache": None,
    }
