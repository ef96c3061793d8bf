"""Asking for structure where the endpoint enforces it, and only there."""

from reasonray.gateway.capabilities import Capabilities
from reasonray.gateway.protocol import LLMRequest, system, user
from reasonray.gateway.testing import ScriptedLLM
from reasonray.strategies.output import ANSWER, CRITIQUE, SCORE, STEP, VOTE, shaped, structured
from tests.unit.strategy_harness import context_for


def test_an_enforcing_endpoint_gets_a_strict_schema_and_the_prompt_names_its_fields():
    request = LLMRequest(messages=(system("Solve it."), user("q")))
    asked = shaped(request, ANSWER, True)
    assert asked.response_format == {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER.schema, "strict": True}}
    assert asked.messages[0].content == f"Solve it.\n\n{ANSWER.note}" and asked.messages[1] == request.messages[1]
    assert shaped(request, ANSWER, False) is request  # elsewhere the prompt's tags are all the model is given


def test_a_request_without_a_system_message_gets_one_with_the_note():
    asked = shaped(LLMRequest(messages=(user("q"),)), SCORE, True)
    assert [m.role for m in asked.messages] == ["system", "user"] and asked.messages[0].content == SCORE.note


def test_every_schema_is_strict_compatible():
    for output in (ANSWER, CRITIQUE, SCORE, STEP, VOTE):
        schema = output.schema
        assert schema["additionalProperties"] is False and schema["required"] == list(schema["properties"])


def test_structured_follows_the_capabilities_through_the_observed_llm():
    llm = ScriptedLLM([])
    context, _ = context_for(llm)
    assert structured(context) is False
    llm.capabilities = Capabilities(structured_output=True)
    assert structured(context) is True and context.llm.capabilities.structured_output


def test_every_layer_of_the_llm_stack_passes_the_endpoints_capabilities_through():
    from reasonray.gateway.cache import CachingLLM, LRUTTLCache
    from reasonray.gateway.metered import MeteredLLM
    from reasonray.gateway.resilience import ResilientLLM
    from reasonray.kernel.telemetry import NoMetrics

    endpoint = ScriptedLLM([])
    endpoint.capabilities = Capabilities(structured_output=True, tool_choice=True)
    stack = MeteredLLM(ResilientLLM(CachingLLM(endpoint, LRUTTLCache()), None), NoMetrics(), caching=True)
    context, _ = context_for(stack)
    assert context.llm.capabilities == endpoint.capabilities
