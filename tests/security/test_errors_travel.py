"""Errors raised in a Ray fan-out branch travel back by pickle: each must arrive as itself, or the
API answers "internal error" (as a provider failure inside tree_of_thought once did)."""

import pickle

import pytest

from reasonray.api.jsonrpc import error_for
from reasonray.gateway.errors import CircuitOpenError, ProviderRejectedError, ProviderUnavailableError
from reasonray.kernel.errors import BudgetExceededError, ModelBehaviorError, SandboxUnavailableError


@pytest.mark.parametrize(
    "exc",
    [
        CircuitOpenError("breaker open", retry_after_s=2.5),
        ProviderUnavailableError("gave up", attempts=3, cause="500"),
        ProviderRejectedError("bad request", status_code=400),
        BudgetExceededError("spent", {"max_total_tokens": 10}),
        ModelBehaviorError("no answer tag"),
        SandboxUnavailableError("no bwrap"),
    ],
)
def test_errors_survive_the_trip_and_keep_their_code(exc):
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is type(exc) and back.__dict__ == exc.__dict__
    assert error_for(back).code == error_for(exc).code
    assert error_for(back).data["error_type"] == error_for(exc).data["error_type"] != "internal"
