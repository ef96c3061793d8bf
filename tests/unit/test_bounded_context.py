"""bounded_context: its edge cases (an answer in the first chunk, no stop sequence, iterations running out,
failed summaries, carryovers that no longer fit), both carryover modes, limits, metrics, events."""

import json

import pytest

from reasonray.gateway.errors import ProviderUnavailableError
from reasonray.gateway.protocol import LLMRequest
from reasonray.gateway.simulator.inprocess import SimulatedLLM
from reasonray.gateway.testing import ScriptedLLM
from reasonray.gateway.tokens import count_messages, counter_for_model
from reasonray.kernel.errors import InvalidParamsError, MaxIterationsError
from reasonray.kernel.events import read_event_log
from reasonray.strategies.bounded_context import (
    BoundedContext,
    BoundedContextSettings,
    capacity,
)
from reasonray.strategies.compute_cost import attention_pairs
from tests.unit.strategy_harness import context_for

COUNTER = counter_for_model("simulated")


async def run(llm, query="[[sim think=30000 answer=7]] Solve it.", strategy=None, **config):
    context, recorder = context_for(llm, strategy="bounded_context")
    result = await (strategy or BoundedContext()).reason(query, context=context, config=config)
    return result, recorder


class Recording(SimulatedLLM):
    """The simulated model, keeping every request it was sent."""

    def __init__(self):
        super().__init__()
        self.requests: list[LLMRequest] = []

    async def complete(self, request):
        self.requests.append(request)
        return await super().complete(request)


@pytest.mark.parametrize("mode", ["tail", "summary"])
async def test_thirty_thousand_tokens_of_reasoning_answer_within_ten_iterations(mode):
    llm = Recording()
    result, _ = await run(llm, max_iterations=10, carryover_mode=mode)
    specific = result.metrics.strategy_specific
    assert result.answer == "7"
    assert specific["stopped_by"] == "answer" and specific["compute_savings_pct"] > 50
    assert specific["reasoning_tokens"] >= 30000
    assert [i["iteration"] for i in specific["iterations"]] == list(range(specific["total_iterations"]))
    assert specific["iterations"][-1]["has_answer"] and not any(i["has_answer"] for i in specific["iterations"][:-1])
    for request in llm.requests:  # the point of bounding: no request the model sees exceeds chunk_size
        assert count_messages(COUNTER, request.messages) + request.max_tokens <= 8192


async def test_every_call_is_counted_with_the_gateway_tokenizer_not_estimated():
    llm = Recording()
    result, recorder = await run(llm, max_iterations=10)
    invocations = [e for e in recorder.events if type(e).__name__ == "LLMInvocation"]
    specific = result.metrics.strategy_specific
    assert [i["prompt_tokens"] for i in specific["iterations"]] == [e.prompt_tokens for e in invocations]
    assert [count_messages(COUNTER, r.messages) for r in llm.requests] == [e.prompt_tokens for e in invocations]
    lengths = [e.prompt_tokens + e.completion_tokens for e in invocations]
    assert specific["attention_cost_bounded"] == sum(attention_pairs(n) for n in lengths)
    reasoning = sum(e.completion_tokens for e in invocations)
    assert specific["attention_cost_baseline"] == attention_pairs(invocations[0].prompt_tokens + reasoning)


async def test_default_five_iterations_run_out_with_the_partial_trace():
    with pytest.raises(MaxIterationsError) as err:
        await run(SimulatedLLM(), max_iterations=5)
    data = err.value.data
    assert "within 5 iterations (capacity 24576 tokens)" in str(err.value)
    assert "increasing max_iterations to 10" in str(err.value)
    assert data["total_iterations"] == 5 and len(data["iterations"]) == 5
    assert data["reasoning_capacity_tokens"] == 24576 and "[progress" in data["last_carryover"]


async def test_final_answer_mode_asks_once_more_from_the_last_carryover():
    result, _ = await run(SimulatedLLM(), max_iterations=2, on_max_iterations="final_answer")
    assert result.answer == "7" and result.metrics.strategy_specific["stopped_by"] == "final_answer"
    assert result.metrics.llm_calls == 3


async def test_answer_in_the_first_chunk_returns_with_no_carryover():
    llm = ScriptedLLM(["<thinking>quick</thinking>It is 4. <answer>4"])
    result, recorder = await run(llm, query="What is 2+2?")
    llm.assert_complete()
    specific = result.metrics.strategy_specific
    assert result.answer == "4" and specific["total_iterations"] == 1 and specific["carryover_compressions"] == 0
    assert not any(type(e).__name__ == "Carryover" for e in recorder.events)
    assert llm.requests[0].stop == ("</answer>", "<continue>")


