"""Retries within a deadline and the failure-rate breaker: a fake clock and fake sleeps, no waiting."""

import asyncio
import random
import uuid

import pytest

from reasonray.gateway.errors import (
    CircuitOpenError,
    ProviderRejectedError,
    ProviderUnavailableError,
    TransientProviderError,
)
from reasonray.gateway.protocol import LLMRequest, user
from reasonray.gateway.resilience import CircuitBreaker, ResilientLLM, RetryPolicy, breaker_for
from reasonray.gateway.testing import FunctionLLM, ScriptedLLM

REQUEST = LLMRequest(messages=(user("q"),))


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def resilient(replies, *, attempts=3, deadline=None, clock=None, **breaker):
    clock = clock or Clock()
    sleeps = []

    async def sleep(seconds):
        sleeps.append(seconds)
        clock.now += seconds

    inner = ScriptedLLM(replies)
    llm = ResilientLLM(
        inner,
        RetryPolicy(attempts, 1.0, 8.0, 0.0, deadline),
        CircuitBreaker(clock=clock, **breaker),
        endpoint="http://sim",
        sleep=sleep,
        clock=clock,
    )
    return llm, inner, sleeps


def fault(status=500):
    return TransientProviderError(f"HTTP {status}", status_code=status)


async def test_transient_failures_are_retried_with_exponential_backoff():
    llm, inner, sleeps = resilient([fault(500), fault(429), "ok"])
    completion = await llm.complete(REQUEST)
    assert completion.text == "ok" and completion.attempts == 3
    assert sleeps == [1.0, 2.0]
    inner.assert_complete()


async def test_a_success_after_failed_attempts_is_charged_what_they_cost():
    """A stream the server cut midway was generated and paid for: its tokens join the call that succeeded after it."""
    cut = fault(500)
    cut.spent = (55, 40)
    llm, _, _ = resilient([cut, "ok"])
    plain, _, _ = resilient(["ok"])
    retried, once = await llm.complete(REQUEST), await plain.complete(REQUEST)
    assert retried.attempts == 2
    assert retried.usage.prompt_tokens == once.usage.prompt_tokens + 55
    assert retried.usage.completion_tokens == once.usage.completion_tokens + 40


async def test_a_rejected_request_fails_at_once():
    llm, inner, sleeps = resilient([ProviderRejectedError("HTTP 401", status_code=401)])
    with pytest.raises(ProviderRejectedError):
        await llm.complete(REQUEST)
    assert len(inner.requests) == 1 and sleeps == []


async def test_the_final_error_names_the_cause_and_the_attempts():
    llm, _inner, _ = resilient([TransientProviderError(f"HTTP 503 try {i}", status_code=503) for i in range(3)])
    with pytest.raises(ProviderUnavailableError) as err:
        await llm.complete(REQUEST)
    assert err.value.attempts == 3
    assert "failed after 3 attempt(s)" in str(err.value) and "HTTP 503 try 2" in str(err.value)


async def test_no_retry_starts_after_the_deadline():
    # waits 1 s, 2 s, 4 s: the third retry would start at 7 s, past the 5 s deadline
    llm, inner, sleeps = resilient([fault(), fault(), fault()], attempts=10, deadline=5.0)
    with pytest.raises(ProviderUnavailableError) as err:
        await llm.complete(REQUEST)
    assert err.value.attempts == 3 and sleeps == [1.0, 2.0]
    inner.assert_complete()


def test_backoff_has_jitter_honours_retry_after_and_is_capped():
    policy = RetryPolicy(5, 1.0, 8.0, 0.5)
    waits = [policy.backoff(1) for _ in range(50)]
    assert all(1.0 <= w <= 1.5 for w in waits) and len(set(waits)) > 1
    assert policy.backoff(1, retry_after_s=5.0) >= 5.0
    assert policy.backoff(10) == 8.0


def test_the_breaker_needs_the_minimum_number_of_calls_before_the_rate_counts():
    clock = Clock()
    breaker = CircuitBreaker(0.5, minimum_calls=10, window_s=10, clock=clock)
    for _ in range(9):
        breaker.before_call()
        breaker.record_failure()
    assert breaker.state == "closed" and breaker.failure_rate() == 1.0
    breaker.before_call()
    breaker.record_failure()
    assert breaker.state == "open"


