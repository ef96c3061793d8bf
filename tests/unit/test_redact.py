import json

import structlog

from reasonray.api.service import ExecuteParams, ReasoningService
from reasonray.gateway.testing import FunctionLLM
from reasonray.gateway.tokens import counter_for_model
from reasonray.kernel.config import ReasoningSettings
from reasonray.kernel.redact import redact
from reasonray.strategies.registry import StrategyRegistry, build_catalogue


def test_personal_data_and_secrets_are_redacted():
    text = "mail ann@example.com, key sk-FAKE_test_key_000000, password: hunter2, card 4111 1111 1111 1111, host 10.1.2.3"
    redacted = redact(text)
    for secret in ("ann@example.com", "sk-FAKE_test_key_000000", "hunter2", "4111 1111", "10.1.2.3"):
        assert secret not in redacted
    assert "[email]" in redacted and "[secret]" in redacted and "[number]" in redacted and "[ip]" in redacted
    assert redact("What is 17 * 23?") == "What is 17 * 23?"


def service(log_queries):
    catalogue = build_catalogue(
        StrategyRegistry().discover(),
        ReasoningSettings(enabled_strategies=["chain_of_thought"], default_strategy="chain_of_thought"),
    )
    llm = FunctionLLM(lambda request: "<answer>ok</answer>")
    return ReasoningService(catalogue, llm, counter_for_model("function"), log_queries=log_queries)


async def test_queries_are_logged_only_when_asked_and_then_redacted():
    params = ExecuteParams(query="email me at ann@example.com")
    with structlog.testing.capture_logs() as quiet:
        await service(False).execute(params, "t-quiet")
    assert "ann@example.com" not in json.dumps(quiet, default=str) and not any(e["event"] == "query.received" for e in quiet)
    with structlog.testing.capture_logs() as loud:
        await service(True).execute(params, "t-loud")
    [entry] = [e for e in loud if e["event"] == "query.received"]
    assert entry["query"] == "email me at [email]"
