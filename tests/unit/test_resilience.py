import pytest

from gateway.errors import CircuitOpenError, ProviderRejectedError, ProviderUnavailableError, TransientProviderError
from gateway.protocol import LLMRequest, user
from gateway.resilience import CircuitBreaker, ResilientLLM, RetryPolicy
from gateway.testing import ScriptedLLM

REQUEST = LLMRequest(messages=(user("q"),))


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def resilient(replies, *, attempts=3, threshold=5, reset=60.0, clock=None):
    sleeps = []

    async def sleep(seconds):
        sleeps.append(seconds)

    inner = ScriptedLLM(replies)
    breaker = CircuitBreaker(threshold, reset, clock=clock or Clock())
    llm = ResilientLLM(inner, RetryPolicy(attempts, 1.0, 8.0, 0.0), breaker, endpoint="http://sim", sleep=sleep)
    return llm, inner, sleeps


async def test_transient_failures_are_retried_with_exponential_backoff():
    llm, inner, sleeps = resilient([TransientProviderError("500"), TransientProviderError("429"), "ok"])
    completion = await llm.complete(REQUEST)
    assert completion.text == "ok" and completion.attempts == 3
    assert sleeps == [1.0, 2.0]
    inner.assert_complete()


async def test_a_rejected_request_fails_at_once():
    llm, inner, sleeps = resilient([ProviderRejectedError("HTTP 401", status_code=401)])
    with pytest.raises(ProviderRejectedError):
        await llm.complete(REQUEST)
    assert len(inner.requests) == 1 and sleeps == []


async def test_the_final_error_names_the_cause_and_the_attempts():
    llm, inner, _ = resilient([TransientProviderError(f"HTTP 503 try {i}") for i in range(3)])
    with pytest.raises(ProviderUnavailableError) as err:
        await llm.complete(REQUEST)
    assert err.value.attempts == 3
    assert "failed after 3 attempt(s)" in str(err.value) and "HTTP 503 try 2" in str(err.value)


def test_backoff_has_jitter_honours_retry_after_and_is_capped():
    policy = RetryPolicy(5, 1.0, 8.0, 0.5)
    waits = [policy.backoff(1) for _ in range(50)]
    assert all(1.0 <= w <= 1.5 for w in waits) and len(set(waits)) > 1
    assert policy.backoff(1, retry_after_s=5.0) >= 5.0
    assert policy.backoff(10) == 8.0


async def test_breaker_opens_after_consecutive_failures_and_fails_fast():
    clock = Clock()
    llm, inner, _ = resilient([TransientProviderError("down")] * 5, attempts=1, clock=clock)
    for _ in range(5):
        with pytest.raises(ProviderUnavailableError):
            await llm.complete(REQUEST)
    assert llm.breaker.state == "open"
    with pytest.raises(CircuitOpenError) as err:
        await llm.complete(REQUEST)
    assert len(inner.requests) == 5  # the open breaker did not call the provider
    assert err.value.retry_after_s == pytest.approx(60.0)


async def test_half_open_trial_closes_on_success_and_reopens_on_failure():
    clock = Clock()
    llm, inner, _ = resilient(
        [TransientProviderError("down"), TransientProviderError("still down"), "back"], attempts=1, threshold=1, reset=10, clock=clock
    )
    with pytest.raises(ProviderUnavailableError):
        await llm.complete(REQUEST)
    clock.now = 10.0
    assert llm.breaker.state == "half_open"
    with pytest.raises(ProviderUnavailableError):
        await llm.complete(REQUEST)  # the trial failed: open again for another 10 s
    assert llm.breaker.state == "open"
    clock.now = 20.0
    assert (await llm.complete(REQUEST)).text == "back"
    assert llm.breaker.state == "closed"
    inner.assert_complete()


async def test_success_resets_the_consecutive_count():
    llm, _, _ = resilient([TransientProviderError("x"), "ok", TransientProviderError("y"), "ok"], attempts=1, threshold=2)
    for _ in range(2):
        with pytest.raises(ProviderUnavailableError):
            await llm.complete(REQUEST)
        await llm.complete(REQUEST)
    assert llm.breaker.state == "closed"