async def test_a_chunk_with_no_stop_sequence_continues():
    from reasonray.gateway.protocol import Choice, Completion, Usage

    cut = Completion(choices=(Choice(text="Step 1: partial work", finish_reason="length"),), usage=Usage(100, 50), model="scripted")
    llm = ScriptedLLM([cut, "Step 2 <answer>5"])
    result, _ = await run(llm, query="q")
    llm.assert_complete()
    assert [i["stop"] for i in result.metrics.strategy_specific["iterations"]] == ["length", "answer"]
    assert "Step 1: partial work" in llm.requests[1].messages[-1].content


async def test_thinking_is_stripped_from_the_carryover_but_kept_in_the_event_log(tmp_path):
    llm = ScriptedLLM(["visible step <thinking>SECRET scratch</thinking> more visible", "<answer>1"])
    context, recorder = context_for(llm, path=tmp_path / "run.jsonl", keep=False)
    await BoundedContext().reason("q", context=context, config={})
    recorder.close()
    assert "SECRET" not in llm.requests[1].messages[-1].content
    assert "visible step" in llm.requests[1].messages[-1].content
    events = read_event_log(tmp_path / "run.jsonl")
    assert "SECRET scratch" in events[0]["responses"][0]
    assert [e["type"] for e in events] == ["LLM_INVOCATION", "ITERATION_END", "CARRYOVER", "LLM_INVOCATION", "ITERATION_END"]
    carryover = next(e for e in events if e["type"] == "CARRYOVER")
    assert "SECRET" not in carryover["text"]


async def test_summary_mode_uses_the_structured_carryover():
    llm = Recording()
    result, recorder = await run(llm, max_iterations=10, carryover_mode="summary")
    carryovers = [e for e in recorder.events if type(e).__name__ == "Carryover"]
    assert carryovers and all("Key Findings:" in c.text and not c.fallback for c in carryovers)
    assert all(c.tokens <= 4096 for c in carryovers)
    assert result.metrics.strategy_specific["carryover_fallbacks"] == 0
    summary_requests = [r for r in llm.requests if "Current Strategy:" in (r.messages[0].content or "")]
    assert len(summary_requests) == len(carryovers)
    assert all(count_messages(COUNTER, r.messages) + r.max_tokens <= 8192 for r in summary_requests)


@pytest.mark.parametrize("failure", ["", "<thinking>only thinking</thinking>", ProviderUnavailableError("down", attempts=3)])
async def test_a_failed_or_empty_summary_falls_back_to_the_raw_tail(failure):
    llm = ScriptedLLM(["first chunk of visible reasoning", failure, "<answer>9"])
    result, recorder = await run(llm, query="q", carryover_mode="summary")
    llm.assert_complete()
    [carryover] = [e for e in recorder.events if type(e).__name__ == "Carryover"]
    assert carryover.fallback and carryover.text == "first chunk of visible reasoning"
    assert result.answer == "9" and result.metrics.strategy_specific["carryover_fallbacks"] == 1
    assert any(type(e).__name__ == "RunWarning" and e.code == "carryover_fallback" for e in recorder.events)


@pytest.mark.parametrize(
    "config,fragment",
    [
        ({"chunk_size": 4096, "carryover_size": 8192}, "carryover_size must be less than chunk_size"),
        ({"max_iterations": 0}, "max_iterations: Input should be greater than or equal to 1"),
        ({"max_iterations": 51}, "max_iterations: Input should be less than or equal to 50"),
        ({"chunk_size": 127, "carryover_size": 16}, "chunk_size: Input should be greater than or equal to 128"),
        ({"chunk_size": 128, "carryover_size": 15}, "carryover_size: Input should be greater than or equal to 16"),
        ({"carryover_mode": "zip"}, "carryover_mode: Input should be 'auto', 'delethink', 'tail' or 'summary'"),
    ],
)
async def test_invalid_parameters_say_what_to_change(config, fragment):
    with pytest.raises(InvalidParamsError, match=fragment):
        await run(ScriptedLLM([]), **config)


async def test_the_servers_iteration_cap_is_enforced():
    strategy = BoundedContext(BoundedContextSettings(max_allowed_iterations=10))
    with pytest.raises(InvalidParamsError, match="exceeds this server's max_allowed_iterations \\(10\\)"):
        await run(ScriptedLLM([]), strategy=strategy, max_iterations=20)


