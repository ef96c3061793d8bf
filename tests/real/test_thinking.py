"""A model that thinks, on the real server: SmolLM2 behind a chat template that opens a thinking block.

llama-cpp-python's server runs with its documented defaults plus the user's own template
(`--chat_format hf-tokenizer-config`, tests/real/data/thinking_tokenizer_config.json): the prompt ends in
`<think>`, so every reply comes in R1 form (thinking first; `</think>` and an answer when the model gets
there), and a final assistant message is continued rather than closed, which is how this server offers prefix
continuation. ReasonRay is configured for it as a user would: `[llm] thinks`, `thinks_in_text` and
`prefix_continuation = "continue_final_message"` (and, once, `"completions"` with the same template as `[llm]
chat_template`: the server's raw completions endpoint continues the thinking instead). What must hold whatever
the 135M model writes: a reply cut inside its thinking is never an answer, bounded context's delethink chunks
continue the thinking instead of starting over, and the run's counts are the server's.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reasonray.api.app import build_application
from reasonray.gateway.local_model import LocalModelServer
from reasonray.gateway.protocol import LLMRequest, user
from reasonray.kernel.config import Settings
from tests.real.conftest import CLASSIFIED, model_section
from tests.real.recorder import Recorder

TEMPLATE = Path(__file__).parent / "data" / "thinking_tokenizer_config.json"
ALIAS = "smollm2-think"
LONG = "List the numbers from 1 to 80, one per line, then say how many you listed."
CHUNKS = {"chunk_size": 512, "carryover_size": 96, "max_iterations": 4, "on_max_iterations": "final_answer", "temperature": 0}


@pytest.fixture(scope="module")
def thinking_server() -> Iterator[Recorder]:
    extra = ("--chat_format", "hf-tokenizer-config", "--hf_tokenizer_config_path", str(TEMPLATE))
    with LocalModelServer(model_section(alias=ALIAS), documented_defaults=True, extra_args=extra) as server:
        proxy = Recorder(server.url).start()
        try:
            yield proxy
        finally:
            proxy.stop()


def application(url: str, **stated: Any) -> Any:
    llm = {
        "provider": "openai",
        "base_url": url,
        "model": ALIAS,
        "api_key_required": False,
        "thinks": True,
        "thinks_in_text": True,
        "prefix_continuation": "continue_final_message",
        "stream": False,  # plain calls: the server reports their usage, which the run's counts are held against
        "cache": {"enabled": False},
        **stated,
    }
    reasoning = {"enabled_strategies": ["chain_of_thought", "bounded_context"], "default_strategy": "chain_of_thought"}
    return build_application(Settings.model_validate({"llm": llm, "reasoning": reasoning}), data_dir=None, memory=False)


def complete(url: str, request: LLMRequest, **stated: Any) -> Any:
    """One call through the client of an application configured for the server, with `stated` in its `[llm]`."""

    async def call() -> Any:
        app = application(url, **stated)
        try:
            return await app.client.complete(request)
        finally:
            await app.aclose()

    return asyncio.run(call())


def execute(recorder: Recorder, params: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    async def run() -> dict[str, Any]:
        app = application(recorder.url)
        try:
            payload, _ = await app.dispatcher.handle_payload({"jsonrpc": "2.0", "id": 1, "method": "reasoning.execute", "params": params})
            return payload
        finally:
            await app.aclose()

    mark = recorder.mark()
    payload = asyncio.run(run())
    until = recorder.mark()
    recorder.wait_idle(600)
    return payload, recorder.since(mark, until)


def test_a_reply_cut_inside_its_thinking_is_unfinished_thinking_never_an_answer(thinking_server):
    completion = complete(thinking_server.url, LLMRequest(messages=(user(LONG),), max_tokens=12))
    assert completion.finish_reason == "length" and completion.thinking_unfinished
    assert completion.text == "" and completion.reasoning  # the thinking so far, and no answer read out of it


@pytest.mark.parametrize("mode", ["delethink", "summary"])
def test_bounded_context_on_a_thinking_model_progresses_every_chunk_with_the_servers_counts(thinking_server, mode):
    payload, calls = execute(
        thinking_server, {"query": LONG, "strategy": "bounded_context", "strategy_config": {**CHUNKS, "carryover_mode": mode}}
    )
    if "error" in payload:
        error = payload["error"]
        assert error["code"] in CLASSIFIED and error["data"].get("error_type"), error
        return
    result = payload["result"]
    assert "<think" not in result["answer"] and "</think>" not in result["answer"]
    metrics = result["metrics"]
    assert metrics["llm_calls"] == len(calls) and all(c.usage for c in calls)
    assert metrics["prompt_tokens"] == sum(c.usage["prompt_tokens"] for c in calls)
    assert metrics["completion_tokens"] == sum(c.usage["completion_tokens"] for c in calls)
    # no call repeats the one before it: a chunk cut while thinking is carried on, never started over
    bodies = [json.dumps(c.request.get("messages"), sort_keys=True) for c in calls]
    assert all(a != b for a, b in itertools.pairwise(bodies)), "a chunk started over from the same prompt"
    iterations = metrics["strategy_specific"]["iterations"]
    if mode == "delethink":
        for before, after in itertools.pairwise(iterations):
            if before.get("stop") == "thinking":  # cut inside its thinking: the next chunk continues that thinking
                assert after.get("continued_tokens", 0) > 0, iterations


def test_thinking_continues_through_the_raw_completions_endpoint_in_the_models_own_template(thinking_server):
    mark = thinking_server.mark()
    request = LLMRequest(messages=(user(LONG),), continue_thinking="1\n2\n3\n", max_tokens=24)
    completion = complete(thinking_server.url, request, prefix_continuation="completions", chat_template=str(TEMPLATE))
    thinking_server.wait_idle(600)
    calls = [c for c in thinking_server.calls if c.arrived >= mark and c.path.endswith("/v1/completions")]
    assert len(calls) == 1 and calls[0].status == 200, calls
    # one prompt, rendered by the template ReasonRay was given: the turn and the thinking opened, then the thinking so far
    assert calls[0].request["prompt"].endswith("<|im_start|>user\n" + LONG + "<|im_end|>\n<|im_start|>assistant\n<think>\n1\n2\n3\n")
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (
        calls[0].usage["prompt_tokens"],
        calls[0].usage["completion_tokens"],
    )
    assert completion.thinking_control == "continued"
    # a reply that never closed its thinking (cut by max_tokens, or ended by the model) holds no answer read out of it
    if completion.thinking_unfinished:
        assert completion.text == "" and completion.reasoning