async def test_the_open_breaker_fails_fast_without_calling_the_endpoint():
    llm, inner, _ = resilient([fault()] * 4, attempts=1, minimum_calls=4, reset_timeout_s=30)
    for _ in range(4):
        with pytest.raises(ProviderUnavailableError):
            await llm.complete(REQUEST)
    assert llm.breaker.state == "open"
    with pytest.raises(CircuitOpenError) as err:
        await llm.complete(REQUEST)
    assert len(inner.requests) == 4  # the open breaker did not call the endpoint
    assert err.value.retry_after_s == pytest.approx(30.0)
    assert "100% of the endpoint's last calls failed" in str(err.value)


def test_a_failure_rate_below_the_threshold_keeps_it_closed():
    breaker = CircuitBreaker(0.5, minimum_calls=10, window_s=10, clock=Clock())
    for i in range(100):
        breaker.before_call()
        breaker.record_failure() if i % 5 >= 3 else breaker.record_success()  # 40%, never more
    assert breaker.state == "closed" and breaker.failure_rate() == pytest.approx(0.4)


def test_old_outcomes_leave_the_window():
    clock = Clock()
    breaker = CircuitBreaker(0.5, minimum_calls=4, window_s=10, clock=clock)
    for _ in range(3):
        breaker.record_failure()
    clock.now = 11.0  # those three are older than the window now
    for _ in range(3):
        breaker.record_success()
    breaker.record_failure()
    assert breaker.failure_rate() == pytest.approx(0.25) and breaker.state == "closed"


def test_random_ten_percent_faults_at_high_concurrency_never_open_it():
    """100,000 attempts at 500 per second (a busy service), 10% of them faults: the rate never reaches 50%."""
    rng = random.Random(7)
    clock = Clock()
    breaker = CircuitBreaker(clock=clock)  # the defaults: 50% over 10 s, at least 20 calls
    for _ in range(100_000):
        clock.now += 0.002
        breaker.before_call()
        breaker.record_failure() if rng.random() < 0.1 else breaker.record_success()
        assert breaker.state == "closed"


def test_a_dead_endpoint_opens_it_within_a_second():
    """32 callers, 1.3 s per call: 25 successes a second fill the window; then the endpoint refuses
    connections and each caller fails about once a second (its first backoff)."""
    clock = Clock()
    breaker = CircuitBreaker(clock=clock)  # the defaults
    for _ in range(500):  # a healthy past
        clock.now += 0.04
        breaker.record_success()
    died_at = clock.now
    while breaker.state == "closed":
        clock.now += 1 / 32
        breaker.before_call()
        breaker.record_failure()
    assert clock.now - died_at <= 1.0


async def test_rejected_requests_and_rate_limits_never_count():
    """One caller's requests keep being rejected (400, 413, context too long) and 429s come back:
    the endpoint is healthy, so an unrelated request still goes through."""
    rejections = [ProviderRejectedError(f"HTTP {s}", status_code=s) for s in (400, 413, 400, 422)] * 10
    llm, inner, _ = resilient([*rejections, fault(429), "unrelated"], attempts=2, minimum_calls=4)
    for _ in rejections:
        with pytest.raises(ProviderRejectedError):
            await llm.complete(REQUEST)
    assert (await llm.complete(REQUEST)).text == "unrelated"  # the 429 was retried, not counted
    assert llm.breaker.state == "closed" and llm.breaker.failure_rate() == 0.0
    inner.assert_complete()


def half_open(probes: int) -> tuple[Clock, CircuitBreaker]:
    """A breaker opened by two failures, its reset timeout (5 s) just over: half open, for `probes` probes at a time."""
    clock = Clock()
    breaker = CircuitBreaker(0.5, minimum_calls=2, window_s=10, reset_timeout_s=5, half_open_probes=probes, clock=clock)
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.state == "open"
    clock.now = 5.0
    return clock, breaker