async def test_a_query_too_long_for_the_chunk_is_refused_before_any_call():
    llm = ScriptedLLM([])
    with pytest.raises(InvalidParamsError, match=r"context size exceeded.*shorten the query"):
        await run(llm, query="word " * 1200, chunk_size=1024, carryover_size=512)
    assert llm.requests == []


async def test_a_carryover_that_no_longer_fits_is_cut_with_a_warning():
    query = "word " * 300  # about 300 tokens of a 1024-token chunk
    llm = ScriptedLLM(["reasoning " * 700, "<answer>2"])
    result, recorder = await run(llm, query=query, chunk_size=1024, carryover_size=900, head_tokens=0)
    second = llm.requests[1]
    assert count_messages(COUNTER, second.messages) + second.max_tokens <= 1024 and second.max_tokens >= 256
    assert any(type(e).__name__ == "RunWarning" and e.code == "carryover_truncated" for e in recorder.events)
    assert result.answer == "2"


async def test_a_provider_failure_keeps_the_partial_iterations():
    llm = ScriptedLLM(["step one", ProviderUnavailableError("HTTP 503", attempts=3)])
    with pytest.raises(ProviderUnavailableError) as err:
        await run(llm, query="q")
    assert err.value.partial_result["total_iterations"] == 1


async def test_128k_tokens_of_reasoning_complete_with_8k_chunks():
    result, _ = await run(SimulatedLLM(), query="[[sim think=128000 answer=42]] go", max_iterations=50)
    specific = result.metrics.strategy_specific
    assert result.answer == "42" and specific["reasoning_tokens"] >= 128000
    assert specific["compute_savings_pct"] > 75


@pytest.mark.parametrize("carryover_size", [512, 2048, 4096])
@pytest.mark.parametrize("mode", ["tail", "summary"])
async def test_answers_hold_across_carryover_sizes(mode, carryover_size):
    result, _ = await run(
        SimulatedLLM(), query="[[sim think=12000 answer=3]] go", max_iterations=20, carryover_mode=mode, carryover_size=carryover_size
    )
    assert result.answer == "3"


def test_capacity_follows_br5():
    from reasonray.strategies.bounded_context import BoundedContextConfig

    assert capacity(BoundedContextConfig()) == 8192 + 4 * 4096
    assert capacity(BoundedContextConfig(max_iterations=10, chunk_size=16384, carryover_size=1024)) == 16384 + 9 * 15360


async def test_config_schema_and_capabilities():
    strategy = BoundedContext()
    schema = strategy.get_config_schema()
    assert {"chunk_size", "carryover_size", "max_iterations", "carryover_mode"} <= set(schema["properties"])
    assert all(p.get("description") for p in schema["properties"].values())
    assert "reasoning.strategy.bounded_context" in strategy.get_capabilities()
    json.dumps(schema)


async def test_warnings_reach_the_logs_with_their_message_but_no_model_text():
    import structlog

    llm = ScriptedLLM(["private reasoning text", "", "<answer>9"])
    with structlog.testing.capture_logs() as logs:
        await run(llm, query="q", carryover_mode="summary")
    [warning] = [e for e in logs if e["event"] == "RunWarning"]
    assert warning["code"] == "carryover_fallback" and "raw tail" in warning["message"]
    assert "private reasoning text" not in json.dumps(logs, default=str)


class JoinCostsAToken:
    """The real counter, except that the summary frame joined to the reasoning after it costs one
    token more than its parts (as BPE merges can make a join cost more or less)."""

    def __init__(self, inner):
        self.inner = inner
        self.encoding_name = inner.encoding_name

    def count(self, text):
        marker = "Latest reasoning:\n"
        return self.inner.count(text) + (marker in text and not text.endswith(marker))

    def head(self, text, n):
        return self.inner.head(text, n)

    def tail(self, text, n):
        return self.inner.tail(text, n)


