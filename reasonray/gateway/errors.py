"""Errors of the LLM gateway, by whose fault they are.

LLMError                      something went wrong talking to the model
├── LLMConfigError            the gateway is configured wrongly (missing key, bad URL): the operator's fault
├── ProviderRejectedError     the provider refused this request (400/401/403/404/422): retrying will not help
├── TransientProviderError    one attempt failed (429, 5xx, timeout, connection); another may not
├── ProviderUnavailableError  the provider failed on every attempt
│   └── CircuitOpenError      too many consecutive failures: calls fail fast until the breaker half-opens
└── RemoteRequestsForbidden   a test tried to reach a non-loopback endpoint
"""

from __future__ import annotations

from reasonray.kernel.errors import ReasonRayError


class LLMError(ReasonRayError, code=-32013, http_status=502, error_type="llm_error"):
    """Something went wrong talking to the model."""


class LLMConfigError(LLMError, error_type="llm_config"):  # the provider is unusable: a gateway failure (502), not a bug
    """The gateway is configured wrongly; the message says which setting to change."""


class ProviderRejectedError(LLMError, error_type="provider_rejected"):
    """The provider refused the request itself; retrying the same request cannot succeed."""

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message, {"status_code": status_code})
        self.status_code = status_code


class TransientProviderError(LLMError):
    """One attempt failed in a way that another attempt may not (rate limit, server error, timeout)."""

    def __init__(self, message: str, *, status_code: int | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.retry_after_s = retry_after_s
        self.spent = (0, 0)  # (prompt, completion) tokens the failed attempt cost, when the server had started on it


class ProviderUnavailableError(LLMError, error_type="provider_unavailable"):
    """The provider failed on every attempt (rate limits, server errors, timeouts, connection errors)."""

    def __init__(self, message: str, *, attempts: int = 0, cause: str = "", status_code: int | None = None) -> None:
        super().__init__(message, {"attempts": attempts})
        self.attempts = attempts
        self.cause = cause
        self.status_code = status_code  # of the last attempt; None for a timeout or a connection error
        self.spent = (0, 0)  # (prompt, completion) tokens the failed attempts cost, as far as they are known


class CircuitOpenError(ProviderUnavailableError, error_type="circuit_open"):
    """The breaker is open after consecutive failures; calls fail fast until it half-opens."""

    def __init__(self, message: str, *, retry_after_s: float = 0.0) -> None:
        super().__init__(message, attempts=0, cause="circuit_open")
        self.data = {"attempts": 0, "retry_after_s": round(retry_after_s, 3)}
        self.retry_after_s = retry_after_s


class RemoteRequestsForbidden(LLMError):
    """Raised when requests to non-loopback endpoints are switched off (the test suite does this)."""