def test_half_open_lets_a_few_probes_through_and_closes_when_they_all_succeed():
    _, breaker = half_open(probes=2)
    assert breaker.state == "half_open"
    breaker.before_call()
    breaker.before_call()
    with pytest.raises(CircuitOpenError):
        breaker.before_call()  # only two probes at a time
    breaker.record_success()
    assert breaker.state == "half_open"
    breaker.record_success()
    assert breaker.state == "closed" and breaker.failure_rate() == 0.0
    breaker.before_call()


def test_a_failed_probe_opens_it_again_and_a_released_probe_frees_its_slot():
    clock, breaker = half_open(probes=1)
    breaker.before_call()
    breaker.release_probe()  # that probe was rejected (a 400): it said nothing about the endpoint
    breaker.before_call()
    breaker.record_failure()
    assert breaker.state == "open"
    clock.now = 9.0
    assert breaker.state == "open"  # open for another reset_timeout_s from the failed probe
    clock.now = 10.0
    breaker.before_call()
    breaker.record_success()
    assert breaker.state == "closed"


def test_one_breaker_per_endpoint():
    # endpoints of this test alone: the registry lives as long as the process
    a_url, b_url = f"http://a-{uuid.uuid4().hex}/v1", f"http://b-{uuid.uuid4().hex}/v1"
    a = breaker_for(a_url, minimum_calls=5)
    assert isinstance(a, CircuitBreaker) and a.minimum_calls == 5
    assert breaker_for(a_url, minimum_calls=5) is a
    b = breaker_for(b_url, minimum_calls=5)
    assert isinstance(b, CircuitBreaker) and b is not a


async def test_retries_reach_three_nines_at_ten_percent_faults_and_the_breaker_stays_closed():
    rng = random.Random(3)
    clock = Clock()

    def reply(request):
        clock.now += 0.01
        return fault(rng.choice((429, 500))) if rng.random() < 0.1 else "ok"

    async def sleep(seconds):
        clock.now += seconds / 64  # 64 callers share the clock: the waits overlap

    llm = ResilientLLM(FunctionLLM(reply), RetryPolicy(4, 0.05, 1.0, 0.05, 30.0), CircuitBreaker(clock=clock), sleep=sleep, clock=clock)
    outcomes = await asyncio.gather(*(llm.complete(REQUEST) for _ in range(2000)), return_exceptions=True)
    ok = sum(not isinstance(o, BaseException) for o in outcomes)
    assert ok / len(outcomes) >= 0.999
    assert llm.breaker.state == "closed"


async def test_the_final_error_carries_the_last_status_and_cause_and_names_the_endpoint():
    llm, _inner, _ = resilient([fault(502), fault(503)], attempts=2)
    with pytest.raises(ProviderUnavailableError) as err:
        await llm.complete(REQUEST)
    assert err.value.status_code == 503 and err.value.cause == "HTTP 503" and err.value.data == {"attempts": 2}
    assert str(err.value).startswith("LLM provider 'http://sim' failed after 2 attempt(s)")

    unnamed = ResilientLLM(ScriptedLLM([fault(500)], model="sim-model"), RetryPolicy(1, 1.0, 8.0, 0.0), CircuitBreaker(clock=Clock()))
    assert unnamed.model == "sim-model"
    with pytest.raises(ProviderUnavailableError, match="LLM provider 'sim-model' failed after 1 attempt"):
        await unnamed.complete(REQUEST)


async def test_a_retry_may_start_exactly_at_the_deadline():
    # waits 1 s and 2 s: the third attempt starts at 3 s, on the 3 s deadline, and succeeds
    llm, inner, sleeps = resilient([fault(), fault(), "ok"], attempts=10, deadline=3.0)
    assert (await llm.complete(REQUEST)).attempts == 3 and sleeps == [1.0, 2.0]
    inner.assert_complete()