@pytest.mark.parametrize("mode", ["summary", "tail"])
async def test_no_call_ever_asks_for_more_than_chunk_size(mode):
    """Prompt plus max_tokens of every call (reasoning, summary, final answer) fits chunk_size, even with a
    query that leaves the final answer no room unless the carryover gives some back (was: 8,193 of 8,192)."""
    llm = Recording()
    context, _ = context_for(llm, strategy="bounded_context")
    context.tokens = JoinCostsAToken(context.tokens)
    # 58 sentences: the tail's carryover is cut to fit, the final answer's room comes out of it, and a margin
    # of ~17 tokens stays for the head kept from the first chunk (the model's words, which vary with its draws)
    query = "[[sim think=30000 answer=7]] " + "Consider every detail of this long problem statement. " * 58
    config = {"carryover_mode": mode, "chunk_size": 1024, "carryover_size": 512, "max_iterations": 3, "on_max_iterations": "final_answer"}
    result = await BoundedContext().reason(query, context=context, config=config)
    assert result.metrics.strategy_specific["stopped_by"] == "final_answer"
    kinds = {"summary": 0, "final": 0}
    for request in llm.requests:
        prompt = count_messages(context.tokens, request.messages)
        assert prompt + request.max_tokens <= 1024, (prompt, request.max_tokens)
        kinds["summary"] += "Latest reasoning:" in request.messages[-1].content
        kinds["final"] += "final answer now" in request.messages[-1].content
    assert kinds["final"] == 1 and kinds["summary"] == (3 if mode == "summary" else 0)


class OtherTokenizer:
    """A model server that counts prompts 12% above our counter plus 12 tokens of chat framing (SmolLM2 through
    llama.cpp ran +5% to +14%), and rambles until max_tokens, which it honours by its own count."""

    model = "other-tokenizer"

    def __init__(self):
        self.requests = []

    async def complete(self, request):
        import math

        from reasonray.gateway.protocol import Choice, Completion, Usage

        self.requests.append(request)
        prompt = math.ceil(count_messages(COUNTER, request.messages) * 1.12) + 12
        return Completion(
            choices=(Choice(text="and then we multiply again " * (request.max_tokens // 5), finish_reason="length"),),
            usage=Usage(prompt, request.max_tokens),
            model=self.model,
        )


@pytest.mark.parametrize("mode", ["tail", "summary"])
async def test_no_chunk_exceeds_chunk_size_by_the_servers_own_count(mode):
    llm = OtherTokenizer()
    config = {"chunk_size": 1024, "carryover_size": 512, "max_iterations": 4, "carryover_mode": mode}
    with pytest.raises(MaxIterationsError) as err:
        await run(llm, query="What is 17 * 23? Show every step.", **config)
    iterations = err.value.data["iterations"]
    assert len(iterations) == 4
    # the server's usage, not our count, and never above chunk_size (was 1031, 1069, 1057, 1069)
    assert all(i["tokens"] == i["prompt_tokens"] + i["completion_tokens"] <= 1024 for i in iterations), iterations
    # once calibrated on a prompt of its size, a chunk wastes little of its room to the margin
    assert iterations[-1]["tokens"] >= 1024 - 32, iterations
    summaries = [r for r in llm.requests if r.purpose == "summarize"]
    assert len(summaries) == (4 if mode == "summary" else 0)  # one after each chunk
    for request in summaries:
        import math

        assert math.ceil(count_messages(COUNTER, request.messages) * 1.12) + 12 + request.max_tokens <= 1024


async def test_a_model_that_ignores_the_tag_answers_with_a_chunk_that_states_it():
    llm = ScriptedLLM(["17 * 20 = 340 and 17 * 3 = 51, so 340 + 51 = 391.\nThe answer is: 391"])
    result, _ = await run(llm, query="What is 17 * 23?")
    s = result.metrics.strategy_specific
    assert result.answer == "391" and s["found_by"] == "phrase" and s["stopped_by"] == "answer"


async def test_a_chunk_cut_by_max_tokens_is_not_an_answer_even_if_it_says_one():
    from reasonray.gateway.protocol import Choice, Completion, Usage

    cut = Completion(choices=(Choice(text="The answer is: 3", finish_reason="length"),), usage=Usage(100, 50), model="scripted")
    llm = ScriptedLLM([cut, "so it is <answer>4"])
    result, _ = await run(llm, query="q")
    assert result.answer == "4" and result.metrics.strategy_specific["found_by"] == "tag"


async def test_the_final_answer_call_reads_an_untagged_reply():
    llm = ScriptedLLM(["reasoning goes on", "more reasoning", "It comes to 17 * 23 = 391"])
    result, _ = await run(llm, query="What is 17 * 23?", max_iterations=2, on_max_iterations="final_answer")
    s = result.metrics.strategy_specific
    assert result.answer == "391" and s["found_by"] == "final_number" and s["stopped_by"] == "final_answer"
