"""Retries with exponential backoff and jitter inside a per-call deadline, and a circuit breaker per
model endpoint, wrapped around any LLM.

A `TransientProviderError` (429, 5xx, timeouts, connection errors) is retried; anything else fails
at once. Every attempt passes through the endpoint's breaker, which works like resilience4j's
time-based breaker (and Envoy's outlier detection): it keeps the outcomes of the last `window_s`
seconds and opens when at least `minimum_calls` were seen and `failure_rate_threshold` of them were
faults *of the endpoint* (HTTP 5xx, timeouts, refused connections). Answers about one request (400,
413, context too long, content filter) and rate limits (429, which the retry honours with its
Retry-After) say nothing about the endpoint's health and are not counted, so one caller whose requests
keep being rejected cannot make everyone fail fast. A rate, not a count: random 10% faults under high
concurrency stay far below the threshold, while a dead endpoint fills the window with failures within
`minimum_calls` attempts. After `reset_timeout_s` the breaker half-opens and lets `half_open_probes`
calls through; all of them succeeding closes it, any fault re-opens it.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

import msgspec
import structlog
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

from reasonray.gateway.capabilities import Layer
from reasonray.gateway.errors import (
    CircuitOpenError,
    ProviderUnavailableError,
    TransientProviderError,
)
from reasonray.gateway.protocol import LLM, Completion, LLMRequest

log = structlog.get_logger(__name__)

BreakerState = Literal["closed", "open", "half_open"]
Clock = Callable[[], float]

NOT_ENDPOINT_FAULTS = frozenset({429})
"""Transient statuses that say "slow down", not "broken": retried, never counted by the breaker."""


def is_endpoint_fault(exc: BaseException) -> bool:
    """Whether a failed attempt says the endpoint is unhealthy (5xx, timeout, connection refused)."""
    return isinstance(exc, TransientProviderError) and exc.status_code not in NOT_ENDPOINT_FAULTS


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 4
    initial_backoff_s: float = 1.0
    max_backoff_s: float = 8.0
    jitter_s: float = 0.5
    deadline_s: float | None = None
    """No retry starts later than this many seconds after the call began (None: only max_attempts)."""

    def backoff(self, attempt: int, retry_after_s: float | None = None, rng: Callable[[float, float], float] = random.uniform) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based): 1 s, 2 s, 4 s... plus jitter."""
        wait = self.initial_backoff_s * 2 ** (attempt - 1) + rng(0, self.jitter_s)
        if retry_after_s is not None:  # the provider said how long to wait; never retry sooner
            wait = max(wait, retry_after_s)
        return float(min(wait, self.max_backoff_s))


@dataclass(eq=False, repr=False)
class CircuitBreaker:
    """Failure-rate breaker over a sliding time window. One instance guards one endpoint in one process
    (`breaker_for`); it is used from one event loop per process, and a lock keeps threads safe too."""

    failure_rate_threshold: float = 0.5
    minimum_calls: int = 20
    window_s: float = 2.0
    reset_timeout_s: float = 10.0
    half_open_probes: int = 3
    clock: Clock = time.monotonic
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _outcomes: deque[tuple[float, bool]] = field(default_factory=deque, init=False)  # (when, was a fault), oldest first
    _faults: int = field(default=0, init=False)
    _opened_at: float | None = field(default=None, init=False)
    _last_rate: float = field(default=0.0, init=False)
    _probes_started: int = field(default=0, init=False)
    _probes_succeeded: int = field(default=0, init=False)

    @property
    def state(self) -> BreakerState:
        if self._opened_at is None:
            return "closed"
        if self.clock() - self._opened_at >= self.reset_timeout_s:
            return "half_open"
        return "open"

    def failure_rate(self) -> float:
        """The share of faults among the calls of the current window (0 when there were none)."""
        with self._lock:
            self._expire(self.clock())
            return self._faults / len(self._outcomes) if self._outcomes else 0.0

    def before_call(self) -> None:
        """Raise CircuitOpenError unless a call may go through now."""
        with self._lock:
            state = self.state
            if state == "closed":
                return
            if state == "half_open" and self._probes_started < self.half_open_probes:
                self._probes_started += 1
                return
            assert self._opened_at is not None
            retry_after = max(0.0, self.reset_timeout_s - (self.clock() - self._opened_at))
        if state == "half_open":
            retry_after = 0.0  # the probes are out; their outcome decides within one call's time
        raise CircuitOpenError(
            f"LLM circuit breaker is open: {self._last_rate:.0%} of the endpoint's last calls failed; "
            f"calls fail fast for another {retry_after:.1f}s. Check the provider, then retry.",
            retry_after_s=retry_after,
        )

    def record_success(self) -> None:
        with self._lock:
            if self._opened_at is not None:  # only probes count now; a late reply from before the opening does not
                if self.state == "half_open":
                    self._probes_succeeded += 1
                    if self._probes_succeeded >= self.half_open_probes:  # closed: the window starts afresh
                        self._opened_at, self._faults, self._probes_started, self._probes_succeeded = None, 0, 0, 0
                        self._outcomes.clear()
                        log.info("llm.breaker.closed")
                return
            self._record(False)

    def record_failure(self) -> None:
        """An endpoint fault (5xx, timeout, connection): counts towards the rate; re-opens a half-open breaker."""
        with self._lock:
            if self._opened_at is not None:
                if self.state == "half_open":
                    self._open(self._last_rate)
                return
            self._record(True)
            calls = len(self._outcomes)
            rate = self._faults / calls
            if calls >= self.minimum_calls and rate >= self.failure_rate_threshold:
                self._open(rate)

    def release_probe(self) -> None:
        """A call ended without telling us about the endpoint (a rejected request, a 429, a cancellation)."""
        with self._lock:
            if self._opened_at is not None and self._probes_started > self._probes_succeeded:
                self._probes_started -= 1

    def _record(self, fault: bool) -> None:
        now = self.clock()
        self._outcomes.append((now, fault))
        self._faults += fault
        self._expire(now)

    def _expire(self, now: float) -> None:
        while self._outcomes and now - self._outcomes[0][0] > self.window_s:
            _, fault = self._outcomes.popleft()
            self._faults -= fault

    def _open(self, rate: float) -> None:
        self._opened_at = self.clock()
        self._last_rate = rate
        self._probes_started = self._probes_succeeded = 0
        log.warning("llm.breaker.opened", failure_rate=round(rate, 3), calls=len(self._outcomes))


