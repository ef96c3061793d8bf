"""Retries with exponential backoff and jitter, and a circuit breaker, wrapped around any LLM.

A `TransientProviderError` (429, 5xx, timeouts, connection errors) is retried; anything else fails
at once. Every attempt passes through the breaker: after `failure_threshold` consecutive transient
failures it opens and calls fail fast with `CircuitOpenError`; after `reset_timeout_s` one trial
call is let through (half-open), whose outcome closes or re-opens it.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

import msgspec
import structlog
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt

from gateway.errors import CircuitOpenError, ProviderUnavailableError, TransientProviderError
from gateway.protocol import LLM, Completion, LLMRequest

log = structlog.get_logger(__name__)

BreakerState = Literal["closed", "open", "half_open"]


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 3
    initial_backoff_s: float = 1.0
    max_backoff_s: float = 8.0
    jitter_s: float = 0.5

    def backoff(self, attempt: int, retry_after_s: float | None = None) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based): 1 s, 2 s, 4 s... plus jitter."""
        wait = self.initial_backoff_s * 2 ** (attempt - 1) + random.uniform(0, self.jitter_s)
        if retry_after_s is not None:  # the provider said how long to wait; never retry sooner
            wait = max(wait, retry_after_s)
        return min(wait, self.max_backoff_s)


class CircuitBreaker:
    """Consecutive-failure breaker. One instance guards one endpoint within one process."""

    def __init__(
        self,
        failure_threshold: int = 5,
        reset_timeout_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.failure_threshold = failure_threshold
        self.reset_timeout_s = reset_timeout_s
        self._clock = clock
        self._failures = 0
        self._opened_at: float | None = None
        self._trial_in_flight = False

    @property
    def state(self) -> BreakerState:
        if self._opened_at is None:
            return "closed"
        if self._clock() - self._opened_at >= self.reset_timeout_s:
            return "half_open"
        return "open"

    def before_call(self) -> None:
        """Raise CircuitOpenError unless a call may go through now."""
        state = self.state
        if state == "closed":
            return
        if state == "half_open" and not self._trial_in_flight:
            self._trial_in_flight = True
            return
        assert self._opened_at is not None
        retry_after = max(0.0, self.reset_timeout_s - (self._clock() - self._opened_at))
        raise CircuitOpenError(
            f"LLM circuit breaker is open after {self._failures} consecutive failures; "
            f"calls fail fast for another {retry_after:.1f}s. Check the provider, then retry.",
            retry_after_s=retry_after,
        )

    def record_success(self) -> None:
        if self._opened_at is not None:
            log.info("llm.breaker.closed")
        self._failures = 0
        self._opened_at = None
        self._trial_in_flight = False

    def record_failure(self) -> None:
        self._failures += 1
        reopen = self._trial_in_flight
        self._trial_in_flight = False
        if reopen or (self._opened_at is None and self._failures >= self.failure_threshold):
            self._opened_at = self._clock()
            log.warning("llm.breaker.opened", consecutive_failures=self._failures)

    def release_trial(self) -> None:
        """A half-open trial ended without telling us about the provider (e.g. a bad request)."""
        self._trial_in_flight = False


class ResilientLLM:
    """Retries transient failures and guards the provider with a circuit breaker."""

    def __init__(
        self,
        inner: LLM,
        retry: RetryPolicy | None = None,
        breaker: CircuitBreaker | None = None,
        *,
        endpoint: str = "",
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.inner = inner
        self.retry = retry or RetryPolicy()
        self.breaker = breaker or CircuitBreaker()
        self.endpoint = endpoint
        self._sleep = sleep

    @property
    def model(self) -> str:
        return self.inner.model

    def _wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        retry_after = exc.retry_after_s if isinstance(exc, TransientProviderError) else None
        return self.retry.backoff(state.attempt_number, retry_after)

    def _before_sleep(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        assert isinstance(exc, TransientProviderError)
        log.warning("llm.retry", attempt=state.attempt_number, error=str(exc)[:200])

    async def _attempt(self, request: LLMRequest) -> Completion:
        self.breaker.before_call()
        try:
            completion = await self.inner.complete(request)
        except TransientProviderError:
            self.breaker.record_failure()
            raise
        except BaseException:
            self.breaker.release_trial()
            raise
        self.breaker.record_success()
        return completion

    async def complete(self, request: LLMRequest) -> Completion:
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.retry.max_attempts),
            wait=self._wait,
            retry=retry_if_exception_type(TransientProviderError),
            before_sleep=self._before_sleep,
            sleep=self._sleep,
            reraise=True,
        )
        attempts = 0
        try:
            async for attempt in retrying:
                with attempt:
                    attempts = attempt.retry_state.attempt_number
                    completion = await self._attempt(request)
        except TransientProviderError as exc:
            raise ProviderUnavailableError(
                f"LLM provider {self.endpoint or self.model!r} failed after {attempts} attempt(s); "
                f"last error: {exc}",
                attempts=attempts,
                cause=str(exc),
            ) from exc
        return msgspec.structs.replace(completion, attempts=attempts)
