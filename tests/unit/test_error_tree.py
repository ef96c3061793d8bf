"""The error tree's own behaviour: what an error keeps when it crosses a process by pickle (Ray ships
errors between actors, tasks and the ingress that way), the names a person reads in a command's output,
and the validation summaries the API and the config loader build from pydantic's errors."""

from __future__ import annotations

import pickle

import pydantic
import pytest

from reasonray.gateway.errors import (
    CircuitOpenError,
    LLMConfigError,
    ProviderRejectedError,
    ProviderUnavailableError,
    RemoteRequestsForbidden,
    TransientProviderError,
)
from reasonray.kernel.config import ConfigError
from reasonray.kernel.errors import (
    BudgetExceededError,
    InvalidParamsError,
    OverloadedError,
    ReasonRayError,
    ReentryError,
    attach_partial,
    describe_errors,
    error_type_of,
    json_safe_errors,
)


def roundtrip(exc: BaseException) -> BaseException:
    return pickle.loads(pickle.dumps(exc))


def test_an_error_without_data_has_its_own_empty_data():
    first, second = ReasonRayError("one"), ReasonRayError("two")
    assert first.data == {} and first.message == "one" and str(first) == "one"
    first.data["x"] = 1
    assert second.data == {}


@pytest.mark.parametrize(
    "exc",
    [
        ReasonRayError("plain"),
        InvalidParamsError("bad query", {"field": "query"}),
        ReentryError("results do not match", {"missing": ["c1"], "extra": []}),
        BudgetExceededError("out of tokens", {"used": 120, "budget": 100}),
        OverloadedError("busy", {"retry_after_s": 2.5}),
        ConfigError("[llm] base_url: not a URL"),
    ],
)
def test_a_pickled_error_keeps_its_class_message_and_data(exc):
    again = roundtrip(exc)
    assert type(again) is type(exc)
    assert again.message == exc.message and str(again) == str(exc) and again.data == exc.data
    assert (again.code, again.http_status, again.error_type) == (exc.code, exc.http_status, exc.error_type)


def test_pickled_provider_errors_keep_their_keyword_fields():
    rejected = roundtrip(ProviderRejectedError("HTTP 401", status_code=401))
    assert type(rejected) is ProviderRejectedError and rejected.status_code == 401 and rejected.data == {"status_code": 401}

    transient = roundtrip(TransientProviderError("HTTP 429", status_code=429, retry_after_s=3.0))
    assert type(transient) is TransientProviderError and (transient.status_code, transient.retry_after_s) == (429, 3.0)
    assert str(transient) == "HTTP 429"

    unavailable = roundtrip(ProviderUnavailableError("gave up", attempts=4, cause="HTTP 503", status_code=503))
    assert type(unavailable) is ProviderUnavailableError
    assert (unavailable.attempts, unavailable.cause, unavailable.status_code) == (4, "HTTP 503", 503)
    assert unavailable.data == {"attempts": 4} and unavailable.message == "gave up"

    opened = roundtrip(CircuitOpenError("open", retry_after_s=12.34567))
    assert type(opened) is CircuitOpenError and opened.retry_after_s == 12.34567
    assert opened.data == {"attempts": 0, "retry_after_s": 12.346} and opened.cause == "circuit_open"
    assert opened.error_type == "circuit_open" and opened.code == -32013


def test_provider_errors_default_to_no_status_and_no_retry_hint():
    transient = TransientProviderError("timed out")
    assert transient.status_code is None and transient.retry_after_s is None and transient.data == {}
    unavailable = ProviderUnavailableError("gave up")
    assert (unavailable.attempts, unavailable.cause, unavailable.status_code) == (0, "", None)
    assert CircuitOpenError("open").retry_after_s == 0.0


def test_error_types_read_as_the_api_names_them_or_as_the_class_in_snake_case():
    assert error_type_of(BudgetExceededError("x")) == "budget_exceeded"
    assert error_type_of(CircuitOpenError("x")) == "circuit_open"
    assert error_type_of(LLMConfigError("x")) == "llm_config"
    assert error_type_of(RemoteRequestsForbidden("x")) == "llm_error"
    # errors the API never answers with are named by their class
    assert error_type_of(ConfigError("x")) == "config_error"
    assert error_type_of(ReasonRayError("x")) == "reason_ray_error"
    assert error_type_of(ValueError("x")) == "value_error"
    assert error_type_of(KeyError("x")) == "key_error"


def test_attach_partial_keeps_what_the_run_achieved_on_the_same_error():
    exc = BudgetExceededError("out of tokens")
    assert attach_partial(exc, {"iterations": 2}) is exc
    assert exc.partial_result == {"iterations": 2}


class _Budget(pydantic.BaseModel):
    max_tokens: int
    deadline_s: float


class _Request(pydantic.BaseModel):
    query: str
    budget: _Budget


def test_validation_errors_name_each_field_by_its_path():
    with pytest.raises(pydantic.ValidationError) as err:
        _Request.model_validate({"budget": {"max_tokens": "many", "deadline_s": 1.0}})
    summary = describe_errors(err.value)
    parts = summary.split("; ")
    assert len(parts) == 2
    assert parts[0].startswith("query: ") and "required" in parts[0].lower()
    assert parts[1].startswith("budget.max_tokens: ") and "integer" in parts[1]

    assert json_safe_errors(err.value) == [
        {"loc": ["query"], "msg": "Field required", "type": "missing"},
        {
            "loc": ["budget", "max_tokens"],
            "msg": "Input should be a valid integer, unable to parse string as an integer",
            "type": "int_parsing",
        },
    ]


def test_an_error_about_the_whole_value_is_named_value():
    with pytest.raises(pydantic.ValidationError) as err:
        pydantic.TypeAdapter(int).validate_python("many")
    assert describe_errors(err.value).startswith("value: ")
    assert json_safe_errors(err.value)[0]["loc"] == []