_breakers: dict[tuple[str, tuple[tuple[str, float], ...]], CircuitBreaker] = {}
_breakers_lock = threading.Lock()


def breaker_for(endpoint: str, **settings: float) -> CircuitBreaker:
    """The process's one breaker for `endpoint` (with these settings): every LLM stack calling the same
    endpoint from this process sees, and feeds, the same health."""
    key = (endpoint, tuple(sorted(settings.items())))
    with _breakers_lock:
        return _breakers.setdefault(key, CircuitBreaker(**settings))  # type: ignore[arg-type]  # keyword settings of CircuitBreaker


class ResilientLLM(Layer):
    """Retries transient failures within the policy's deadline and guards the endpoint with its breaker."""

    def __init__(
        self,
        inner: LLM,
        retry: RetryPolicy | None = None,
        breaker: CircuitBreaker | None = None,
        *,
        endpoint: str = "",
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Clock = time.monotonic,
    ) -> None:
        self.inner = inner
        self.retry = retry or RetryPolicy()
        self.breaker = breaker or CircuitBreaker(clock=clock)
        self.endpoint = endpoint
        self.sleep = sleep
        self.clock = clock

    async def _attempt(self, request: LLMRequest, spent: list[int]) -> Completion:
        """One attempt through the breaker; a failed one adds what it cost to `spent` (it was made and paid for)."""
        self.breaker.before_call()
        try:
            completion = await self.inner.complete(request)
        except BaseException as exc:
            if isinstance(exc, TransientProviderError):
                spent[:] = spent[0] + exc.spent[0], spent[1] + exc.spent[1]
            if is_endpoint_fault(exc):
                self.breaker.record_failure()
            else:  # a rejected request, a 429, a cancellation: nothing said about the endpoint's health
                self.breaker.release_probe()
            raise
        self.breaker.record_success()
        return completion

    async def complete(self, request: LLMRequest) -> Completion:
        policy, started = self.retry, self.clock()

        def failed(state: RetryCallState) -> BaseException | None:
            return state.outcome.exception() if state.outcome else None

        retrying = AsyncRetrying(
            # no retry starts past the policy's deadline
            stop=lambda state: (
                state.attempt_number >= policy.max_attempts
                or (policy.deadline_s is not None and self.clock() + state.upcoming_sleep - started > policy.deadline_s)
            ),
            wait=lambda state: policy.backoff(state.attempt_number, getattr(failed(state), "retry_after_s", None)),  # its Retry-After
            retry=retry_if_exception_type(TransientProviderError),
            before_sleep=lambda state: log.warning("llm.retry", attempt=state.attempt_number, error=str(failed(state))[:200]),
            sleep=self.sleep,
            reraise=True,
        )
        attempts = 0
        spent = [0, 0]  # what failed attempts cost: they were made and paid for
        try:
            async for attempt in retrying:
                with attempt:
                    attempts = attempt.retry_state.attempt_number
                    completion = await self._attempt(request, spent)
        except TransientProviderError as exc:
            error = ProviderUnavailableError(
                f"LLM provider {self.endpoint or self.model!r} failed after {attempts} attempt(s); last error: {exc}",
                attempts=attempts,
                cause=str(exc),
                status_code=exc.status_code,
            )
            error.spent = (spent[0], spent[1])
            raise error from exc
        used = completion.usage  # with what the attempts before it cost (a stream cut midway, a timeout)
        usage = msgspec.structs.replace(
            used, prompt_tokens=used.prompt_tokens + spent[0], completion_tokens=used.completion_tokens + spent[1]
        )
        return msgspec.structs.replace(completion, usage=usage, attempts=attempts)