def test_backoff_doubles_from_the_initial_wait_up_to_the_cap_and_a_short_retry_after_never_shortens_it():
    policy = RetryPolicy(6, 0.5, 3.0, 0.0)
    assert [policy.backoff(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert policy.backoff(3, retry_after_s=0.1) == 2.0
    assert policy.backoff(1, retry_after_s=2.5) == 2.5
    assert RetryPolicy(4, 1.0, 8.0, 0.5).backoff(2, rng=lambda low, high: high) == 2.5


def test_only_server_faults_timeouts_and_connection_errors_say_the_endpoint_is_unhealthy():
    from reasonray.gateway.resilience import is_endpoint_fault

    assert is_endpoint_fault(fault(500)) and is_endpoint_fault(fault(503))
    assert is_endpoint_fault(TransientProviderError("timed out"))  # no status: a timeout or a refused connection
    assert not is_endpoint_fault(fault(429))
    assert not is_endpoint_fault(ProviderRejectedError("HTTP 400", status_code=400))
    assert not is_endpoint_fault(RuntimeError("boom"))


def test_an_open_breaker_counts_down_its_retry_hint_and_half_open_with_probes_out_says_retry_now():
    clock = Clock()
    breaker = CircuitBreaker(0.5, minimum_calls=2, window_s=10, reset_timeout_s=30, half_open_probes=1, clock=clock)
    assert breaker.failure_rate() == 0.0  # no calls yet
    breaker.record_failure()
    breaker.record_failure()
    clock.now = 10.0
    with pytest.raises(CircuitOpenError) as err:
        breaker.before_call()
    assert err.value.retry_after_s == pytest.approx(20.0) and "for another 20.0s" in str(err.value)
    clock.now = 30.0
    breaker.before_call()  # the one probe
    with pytest.raises(CircuitOpenError) as err:
        breaker.before_call()
    assert err.value.retry_after_s == 0.0


def test_a_late_success_from_before_the_opening_does_not_count_as_a_probe():
    clock = Clock()
    breaker = CircuitBreaker(0.5, minimum_calls=2, window_s=10, reset_timeout_s=5, half_open_probes=1, clock=clock)
    breaker.record_failure()
    breaker.record_failure()
    breaker.record_success()  # a reply to a call made before the breaker opened
    breaker.release_probe()  # and a rejected one: no probe was out, nothing to release
    clock.now = 5.0
    assert breaker.state == "half_open"
    breaker.before_call()
    with pytest.raises(CircuitOpenError):
        breaker.before_call()  # the one probe slot is taken: the late reply did not free or fill it
    breaker.record_success()
    assert breaker.state == "closed"


def test_an_outcome_exactly_one_window_old_still_counts():
    clock = Clock()
    breaker = CircuitBreaker(0.5, minimum_calls=100, window_s=10, clock=clock)
    breaker.record_failure()
    clock.now = 10.0
    breaker.record_success()
    assert breaker.failure_rate() == pytest.approx(0.5)
    clock.now = 10.5
    assert breaker.failure_rate() == 0.0


def test_breakers_are_shared_per_endpoint_and_settings():
    url = f"http://shared-{uuid.uuid4().hex}/v1"
    a = breaker_for(url, minimum_calls=5, window_s=3.0)
    assert breaker_for(url, window_s=3.0, minimum_calls=5) is a
    other = breaker_for(url, minimum_calls=6, window_s=3.0)
    assert isinstance(other, CircuitBreaker) and other is not a and other.minimum_calls == 6
    assert (a.minimum_calls, a.window_s) == (5, 3.0)


def test_a_closed_breaker_starts_afresh_and_the_log_says_when_it_opened_and_closed():
    from structlog.testing import capture_logs

    clock = Clock()
    breaker = CircuitBreaker(0.5, minimum_calls=2, window_s=100, reset_timeout_s=5, half_open_probes=1, clock=clock)
    with capture_logs() as logs:
        breaker.record_failure()
        breaker.record_failure()
        clock.now = 5.0
        breaker.before_call()
        breaker.record_success()
    assert [(e["event"], e["log_level"]) for e in logs] == [("llm.breaker.opened", "warning"), ("llm.breaker.closed", "info")]
    assert logs[0]["failure_rate"] == 1.0 and logs[0]["calls"] == 2
    assert breaker.state == "closed"
    breaker.record_success()
    breaker.record_failure()  # the window began at the closing: one fault in two calls
    assert breaker.failure_rate() == pytest.approx(0.5) and breaker.state == "open"
